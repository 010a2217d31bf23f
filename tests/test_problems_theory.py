"""The paper's convergence theorems for simplified AM-SGD, checked on certified problems."""

from __future__ import annotations

import functools
import math
import types

import numpy as np
import pytest

from amopt.problems import (
    HuberRegression,
    LogisticRegression,
    NonconvexLogisticRegression,
    check_fixed_cap,
    check_theorem_3_1,
    check_theorem_3_2,
)

SEEDS = 10
HUBER = HuberRegression.planted(200, 10, delta=1.0, noise=0.5, seed=1)
HUBER_INTERP = HuberRegression.planted(200, 10, delta=1.0, seed=0)
NONCONVEX = NonconvexLogisticRegression.synthetic(200, 10, alpha=0.1, flip=0.1, seed=0)


def _reference_am_sgd(prob, x0, T, lr, beta_max, seed, batch_size=1):
    """Independent transcription of eq. (mom_for_proof): d_0 = 0, lam = 0; yields x_0..x_T."""
    rng = np.random.default_rng(seed)
    x, d = x0.copy(), np.zeros_like(x0)
    xs = [x.copy()]
    for _ in range(T):
        idx = rng.integers(0, prob.n_samples, size=batch_size)
        g = prob.batch_value_and_grad(x, idx)[1]
        den = float(np.sum((d - g) ** 2))
        beta = 0.0 if den == 0.0 else min(max(float(g @ g) / den, 0.0), beta_max)
        d = beta * d + (1.0 - beta) * g
        x = x - lr * d
        xs.append(x.copy())
    return np.array(xs)


def test_theorem_3_1_matches_an_independent_run():
    T = 100
    res = check_theorem_3_1(HUBER, T, seeds=SEEDS)
    a = (1 + 1 / T) ** -(np.arange(T) + 1.0)
    gaps = []
    for seed in range(SEEDS):
        xs = _reference_am_sgd(HUBER, np.zeros(10), T, 1 / math.sqrt(T), 1 / T, seed)
        x_a = (a[:, None] * xs[:T]).sum(axis=0) / a.sum()
        gaps.append(float(HUBER.fun(x_a)) - HUBER.f_star)
    np.testing.assert_allclose(res.per_seed, gaps, rtol=1e-12, atol=1e-15)
    assert res.measured == pytest.approx(np.mean(gaps), rel=1e-12)
    x_star = HUBER.x_star
    bound = (x_star @ x_star + 2.5 * HUBER.G2) / math.sqrt(T)
    assert res.bound == pytest.approx(bound, rel=1e-14)
    assert (res.lr, res.beta_max, res.T, res.seeds) == (0.1, 0.01, T, tuple(range(SEEDS)))


def test_theorem_3_2_matches_an_independent_run():
    T, c = 100, 0.5
    res = check_theorem_3_2(NONCONVEX, T, seeds=SEEDS, c=c)
    sq = np.empty((SEEDS, T))
    dec = np.empty(SEEDS)
    for seed in range(SEEDS):
        xs = _reference_am_sgd(
            NONCONVEX, np.zeros(10), T, 1 / math.sqrt(T), c / math.sqrt(T), seed
        )
        sq[seed] = [np.sum(NONCONVEX.grad(x) ** 2) for x in xs[:T]]
        dec[seed] = float(NONCONVEX.fun(xs[0]) - NONCONVEX.fun(xs[T]))
    # min over t of the expectation (seed mean), not the mean of per-seed minima
    assert res.measured == pytest.approx(sq.mean(axis=0).min(), rel=1e-12)
    assert res.measured > np.mean(sq.min(axis=1))
    bound = (dec.mean() + (1 + 8 * NONCONVEX.L) / 4 * NONCONVEX.G2) / (math.sqrt(T) * (1 - c))
    assert res.bound == pytest.approx(bound, rel=1e-12)


def test_fixed_cap_matches_an_independent_run():
    T, bmax = 100, 0.9
    res = check_fixed_cap(HUBER, T, seeds=SEEDS, beta_max=bmax)
    gaps = []
    for seed in range(SEEDS):
        xs = _reference_am_sgd(HUBER, np.zeros(10), T, 1 / math.sqrt(T), bmax, seed)
        gaps.append(float(HUBER.fun(xs[:T].mean(axis=0))) - HUBER.f_star)
    assert res.measured == pytest.approx(np.mean(gaps), rel=1e-12)
    eps, lr = 1 - bmax, 1 / math.sqrt(T)
    dist = HUBER.x_star @ HUBER.x_star
    bound = (
        dist / (2 * lr * eps * T)
        + lr * HUBER.G2 * (2 + eps) / (2 * eps**3)
        + HUBER.f_star * (1 + eps - eps**2) / eps**2
    )
    assert res.bound == pytest.approx(bound, rel=1e-12)


