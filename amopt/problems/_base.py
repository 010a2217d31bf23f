"""Shared machinery of the test problems: array conversion, data checks, spectral bounds."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..backends import to_numpy
from ..backends.sparse import (
    DeviceCSR,
    _GatheredRows,
    _SelectedRows,
    _Structure,
    _take_rows,
    device_indices,
    device_library,
)
from ..core.xp import array_namespace, is_array

__all__ = ["Problem", "FiniteSumProblem"]


class Problem:
    """Base class of the deterministic test problems.

    Subclasses implement :meth:`value_and_grad`; :meth:`fun` and :meth:`grad`
    are derived from it (and overridden where a cheaper form exists). Every
    method accepts a 1-D array of length :attr:`dim` from any array-API
    backend (NumPy, PyTorch, CuPy, array-api-strict) and answers in the same
    namespace, dtype and device; values are 0-d arrays (for NumPy input a
    ``numpy.float64``). Python sequences are converted to float64 NumPy arrays.

    Examples
    --------
    A subclass only needs :attr:`dim` and :meth:`value_and_grad`:

    >>> import numpy as np
    >>> from amopt.problems import Problem
    >>> class SumOfSquares(Problem):
    ...     dim = 2
    ...
    ...     def value_and_grad(self, x):
    ...         x = np.asarray(x, dtype=np.float64)
    ...         return np.sum(x * x), 2 * x
    >>> prob = SumOfSquares()
    >>> float(prob.fun([1.0, 2.0])), prob.grad(np.array([1.0, 2.0])).tolist()
    (5.0, [2.0, 4.0])
    >>> float(prob(np.ones(2)))  # calling a problem is fun
    2.0
    """

    #: Number of variables.
    dim: int

    def __call__(self, x: Any) -> Any:
        """Same as :meth:`fun`, so that a problem can be passed where a callable is wanted."""
        return self.fun(x)

    def fun(self, x: Any) -> Any:
        """Objective value at ``x``."""
        return self.value_and_grad(x)[0]

    def grad(self, x: Any) -> Any:
        """Gradient at ``x`` (same shape, namespace, dtype and device as ``x``)."""
        return self.value_and_grad(x)[1]

    def value_and_grad(self, x: Any) -> tuple[Any, Any]:  # pragma: no cover - abstract
        """Objective value and gradient at ``x``."""
        raise NotImplementedError

    def _prepare(self, x: Any, shapes: tuple[tuple[int, ...], ...] | None = None) -> tuple:
        """Validate ``x``; return ``(x, xp)``."""
        if isinstance(x, list | tuple):
            x = np.asarray(x, dtype=np.float64)
        if not is_array(x):
            raise TypeError(
                f"x must be an array (NumPy, PyTorch, CuPy, array-api-strict), got "
                f"{type(x).__name__}"
            )
        if isinstance(x, np.ndarray) and not np.issubdtype(x.dtype, np.floating):
            if not (np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_):
                raise TypeError(f"x must have a real floating dtype, got {x.dtype}")
            x = x.astype(np.float64)
        xp = array_namespace(x)
        if not xp.isdtype(x.dtype, "real floating"):
            raise TypeError(f"x must have a real floating dtype, got {x.dtype}")
        allowed = shapes if shapes is not None else ((self.dim,),)
        if tuple(x.shape) not in allowed:
            want = " or ".join(str(s) for s in allowed)
            raise ValueError(f"x must have shape {want}, got {tuple(x.shape)}")
        return x, xp


class FiniteSumProblem(Problem):
    r"""A :class:`Problem` of the form :math:`\frac1n \sum_i f_i(x) + r(x)`.

    Satisfies the :class:`amopt.FiniteSum` protocol: :attr:`n_samples`,
    :meth:`value_and_grad` (the full objective) and
    :meth:`batch_value_and_grad` (the mean of :math:`f_i` over an index array
    plus the regulariser :math:`r`).

    Examples
    --------
    :class:`LogisticRegression` is a finite sum over its rows; the batch over
    every row is the full objective:

    >>> import numpy as np
    >>> from amopt.problems import FiniteSumProblem, LogisticRegression
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5]])
    >>> prob = LogisticRegression(X, np.array([1, 2, 2, 1]), l2=0.1)
    >>> isinstance(prob, FiniteSumProblem), prob.n_samples
    (True, 4)
    >>> x = np.array([0.5, -0.5])
    >>> f, g = prob.value_and_grad(x)
    >>> fb, gb = prob.batch_value_and_grad(x, np.arange(prob.n_samples))
    >>> bool(np.isclose(f, fb)), bool(np.allclose(g, gb))
    (True, True)
    """

    #: Number of terms ``n``.
    n_samples: int

    def batch_value_and_grad(
        self, x: Any, indices: Any
    ) -> tuple[Any, Any]:  # pragma: no cover - abstract
        """Mean of :math:`f_i` over ``indices`` plus :math:`r`, and its gradient."""
        raise NotImplementedError

    def _check_indices(self, indices: Any) -> np.ndarray:
        idx = to_numpy(indices) if is_array(indices) else np.asarray(indices)
        if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
            raise ValueError(
                f"indices must be a 1-D integer array, got shape {idx.shape} and dtype {idx.dtype}"
            )
        if idx.size == 0:
            raise ValueError("indices must not be empty")
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.n_samples:
            raise ValueError(
                f"indices must lie in [0, {self.n_samples - 1}] (n_samples={self.n_samples}), "
                f"got values in [{lo}, {hi}]"
            )
        return idx.astype(np.intp, copy=False)


class _RowSum(FiniteSumProblem):
    """A finite sum over the rows of a design: :math:`f_i` depends on row ``i`` and its target.

    Subclasses set ``_data`` (a :class:`_Design`, or the chunked design of
    :mod:`amopt.backends.dask` for a dask ``X``) and ``_eval(x, xp, X, t, m, XT=None)``,
    the objective and gradient of the ``m`` rows ``X`` with targets ``t``;
    ``_shapes`` are the accepted shapes of ``x`` (None: ``(dim,)``).
    """

    _shapes: tuple[tuple[int, ...], ...] | None = None

    def value_and_grad(self, x: Any) -> tuple[Any, Any]:
        """Full objective and gradient."""
        x, xp = self._prepare(x, self._shapes)
        if getattr(self._data, "lazy", False):
            return self._data.evaluate(self._eval, x, self.n_samples)
        X, t = self._data.arrays(x, xp)
        return self._eval(x, xp, X, t, self.n_samples, self._data.XT)

    def batch_value_and_grad(self, x: Any, indices: Any) -> tuple[Any, Any]:
        """Mean loss over the rows ``indices`` (repeats count) plus the regulariser, and its
        gradient.

        ``indices``: a 1-D integer array, on the host (checked against
        ``[0, n_samples)``), or, for a torch or CuPy ``x``, a tensor/array of the
        same library, which stays on the device: the rows are gathered there and
        nothing is read back (so its values are not range-checked on the host).
        """
        x, xp = self._prepare(x, self._shapes)
        idx = device_indices(indices, x)
        if idx is None:
            idx = self._check_indices(indices)
        if getattr(self._data, "lazy", False):
            return self._data.evaluate(self._eval, x, idx.shape[0], idx)
        X, t = self._data.arrays(x, xp)
        Xb, tb = self._data.rows(X, t, idx, xp, x)
        return self._eval(x, xp, Xb, tb, idx.shape[0])


class _SolvedNumerically:
    """:attr:`x_star` and :attr:`f_star` of a problem from its ``reference_solution()``."""

    @property
    def x_star(self) -> np.ndarray:
        return self.reference_solution().x  # type: ignore[attr-defined]

    @property
    def f_star(self) -> float:
        return self.reference_solution().fun  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- data helpers


def _check_scalar(name: str, value: Any, *, low: float = 0.0, low_open: bool = False) -> float:
    """A finite real number >= low (> low if ``low_open``); clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    bad = not np.isfinite(v) or (v <= low if low_open else v < low)
    if bad:
        rng = f"({low}, inf)" if low_open else f"[{low}, inf)"
        raise ValueError(f"{name} must be a finite number in {rng}, got {value!r}")
    return v


