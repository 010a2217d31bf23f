"""Rosenbrock and Huber regression (the latter with a planted, analytically known solution)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..backends import to_numpy
from ._base import (
    Problem,
    _check_int,
    _check_scalar,
    _check_targets,
    _Design,
    _RowSum,
    _SolvedNumerically,
)
from ._reference import ReferenceSolution, solve_reference

__all__ = ["HuberRegression", "Rosenbrock"]


class Rosenbrock(Problem):
    r"""The chained Rosenbrock function :math:`\sum_{i<d} b(x_{i+1} - x_i^2)^2 + (1 - x_i)^2`.

    Same as :func:`scipy.optimize.rosen` for ``b = 100``. Non-convex, with
    minimiser :math:`x^* = (1, \dots, 1)` and :math:`f^* = 0`.

    Parameters
    ----------
    dim : int, default 2
        Number of variables (>= 2).
    b : float, default 100.0
        Valley steepness (> 0).

    Attributes
    ----------
    x_star : numpy.ndarray
        ``ones(dim)``.
    f_star : float
        0.
    x0 : numpy.ndarray
        The classical start ``(-1.2, 1, -1.2, 1, ...)``.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt.problems import Rosenbrock
    >>> r = Rosenbrock()
    >>> round(float(r.fun(r.x0)), 12), r.grad(np.array([1.0, 1.0]))
    (24.2, array([0., 0.]))
    """

    def __init__(self, dim: int = 2, *, b: float = 100.0):
        self.dim = _check_int("dim", dim, low=2)
        self.b = _check_scalar("b", b, low_open=True)
        self.x_star = np.ones(self.dim)
        self.f_star = 0.0
        self.x0 = np.where(np.arange(self.dim) % 2 == 0, -1.2, 1.0)

    def value_and_grad(self, x: Any) -> tuple[Any, Any]:
        x, xp = self._prepare(x)
        head, tail = x[:-1], x[1:]
        t = tail - head * head
        u = 1.0 - head
        f = xp.sum(self.b * t * t + u * u)
        zero = xp.zeros_like(x[:1])
        g = xp.concat([-4.0 * self.b * head * t - 2.0 * u, zero]) + xp.concat(
            [zero, 2.0 * self.b * t]
        )
        return f, g

    def hess(self, x: Any) -> np.ndarray:
        """Dense Hessian (NumPy float64), as :func:`scipy.optimize.rosen_hess` for ``b = 100``."""
        x, _ = self._prepare(x)
        x = np.asarray(to_numpy(x), dtype=np.float64)
        b = self.b
        H = np.zeros((self.dim, self.dim))
        i = np.arange(self.dim - 1)
        H[i, i] += 12.0 * b * x[:-1] ** 2 - 4.0 * b * x[1:] + 2.0
        H[i + 1, i + 1] += 2.0 * b
        H[i, i + 1] = H[i + 1, i] = -4.0 * b * x[:-1]
        return H


class HuberRegression(_SolvedNumerically, _RowSum):
    r"""Huber regression :math:`f(x) = \frac1n\sum_i h_\delta(a_i^\top x - y_i)`.

    With :math:`h_\delta(r) = r^2/2` for :math:`|r| \le \delta` and
    :math:`\delta(|r| - \delta/2)` otherwise: convex, smooth, and with
    gradients bounded everywhere, which makes it the convex test problem of the
    convergence theorems (:func:`check_theorem_3_1`, :func:`check_fixed_cap`).

    Parameters
    ----------
    X : array_like or scipy.sparse matrix, shape (n_samples, n_features)
    y : array_like, shape (n_samples,)
    delta : float, default 1.0
        Huber threshold (> 0).

    Attributes
    ----------
    L : float
        :math:`\lambda_{\max}(X^\top X)/n` (:math:`0 \le h'' \le 1`).
    L_max : float
        :math:`\max_i\|a_i\|^2`.
    G2 : float
        Certified :math:`\sup_x E\|\nabla f_S(x)\|^2 \le \delta^2\frac1n\sum_i\|a_i\|^2`,
        since :math:`\nabla f_i(x) = h'_\delta(r_i) a_i` with :math:`|h'_\delta| \le \delta`
        (and Jensen for batches).
    sigma_f2 : float
        Certified bound on :math:`E_S[f_S(x^*) - \inf f_S]`:
        :math:`f^* - \frac1n\sum_i \inf f_i`, where :math:`\inf f_i = 0` if
        :math:`a_i \ne 0` and :math:`h_\delta(y_i)` otherwise.
    x_star, f_star
        Analytic for :meth:`planted` problems, else from an L-BFGS-B solve to
        ``gtol = 1e-10`` (cached).
    convex : bool
        True.

    Examples
    --------
    >>> from amopt.problems import HuberRegression
    >>> prob = HuberRegression.planted(200, 5, noise=0.5, seed=0)
    >>> f, g = prob.value_and_grad(prob.x_star)
    >>> bool(abs(float(f) - prob.f_star) < 1e-15), float(abs(g).max()) < 1e-15
    (True, True)
    """

    convex = True

    def __init__(self, X: Any, y: Any, *, delta: float = 1.0):
        y = _check_targets(y)
        self.delta = _check_scalar("delta", delta, low_open=True)
        self._data = _Design(X, y)
        self.n_samples, self.n_features = self._data.n, self._data.d
        self.dim = self.n_features
        self.x0 = np.zeros(self.dim)
        self._ref: ReferenceSolution | None = None

    @classmethod
    def planted(
        cls,
        n_samples: int = 200,
        n_features: int = 10,
        *,
        delta: float = 1.0,
        noise: float = 0.0,
        seed: int | np.random.Generator | None = None,
    ) -> HuberRegression:
        r"""A Huber problem whose minimiser is known exactly.

        Rows :math:`a_i \sim N(0, I/d)`, a planted :math:`x^\dagger \sim N(0, I)`.
        With ``noise = 0``, :math:`y_i = a_i^\top x^\dagger` (interpolation:
        :math:`f^* = 0`, :math:`\sigma_f^2 = 0`). With ``noise > 0``, rows come
        in identical pairs whose residuals at :math:`x^\dagger` are
        :math:`+e_j` and :math:`-e_j`, :math:`e_j \sim N(0, \text{noise}^2)`.
        Since :math:`h'_\delta` is odd, :math:`\nabla f(x^\dagger) =
        \frac1n\sum_j (h'(e_j) + h'(-e_j)) a_j = 0`, so by convexity
        :math:`x^* = x^\dagger` and :math:`f^* = \frac1n\sum_i h_\delta(e_i)`, with
        no numerical solve; here :math:`\sigma_f^2 = f^* > 0`.

        Parameters
        ----------
        n_samples : int, default 200
            Must be even when ``noise > 0``.
        n_features : int, default 10
        delta : float, default 1.0
        noise : float, default 0.0
        seed : int or numpy.random.Generator, optional
        """
        n = _check_int("n_samples", n_samples)
        d = _check_int("n_features", n_features)
        noise = _check_scalar("noise", noise)
        if noise > 0 and n % 2:
            raise ValueError(f"n_samples must be even when noise > 0, got {n}")
        rng = np.random.default_rng(seed)
        x_true = rng.standard_normal(d)
        if noise > 0:
            half = rng.standard_normal((n // 2, d)) / math.sqrt(d)
            e = noise * rng.standard_normal(n // 2)
            X = np.vstack([half, half])
            resid = np.concatenate([e, -e])
        else:
            X = rng.standard_normal((n, d)) / math.sqrt(d)
            resid = np.zeros(n)
        y = X @ x_true - resid  # residual a_i^T x_true - y_i = resid_i
        prob = cls(X, y, delta=delta)
        f, g = prob.value_and_grad(x_true)
        prob._ref = ReferenceSolution(
            x=x_true, fun=float(_huber(resid, prob.delta).mean()),
            grad_norm=float(np.max(np.abs(g))), gtol=0.0, converged=True,
        )  # fmt: skip
        return prob

    @property
    def L(self) -> float:
        return self._data.gram_max / self.n_samples

    @property
    def L_max(self) -> float:
        return float(np.max(self._data.row_sq_norms))

    @property
    def G2(self) -> float:
        return self.delta**2 * float(np.mean(self._data.row_sq_norms))

    @property
    def sigma_f2(self) -> float:
        zero = self._data.row_sq_norms == 0.0
        inf_fi = np.where(zero, _huber(self._data.targets, self.delta), 0.0)
        return max(self.f_star - float(np.mean(inf_fi)), 0.0)

    def _eval(self, x: Any, xp: Any, X: Any, t: Any, m: int, XT: Any = None):
        r = self._data.matvec(X, x) - t
        a = xp.abs(r)
        quad = a <= self.delta
        f = xp.sum(xp.where(quad, 0.5 * r * r, self.delta * (a - 0.5 * self.delta))) / m
        psi = xp.clip(r, -self.delta, self.delta)
        g = self._data.rmatvec(X, psi, xp, XT) / m
        return f, g

    def reference_solution(
        self, gtol: float = 1e-10, *, maxiter: int = 100_000, cache: bool = True,
        cache_dir: Any = None,
    ) -> ReferenceSolution:  # fmt: skip
        """The planted solution, or an L-BFGS-B solve to ``gtol`` (cached like
        :meth:`LogisticRegression.reference_solution`)."""
        if self._ref is not None:
            return self._ref
        gtol = _check_scalar("gtol", gtol, low_open=True)
        maxiter = _check_int("maxiter", maxiter)
        key = "huber-" + self._data.digest(self.delta)[:40]
        return solve_reference(
            key, self.value_and_grad, np.zeros(self.dim), gtol=gtol, maxiter=maxiter,
            cache=cache, cache_dir=cache_dir, hess=self.hess if self.dim <= 2000 else None,
        )  # fmt: skip

    def hess(self, x: Any) -> np.ndarray:
        r"""Dense generalised Hessian at ``x`` (NumPy float64; small problems only).

        :math:`\frac1n X^\top \mathrm{diag}(1_{|r_i| \le \delta}) X`, with
        :math:`r_i = a_i^\top x - y_i`.
        """
        x, _ = self._prepare(x)
        w = np.asarray(to_numpy(x), dtype=np.float64)
        H = self._data.host
        inside = (np.abs(np.asarray(H @ w) - self._data.targets) <= self.delta).astype(float)
        if sp.issparse(H):
            G = (H.T @ H.multiply(inside[:, None]).tocsr()).toarray()
        else:
            G = H.T @ (H * inside[:, None])
        return np.asarray(G) / self.n_samples


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))
