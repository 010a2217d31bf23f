"""Quadratic test problems: a chosen-spectrum quadratic and finite-sum least squares."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..backends import dask as _lazy
from ..backends import to_numpy
from ._base import (
    Problem,
    _check_int,
    _check_scalar,
    _check_targets,
    _Design,
    _device,
    _RowSum,
    _SolvedNumerically,
)
from ._reference import ReferenceSolution

__all__ = ["LeastSquares", "Quadratic"]


class Quadratic(Problem):
    r"""The quadratic :math:`f(x) = \tfrac12 x^\top A x - b^\top x` with symmetric PSD ``A``.

    Build one from a matrix, or with a prescribed spectrum through
    :meth:`from_spectrum`. The eigen-decomposition is computed once (or known
    by construction), which gives exact :attr:`x_star`, :attr:`f_star`,
    :attr:`L` and :attr:`mu`.

    Parameters
    ----------
    A : array_like, shape (dim, dim) or (dim,)
        Symmetric positive semi-definite matrix, or its diagonal (1-D).
    b : array_like, shape (dim,), optional
        Linear term; zeros by default.

    Attributes
    ----------
    A : numpy.ndarray
        The matrix (2-D), or its diagonal (1-D) when :attr:`is_diagonal`.
    b : numpy.ndarray
    dim : int
    is_diagonal : bool
    eigenvalues : numpy.ndarray
        Ascending eigenvalues of ``A``.
    L, mu : float
        Largest and smallest eigenvalue (smoothness and strong convexity).
    cond : float
        ``L / mu`` (``inf`` when ``mu = 0``).
    x_star : numpy.ndarray or None
        The minimiser (minimum-norm one if ``A`` is singular); ``None`` when
        ``f`` is unbounded below (``b`` not in the range of ``A``).
    f_star : float
        ``min f`` (``-inf`` when unbounded below).

    Examples
    --------
    >>> import numpy as np
    >>> from amopt.problems import Quadratic
    >>> q = Quadratic(np.array([[2.0, 0.0], [0.0, 4.0]]), b=np.array([2.0, 4.0]))
    >>> q.L, q.mu, q.x_star, q.f_star
    (4.0, 2.0, array([1., 1.]), -3.0)
    >>> float(q.fun(np.zeros(2))), q.grad(np.zeros(2))
    (0.0, array([-2., -4.]))
    """

    def __init__(self, A: Any, b: Any = None):
        A = np.array(to_numpy(A) if not isinstance(A, list | tuple) else A, dtype=np.float64)
        if A.ndim not in (1, 2) or A.size == 0:
            raise ValueError(
                f"A must be a non-empty square matrix or a 1-D diagonal, got shape {A.shape}"
            )
        if not np.all(np.isfinite(A)):
            raise ValueError("A contains NaN or infinite values")
        if A.ndim == 2:
            if A.shape[0] != A.shape[1]:
                raise ValueError(f"A must be square, got shape {A.shape}")
            scale = max(float(np.max(np.abs(A))), np.finfo(np.float64).tiny)
            if not np.allclose(A, A.T, rtol=0.0, atol=1e-12 * scale):
                raise ValueError("A must be symmetric (|A - A^T| <= 1e-12 max|A|)")
            A = 0.5 * (A + A.T)
            eigvals, eigvecs = np.linalg.eigh(A)
        else:
            eigvals, eigvecs = A.copy(), None
        self._init(A, b, eigvals, eigvecs)

    def _init(self, A: np.ndarray, b: Any, eigvals: np.ndarray, eigvecs: np.ndarray | None):
        dim = A.shape[0]
        if b is None:
            b = np.zeros(dim)
        b = np.array(to_numpy(b) if not isinstance(b, list | tuple) else b, dtype=np.float64)
        if b.shape != (dim,):
            raise ValueError(f"b must have shape ({dim},) to match A, got {b.shape}")
        if not np.all(np.isfinite(b)):
            raise ValueError("b contains NaN or infinite values")
        top = float(np.max(np.abs(eigvals)))
        tol = 1e-12 * max(top, np.finfo(np.float64).tiny)
        if float(np.min(eigvals)) < -tol:
            raise ValueError(
                f"A must be positive semi-definite; its smallest eigenvalue is {np.min(eigvals)!r}"
            )
        lam = np.where(eigvals < tol, 0.0, eigvals)
        self.A = A
        self.b = b
        self.dim = int(dim)
        self.is_diagonal = A.ndim == 1
        order = np.argsort(lam, kind="stable")
        self.eigenvalues = lam[order]
        self.L = float(self.eigenvalues[-1])
        self.mu = float(self.eigenvalues[0])
        self.cond = self.L / self.mu if self.mu > 0 else math.inf
        # x* in the eigenbasis: c = V^T b; x* = V (c / lam) on the range, 0 on the kernel.
        c = b if eigvecs is None else eigvecs.T @ b
        pos = lam > 0
        if np.any(np.abs(c[~pos]) > 1e-10 * max(float(np.linalg.norm(b)), 1.0)):
            self.x_star, self.f_star = None, -math.inf
        else:
            z = np.where(pos, c / np.where(pos, lam, 1.0), 0.0)
            self.x_star = z if eigvecs is None else eigvecs @ z
            self.f_star = float(-0.5 * np.dot(c[pos], z[pos]))
        self._cache: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    @classmethod
    def from_spectrum(
        cls,
        dim: int,
        *,
        cond: float = 1e3,
        L: float = 1.0,
        spacing: Literal["log", "linear"] = "log",
        dense: bool = True,
        seed: int | np.random.Generator | None = None,
        b: Any = None,
    ) -> Quadratic:
        """A quadratic whose eigenvalues run from ``L / cond`` to ``L``.

        Parameters
        ----------
        dim : int
            Dimension (>= 1; ``dim = 1`` needs ``cond = 1``).
        cond : float, default 1e3
            Condition number ``L / mu`` (>= 1, finite).
        L : float, default 1.0
            Largest eigenvalue (> 0).
        spacing : {"log", "linear"}, default "log"
            Geometric or arithmetic spacing of the eigenvalues.
        dense : bool, default True
            Dense ``A = Q diag(lam) Q^T`` with ``Q`` a Haar-random orthogonal
            matrix, or the diagonal matrix ``diag(lam)`` (stored as a vector).
        seed : int or numpy.random.Generator, optional
            Randomness for ``Q`` and the default ``b``.
        b : array_like, optional
            Linear term; default a standard normal vector.

        Examples
        --------
        >>> from amopt.problems import Quadratic
        >>> q = Quadratic.from_spectrum(50, cond=100.0, seed=0)
        >>> round(q.L, 12), round(q.mu, 12), round(q.cond, 6)
        (1.0, 0.01, 100.0)
        """
        dim = _check_int("dim", dim)
        L = _check_scalar("L", L, low_open=True)
        cond = _check_scalar("cond", cond, low=1.0)
        if spacing not in ("log", "linear"):
            raise ValueError(f"spacing must be 'log' or 'linear', got {spacing!r}")
        if not isinstance(dense, bool):
            raise TypeError(f"dense must be a bool, got {type(dense).__name__}")
        if dim == 1 and cond != 1.0:
            raise ValueError(
                f"with dim=1 there is one eigenvalue, so cond must be 1, got {cond!r}"
            )
        mu = L / cond
        if dim == 1:
            lam = np.array([L])
        elif spacing == "log":
            lam = np.geomspace(mu, L, dim)
        else:
            lam = np.linspace(mu, L, dim)
        lam[0], lam[-1] = mu, L  # exact end points
        rng = np.random.default_rng(seed)
        if dense:
            Z = rng.standard_normal((dim, dim))
            Q, R = np.linalg.qr(Z)
            Q = Q * np.sign(np.diag(R))  # Haar measure
            A = (Q * lam) @ Q.T
            A = 0.5 * (A + A.T)
            eigvecs = Q
        else:
            A, eigvecs = lam.copy(), None
        if b is None:
            b = rng.standard_normal(dim)
        obj = cls.__new__(cls)
        obj._init(A, b, lam, eigvecs)
        return obj

    def _arrays(self, x: Any, xp: Any) -> tuple[Any, Any]:
        if isinstance(x, np.ndarray) and x.dtype == np.float64:
            return self.A, self.b
        dev = _device(x)
        key = (xp.__name__, str(dev), str(x.dtype))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = (
                xp.asarray(self.A, dtype=x.dtype, device=dev),
                xp.asarray(self.b, dtype=x.dtype, device=dev),
            )
        return hit

    def _ax(self, A: Any, x: Any) -> Any:
        return A * x if self.is_diagonal else A @ x

    def fun(self, x: Any) -> Any:
        x, xp = self._prepare(x)
        A, b = self._arrays(x, xp)
        return xp.sum(x * (0.5 * self._ax(A, x) - b))

    def grad(self, x: Any) -> Any:
        x, xp = self._prepare(x)
        A, b = self._arrays(x, xp)
        return self._ax(A, x) - b

    def value_and_grad(self, x: Any) -> tuple[Any, Any]:
        """Value and gradient ``A x - b`` with one product by ``A``."""
        x, xp = self._prepare(x)
        A, b = self._arrays(x, xp)
        Ax = self._ax(A, x)
        return xp.sum(x * (0.5 * Ax - b)), Ax - b

    def hess(self, x: Any = None) -> Any:
        """The (constant) Hessian ``A`` as a dense matrix, in ``x``'s namespace if given."""
        H = np.diag(self.A) if self.is_diagonal else self.A
        if x is None:
            return H.copy()
        x, xp = self._prepare(x)
        return xp.asarray(H, dtype=x.dtype, device=_device(x))


