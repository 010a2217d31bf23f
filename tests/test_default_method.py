"""The default of ``amopt.minimize`` against GD on the convex problems of the problem set.

The rule the default (method, numerator, cap of beta, lr) was chosen by: on every
convex problem of ``python -m amopt.bench --problem-set`` it reaches the gradient
test in at most GD's iterations, or, where neither reaches it, ends at an objective
no higher than GD's; here at the set's horizon (5,000 iterations) and at
``minimize``'s default ``maxiter`` (1,000). The LIBSVM problems of the set are
slower and are covered by the bench rows.
"""

import numpy as np
import pytest

import amopt
from amopt.bench import _problem_set

FAST_CONVEX = ("quad-cond10", "quad-cond1e3", "quad-cond1e5", "ls-well", "ls-ill")


def _gd(prob, x0, lr, gtol, maxiter):
    """Plain gradient descent, written out: (iterations to the test or None, final f)."""
    x = x0.copy()
    for k in range(maxiter):
        g = prob.grad(x)
        if np.max(np.abs(g)) <= gtol:
            return k, float(prob.fun(x))
        x = x - lr * g
    reached = np.max(np.abs(prob.grad(x))) <= gtol
    return (maxiter if reached else None), float(prob.fun(x))


@pytest.mark.parametrize("maxiter", [1000, _problem_set.MAXITER])
@pytest.mark.parametrize("key", FAST_CONVEX)
def test_default_is_at_least_as_fast_as_gd(key, maxiter):
    case = next(c for c in _problem_set.PROBLEMS if c.key == key)
    prob, x0 = case.make()
    lr = 1.0 / prob.L
    gtol = _problem_set.RTOL * float(np.max(np.abs(prob.grad(x0))))
    res = amopt.minimize(prob, x0, options={"lr": lr, "gtol": gtol, "maxiter": maxiter})
    gd_nit, gd_f = _gd(prob, x0, lr, gtol, maxiter)
    if gd_nit is not None:
        assert res.success and res.nit <= gd_nit
    elif not res.success:
        # neither reached the test: no higher objective than GD's (up to rounding of f)
        assert res.fun <= gd_f + 1e-12 * abs(gd_f)
