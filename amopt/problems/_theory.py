r"""Empirical checks of the convergence theorems of simplified AM-SGD (paper, Sec. 3.5, Supp. C).

The method analysed is AM-SGD with :math:`\lambda = 0` and :math:`d_0 = 0`:

.. math::

    \beta_t = \operatorname{clip}\big(\|g_t\|^2 / \|d_t - g_t\|^2, 0, \beta_{\max}\big),\quad
    d_{t+1} = \beta_t d_t + (1 - \beta_t) g_t,\quad x_{t+1} = x_t - \eta d_{t+1},

with :math:`\beta_t = 0` when :math:`d_t = g_t`, and :math:`g_t` the gradient of a
mini-batch drawn uniformly with replacement. The step is
:func:`amopt.am_momentum_step` (``numerator="linear"``, ``lam=0``) started from
``am_momentum_init(x0, d0=zeros)``. Expectations are estimated by averages
over independent seeds; a measured value above its bound fails the check.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..optimize.steps import am_momentum_init, am_momentum_step
from ._base import _check_int, _check_scalar

__all__ = ["TheoremCheck", "check_fixed_cap", "check_theorem_3_1", "check_theorem_3_2"]


@dataclasses.dataclass(frozen=True)
class TheoremCheck:
    """Outcome of one theorem check.

    Attributes
    ----------
    theorem : str
        ``"3.1"``, ``"3.2"`` or ``"fixed-cap"``.
    T : int
        Iterations per run.
    seeds : tuple of int
        The runs' seeds.
    lr, beta_max : float
        Step size and momentum cap used.
    measured : float
        The seed-average estimate of the left-hand side of the theorem.
    bound : float
        The right-hand side, from the certified constants (and, for 3.2, the
        seed-average of :math:`f(x_0) - f(x_T)`).
    ratio : float
        ``measured / bound``.
    passed : bool
        ``measured <= bound``.
    stderr : float
        Standard error over seeds of the measured quantity (for 3.2, at the
        minimising ``t``).
    per_seed : numpy.ndarray
        The per-seed values whose mean is ``measured`` (3.2: at the minimising ``t``).
    constants : dict
        The constants that enter the bound (``G2``, ``L``, ``dist0_sq``, ...).

    Examples
    --------
    >>> from amopt.problems import HuberRegression, check_theorem_3_1
    >>> res = check_theorem_3_1(HuberRegression.planted(100, 5, seed=0), T=100, seeds=3)
    >>> res.theorem, res.T, res.seeds, res.per_seed.shape
    ('3.1', 100, (0, 1, 2), (3,))
    >>> res.passed == (res.measured <= res.bound), sorted(res.constants)
    (True, ['G2', 'dist0_sq', 'f_star'])
    """

    theorem: str
    T: int
    seeds: tuple[int, ...]
    lr: float
    beta_max: float
    measured: float
    bound: float
    ratio: float
    passed: bool
    stderr: float
    per_seed: np.ndarray
    constants: dict[str, float]

    def __str__(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"Theorem {self.theorem} (T={self.T}, {len(self.seeds)} seeds, lr={self.lr:.4g}, "
            f"beta_max={self.beta_max:.4g}): measured {self.measured:.6g} "
            f"(+- {self.stderr:.2g}) <= bound {self.bound:.6g}? ratio {self.ratio:.4g}: {verdict}"
        )


def _seeds(seeds: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(seeds, bool):
        raise TypeError("seeds must be an int or a sequence of ints, got bool")
    if isinstance(seeds, int | np.integer):
        n = _check_int("seeds", seeds)
        return tuple(range(n))
    try:
        out = tuple(int(s) for s in seeds)
    except TypeError:
        raise TypeError(
            f"seeds must be an int or a sequence of ints, got {type(seeds).__name__}"
        ) from None
    if not out:
        raise ValueError("seeds must not be empty")
    return out


def _constant(problem: Any, name: str, theorem: str) -> float:
    value = getattr(problem, name, None)
    if value is None:
        raise ValueError(f"Theorem {theorem} needs problem.{name}, which this problem lacks")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(
            f"Theorem {theorem} needs a finite certified problem.{name}, got {value} "
            "(e.g. an L2 term makes the stochastic gradients unbounded)"
        )
    return value


def _start(problem: Any, x0: Any) -> np.ndarray:
    for name in ("n_samples", "batch_value_and_grad", "value_and_grad", "dim"):
        if not hasattr(problem, name):
            raise TypeError(f"problem must be a finite-sum problem with .{name}")
    if x0 is None:
        x0 = getattr(problem, "x0", None)
    x0 = np.zeros(problem.dim) if x0 is None else np.array(x0, dtype=np.float64)
    if x0.shape != (problem.dim,):
        raise ValueError(f"x0 must have shape ({problem.dim},), got {x0.shape}")
    return x0


def _run_am_sgd(
    problem: Any,
    x0: np.ndarray,
    T: int,
    lr: float,
    beta_max: float,
    seed: int,
    batch_size: int,
    observe: Callable[[int, np.ndarray], None],
) -> np.ndarray:
    """Simplified AM-SGD; ``observe(t, x_t)`` for t = 0..T; returns x_T."""
    rng = np.random.default_rng(seed)
    n = problem.n_samples
    x = x0.copy()
    state = am_momentum_init(x, d0=np.zeros_like(x))
    for t in range(T):
        observe(t, x)
        idx = rng.integers(0, n, size=batch_size)
        _, g = problem.batch_value_and_grad(x, idx)
        x, state, _ = am_momentum_step(
            x, np.asarray(g), state, lr=lr, lam=0.0, beta_max=beta_max, numerator="linear"
        )
    observe(T, x)
    return x


def _common(T, seeds, batch_size):
    T = _check_int("T", T)
    return T, _seeds(seeds), _check_int("batch_size", batch_size)


def _convex_start(
    problem: Any, x0: Any, theorem: str, names: Sequence[str]
) -> tuple[dict[str, float], np.ndarray, float]:
    """The checks of a convex theorem: its constants ``names``, the start, ``||x_0 - x*||^2``."""
    if not getattr(problem, "convex", False):
        label = "the fixed-cap theorem" if theorem == "fixed-cap" else f"Theorem {theorem}"
        raise ValueError(f"{label} assumes every f_S convex; problem.convex is not True")
    consts = {name: _constant(problem, name, theorem) for name in names}
    x0 = _start(problem, x0)
    x_star = np.asarray(problem.x_star, dtype=np.float64)
    return consts, x0, float(np.sum((x0 - x_star) ** 2))


def _averaged_gaps(
    problem: Any,
    x0: np.ndarray,
    T: int,
    lr: float,
    beta_max: float,
    seeds: tuple[int, ...],
    batch_size: int,
    weights: np.ndarray,
    f_star: float,
) -> list[float]:
    """Per seed, ``f(sum_{t<T} w_t x_t / sum_{t<T} w_t) - f_star`` of one AM-SGD run."""
    gaps = []
    for seed in seeds:
        acc = np.zeros_like(x0)

        def observe(t, x, acc=acc):
            if t < T:
                acc += weights[t] * x

        _run_am_sgd(problem, x0, T, lr, beta_max, seed, batch_size, observe)
        gaps.append(float(problem.value_and_grad(acc / weights.sum())[0]) - f_star)
    return gaps


def _result(theorem, T, seeds, lr, beta_max, values, bound, constants, per_seed=None):
    values = np.asarray(values, dtype=np.float64)
    measured = float(np.mean(values))
    stderr = float(np.std(values, ddof=1) / math.sqrt(values.size)) if values.size > 1 else 0.0
    return TheoremCheck(
        theorem=theorem, T=T, seeds=seeds, lr=lr, beta_max=beta_max, measured=measured,
        bound=float(bound), ratio=measured / bound if bound > 0 else math.inf,
        passed=bool(measured <= bound), stderr=stderr,
        per_seed=values if per_seed is None else per_seed, constants=constants,
    )  # fmt: skip


def check_theorem_3_1(
    problem: Any,
    T: int,
    seeds: int | Sequence[int] = 10,
    *,
    x0: Any = None,
    batch_size: int = 1,
) -> TheoremCheck:
    r"""Theorem 3.1 (convex), for the weighted average iterate :math:`x_T^{(a)}`.

    .. math::

        E[f(x_T^{(a)}) - f^*] \le \frac{\|x_0 - x^*\|^2 + \frac52 G^2}{\sqrt T}

    Runs simplified AM-SGD with :math:`\eta = 1/\sqrt T`, :math:`\beta_{\max} = 1/T`
    and measures :math:`f` at the weighted average
    :math:`x_T^{(a)} = \sum_{t<T} a_t x_t / \sum_{t<T} a_t`,
    :math:`a_t = (1 + 1/T)^{-(t+1)}`, averaged over seeds.

    Parameters
    ----------
    problem : finite-sum problem
        With ``convex = True`` and certified ``G2``, ``x_star``, ``f_star``
        (e.g. :class:`HuberRegression`, or :class:`LogisticRegression` with ``l2 = 0``).
    T : int
        Iterations.
    seeds : int or sequence of int, default 10
        Number of runs (seeds ``0..seeds-1``) or the seeds themselves.
    x0 : array_like, optional
        Start; default ``problem.x0`` or zeros.
    batch_size : int, default 1
        Mini-batch size (sampled uniformly with replacement).

    Returns
    -------
    TheoremCheck
        ``constants``: ``G2``, ``f_star`` and ``dist0_sq`` (:math:`\|x_0 - x^*\|^2`).

    Examples
    --------
    >>> from amopt.problems import HuberRegression, check_theorem_3_1
    >>> res = check_theorem_3_1(HuberRegression.planted(100, 5, seed=0), T=100, seeds=3)
    >>> res.passed, res.ratio < 0.5
    (True, True)
    """
    T, seeds, batch_size = _common(T, seeds, batch_size)
    consts, x0, dist0 = _convex_start(problem, x0, "3.1", ("G2", "f_star"))
    lr, beta_max = 1.0 / math.sqrt(T), 1.0 / T
    weights = (1.0 + 1.0 / T) ** -(np.arange(T) + 1.0)
    gaps = _averaged_gaps(
        problem, x0, T, lr, beta_max, seeds, batch_size, weights, consts["f_star"]
    )
    bound = (dist0 + 2.5 * consts["G2"]) / math.sqrt(T)
    return _result("3.1", T, seeds, lr, beta_max, gaps, bound, {**consts, "dist0_sq": dist0})


def check_theorem_3_2(
    problem: Any,
    T: int,
    seeds: int | Sequence[int] = 10,
    *,
    c: float = 0.5,
    x0: Any = None,
    batch_size: int = 1,
) -> TheoremCheck:
    r"""Theorem 3.2 (non-convex, :math:`L`-smooth).

    .. math::

        \min_{0 \le t < T} E\|\nabla f(x_t)\|^2 \le
        \frac{E[f(x_0) - f(x_T)] + \frac{1 + 8L}{4} G^2}{\sqrt T (1 - c)}

    with :math:`\eta = 1/\sqrt T`, :math:`\beta_{\max} = c\eta`. Measured: for each
    ``t`` the seed-average of the full-gradient norm squared at :math:`x_t`, then
    the minimum over ``t``; the bound uses the seed-average of
    :math:`f(x_0) - f(x_T)`.

    Parameters
    ----------
    problem : finite-sum problem
        With certified ``L`` and ``G2`` (e.g. :class:`NonconvexLogisticRegression`).
    T : int
    seeds : int or sequence of int, default 10
    c : float, default 0.5
        In (0, 1).
    x0 : array_like, optional
    batch_size : int, default 1

    Returns
    -------
    TheoremCheck
        ``constants``: ``G2``, ``L``, ``c``, ``f_decrease`` (the seed-average of
        :math:`f(x_0) - f(x_T)`) and ``t_min``, the ``t`` that minimises the
        seed-average, at which ``per_seed`` and ``stderr`` are taken.

    Examples
    --------
    >>> from amopt.problems import NonconvexLogisticRegression, check_theorem_3_2
    >>> prob = NonconvexLogisticRegression.synthetic(100, 5, seed=0)
    >>> check_theorem_3_2(prob, T=100, seeds=3).passed
    True
    """
    T, seeds, batch_size = _common(T, seeds, batch_size)
    c = _check_scalar("c", c, low_open=True)
    if c >= 1:
        raise ValueError(f"c must lie in (0, 1), got {c!r}")
    G2 = _constant(problem, "G2", "3.2")
    L = _constant(problem, "L", "3.2")
    x0 = _start(problem, x0)
    lr = 1.0 / math.sqrt(T)
    beta_max = c * lr
    sq = np.empty((len(seeds), T))
    decrease = np.empty(len(seeds))
    f0 = float(problem.value_and_grad(x0)[0])
    for k, seed in enumerate(seeds):

        def observe(t, x, k=k):
            if t < T:
                g = np.asarray(problem.value_and_grad(x)[1])
                sq[k, t] = float(np.sum(g * g))

        xT = _run_am_sgd(problem, x0, T, lr, beta_max, seed, batch_size, observe)
        decrease[k] = f0 - float(problem.value_and_grad(xT)[0])
    mean_sq = sq.mean(axis=0)
    t_min = int(np.argmin(mean_sq))
    bound = (float(decrease.mean()) + (1.0 + 8.0 * L) / 4.0 * G2) / (math.sqrt(T) * (1.0 - c))
    consts = {"G2": G2, "L": L, "c": c, "f_decrease": float(decrease.mean()), "t_min": t_min}
    return _result("3.2", T, seeds, lr, beta_max, sq[:, t_min], bound, consts)


def check_fixed_cap(
    problem: Any,
    T: int,
    seeds: int | Sequence[int] = 10,
    *,
    beta_max: float = 0.9,
    lr: float | None = None,
    x0: Any = None,
    batch_size: int = 1,
) -> TheoremCheck:
    r"""Fixed-cap theorem (Supplement C.1, convex, :math:`\epsilon = 1 - \beta_{\max}`).

    .. math::

        E[f(\bar x_T) - f^*] \le \frac{\|x_0 - x^*\|^2}{2\eta\epsilon T}
        + \eta G^2 \frac{2 + \epsilon}{2\epsilon^3}
        + \sigma_f^2 \frac{1 + \epsilon - \epsilon^2}{\epsilon^2}

    with :math:`\bar x_T = \frac1T\sum_{t<T} x_t` and
    :math:`\sigma_f^2 \ge E_S[f_S(x^*) - \inf f_S]`.

    Parameters
    ----------
    problem : finite-sum problem
        With ``convex = True`` and certified ``G2``, ``x_star``, ``f_star``, ``sigma_f2``.
    T : int
    seeds : int or sequence of int, default 10
    beta_max : float, default 0.9
        Fixed cap in [0, 1).
    lr : float, optional
        Step size; default :math:`1/\sqrt T`.
    x0 : array_like, optional
    batch_size : int, default 1

    Returns
    -------
    TheoremCheck
        ``constants``: ``G2``, ``f_star``, ``sigma_f2``, ``dist0_sq`` and ``eps``.

    Examples
    --------
    >>> from amopt.problems import HuberRegression, check_fixed_cap
    >>> prob = HuberRegression.planted(100, 5, noise=0.3, seed=0)
    >>> check_fixed_cap(prob, T=100, seeds=3).passed
    True
    """
    T, seeds, batch_size = _common(T, seeds, batch_size)
    beta_max = _check_scalar("beta_max", beta_max)
    if beta_max >= 1:
        raise ValueError(f"beta_max must lie in [0, 1), got {beta_max!r}")
    lr = 1.0 / math.sqrt(T) if lr is None else _check_scalar("lr", lr, low_open=True)
    consts, x0, dist0 = _convex_start(problem, x0, "fixed-cap", ("G2", "f_star", "sigma_f2"))
    gaps = _averaged_gaps(
        problem, x0, T, lr, beta_max, seeds, batch_size, np.ones(T), consts["f_star"]
    )
    eps = 1.0 - beta_max
    bound = (
        dist0 / (2.0 * lr * eps * T)
        + lr * consts["G2"] * (2.0 + eps) / (2.0 * eps**3)
        + consts["sigma_f2"] * (1.0 + eps - eps**2) / eps**2
    )
    consts.update(dist0_sq=dist0, eps=eps)
    return _result("fixed-cap", T, seeds, lr, beta_max, gaps, bound, consts)