class LeastSquares(_SolvedNumerically, _RowSum):
    r"""Least squares :math:`f(x) = \frac{1}{2n}\|Xx - y\|^2 + \frac{\ell_2}{2}\|x\|^2`.

    A finite sum with :math:`f_i(x) = \frac12 (a_i^\top x - y_i)^2` and the
    regulariser :math:`\frac{\ell_2}{2}\|x\|^2`; it satisfies
    :class:`amopt.FiniteSum`.

    Parameters
    ----------
    X : array_like or scipy.sparse matrix, shape (n_samples, n_features)
        Dense NumPy/PyTorch/array-API array or SciPy sparse matrix (evaluated
        for NumPy, torch and CuPy ``x``, as for :class:`LogisticRegression`), or a
        dask array chunked by rows, with dense or SciPy sparse chunks: it is never
        gathered into memory, and the problem evaluates dask ``x`` lazily and NumPy
        ``x`` with one computation.
    y : array_like, shape (n_samples,)
        With a dask ``X``, a dask ``y`` is kept lazy too.
    l2 : float, default 0.0
        Ridge coefficient (>= 0).

    Attributes
    ----------
    n_samples, dim : int
    L : float
        :math:`\lambda_{\max}(X^\top X)/n + \ell_2` (Lanczos on :math:`X^\top X`; for a
        dask ``X``, the Gram matrix accumulated over the chunks up to 2048 features,
        Lanczos on the chunked operator above).
    L_max : float
        :math:`\max_i \|a_i\|^2 + \ell_2`, the smoothness of each :math:`f_i + r`.
    x_star, f_star
        Least-squares solution (minimum-norm when rank deficient) and value,
        from a direct solve (dense) or LSQR to 1e-14 (sparse).

    Examples
    --------
    >>> import numpy as np
    >>> from amopt.problems import LeastSquares
    >>> X = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> ls = LeastSquares(X, X @ np.array([1.0, -1.0]))
    >>> np.round(ls.x_star, 12), abs(ls.f_star) < 1e-20
    (array([ 1., -1.]), True)
    >>> f, g = ls.batch_value_and_grad(np.zeros(2), np.array([0, 1]))
    >>> float(f), g
    (1.25, array([-0.5,  2. ]))
    """

    def __init__(self, X: Any, y: Any, *, l2: float = 0.0):
        if _lazy.is_lazy((X,)) and _lazy.is_lazy((y,)):
            # both chunked: y is checked with X, in one pass over the chunks
            if np.dtype(y.dtype).kind not in "biuf":
                raise TypeError(f"y must hold real numbers, got dtype {y.dtype}")
            if y.ndim != 1:
                raise ValueError(f"y must be 1-D, got shape {y.shape}")
            y = y.astype(np.float64)
        else:
            y = _check_targets(y)
        self._data = _lazy.design(X, y) or _Design(X, y)
        self.l2 = _check_scalar("l2", l2)
        self.n_samples, self.dim = self._data.n, self._data.d
        self._ref: ReferenceSolution | None = None

    @property
    def L(self) -> float:
        return self._data.gram_max / self.n_samples + self.l2

    @property
    def L_max(self) -> float:
        return float(np.max(self._data.row_sq_norms)) + self.l2

    def _eval(self, x: Any, xp: Any, X: Any, t: Any, m: int, XT: Any = None) -> tuple[Any, Any]:
        r = self._data.matvec(X, x) - t
        f = 0.5 * xp.sum(r * r) / m
        g = self._data.rmatvec(X, r, xp, XT) / m
        if self.l2:
            f = f + 0.5 * self.l2 * xp.sum(x * x)
            g = g + self.l2 * x
        return f, g

    def reference_solution(self) -> ReferenceSolution:
        """Exact least-squares solution (computed once).

        On a dask ``X``: tall-and-skinny QR (dense chunks) or LSQR (sparse
        chunks) on the chunks, without gathering ``X``.
        """
        if self._ref is None:
            if getattr(self._data, "lazy", False):
                x = self._data.lstsq(self.l2)
            else:
                x = self._host_lstsq()
            f, g = self.value_and_grad(x)
            gn = float(np.max(np.abs(g)))
            self._ref = ReferenceSolution(x, float(f), gn, gtol=0.0, converged=True)
        return self._ref

    def _host_lstsq(self) -> np.ndarray:
        H, y, n = self._data.host, self._data.targets, self.n_samples
        damp = math.sqrt(n * self.l2)
        if sp.issparse(H):
            return spla.lsqr(H, y, damp=damp, atol=1e-14, btol=1e-14, conlim=1e16,
                             iter_lim=20 * (self.dim + n))[0]  # fmt: skip
        M = np.vstack([H, damp * np.eye(self.dim)]) if damp else H
        rhs = np.concatenate([y, np.zeros(self.dim)]) if damp else y
        return np.linalg.lstsq(M, rhs, rcond=None)[0]
