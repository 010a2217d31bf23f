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


# ----------------------------------------------------------------------------- G


def _q100():
    """Condition 100, f* = 0 at x* = 0."""
    return Quadratic.from_spectrum(10, cond=100, seed=0, b=np.zeros(10))


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_a_run_that_ends_above_f_x0_says_it_diverged(array):
    """AM-MGD at lr = 10/L stays finite (beta is clipped) but ends far above f(x0)."""
    q = _q100()
    x0 = np.ones(10)
    f0 = float(q.fun(x0))
    if array == "torch":
        torch = pytest.importorskip("torch")
        x0 = torch.ones(10, dtype=torch.float64)
    res = amopt.minimize(q, x0, method="am-mgd", options={"lr": 10 / q.L, "maxiter": 200})
    assert np.isfinite(res.fun) and res.fun > f0  # the situation tested
    assert res.status == 2 and not res.success
    assert res.message == amopt.STATUS_MESSAGES["increased"][1]
    # a run that converges at the same maxiter keeps status 1 or 0
    res = amopt.minimize(q, x0, method="am-mgd", options={"lr": 1 / q.L, "maxiter": 5})
    assert res.status == 1 and res.fun < f0


@pytest.mark.parametrize("method", ["sgd", "msgd", "am-sgd"])
def test_mini_batch_method_refuses_a_plain_callable(method):
    q = _q100()
    with pytest.raises(ValueError, match=rf"method '{method}' takes mini-batches.*fun="):
        amopt.minimize(lambda x: q.fun(x), np.ones(10), method=method, jac=q.grad)


def test_maxiter_is_status_1_for_every_method():
    rng = np.random.default_rng(0)
    prob = LeastSquares(rng.standard_normal((40, 5)), rng.standard_normal(40))
    for method in amopt.METHODS:
        res = amopt.minimize(prob, np.zeros(5), method=method, options={"lr": 0.01, "maxiter": 3})
        assert res.nit == 3, method
        assert res.status == 1 and not res.success, method
        assert res.message == amopt.STATUS_MESSAGES["maxiter"][1], method
