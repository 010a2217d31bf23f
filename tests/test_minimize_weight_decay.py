"""Weight decay in ``amopt.minimize``: which objective each method minimises.

Coupled decay :math:`\\mu` (gd, mgd, am-mgd, sgd, msgd, am-sgd, adam, am-adam)
minimises :math:`F = f + \\frac{\\mu}{2}\\|x\\|^2`: the steps and the ``gtol`` test
use :math:`\\nabla F = g + \\mu x` and the exact numerator of am-mgd/am-sgd the
decrease of :math:`F` (am-adam's uses the decrease of f: algorithms.md section 3 adds
its L2 penalty to the gradient only, and the oracle tests pin that). Decoupled decay
(adamw, am-adamw) is not the gradient of an objective and ``gtol`` tests
:math:`\\nabla f`. ``res.fun``/``res.jac`` and the callback's ``fun``/``jac`` are
always the values of ``fun`` and ``jac``.
"""

import array_api_compat.numpy as npx
import numpy as np
import pytest

import amopt

from _objectives import DIAG_A as A
from _objectives import DIAG_B as B
from _objectives import Logistic, logreg_data
from _objectives import diag_f as f
from _objectives import diag_g as g
from oracle import run_am_mgd

MU = 0.5


def F(x):
    return f(x) + 0.5 * MU * float(x @ x)


def G(x):
    return g(x) + MU * x


# the minimiser of F, from the normal equations (A + mu I) x = B
X_F = np.linalg.solve(A + MU * np.eye(3), B)
LAMBDA_MIN_F = 1.0 + MU


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("gd", {"lr": 0.09}),
        ("mgd", {"lr": 0.09, "beta": 0.5}),
        ("am-mgd", {"lr": 0.09, "numerator": "linear"}),
        ("am-mgd", {"lr": 0.09, "numerator": "exact", "lam": 0.1, "beta_max": 0.9}),
        ("adam", {"lr": 0.05}),
        ("am-adam", {"lr": 0.05}),
    ],
)
def test_coupled_decay_converges_to_the_minimiser_of_the_regularised_objective(method, options):
    gtol = 1e-9
    res = amopt.minimize(
        f,
        np.zeros(3),
        method=method,
        jac=g,
        options={**options, "weight_decay": MU, "gtol": gtol, "maxiter": 50000},
    )
    assert res.success and res.status == 0, res.message
    # gtol is a bound on the gradient of F, which bounds the distance to its minimiser
    assert np.max(np.abs(G(res.x))) <= gtol
    np.testing.assert_allclose(res.x, X_F, rtol=0, atol=np.sqrt(3) * gtol / LAMBDA_MIN_F)
    # the result reports fun and jac themselves
    assert res.fun == pytest.approx(f(res.x), rel=1e-14)
    np.testing.assert_allclose(res.jac, g(res.x), rtol=1e-14, atol=1e-15)


def test_callback_reports_fun_and_jac_under_decay():
    seen = []

    def callback(intermediate_result):
        seen.append(intermediate_result)

    amopt.minimize(
        f,
        np.ones(3),
        method="am-mgd",
        jac=g,
        callback=callback,
        options={"lr": 0.09, "weight_decay": MU, "maxiter": 5, "gtol": 0},
    )
    assert len(seen) == 5
    for r in seen:
        assert r.fun == pytest.approx(f(r.x), rel=1e-14)
        np.testing.assert_allclose(r.jac, g(r.x), rtol=1e-14)


