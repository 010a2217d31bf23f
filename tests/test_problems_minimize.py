"""The problems through amopt.minimize: the paper's LIBSVM comparison and every method."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.optimize

import amopt
from amopt.problems import (
    HuberRegression,
    LeastSquares,
    LogisticRegression,
    NonconvexLogisticRegression,
    Quadratic,
    Rosenbrock,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _am_mgd_reference(prob, lr, T):
    """AM-MGD of docs/algorithms.md section 2 (exact numerator, lam = 0, beta_max = 1)."""
    x = np.zeros(prob.dim)
    d, f_prev = None, None
    for _ in range(T):
        f, g = prob.value_and_grad(x)
        f = float(f)
        if d is None:
            d = g.copy()
        v = d - g
        den = v @ v
        if f_prev is None:
            num = g @ g  # step 0 (d = g) has no f(x_{-1}); den = 0 there anyway
        else:
            num = (f_prev - f) / lr - v @ g
        beta = (
            0.0 if den <= np.finfo(float).eps ** 2 * (d @ d + g @ g) else min(max(num / den, 0), 1)
        )
        d = g + beta * (d - g)
        x = x - lr * d
        f_prev = f
    return float(prob.fun(x))


def _mgd_reference(prob, lr, beta, T):
    x = np.zeros(prob.dim)
    d = None
    for _ in range(T):
        g = prob.grad(x)
        d = g.copy() if d is None else beta * d + (1 - beta) * g
        x = x - lr * d
    return float(prob.fun(x))


# Final losses after 1000 iterations with lr = 1/L from x0 = 0 (l2 = 0, the paper's setting).
LIBSVM_EXPECTED = {
    "mushrooms": (0.018463755058829648, 0.025104686102972288),
    "a9a": (0.32435780712092127, 0.3244648093826462),
}


@pytest.mark.parametrize("name", list(LIBSVM_EXPECTED))
def test_am_mgd_beats_mgd_on_libsvm(name):
    if name == "a9a" and not (DATA / "libsvm" / "a9a").is_file():
        pytest.skip(f"offline LIBSVM file {DATA / 'libsvm' / 'a9a'} is absent")
    prob = LogisticRegression.from_libsvm(name, cache_dir=DATA, download=False)
    lr, T = 1.0 / prob.L, 1000
    x0 = np.zeros(prob.dim)
    am = amopt.minimize(
        prob, x0, method="am-mgd",
        options={"lr": lr, "maxiter": T, "gtol": 0, "numerator": "exact"},
    )  # fmt: skip
    mgd = amopt.minimize(
        prob, x0, method="mgd", options={"lr": lr, "beta": 0.9, "maxiter": T, "gtol": 0}
    )
    assert am.nit == mgd.nit == T
    expected_am, expected_mgd = LIBSVM_EXPECTED[name]
    assert am.fun == pytest.approx(expected_am, rel=1e-7)
    assert mgd.fun == pytest.approx(expected_mgd, rel=1e-7)
    assert am.fun < mgd.fun
    # Independent transcriptions of the two methods give the same losses.
    assert am.fun == pytest.approx(_am_mgd_reference(prob, lr, T), rel=1e-9)
    assert mgd.fun == pytest.approx(_mgd_reference(prob, lr, 0.9, T), rel=1e-12)
    assert am.betas.shape == (T,) and np.all((am.betas >= 0) & (am.betas <= 1))


def _finite_sums():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 6)) / np.sqrt(6)
    y = np.where(X @ rng.standard_normal(6) + 0.3 * rng.standard_normal(120) > 0, 1, 0)
    classes = np.argmax(X @ rng.standard_normal((6, 3)) * 3 + rng.gumbel(size=(120, 3)), axis=1)
    return {
        "logreg": LogisticRegression(X, y, l2=1e-3),
        "softmax": LogisticRegression(X, classes),
        "nonconvex": NonconvexLogisticRegression(X, y, alpha=0.1),
        "huber": HuberRegression.planted(120, 6, noise=0.3, seed=1),
        "lsq": LeastSquares(X, X @ rng.standard_normal(6) + 0.1 * rng.standard_normal(120)),
    }


FINITE_SUMS = _finite_sums()
DETERMINISTIC = ["gd", "mgd", "am-mgd", "adam", "adamw", "am-adam", "am-adamw"]
STOCHASTIC = ["sgd", "msgd", "am-sgd"]


def _f_reference(name):
    prob = FINITE_SUMS[name]
    if name != "nonconvex":
        return prob.reference_solution(cache=False).fun if name != "lsq" else prob.f_star

    def fg(z):  # non-convex: the local minimum L-BFGS-B reaches from x0 = 0
        f, g = prob.value_and_grad(z)
        return float(f), g

    return scipy.optimize.minimize(
        fg, np.zeros(prob.dim), jac=True, method="L-BFGS-B", options={"gtol": 1e-12}
    ).fun


def _options(method, prob):
    if method in ("adam", "adamw", "am-adam", "am-adamw"):
        return {"lr": 0.05, "gtol": 0}
    if method in STOCHASTIC:
        return {"lr": 0.5 / prob.L, "batch_size": 16, "seed": 0}
    return {"lr": 1.0 / prob.L, "gtol": 0}


@pytest.mark.parametrize("method", list(amopt.METHODS))
@pytest.mark.parametrize("name", list(FINITE_SUMS))
def test_every_method_on_every_finite_sum(method, name):
    prob = FINITE_SUMS[name]
    x0 = np.zeros(prob.dim)
    f0, f_ref = float(prob.fun(x0)), _f_reference(name)
    res = amopt.minimize(
        prob, x0, method=method, options={**_options(method, prob), "maxiter": 150}
    )
    assert res.nit == 150 and res.x.shape == x0.shape
    assert res.fun == pytest.approx(float(prob.fun(res.x)), rel=1e-12)
    assert res.fun - f_ref < 0.5 * (f0 - f_ref)  # at least half the gap closed


@pytest.mark.parametrize("method", DETERMINISTIC)
def test_deterministic_problems_through_minimize(method):
    torch = pytest.importorskip("torch")
    q = Quadratic.from_spectrum(20, cond=100.0, seed=2)
    opts = {**_options(method, q), "maxiter": 300}
    res = amopt.minimize(q.value_and_grad, np.zeros(20), method=method, jac=True, options=opts)
    assert res.fun - q.f_star < 0.5 * (float(q.fun(np.zeros(20))) - q.f_star)
    # The same run on torch tensors (the problem answers in the caller's namespace).
    rt = amopt.minimize(
        q.value_and_grad, torch.zeros(20, dtype=torch.float64), method=method, jac=True,
        options=opts,
    )  # fmt: skip
    assert isinstance(rt.x, torch.Tensor)
    np.testing.assert_allclose(rt.x.numpy(), res.x, rtol=1e-9, atol=1e-12)
    # scipy-style separate fun / jac
    rs = amopt.minimize(q.fun, np.zeros(20), method=method, jac=q.grad, options=opts)
    np.testing.assert_allclose(rs.x, res.x, rtol=1e-12, atol=1e-14)


def test_am_mgd_solves_rosenbrock():
    r = Rosenbrock(2)
    res = amopt.minimize(
        r.value_and_grad, r.x0, method="am-mgd", jac=True,
        options={"lr": 2e-3, "maxiter": 20000, "gtol": 1e-6, "numerator": "exact"},
    )  # fmt: skip
    assert res.success and np.allclose(res.x, r.x_star, atol=1e-5)
    assert res.nit == pytest.approx(7714, rel=0.02)  # measured


def test_quadratic_through_minimize():
    q = Quadratic.from_spectrum(50, cond=1e3, seed=0)
    x0 = np.zeros(50)
    # Measured iterations to max|g| <= 1e-8 at lr = 1/L, and the gap after 1000 steps.
    measured = {
        ("am-mgd", "exact"): (10672, 17.3067),
        ("am-mgd", "linear"): (7717, 16.4504),
        ("mgd", None): (None, 24.5337),  # 15613 and 15756 iterations to gtol (not rerun)
        ("gd", None): (None, 25.7103),
    }
    gaps = {}
    for (method, numerator), (nit, gap) in measured.items():
        # the AM rows at the paper's cap 1 (AM-MGD's default cap is 0.998, checked below)
        opts = {"lr": 1 / q.L} | ({"numerator": numerator, "beta_max": 1.0} if numerator else {})
        if nit is not None:
            res = amopt.minimize(
                q, x0, method=method, jac=q.grad, options=opts | {"gtol": 1e-8, "maxiter": 20000}
            )
            assert res.success and res.nit == pytest.approx(nit, rel=0.02)
            # |x - x*| <= |A (x - x*)| / mu = |g| / mu
            err = np.linalg.norm(res.x - q.x_star)
            assert err <= np.linalg.norm(q.grad(res.x)) / q.mu * (1 + 1e-9)
        short = amopt.minimize(q, x0, method=method, jac=q.grad, options=opts | {"gtol": 0})
        gaps[method, numerator] = short.fun - q.f_star
        assert gaps[method, numerator] == pytest.approx(gap, rel=1e-4)
    assert (
        gaps["am-mgd", "linear"] < gaps["am-mgd", "exact"] < gaps["mgd", None] < gaps["gd", None]
    )
    # the default of am-mgd (linear numerator, cap 0.998) against GD, both run here
    to_tol = {"lr": 1 / q.L, "gtol": 1e-8, "maxiter": 20000}
    default = amopt.minimize(q, x0, method="am-mgd", jac=q.grad, options=to_tol)
    gd = amopt.minimize(q, x0, method="gd", jac=q.grad, options=to_tol)
    assert default.success and gd.success and default.nit < gd.nit
    short = amopt.minimize(q, x0, method="am-mgd", jac=q.grad, options={"lr": 1 / q.L, "gtol": 0})
    assert short.fun - q.f_star < gaps["gd", None]
