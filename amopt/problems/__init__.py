"""Test problems for optimisers: quadratics, least squares, logistic regression, Rosenbrock,
Huber regression, and checks of the paper's convergence theorems.

Every problem exposes ``fun(x)``, ``grad(x)`` and ``value_and_grad(x)`` on any
array-API backend (NumPy, PyTorch, CuPy, array-api-strict), plus the constants
an optimisation researcher needs (``L``, ``mu``, ``x_star``, ``f_star``, ...).
The finite-sum problems also provide ``n_samples`` and
``batch_value_and_grad(x, indices)``, i.e. they satisfy :class:`amopt.FiniteSum`
and can be passed directly to :func:`amopt.minimize`, including its
stochastic methods.
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