@pytest.mark.parametrize("lam", [0.0, 0.1])
def test_exact_numerator_uses_the_decrease_of_the_regularised_objective(lam):
    """AM-MGD with decay equals the oracle run on F without decay, step by step."""
    x0 = np.array([2.0, -1.0, 3.0])
    n_steps, lr = 30, 0.09
    opts = {"lr": lr, "lam": lam, "beta_max": 0.95, "numerator": "exact"}
    iterates = [x0.copy()]
    res = amopt.minimize(
        f,
        x0,
        method="am-mgd",
        jac=g,
        callback=lambda intermediate_result: iterates.append(intermediate_result.x),
        options={**opts, "weight_decay": MU, "maxiter": n_steps, "gtol": 0},
    )
    want = run_am_mgd(lambda xs, t: (F(xs[0]), [G(xs[0])]), [x0], n_steps=n_steps, **opts)
    assert np.ptp(want["betas"]) > 0.05  # the run is not trivial: beta adapts
    for got, expected in zip(iterates, want["x"], strict=True):
        np.testing.assert_allclose(got, expected[0], rtol=1e-12, atol=1e-12)
    # the exact numerator divides the rounding of F_prev - F by lr |d - g|^2
    np.testing.assert_allclose(res.betas, want["betas"], rtol=1e-10, atol=1e-9)


def test_stochastic_exact_numerator_uses_the_regularised_batch_objective():
    X, y = logreg_data()
    prob = Logistic(npx, X, y)
    batches = []

    class Recording:
        n_samples = prob.n_samples

        def value_and_grad(self, x):
            return prob.value_and_grad(x)

        def batch_value_and_grad(self, x, idx):
            batches.append(np.array(idx))
            return prob.batch_value_and_grad(x, idx)

    x0 = np.full(8, 0.1)
    n_steps, mu = 25, 0.05
    opts = {"lr": 1.0 / prob.L, "lam": 0.0, "beta_max": 1.0, "numerator": "exact"}
    iterates = [x0.copy()]
    amopt.minimize(
        Recording(),
        x0,
        method="am-sgd",
        callback=lambda intermediate_result: iterates.append(intermediate_result.x),
        options={**opts, "weight_decay": mu, "maxiter": n_steps, "batch_size": 9, "seed": 2},
    )

    def oracle(xs, t):
        fb, gb = prob.batch_value_and_grad(xs[0], batches[t])
        x = xs[0]
        return float(fb) + 0.5 * mu * float(x @ x), [gb + mu * x]

    want = run_am_mgd(oracle, [x0], n_steps=n_steps, **opts)
    for got, expected in zip(iterates, want["x"], strict=True):
        np.testing.assert_allclose(got, expected[0], rtol=1e-12, atol=1e-12)


COUPLED = ["gd", "mgd", "am-mgd", "sgd", "msgd", "am-sgd", "adam", "am-adam"]
DECOUPLED = ["adamw", "am-adamw"]
X_STAR_f = np.linalg.solve(A, B)  # the stationary point of f alone


@pytest.mark.parametrize("method", COUPLED + DECOUPLED)
def test_gtol_tests_the_gradient_the_method_follows(method):
    """Coupled: gtol tests g + mu x (zero at X_F); decoupled: g (zero at X_STAR_f).

    Started at the point where the tested gradient vanishes, the run stops at once
    with success; started at the other point (where it is mu * |x| ~ 0.1), it steps.
    """
    stops_at, steps_from = (X_F, X_STAR_f) if method in COUPLED else (X_STAR_f, X_F)
    opts = {"lr": 0.01, "weight_decay": MU, "gtol": 1e-12, "maxiter": 3}
    fun = f
    if method in ("sgd", "msgd", "am-sgd"):  # these need a FiniteSum: f as one sample

        class One:
            n_samples = 1

            def value_and_grad(self, x):
                return f(x), g(x)

            def batch_value_and_grad(self, x, idx):
                return f(x), g(x)

        fun = One()
    jac = g if fun is f else None
    res = amopt.minimize(fun, stops_at.copy(), method=method, jac=jac, options=opts)
    assert res.status == 0 and res.success and res.nit == 0, res.message
    assert res.message == amopt.STATUS_MESSAGES["gtol"][1]
    assert res.fun == pytest.approx(f(stops_at), rel=1e-14)
    np.testing.assert_allclose(res.jac, g(stops_at), rtol=1e-14, atol=1e-15)
    res = amopt.minimize(fun, steps_from.copy(), method=method, jac=jac, options=opts)
    # every method, mini-batch or full batch, ends maxiter with scipy's status 1
    assert res.nit == 3 and res.status == 1
    assert res.message == amopt.STATUS_MESSAGES["maxiter"][1]