# Measured on this machine (seeds 0..9); deterministic up to floating-point reassociation.
EXPECTED = {
    ("3.1", "huber", 100): (0.101982, 0.692985),
    ("3.1", "huber", 1000): (0.0363040, 0.219141),
    ("3.1", "huber-interp", 100): (0.131395, 0.807433),
    ("3.1", "huber-interp", 1000): (0.0424183, 0.255333),
    ("3.2", "nonconvex", 100): (0.00240535, 0.213708),
    ("3.2", "nonconvex", 1000): (0.000513655, 0.0678706),
    ("fixed-cap", "huber", 100): (0.139175, 119.229),
    ("fixed-cap", "huber", 1000): (0.0784929, 46.9517),
}
PROBLEMS = {"huber": HUBER, "huber-interp": HUBER_INTERP, "nonconvex": NONCONVEX}
CHECKS = {"3.1": check_theorem_3_1, "3.2": check_theorem_3_2, "fixed-cap": check_fixed_cap}


@functools.cache
def _check(theorem, problem, T):
    return CHECKS[theorem](PROBLEMS[problem], T, seeds=SEEDS)


@pytest.mark.parametrize(("theorem", "problem", "T"), list(EXPECTED))
def test_theorem_bounds_hold(theorem, problem, T):
    res = _check(theorem, problem, T)
    measured, bound = EXPECTED[theorem, problem, T]
    assert res.passed, str(res)
    assert res.measured <= res.bound and res.ratio == res.measured / res.bound < 1
    assert res.measured == pytest.approx(measured, rel=1e-5)
    assert res.bound == pytest.approx(bound, rel=1e-5)
    assert len(res.seeds) == SEEDS and res.per_seed.shape == (SEEDS,)
    assert theorem in str(res) and "passed" in str(res)


def test_rate_improves_with_T():
    # The 1/sqrt(T) bounds shrink with T, and so does what they bound.
    for theorem, problem in [("3.1", "huber"), ("3.2", "nonconvex"), ("fixed-cap", "huber")]:
        r100, r1000 = (_check(theorem, problem, T) for T in (100, 1000))
        assert r1000.measured < r100.measured and r1000.bound < r100.bound


def test_theorem_3_1_on_logistic_regression_with_numerical_solution():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((150, 5)) / math.sqrt(5)
    y = np.where(X @ rng.standard_normal(5) + 0.5 * rng.standard_normal(150) > 0, 1, 2)
    prob = LogisticRegression(X, y)  # l2 = 0: G2 = mean ||a_i||^2 is certified
    prob.reference_solution(cache=False)
    for T in (100, 1000):
        res = check_theorem_3_1(prob, T, seeds=SEEDS, batch_size=4)
        assert res.passed and 0 < res.measured < res.bound, str(res)
        assert res.constants["G2"] == pytest.approx(np.mean(np.sum(X * X, axis=1)))


def test_a_wrong_constant_fails_the_check():
    # A problem that misstates G^2 = 0 and x* = x0 has bound 0 < measured: the check fails.
    liar = types.SimpleNamespace(
        n_samples=HUBER.n_samples,
        dim=HUBER.dim,
        convex=True,
        G2=0.0,
        x_star=np.zeros(10),
        f_star=HUBER.f_star,
        batch_value_and_grad=HUBER.batch_value_and_grad,
        value_and_grad=HUBER.value_and_grad,
    )
    res = check_theorem_3_1(liar, 100, seeds=3)
    assert not res.passed and res.ratio == math.inf and "FAILED" in str(res)
    liar.G2, liar.x_star, liar.f_star = HUBER.G2, HUBER.x_star, HUBER.f_star - 1.0  # wrong f*
    res = check_theorem_3_1(liar, 100, seeds=3)
    assert not res.passed and res.ratio > 1


def test_argument_errors():
    with pytest.raises(ValueError, match="Theorem 3.1 assumes every f_S convex"):
        check_theorem_3_1(NONCONVEX, 10)
    with pytest.raises(ValueError, match="fixed-cap theorem assumes every f_S convex"):
        check_fixed_cap(NONCONVEX, 10)
    prob = LogisticRegression(np.eye(3), [1, 2, 1], l2=0.1)
    with pytest.raises(ValueError, match=r"needs a finite certified problem.G2, got inf"):
        check_theorem_3_2(prob, 10)
    with pytest.raises(ValueError, match=r"c must lie in \(0, 1\), got 1.0"):
        check_theorem_3_2(NONCONVEX, 10, c=1.0)
    with pytest.raises(ValueError, match=r"beta_max must lie in \[0, 1\), got 1.0"):
        check_fixed_cap(HUBER, 10, beta_max=1.0)
    with pytest.raises(ValueError, match="T must be an integer >= 1, got 0"):
        check_theorem_3_1(HUBER, 0)
    with pytest.raises(ValueError, match="seeds must not be empty"):
        check_theorem_3_1(HUBER, 10, seeds=[])
    with pytest.raises(ValueError, match=r"x0 must have shape \(10,\), got \(3,\)"):
        check_theorem_3_1(HUBER, 10, x0=np.zeros(3))
    with pytest.raises(TypeError, match="problem must be a finite-sum problem"):
        check_theorem_3_2(types.SimpleNamespace(G2=1.0, L=1.0), 10)
    res = check_fixed_cap(HUBER, 10, seeds=[5, 7], beta_max=0.5, lr=0.05, batch_size=8)
    assert res.seeds == (5, 7) and res.lr == 0.05 and res.passed