def _check_targets(y: Any) -> np.ndarray:
    """``y`` of a regression problem: a 1-D array of finite real numbers, as float64."""
    y = np.asarray(to_numpy(y) if not isinstance(y, list | tuple) else y)
    if y.dtype.kind not in "biuf":
        raise TypeError(f"y must hold real numbers, got dtype {y.dtype}")
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {y.shape}")
    y = y.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(y))
    if bad.size:
        raise ValueError(
            f"y contains NaN or infinite values, but must be finite: y[{bad[0]}] = "
            f"{float(y[bad[0]])!r} ({bad.size} non-finite in all)"
        )
    return y


def _check_int(name: str, value: Any, *, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


class _Design:
    """A design matrix ``X`` (NumPy, SciPy sparse, or any array-API array) and targets.

    Keeps the host copy used for spectral computations and reference solves,
    and per-(namespace, device, dtype) copies of the dense data for evaluation.
    """

    def __init__(self, X: Any, targets: np.ndarray):
        if sp.issparse(X):
            X = sp.csr_matrix(X, dtype=np.float64)
            X.sum_duplicates()
            X.sort_indices()
            self.sparse = True
            host = X
            data = X.data
        elif isinstance(X, np.ndarray) or not is_array(X):
            X = np.asarray(X)
            if not (np.issubdtype(X.dtype, np.number) and not np.iscomplexobj(X)):
                raise TypeError(f"X must hold real numbers, got dtype {X.dtype}")
            X = np.ascontiguousarray(X, dtype=np.float64)
            self.sparse = False
            host = X
            data = X
        else:
            xp = array_namespace(X)
            if not xp.isdtype(X.dtype, "real floating"):
                raise TypeError(f"X must have a real floating dtype, got {X.dtype}")
            self.sparse = False
            host = np.ascontiguousarray(to_numpy(X), dtype=np.float64)
            data = host
        if len(X.shape) != 2:
            raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}")
        n, d = X.shape
        if n < 1 or d < 1:
            raise ValueError(f"X must have at least one row and one column, got shape {X.shape}")
        bad = ~np.isfinite(data)
        if np.any(bad):
            k = int(np.argmax(bad.ravel()))
            i, j = (
                (int(np.searchsorted(X.indptr, k, side="right")) - 1, int(X.indices[k]))
                if self.sparse
                else divmod(k, d)
            )
            raise ValueError(
                f"X contains NaN or infinite values, but must be finite: X[{i}, {j}] = "
                f"{float(data.ravel()[k])!r} ({int(np.count_nonzero(bad))} non-finite in all)"
            )
        if not np.any(data):
            raise ValueError(
                f"X must have at least one nonzero entry, got an all-zero X of shape {X.shape} "
                "(the objective would not depend on the data)"
            )
        if targets.shape[0] != n:
            raise ValueError(
                f"X has {n} rows but y has {targets.shape[0]} entries; they must match"
            )
        self.X = X
        self.host = host
        self.XT = host.T.tocsr() if self.sparse else None
        self.targets = targets
        self.n, self.d = int(n), int(d)
        self._cache: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._structures: dict[tuple[str, str], _Structure] = {}
        self._row_sq: np.ndarray | None = None
        self._gram_max: float | None = None

    # ---- evaluation data in x's namespace
    def arrays(self, x: Any, xp: Any) -> tuple[Any, Any]:
        """``(X, targets)`` in the namespace/device/dtype of ``x``.

        A sparse ``X`` stays a SciPy matrix for NumPy ``x``, becomes a
        :class:`~amopt.backends.sparse.DeviceCSR` (torch sparse CSR or
        ``cupyx.scipy.sparse``) for torch and CuPy ``x``; built once per
        (namespace, device, dtype) and cached.
        """
        if isinstance(x, np.ndarray):
            if self.sparse:
                return self.X, self.targets
            if isinstance(self.X, np.ndarray) and x.dtype == np.float64:
                return self.X, self.targets
        elif self.sparse and device_library(x) is None:
            raise TypeError(
                "a problem built on a SciPy sparse matrix evaluates NumPy, torch and CuPy "
                f"arrays, got {type(x).__name__}; pass X.toarray() (or a dense array) for "
                "other backends"
            )
        dev = _device(x)
        key = (xp.__name__, str(dev), str(x.dtype))
        hit = self._cache.get(key)
        if hit is None:
            if self.sparse:
                Xc = DeviceCSR(self._structure(x, dev), self.X, self.XT, x.dtype)
            else:
                src = self.X if not isinstance(self.X, np.ndarray) else self.host
                Xc = _convert(src, xp, x, dev)
            tc = xp.asarray(self.targets, dtype=x.dtype, device=dev)
            hit = self._cache[key] = (Xc, tc)
        return hit

    def _structure(self, x: Any, dev: Any) -> _Structure:
        """The device index arrays of the sparse ``X`` (one copy per device, for every dtype)."""
        lib = device_library(x)
        key = (lib, str(dev))
        st = self._structures.get(key)
        if st is None:
            st = self._structures[key] = _Structure(self.X, self.XT, lib, dev)
        return st

    def matvec(self, X: Any, w: Any) -> Any:
        if isinstance(X, DeviceCSR | _GatheredRows | _SelectedRows):
            return X.matvec(w)
        return X @ w

    def rmatvec(self, X: Any, r: Any, xp: Any, XT: Any = None) -> Any:
        """``X^T r`` for r of shape (m,) or (m, K)."""
        if isinstance(X, DeviceCSR | _GatheredRows | _SelectedRows):
            return X.rmatvec(r)
        if sp.issparse(X):
            return (XT if XT is not None else X.T) @ r
        return xp.matrix_transpose(X) @ r

    def rows(self, X: Any, targets: Any, idx: Any, xp: Any, x: Any):
        """Rows ``idx`` of ``X`` and ``targets``: ``idx`` is a host (NumPy) index array, or,
        for a device ``x``, one already on x's device."""
        if sp.issparse(X):
            return X[idx], targets[idx]
        ix = xp.asarray(idx, device=_device(x)) if isinstance(idx, np.ndarray) else idx
        if isinstance(X, DeviceCSR):
            return X.rows(ix), _take_rows(X.lib, targets, ix)
        lib = device_library(x)
        if lib == "torch":
            # torch's own gather: the array-API ``take`` first maps negative indices, two
            # more operations per array (the indices here lie in [0, n_samples))
            return _take_rows(lib, X, ix), _take_rows(lib, targets, ix)
        return xp.take(X, ix, axis=0), xp.take(targets, ix, axis=0)

    # ---- spectral quantities (host, float64)
    @property
    def row_sq_norms(self) -> np.ndarray:
        """``||a_i||^2`` for every row."""
        if self._row_sq is None:
            H = self.host
            sq = H.multiply(H).sum(axis=1) if self.sparse else np.einsum("ij,ij->i", H, H)
            self._row_sq = np.asarray(sq, dtype=np.float64).ravel()
        return self._row_sq

    @property
    def gram_max(self) -> float:
        r"""Largest eigenvalue of :math:`X^\top X` (= :math:`\sigma_{\max}(X)^2`)."""
        if self._gram_max is None:
            self._gram_max = _gram_lambda_max(self.host)
        return self._gram_max

    def digest(self, *extra: Any) -> str:
        """SHA-256 of the data and the extra parameters (the reference-solution cache key)."""
        h = hashlib.sha256()
        H = self.host
        h.update(repr((type(self).__name__, H.shape, self.sparse, extra)).encode())
        if self.sparse:
            for a in (H.indptr, H.indices, H.data):
                h.update(np.ascontiguousarray(a).tobytes())
        else:
            h.update(H.tobytes())
        h.update(np.ascontiguousarray(self.targets).tobytes())
        return h.hexdigest()


