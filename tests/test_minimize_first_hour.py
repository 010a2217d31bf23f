"""What a new user meets first: problem objects as objectives, honest statuses, options
that can be found, a step size when none is given, the classical momentum baselines and
a default that converges."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.optimize import OptimizeWarning

import amopt
from amopt.problems import LeastSquares, Quadratic, Rosenbrock

# ----------------------------------------------------------------------------- E


@pytest.mark.parametrize("make", [lambda: Quadratic.from_spectrum(50, cond=10), Rosenbrock])
def test_problem_objects_use_their_gradient(make):
    prob = make()
    x0 = np.full(prob.dim, 0.5)
    calls = {"fun": 0, "vg": 0}
    fun, vg = prob.fun, prob.value_and_grad

    def counted_fun(x):
        calls["fun"] += 1
        return fun(x)

    def counted_vg(x):
        calls["vg"] += 1
        return vg(x)

    prob.fun, prob.value_and_grad = counted_fun, counted_vg
    lr = 1.0 / prob.L if hasattr(prob, "L") else 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizeWarning)  # no finite-difference warning
        res = amopt.minimize(
            prob, x0, method="gd", options={"lr": lr, "gtol": 1e-6, "maxiter": 60_000}
        )
    assert calls["fun"] == 0  # no finite-difference evaluations of fun
    assert calls["vg"] == res.nfev == res.njev == res.nit + 1
    assert res.success
    assert np.max(np.abs(prob.grad(res.x))) <= 1e-6
    np.testing.assert_allclose(res.x, prob.x_star, atol=1e-6 / getattr(prob, "mu", 1e-3))


def test_object_with_grad_method_only():
    """An object with ``__call__`` and ``grad`` (no value_and_grad) uses ``grad``."""
    q = Quadratic.from_spectrum(20, cond=10)

    class Obj:
        def __call__(self, x):
            return q.fun(x)

        def grad(self, x):
            return q.grad(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizeWarning)
        res = amopt.minimize(Obj(), np.ones(20), method="gd", options={"lr": 1 / q.L})
    assert res.success and res.nfev == res.nit + 1
