r"""The problem set of ``python -m amopt.bench --problem-set``: which method to use when.

A fixed set of problems (quadratics of condition 10, 1e3 and 1e5; least squares
well and ill conditioned; logistic regression on the bundled LIBSVM sets and on
those found under the data folder; Rosenbrock; a non-convex logistic regression),
and for each method the iterations and the time it takes to reach
:math:`\max|\nabla f| \le 10^{-6} \max|\nabla f(x_0)|`, at most ``MAXITER``
iterations:

* ``gd``, ``mgd`` (damped momentum, ``beta = 0.9``), ``am-mgd`` with the paper's
  exact numerator (cap of beta 1) and with the linearised one at the cap 1, each at
  ``lr = 1/L``;
* ``heavy-ball`` and ``nesterov`` at their textbook tuning from :math:`L` and
  :math:`\mu` (:func:`textbook`): with :math:`\mu = 0` (not strongly convex, or
  not known) at ``lr = 1/L``, ``beta = 0.9``;
* ``minimize`` with no method (the default a user gets, with ``lr = 1/L``: AM-MGD,
  linear numerator, cap of beta 0.998);
* scipy's ``L-BFGS-B`` and ``CG`` on the same f and gradient (their ``nit``; each
  of their iterations is a line search of one or more evaluations, ``nfev``).

A problem's row in the bench is the default's iterations over GD's (where neither
reaches the test in ``MAXITER``: the ratio of their suboptimalities
:math:`f - f_{best}` at ``MAXITER``, :math:`f_{best}` the lowest f of any method on
that problem), with the
target 1 on the convex problems (the rule the default of ``minimize`` was chosen
by: at least as fast as GD in iterations on every convex problem of the set) and
informational on the non-convex ones; its note holds every method's numbers.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from amopt.bench._records import Measured, Row, Settings

__all__ = ["MAXITER", "PROBLEMS", "RTOL", "ROWS", "METHODS", "measure_problem", "textbook"]

#: the stopping test: max|g| <= RTOL * max|g(x0)|
RTOL = 1e-6
MAXITER = 5_000
#: the LIBSVM sets of the problem set, when their files are there (a few seconds each)
LIBSVM_SETS = ("a9a", "w8a")


@dataclass(frozen=True)
class Case:
    """A problem of the set: ``make() -> (problem, x0)``; ``mu`` its strong convexity
    (0 when it has none or it is not known)."""

    key: str
    label: str
    make: Callable[[], tuple[Any, np.ndarray]]
    convex: bool


def _quadratic(cond: float) -> tuple[Any, np.ndarray]:
    from amopt.problems import Quadratic

    rng = np.random.default_rng(0)
    q = Quadratic.from_spectrum(100, cond=cond, seed=0, b=rng.standard_normal(100))
    return q, np.zeros(100)


def _least_squares(ill: bool) -> tuple[Any, np.ndarray]:
    from amopt.problems import LeastSquares

    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 20))
    if ill:  # columns scaled over two decades: condition ~1e4 of X^T X
        X = X * np.geomspace(1.0, 1e-2, 20)
    prob = LeastSquares(X, rng.standard_normal(200))
    # its strong convexity, for the textbook tunings: lambda_min(X^T X) / n
    prob.mu = float(np.linalg.eigvalsh(X.T @ X)[0]) / 200
    return prob, np.zeros(20)


#: the L2 term of the logistic problems: without one, mushrooms is separable (no
#: minimiser: max|g| -> 0 only as |x| -> infinity) and every method crawls
LOGISTIC_L2 = 1e-3


def _logistic(name: str) -> tuple[Any, np.ndarray]:
    from amopt.problems import LogisticRegression

    prob = LogisticRegression.from_libsvm(name, l2=LOGISTIC_L2)
    return prob, np.zeros(prob.dim)


def _rosenbrock() -> tuple[Any, np.ndarray]:
    from amopt.problems import Rosenbrock

    r = Rosenbrock(2)
    return r, r.x0.copy()


def _nonconvex() -> tuple[Any, np.ndarray]:
    from amopt.datasets import load_libsvm
    from amopt.problems import NonconvexLogisticRegression

    X, y = load_libsvm("a1a")[:2]
    prob = NonconvexLogisticRegression(X, y, alpha=0.1)
    return prob, np.full(prob.dim, 0.5)


def _libsvm_file(name: str) -> str | None:
    """The LIBSVM file ``name`` in ``$AMOPT_LIBSVM_DIR``, else in the data folder's
    ``libsvm/`` (:func:`amopt.datasets.get_data_home`: ``$AMOPT_DATA_DIR``, else the
    user cache directory); None when absent (nothing is downloaded here)."""
    from amopt.datasets import get_data_home

    for d in (os.environ.get("AMOPT_LIBSVM_DIR"), str(get_data_home() / "libsvm")):
        if d and (Path(d) / name).is_file():
            return str(Path(d) / name)
    return None


def _cases() -> list[Case]:
    cases = [
        Case("quad-cond10", "quadratic, d=100, cond 10", lambda: _quadratic(10.0), True),
        Case("quad-cond1e3", "quadratic, d=100, cond 1e3", lambda: _quadratic(1e3), True),
        Case("quad-cond1e5", "quadratic, d=100, cond 1e5", lambda: _quadratic(1e5), True),
        Case("ls-well", "least squares 200x20, well conditioned", lambda: _least_squares(False),
             True),
        Case("ls-ill", "least squares 200x20, columns over 1e-2..1", lambda: _least_squares(True),
             True),
        Case("logreg-mushrooms", "logistic regression (l2 1e-3), mushrooms",
             lambda: _logistic("mushrooms"), True),
        Case("logreg-a1a", "logistic regression (l2 1e-3), a1a", lambda: _logistic("a1a"), True),
    ]  # fmt: skip
    for name in LIBSVM_SETS:
        path = _libsvm_file(name)
        if path is not None:
            cases.append(
                Case(
                    f"logreg-{name}",
                    f"logistic regression (l2 1e-3), {name}",
                    lambda p=path: _logistic(p),
                    True,
                )  # fmt: skip
            )
    cases += [
        Case("rosenbrock", "Rosenbrock, d=2, from (-1.2, 1)", _rosenbrock, False),
        Case("nonconvex-logreg", "non-convex logistic regression (alpha 0.1), a1a", _nonconvex,
             False),
    ]  # fmt: skip
    return cases


PROBLEMS: tuple[Case, ...] = tuple(_cases())


def strong_convexity(prob: Any) -> float:
    """:math:`\\mu` where the problem knows it, else 0."""
    # a quadratic's smallest eigenvalue, or the L2 term (a lower bound of mu) of a
    # regularised loss
    for name in ("mu", "l2"):
        mu = getattr(prob, name, None)
        if isinstance(mu, float | int) and math.isfinite(mu) and mu > 0:
            return float(mu)
    return 0.0


def textbook(method: str, L: float, mu: float) -> dict[str, float]:
    """The textbook ``lr`` and ``beta`` of ``"heavy-ball"`` or ``"nesterov"`` from L and mu.

    Heavy ball (Polyak): :math:`\\eta = 4/(\\sqrt L + \\sqrt\\mu)^2`,
    :math:`\\beta = ((\\sqrt\\kappa-1)/(\\sqrt\\kappa+1))^2`; Nesterov: :math:`\\eta = 1/L`,
    :math:`\\beta = (\\sqrt\\kappa-1)/(\\sqrt\\kappa+1)`. With :math:`\\mu = 0` the
    tuning degenerates (:math:`\\beta = 1`): then ``lr = 1/L``, ``beta = 0.9``.
    """
    if mu <= 0:
        return {"lr": 1.0 / L, "beta": 0.9}
    sk = math.sqrt(L / mu)
    if method == "heavy-ball":
        return {
            "lr": 4.0 / (math.sqrt(L) + math.sqrt(mu)) ** 2,
            "beta": ((sk - 1) / (sk + 1)) ** 2,
        }
    return {"lr": 1.0 / L, "beta": (sk - 1) / (sk + 1)}


#: the methods compared: label -> (method, options from (L, mu) or None for scipy)
METHODS: dict[str, tuple[str, Callable[[float, float], dict] | None]] = {
    "GD": ("gd", lambda L, mu: {"lr": 1.0 / L}),
    "MGD (damped, 0.9)": ("mgd", lambda L, mu: {"lr": 1.0 / L, "beta": 0.9}),
    "heavy ball": ("heavy-ball", lambda L, mu: textbook("heavy-ball", L, mu)),
    "Nesterov": ("nesterov", lambda L, mu: textbook("nesterov", L, mu)),
    "AM-MGD exact": ("am-mgd", lambda L, mu: {"lr": 1.0 / L, "numerator": "exact"}),
    "AM-MGD linear, cap 1": (
        "am-mgd",
        lambda L, mu: {"lr": 1.0 / L, "numerator": "linear", "beta_max": 1.0},
    ),
    "default": ("", lambda L, mu: {"lr": 1.0 / L}),
    "L-BFGS-B": ("L-BFGS-B", None),
    "CG": ("CG", None),
}


@dataclass
class Outcome:
    """One method on one problem: iterations (None: not reached in ``MAXITER``), time."""

    nit: int | None
    nfev: int
    seconds: float
    fun: float
    #: max|g| at the end over max|g(x0)|
    g_rel: float


def _run(method: str, options: Callable | None, prob: Any, x0: np.ndarray, L: float, mu: float,
         gtol: float, maxiter: int) -> Outcome:  # fmt: skip
    import scipy.optimize

    from amopt.optimize.minimize import minimize

    t0 = time.perf_counter()
    if options is None:
        opts: dict[str, Any] = {"maxiter": maxiter, "gtol": gtol}
        if method == "L-BFGS-B":
            opts["ftol"] = 0.0  # stop on the gradient only, as the others
        else:
            opts["norm"] = np.inf
        res = scipy.optimize.minimize(prob.value_and_grad, x0, jac=True, method=method,
                                      options=opts)  # fmt: skip
        g = prob.grad(res.x)
    else:
        opts = {**options(L, mu), "maxiter": maxiter, "gtol": gtol}
        res = minimize(prob, x0, **({"method": method} if method else {}), options=opts)
        g = res.jac
    seconds = time.perf_counter() - t0
    g_max = float(np.max(np.abs(g)))
    reached = g_max <= gtol
    g_rel = g_max * RTOL / gtol
    return Outcome(
        int(res.nit) if reached else None, int(res.nfev), seconds, float(res.fun), g_rel
    )


def _L(prob: Any, x0: np.ndarray) -> float:
    L = getattr(prob, "L", None)
    if L is not None:
        return float(L)
    from amopt.optimize.step_size import default_lr

    return 1.0 / default_lr(prob, x0, (), None)[0]


_CACHE: dict[str, dict[str, Outcome]] = {}


def measure_problem(case: Case, maxiter: int = MAXITER) -> dict[str, Outcome]:
    """Every method of :data:`METHODS` on ``case`` (cached for the process)."""
    if case.key in _CACHE:
        return _CACHE[case.key]
    prob, x0 = case.make()
    L, mu = _L(prob, x0), strong_convexity(prob)
    gtol = RTOL * float(np.max(np.abs(prob.grad(x0))))
    out = {
        label: _run(method, options, prob, x0, L, mu, gtol, maxiter)
        for label, (method, options) in METHODS.items()
    }
    _CACHE[case.key] = out
    return out


def _best(got: dict[str, Outcome]) -> float:
    """The lowest f any method reached: the f* of the suboptimality of the table."""
    return min((o.fun for o in got.values() if math.isfinite(o.fun)), default=math.nan)


def _gap(o: Outcome, f_best: float) -> float:
    return o.fun - f_best if math.isfinite(o.fun) else math.inf


def _fmt(o: Outcome, f_best: float) -> str:
    if o.nit is None:  # not reached: the suboptimality at the end, against the best f
        gap = _gap(o, f_best)
        g = "diverged" if not math.isfinite(gap) else f"gap {gap:.1e}"
        return f">{MAXITER} ({g}, {o.seconds:.1f} s)"
    return f"{o.nit} ({o.seconds:.2f} s)"


def format_table(cases: tuple[Case, ...] = PROBLEMS) -> str:
    """The measured table in markdown: iterations to the test (time), one row per problem."""
    head = "| problem | " + " | ".join(METHODS) + " |"
    lines = [head, "|" + "---|" * (len(METHODS) + 1)]
    for case in cases:
        got = _CACHE.get(case.key)
        if got is None:
            continue
        f_best = _best(got)
        cells = " | ".join(_fmt(got[m], f_best) for m in METHODS)
        lines.append(f"| {case.label} | {cells} |")
    return "\n".join(lines)


def _row(case: Case) -> Row:
    def measure(s: Settings) -> Measured:
        got = measure_problem(case)
        default, gd = got["default"], got["GD"]
        f_best = _best(got)
        note = "; ".join(f"{m}: {_fmt(o, f_best)}" for m, o in got.items())
        if default.nit is None and gd.nit is None:
            # neither reached the test in MAXITER: the ratio of their suboptimalities
            # f - f_best (f_best: the lowest f of any method; a momentum method's
            # gradient is not monotone, its f - f* is what it minimises)
            a, b = _gap(default, f_best), _gap(gd, f_best)
            return Measured(a=a, b=b, ratio=a / b if b > 0 else math.inf,
                            unit=f"f - f_best at {MAXITER} it", note=note)  # fmt: skip
        # not reached counts as MAXITER + 1 (a lower bound of the true count)
        a = MAXITER + 1 if default.nit is None else default.nit
        b = MAXITER + 1 if gd.nit is None else gd.nit
        return Measured(a=a, b=b, ratio=a / max(b, 1), unit="it", note=note)

    return Row(
        key=f"problem-set-{case.key}",
        metric=f"{case.label}: iterations to max|g| <= {RTOL:g} max|g(x0)|, "
        "minimize's default / GD (lr = 1/L)",
        side_a="minimize default",
        side_b="GD",
        target=1.0 if case.convex else None,
        measure=measure,
    )


ROWS: tuple[Row, ...] = tuple(_row(c) for c in PROBLEMS)
