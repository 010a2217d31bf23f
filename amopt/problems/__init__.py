"""Test problems for optimisers: quadratics, least squares, logistic regression, Rosenbrock,
Huber regression, and checks of the paper's convergence theorems.

Every problem exposes ``fun(x)``, ``grad(x)`` and ``value_and_grad(x)`` on any
array-API backend (NumPy, PyTorch, CuPy, array-api-strict), plus the constants
an optimisation researcher needs (``L``, ``mu``, ``x_star``, ``f_star``, ...).
The finite-sum problems also provide ``n_samples`` and
``batch_value_and_grad(x, indices)``, i.e. they satisfy :class:`amopt.FiniteSum`
and can be passed directly to :func:`amopt.minimize`, including its
stochastic methods.

Caching: ``x_star`` / ``f_star`` of a problem without a closed form
(:class:`LogisticRegression`, :class:`NonconvexLogisticRegression`,
:class:`HuberRegression` without a planted solution) come from
``reference_solution()``, an L-BFGS-B solve to ``max|grad| <= 1e-10`` kept in
memory and on disk in ``<cache home>/reference/<key>.npz``: ``cache_dir=``, else
``$AMOPT_CACHE_DIR``, else the platform's user cache directory
(``$XDG_CACHE_HOME/amopt`` or ``~/.cache/amopt`` on Linux,
``~/Library/Caches/amopt`` on macOS, ``%LOCALAPPDATA%\\amopt\\Cache`` on Windows;
see :func:`amopt.datasets.get_cache_home`), never in the data folder the
problem was read from. A solve still running after 2 s logs one line on the
``amopt.cache`` logger (stderr): what is computed and where it is cached.
``reference_solution(cache=False)`` keeps it in memory only.
"""

from ._base import FiniteSumProblem, Problem
from ._classic import HuberRegression, Rosenbrock
from ._logistic import LogisticRegression, NonconvexLogisticRegression
from ._quadratic import LeastSquares, Quadratic
from ._reference import ReferenceSolution, ReferenceSolutionWarning
from ._theory import TheoremCheck, check_fixed_cap, check_theorem_3_1, check_theorem_3_2

__all__ = [
    "FiniteSumProblem",
    "HuberRegression",
    "LeastSquares",
    "LogisticRegression",
    "NonconvexLogisticRegression",
    "Problem",
    "Quadratic",
    "ReferenceSolution",
    "ReferenceSolutionWarning",
    "Rosenbrock",
    "TheoremCheck",
    "check_fixed_cap",
    "check_theorem_3_1",
    "check_theorem_3_2",
]
