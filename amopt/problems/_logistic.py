"""Logistic regression (binary and softmax) and a non-convex regularised variant."""

from __future__ import annotations

import math
import os
from typing import Any, Literal

import array_api_compat
import numpy as np
import scipy.sparse as sp
import scipy.special

from .. import backends
from ..backends import dask as _lazy
from ..backends import to_numpy
from ..datasets._libsvm import _check_label_values, _label_convention, binary_labels, class_indices
from ._base import _check_int, _check_scalar, _Design, _RowSum, _SolvedNumerically
from ._reference import ReferenceSolution, solve_reference

__all__ = ["LogisticRegression", "NonconvexLogisticRegression"]

# max_t |d/dt t^2/(1+t^2)| = 3*sqrt(3)/8, attained at t = 1/sqrt(3)
_NONCONVEX_REG_SLOPE = 3.0 * math.sqrt(3.0) / 8.0
# reference solves polish with Newton steps on problems with at most this many parameters
_DENSE_HESSIAN_MAX = 2000


def _labels_1d(y: Any) -> np.ndarray:
    y = np.asarray(to_numpy(y) if not isinstance(y, list | tuple) else y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {y.shape}")
    _check_label_values(y)
    return y


def _design(X: Any, targets: np.ndarray, lazy_labels: Any, kind: str, classes: np.ndarray):
    """The in-memory design, or a chunked one for a dask ``X``.

    With dask labels as well, the targets are encoded from them lazily, so that
    they stay where the labels are (e.g. on the workers of a cluster).
    """
    if lazy_labels is not None:
        from ..backends.dask._design import label_targets

        targets = label_targets(lazy_labels, kind, classes)
    return _lazy.design(X, targets) or _Design(X, targets)


def _scores(data: Any, w: np.ndarray) -> np.ndarray:
    """``X @ w`` on the host, for NumPy ``w`` (computed chunk by chunk for a dask ``X``)."""
    if getattr(data, "lazy", False):
        import dask.array as da

        return np.asarray(data.matvec(data.X, da.from_array(w, chunks=-1)).compute())
    return np.asarray(data.host @ w)


class LogisticRegression(_SolvedNumerically, _RowSum):
    r"""Logistic regression, binary or multiclass (softmax), with an optional L2 term.

    Binary (labels mapped to :math:`b_i = \pm 1` by :func:`~amopt.datasets.binary_labels`:
    the larger label is :math:`+1`, so ``±1``, ``{0, 1}``, ``{1, 2}`` all work; a
    single label :math:`c` is :math:`-1` iff :math:`c \le 0`):

    .. math:: f(x) = \frac1n \sum_i \log(1 + e^{-b_i a_i^\top x}) + \frac{\ell_2}{2}\|x\|^2.

    Softmax (``K`` classes, parameters :math:`W \in \mathbb{R}^{d \times K}`,
    passed flattened in C order as ``x`` of length ``d*K``, or as a ``(d, K)`` array):

    .. math:: f(W) = \frac1n \sum_i \Big(\log \sum_k e^{a_i^\top w_k} - a_i^\top w_{c_i}\Big)
              + \frac{\ell_2}{2}\|W\|_F^2.

    No intercept is fitted (append a column of ones to ``X`` for one).

    Parameters
    ----------
    X : array_like or scipy.sparse matrix, shape (n_samples, n_features)
        NumPy array, SciPy sparse matrix (converted to CSR; NumPy ``x`` is
        evaluated with SciPy, torch ``x`` with a torch sparse CSR copy and CuPy
        ``x`` with a ``cupyx.scipy.sparse`` copy, made once per device and dtype;
        mini-batch rows are gathered on the device), a dense PyTorch/CuPy/array-API
        array, or a dask array chunked by rows, with dense or SciPy sparse chunks:
        it is never gathered into memory, and the problem evaluates dask ``x``
        lazily and NumPy ``x`` with one computation.
    y : array_like, shape (n_samples,)
        Labels, any two values for binary, any values for softmax. With a dask
        ``X``, a dask ``y`` gives lazily encoded targets (the labels themselves
        are read once, for the classes).
    l2 : float, default 0.0
        L2 coefficient (>= 0).
    multiclass : {"auto", "binary", "softmax"}, default "auto"
        ``"auto"``: binary if ``y`` has at most two distinct values, else softmax.

    Attributes
    ----------
    n_samples, n_features : int
    n_classes : int
        2 for binary.
    classes : numpy.ndarray
        The distinct labels, sorted (binary: ``classes[1]`` maps to ``+1``).
    dim : int
        Number of parameters: ``n_features`` (binary) or ``n_features * n_classes``.
    L : float
        Smoothness constant for ``lr = 1/L``. Binary:
        :math:`\lambda_{\max}(X^\top X)/(4n) + \ell_2` (exact sup of the Hessian
        norm, attained at ``x = 0``). Softmax: the standard bound
        :math:`\lambda_{\max}(X^\top X)/(2n) + \ell_2`, from
        :math:`\nabla^2 = \frac1n\sum_i (\mathrm{diag}(p_i) - p_i p_i^\top) \otimes a_i a_i^\top`
        and :math:`\|\mathrm{diag}(p) - pp^\top\| \le 1/2`. Computed by
        Lanczos (``scipy.sparse.linalg.eigsh``) on :math:`X^\top X`, never formed;
        for a dask ``X``, from the Gram matrix accumulated over the chunks up to
        2048 features, by Lanczos on the chunked operator above.
    L_max : float
        :math:`\max_i \|a_i\|^2/4 + \ell_2` (binary), :math:`\max_i \|a_i\|^2/2 + \ell_2`
        (softmax): the smoothness of each :math:`f_i` plus the regulariser.
    G2 : float
        Certified bound on :math:`E\|\nabla f_S(x)\|^2` for every ``x`` and any
        batch: :math:`\frac1n\sum_i\|a_i\|^2` (binary, since
        :math:`|\sigma| \le 1`), twice that for softmax (:math:`\|p - e_c\|^2 \le 2`);
        ``inf`` when ``l2 > 0`` (the gradient is then unbounded).
    convex : bool
        Always true.
    x_star, f_star
        From :meth:`reference_solution` (L-BFGS-B to ``gtol = 1e-10``, cached).

    Examples
    --------
    >>> import numpy as np
    >>> from amopt.problems import LogisticRegression
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5]])
    >>> prob = LogisticRegression(X, np.array([1, 2, 2, 1]), l2=0.1)
    >>> f, g = prob.value_and_grad(np.zeros(2))
    >>> round(float(f), 6), round(prob.L, 6)
    (0.693147, 0.303125)
    >>> sol = prob.reference_solution(cache=False)  # cache=True also stores it on disk
    >>> round(sol.fun, 8), sol.converged
    (0.59994235, True)
    """

    convex = True

    def __init__(
        self,
        X: Any,
        y: Any,
        *,
        l2: float = 0.0,
        multiclass: Literal["auto", "binary", "softmax"] = "auto",
    ):
        lazy_labels = y if _lazy.is_lazy((X,)) and _lazy.is_lazy((y,)) else None
        y = _labels_1d(y)
        if multiclass not in ("auto", "binary", "softmax"):
            raise ValueError(
                f"multiclass must be 'auto', 'binary' or 'softmax', got {multiclass!r}"
            )
        classes = np.unique(y)
        kind = multiclass
        if kind == "auto":
            kind = "binary" if classes.size <= 2 else "softmax"
        if kind == "binary":
            targets = binary_labels(y)
            n_classes = 2
        else:
            idx, classes = class_indices(y)
            n_classes = int(classes.size)
            if n_classes < 2:
                raise ValueError(
                    f"softmax needs at least 2 classes: y has {n_classes} distinct label(s) "
                    f"{classes.tolist()}; use multiclass='binary' or 'auto' for one class"
                )
            targets = np.zeros((y.shape[0], n_classes))
            targets[np.arange(y.shape[0]), idx] = 1.0
        self.kind: str = kind
        self.classes = classes
        self.n_classes = n_classes
        self.l2 = _check_scalar("l2", l2)
        self._data = _design(X, targets, lazy_labels, kind, classes)
        self.n_samples, self.n_features = self._data.n, self._data.d
        self.dim = self.n_features if kind == "binary" else self.n_features * n_classes
        self._shapes = (
            ((self.dim,),) if kind == "binary" else ((self.dim,), (self.n_features, n_classes))
        )

    @classmethod
    def from_libsvm(
        cls,
        path_or_name: str | os.PathLike[str],
        *,
        l2: float = 0.0,
        multiclass: Literal["auto", "binary", "softmax"] = "auto",
        **load_kwargs: Any,
    ) -> LogisticRegression:
        """Logistic regression on a LIBSVM file or registered data set.

        ``load_kwargs`` go to :func:`amopt.datasets.load_libsvm`. A file with a
        single class keeps its sign under the file's label convention (the
        registry's, or ``label_convention=``): only ``1`` in a ``{1, 2}`` file
        is ``-1``.

        Examples
        --------
        >>> from amopt.problems import LogisticRegression
        >>> prob = LogisticRegression.from_libsvm("mushrooms")
        >>> prob.n_samples, prob.dim, round(prob.L, 4)
        (8124, 112, 2.5862)
        """
        from ..datasets import load_libsvm

        X, y = load_libsvm(path_or_name, **load_kwargs)
        if multiclass != "softmax" and load_kwargs.get("labels", "raw") == "raw":
            conv = _label_convention(path_or_name, load_kwargs.get("label_convention"))
            if conv is not None and np.unique(y).size == 1:
                y = binary_labels(y, convention=conv)
        return cls(X, y, l2=l2, multiclass=multiclass)

    # ------------------------------------------------------------------ constants
    @property
    def L(self) -> float:
        factor = 0.25 if self.kind == "binary" else 0.5
        return factor * self._data.gram_max / self.n_samples + self.l2

    @property
    def L_max(self) -> float:
        factor = 0.25 if self.kind == "binary" else 0.5
        return factor * float(np.max(self._data.row_sq_norms)) + self.l2

    @property
    def G2(self) -> float:
        if self.l2 > 0:
            return math.inf
        factor = 1.0 if self.kind == "binary" else 2.0
        return factor * float(np.mean(self._data.row_sq_norms))

    @property
    def sigma_f2(self) -> float:
        r"""Certified bound on :math:`E_S[f_S(x^*) - \inf f_S]` (fixed-cap theorem).

        :math:`f^* - \frac1n\sum_i \inf f_i`, valid for every batch size since
        :math:`\inf f_S \ge` the mean of the per-sample infima; :math:`\inf f_i = 0`
        unless :math:`a_i = 0` (then :math:`f_i \equiv \log K`). ``inf`` when ``l2 > 0``.
        """
        if self.l2 > 0:
            return math.inf
        zero_rows = np.count_nonzero(self._data.row_sq_norms == 0.0)
        return max(self.f_star - zero_rows * math.log(self.n_classes) / self.n_samples, 0.0)

    # ------------------------------------------------------------------ evaluation
    def _zero(self, like: Any, xp: Any) -> Any:
        """A 0-d zero like ``like``: a Python float for NumPy, else one array made once
        per device and dtype (a float would be copied to the device at every call)."""
        if isinstance(like, np.ndarray) or array_api_compat.is_dask_array(like):
            return 0.0
        cache = self.__dict__.setdefault("_zeros", {})
        key = (xp.__name__, str(getattr(like, "device", None)), str(like.dtype))
        zero = cache.get(key)
        if zero is None:
            zero = cache[key] = xp.zeros((), dtype=like.dtype, device=like.device)
        return zero

    def _eval(self, x: Any, xp: Any, X: Any, t: Any, m: int, XT: Any = None):
        data = self._data
        if self.kind == "binary":
            z = data.matvec(X, x)
            # the six operations below in one kernel where the library has one (CuPy)
            loss_kernel = backends.kernel(backends.library_of(z), "logistic_loss")
            fused = loss_kernel and loss_kernel(t, z)
            if fused is None:
                neg_margin = -(t * z)
                loss = xp.logaddexp(self._zero(neg_margin, xp), neg_margin)
                # b * sigmoid(-margin), stable both ways; the gradient X^T (-b sigmoid(-margin))
                # / m with its sign in the divisor (the same values: negation is exact)
                s = t * xp.exp(neg_margin - loss)
            else:
                loss, s = fused
            f = xp.sum(loss) / m
            g = data.rmatvec(X, s, xp, XT) / (-m)
        else:
            W = xp.reshape(x, (self.n_features, self.n_classes))
            Z = data.matvec(X, W)
            zmax = xp.max(Z, axis=1, keepdims=True)
            E = xp.exp(Z - zmax)
            S = xp.sum(E, axis=1, keepdims=True)
            f = (xp.sum(zmax) + xp.sum(xp.log(S)) - xp.sum(Z * t)) / m
            G = data.rmatvec(X, E / S - t, xp, XT) / m
            g = xp.reshape(G, tuple(x.shape))
        if self.l2:
            f = f + 0.5 * self.l2 * xp.sum(x * x)
            g = g + self.l2 * x
        return f, g

    def predict(self, x: Any) -> np.ndarray:
        """Predicted labels (from :attr:`classes`) for the training rows, on the host."""
        x, _ = self._prepare(x, self._shapes)
        w = np.asarray(to_numpy(x), dtype=np.float64)
        if self.kind == "binary":
            return np.where(_scores(self._data, w) >= 0, self.classes[-1], self.classes[0])
        Z = _scores(self._data, w.reshape(self.n_features, self.n_classes))
        return self.classes[np.argmax(np.asarray(Z), axis=1)]

    # ------------------------------------------------------------------ reference solution
    def reference_solution(
        self,
        gtol: float = 1e-10,
        *,
        maxiter: int = 100_000,
        cache: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> ReferenceSolution:
        """High-accuracy minimiser by L-BFGS-B (``ftol = 0``, stops at max|grad| <= gtol).

        Cached in memory and, if ``cache``, on disk in
        ``<cache home>/reference/`` (``cache_dir``, else ``$AMOPT_CACHE_DIR``,
        else the platform's user cache directory; see
        :func:`amopt.datasets.get_cache_home`; never the data folder) under a
        SHA-256 of the data, labels, model and ``l2``. A solve still running
        after 2 s logs one line on the ``amopt.cache`` logger (stderr) saying
        what is computed and where it is cached. Emits
        :class:`ReferenceSolutionWarning` if ``gtol`` is not reached (e.g.
        separable data with ``l2 = 0``, where no minimiser exists).
        """
        gtol = _check_scalar("gtol", gtol, low_open=True)
        maxiter = _check_int("maxiter", maxiter)
        key = "logreg-" + self._data.digest(self.kind, self.l2)[:40]
        x0 = np.zeros(self.dim)
        hess = self.hess if self.dim <= _DENSE_HESSIAN_MAX else None
        return solve_reference(
            key, self.value_and_grad, x0, gtol=gtol, maxiter=maxiter, cache=cache,
            cache_dir=cache_dir, hess=hess,
        )  # fmt: skip

    def hess(self, x: Any) -> np.ndarray:
        r"""Dense Hessian at ``x`` (NumPy float64, shape ``(dim, dim)``; small problems only).

        Binary: :math:`\frac1n X^\top \mathrm{diag}(\sigma_i(1-\sigma_i)) X + \ell_2 I`.
        Softmax (C-order flattening of ``W``): blocks
        :math:`\frac1n X^\top \mathrm{diag}(p_{ik}\delta_{kl} - p_{ik}p_{il}) X + \ell_2 I`.
        """
        x, _ = self._prepare(x, self._shapes)
        w = np.asarray(to_numpy(x), dtype=np.float64).reshape(-1)
        data, n, d, K = self._data, self.n_samples, self.n_features, self.n_classes

        def gram(weights: np.ndarray) -> np.ndarray:
            if getattr(data, "lazy", False):
                return data.weighted_gram(weights) / n
            H = data.host
            WX = H.multiply(weights[:, None]).tocsr() if sp.issparse(H) else H * weights[:, None]
            G = H.T @ WX
            return np.asarray(G.toarray() if sp.issparse(G) else G) / n

        if self.kind == "binary":
            s = scipy.special.expit(_scores(data, w))
            out = gram(s * (1.0 - s))
        else:
            Z = _scores(data, w.reshape(d, K))
            P = np.exp(Z - Z.max(axis=1, keepdims=True))
            P /= P.sum(axis=1, keepdims=True)
            out = np.zeros((d, K, d, K))
            for k in range(K):
                for l in range(k, K):
                    block = gram(P[:, k] * ((k == l) - P[:, l]))
                    out[:, k, :, l] = block
                    out[:, l, :, k] = block.T
            out = out.reshape(d * K, d * K)
        return out + self.l2 * np.eye(self.dim)


class NonconvexLogisticRegression(_RowSum):
    r"""Binary logistic loss plus the non-convex regulariser :math:`\alpha\sum_j x_j^2/(1+x_j^2)`.

    .. math:: f(x) = \frac1n\sum_i \log(1 + e^{-b_i a_i^\top x})
              + \alpha \sum_j \frac{x_j^2}{1 + x_j^2}

    A standard smooth non-convex finite-sum benchmark (e.g. SpiderBoost and
    PAGE experiments). Labels are mapped to ``±1`` as in :class:`LogisticRegression`.

    Parameters
    ----------
    X : array_like or scipy.sparse matrix, shape (n_samples, n_features)
        As for :class:`LogisticRegression`, dask arrays included.
    y : array_like, shape (n_samples,)
        Two-valued labels.
    alpha : float, default 0.1
        Regularisation weight (>= 0).

    Attributes
    ----------
    L : float
        :math:`\lambda_{\max}(X^\top X)/(4n) + 2\alpha`: the loss Hessian is at most
        :math:`X^\top X/(4n)` and :math:`\frac{d^2}{dt^2}\frac{t^2}{1+t^2} =
        \frac{2 - 6t^2}{(1+t^2)^3} \in [-\frac12, 2]`.
    G2 : float
        Certified bound on :math:`E\|\nabla f_S(x)\|^2` for all ``x`` and any batch:
        :math:`\|\nabla f_i(x)\| \le \|a_i\| + \rho` with
        :math:`\rho = \alpha\sqrt{d}\,\frac{3\sqrt3}{8}` (the regulariser's slope
        :math:`2t/(1+t^2)^2` peaks at :math:`3\sqrt3/8`), so
        :math:`G^2 = \frac1n\sum_i(\|a_i\| + \rho)^2` (Jensen for batches).
    f_lower : float
        0, a lower bound on ``f``.
    convex : bool
        False.

    Examples
    --------
    >>> from amopt.problems import NonconvexLogisticRegression
    >>> prob = NonconvexLogisticRegression.synthetic(100, 5, alpha=0.1, seed=0)
    >>> f, g = prob.value_and_grad(prob.x0)
    >>> round(float(f), 6)
    0.693147
    """

    convex = False
    f_lower = 0.0

    def __init__(self, X: Any, y: Any, *, alpha: float = 0.1):
        lazy_labels = y if _lazy.is_lazy((X,)) and _lazy.is_lazy((y,)) else None
        y = _labels_1d(y)
        self.classes = np.unique(y)
        self.alpha = _check_scalar("alpha", alpha)
        self._data = _design(X, binary_labels(y), lazy_labels, "binary", self.classes)
        self.n_samples, self.n_features = self._data.n, self._data.d
        self.dim = self.n_features
        self.x0 = np.zeros(self.dim)

    @classmethod
    def synthetic(
        cls,
        n_samples: int = 200,
        n_features: int = 10,
        *,
        alpha: float = 0.1,
        flip: float = 0.1,
        seed: int | np.random.Generator | None = None,
    ) -> NonconvexLogisticRegression:
        """Gaussian features :math:`a_i \\sim N(0, I/d)`, labels of a random planted
        separator with a fraction ``flip`` of them flipped."""
        n = _check_int("n_samples", n_samples)
        d = _check_int("n_features", n_features)
        flip = _check_scalar("flip", flip)
        if flip > 1:
            raise ValueError(f"flip must be in [0, 1], got {flip!r}")
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n, d)) / math.sqrt(d)
        w = rng.standard_normal(d)
        y = np.where(X @ w >= 0, 1.0, -1.0)
        y[rng.random(n) < flip] *= -1.0
        return cls(X, y, alpha=alpha)

    @property
    def L(self) -> float:
        return 0.25 * self._data.gram_max / self.n_samples + 2.0 * self.alpha

    @property
    def L_max(self) -> float:
        return 0.25 * float(np.max(self._data.row_sq_norms)) + 2.0 * self.alpha

    @property
    def G2(self) -> float:
        rho = self.alpha * math.sqrt(self.dim) * _NONCONVEX_REG_SLOPE
        return float(np.mean((np.sqrt(self._data.row_sq_norms) + rho) ** 2))

    def _eval(self, x: Any, xp: Any, X: Any, t: Any, m: int, XT: Any = None):
        data = self._data
        margin = t * data.matvec(X, x)
        loss = xp.logaddexp(xp.zeros_like(margin), -margin)
        s = -t * xp.exp(-margin - loss)
        x2 = x * x
        q = 1.0 + x2
        f = xp.sum(loss) / m + self.alpha * xp.sum(x2 / q)
        g = data.rmatvec(X, s, xp, XT) / m + (2.0 * self.alpha) * x / (q * q)
        return f, g
