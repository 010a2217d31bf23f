"""Solver quality (the idea of scipy's ``BenchSmoothUnbounded``): GD, MGD, AM-MGD, L-BFGS-B.

On a quadratic (dimension 100, condition number 100) and on LIBSVM logistic
regression (mushrooms, bundled; a9a when present), from ``x0 = 0`` with
``lr = 1/L`` and at most ``MAXITER`` iterations: the final suboptimality
``f(x) - f*`` and the number of iterations to reach ``f - f* <= 1e-6``
(``nan`` when not reached).
"""

from __future__ import annotations

from amopt.bench import cases
from benchmarks import cases as quality

MAXITER = 2000


class TrackSolverQuality:
    params = (list(quality.QUALITY_PROBLEMS), list(quality.QUALITY_METHODS))
    param_names = ["problem", "method"]
    timeout = 900

    def setup_cache(self) -> dict:
        maxiter = 20 if cases.quick() else MAXITER
        out = {}
        for problem in quality.QUALITY_PROBLEMS:
            for method in quality.QUALITY_METHODS:
                try:
                    out[problem, method] = quality.solver_quality(problem, method, maxiter)
                except cases.SkipCase as exc:
                    out[problem, method] = str(exc)
        return out

    def setup(self, results: dict, problem: str, method: str) -> None:
        if isinstance(results[problem, method], str):
            raise NotImplementedError(results[problem, method])

    def track_final_suboptimality(self, results: dict, problem: str, method: str) -> float:
        return results[problem, method]["final_suboptimality"]

    track_final_suboptimality.unit = "f - f*"  # type: ignore[attr-defined]

    def track_iterations_to_1e_6(self, results: dict, problem: str, method: str) -> float:
        return results[problem, method]["iterations_to_1e-6"]

    track_iterations_to_1e_6.unit = "iterations"  # type: ignore[attr-defined]