def _device(x: Any) -> Any:
    import array_api_compat

    return array_api_compat.device(x)


def _convert(a: Any, xp: Any, like: Any, dev: Any) -> Any:
    """Copy ``a`` (NumPy or another namespace's array) into ``xp`` with like's dtype/device."""
    if isinstance(a, np.ndarray):
        return xp.asarray(a, dtype=like.dtype, device=dev)
    src_xp = array_namespace(a)
    if src_xp is xp or src_xp.__name__ == xp.__name__:
        return xp.asarray(xp.astype(a, like.dtype), device=dev)
    return xp.asarray(np.asarray(to_numpy(a)), dtype=like.dtype, device=dev)


def _gram_lambda_max(H: Any) -> float:
    r"""Largest eigenvalue of :math:`H^\top H` by Lanczos (``eigsh``), never forming it."""
    n, d = H.shape
    if min(n, d) == 1:
        return float(H.multiply(H).sum() if sp.issparse(H) else np.sum(H * H))
    if d <= n:
        op = spla.LinearOperator((d, d), matvec=lambda v: H.T @ (H @ v), dtype=np.float64)
        m = d
    else:
        op = spla.LinearOperator((n, n), matvec=lambda v: H @ (H.T @ v), dtype=np.float64)
        m = n
    v0 = np.ones(m) / np.sqrt(m)
    ncv = min(m, 32)
    if ncv <= 1:  # pragma: no cover - m >= 2 here
        ncv = m
    vals = spla.eigsh(
        op, k=1, which="LA", v0=v0, tol=1e-12, ncv=ncv, maxiter=100 * m,
        return_eigenvectors=False,
    )  # fmt: skip
    return float(vals[0])
