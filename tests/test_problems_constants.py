"""Smoothness constants, certified gradient bounds, minimisers, the reference-solution cache,
and the constructors' checks of degenerate data."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from amopt.problems import (
    HuberRegression,
    LeastSquares,
    LogisticRegression,
    NonconvexLogisticRegression,
    Quadratic,
    ReferenceSolutionWarning,
    _reference,
)


def _fd_hessian(grad, x, h=1e-5):
    """Central-difference Jacobian of ``grad`` (an independent Hessian)."""
    H = np.empty((x.size, x.size))
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        H[:, i] = (grad(x + e) - grad(x - e)) / (2 * h)
    return 0.5 * (H + H.T)


def _logistic_data(seed=0, n=60, d=5, scale=1.0):
    rng = np.random.default_rng(seed)
    X = scale * rng.standard_normal((n, d)) + 0.3
    y = np.where(X @ rng.standard_normal(d) + rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y, rng


@pytest.mark.parametrize("l2", [0.0, 0.1])
@pytest.mark.parametrize("sparse", [False, True])
def test_binary_logistic_L_is_a_tight_upper_bound(l2, sparse):
    X, y, rng = _logistic_data()
    prob = LogisticRegression(sp.csr_matrix(X) if sparse else X, y, l2=l2)
    n = X.shape[0]
    gram_top = np.linalg.eigvalsh(X.T @ X)[-1]
    # Tight: equal (to Lanczos accuracy, far inside 1%) to the dense eigen-solve ...
    assert prob.L == pytest.approx(gram_top / (4 * n) + l2, rel=1e-10)
    # ... and an upper bound of the Hessian's largest eigenvalue everywhere.
    for scale in (0.0, 0.5, 3.0):
        x = scale * rng.standard_normal(prob.dim)
        s = 1.0 / (1.0 + np.exp(-(X @ x)))
        H = X.T @ (X * (s * (1 - s))[:, None]) / n + l2 * np.eye(prob.dim)
        top = np.linalg.eigvalsh(H)[-1]
        assert top <= prob.L * (1 + 1e-12)
        np.testing.assert_allclose(prob.hess(x), H, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(_fd_hessian(prob.grad, x), H, atol=1e-7)
    # The bound is attained at x = 0 (sigma' = 1/4 is its maximum).
    assert np.linalg.eigvalsh(prob.hess(np.zeros(prob.dim)))[-1] == pytest.approx(prob.L)
    assert prob.L_max == pytest.approx(np.max(np.sum(X * X, axis=1)) / 4 + l2, rel=1e-14)


def test_softmax_L_bound():
    X, _, rng = _logistic_data(1, n=50, d=4)
    y = rng.integers(0, 3, 50)
    prob = LogisticRegression(X, y, l2=0.05)
    assert prob.kind == "softmax" and prob.dim == 12
    gram_top = np.linalg.eigvalsh(X.T @ X)[-1]
    assert prob.L == pytest.approx(0.5 * gram_top / 50 + 0.05, rel=1e-10)
    for scale in (0.0, 1.0, 4.0):
        x = scale * rng.standard_normal(prob.dim)
        H = _fd_hessian(prob.grad, x)
        assert np.linalg.eigvalsh(H)[-1] <= prob.L
        np.testing.assert_allclose(prob.hess(x), H, atol=1e-7)
    assert prob.L_max == pytest.approx(0.5 * np.max(np.sum(X * X, axis=1)) + 0.05)


def test_L_on_a_real_sparse_data_set_matches_dense_eigensolve():
    prob = LogisticRegression.from_libsvm("a1a")
    Xd = prob._data.host.toarray()
    dense = np.linalg.eigvalsh(Xd.T @ Xd)[-1] / (4 * prob.n_samples)
    assert prob.L == pytest.approx(dense, rel=1e-9)  # within 1% required; 1e-9 measured
    assert prob.L == pytest.approx(1.5671575180, rel=1e-9)


def test_nonconvex_logistic_constants():
    X, y, rng = _logistic_data(2, n=40, d=4)
    alpha = 0.3
    prob = NonconvexLogisticRegression(X, y, alpha=alpha)
    gram_top = np.linalg.eigvalsh(X.T @ X)[-1]
    assert prob.L == pytest.approx(gram_top / (4 * 40) + 2 * alpha, rel=1e-10)
    for scale in (0.0, 0.3, 1.0, 5.0):
        x = scale * rng.standard_normal(4)
        ev = np.linalg.eigvalsh(_fd_hessian(prob.grad, x))
        assert max(abs(ev[0]), abs(ev[-1])) <= prob.L
    # At x = 0 the regulariser's curvature 2*alpha is attained.
    H0 = _fd_hessian(prob.grad, np.zeros(4))
    assert np.linalg.eigvalsh(H0)[-1] == pytest.approx(prob.L, rel=1e-6)


def _sample_gradients(prob, x):
    return np.array(
        [prob.batch_value_and_grad(x, np.array([i]))[1] for i in range(prob.n_samples)]
    )


@pytest.mark.parametrize("kind", ["logistic", "softmax", "nonconvex", "huber"])
def test_certified_G2_bounds_every_stochastic_gradient(kind):
    X, y, rng = _logistic_data(3, n=30, d=4)
    if kind == "logistic":
        prob = LogisticRegression(X, y)
        per_sample = np.sum(X * X, axis=1)
    elif kind == "softmax":
        prob = LogisticRegression(X, rng.integers(0, 4, 30))
        per_sample = 2 * np.sum(X * X, axis=1)
    elif kind == "nonconvex":
        prob = NonconvexLogisticRegression(X, y, alpha=0.7)
        rho = 0.7 * math.sqrt(4) * 3 * math.sqrt(3) / 8
        per_sample = (np.linalg.norm(X, axis=1) + rho) ** 2
    else:
        prob = HuberRegression(X, 5 * rng.standard_normal(30), delta=0.4)
        per_sample = 0.16 * np.sum(X * X, axis=1)
    assert prob.G2 == pytest.approx(per_sample.mean(), rel=1e-12)
    worst = 0.0
    for scale in (0.0, 1.0, 10.0, 1e3):
        for _ in range(5):
            x = scale * rng.standard_normal(prob.dim)
            sq = np.sum(_sample_gradients(prob, x) ** 2, axis=1)
            assert np.all(sq <= per_sample * (1 + 1e-12))
            worst = max(worst, sq.mean() / prob.G2)
    assert worst <= 1.0
    if kind == "nonconvex":  # the regulariser slope 3*sqrt(3)/8 is its maximum, at 1/sqrt(3)
        t = np.linspace(-3, 3, 200001)
        assert np.max(np.abs(2 * t / (1 + t * t) ** 2)) == pytest.approx(3 * math.sqrt(3) / 8)


def test_l2_makes_G2_uncertified():
    X, y, _ = _logistic_data()
    prob = LogisticRegression(X, y, l2=0.1)
    assert prob.G2 == math.inf and prob.sigma_f2 == math.inf


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("spacing", ["log", "linear"])
def test_quadratic_spectrum_and_solution(dense, spacing):
    q = Quadratic.from_spectrum(30, cond=1e4, L=2.0, spacing=spacing, dense=dense, seed=1)
    A = q.hess()
    eig = np.linalg.eigvalsh(A)
    expected = np.geomspace(2e-4, 2.0, 30) if spacing == "log" else np.linspace(2e-4, 2.0, 30)
    np.testing.assert_allclose(eig, expected, rtol=1e-9, atol=1e-12)
    assert (q.L, q.mu) == (2.0, 2e-4)
    assert q.cond == pytest.approx(1e4, rel=1e-12)
    np.testing.assert_allclose(A @ q.x_star, q.b, atol=1e-9)
    assert q.f_star == pytest.approx(-0.5 * q.b @ np.linalg.solve(A, q.b), rel=1e-9)
    assert float(q.fun(q.x_star)) == pytest.approx(q.f_star, rel=1e-10)
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert float(q.fun(q.x_star + rng.standard_normal(30))) > q.f_star
    assert np.array_equal(A, A.T)
    off_diagonal = np.count_nonzero(A - np.diag(np.diag(A)))
    assert (off_diagonal == 0) == (not dense)


def test_quadratic_from_matrix_and_singular_cases():
    q = Quadratic(np.diag([0.0, 2.0]), b=np.array([0.0, 4.0]))
    np.testing.assert_allclose(q.x_star, [0.0, 2.0])  # minimum-norm minimiser
    assert (q.f_star, q.mu, q.cond) == (-4.0, 0.0, math.inf)
    q = Quadratic(np.diag([0.0, 2.0]), b=np.array([1.0, 0.0]))
    assert q.x_star is None and q.f_star == -math.inf  # unbounded below
    with pytest.raises(ValueError, match="A must be symmetric"):
        Quadratic(np.array([[1.0, 2.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="A must be positive semi-definite"):
        Quadratic(np.diag([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"b must have shape \(2,\)"):
        Quadratic(np.eye(2), b=np.ones(3))
    with pytest.raises(ValueError, match=r"cond must be a finite number in \[1.0, inf\), got 0.5"):
        Quadratic.from_spectrum(3, cond=0.5)
    with pytest.raises(ValueError, match="spacing must be 'log' or 'linear', got 'geom'"):
        Quadratic.from_spectrum(3, spacing="geom")
    with pytest.raises(ValueError, match="with dim=1 there is one eigenvalue"):
        Quadratic.from_spectrum(1, cond=10.0)


@pytest.mark.parametrize("sparse", [False, True])
def test_least_squares_solution(sparse):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((50, 6))
    y = rng.standard_normal(50)
    for l2 in (0.0, 0.2):
        prob = LeastSquares(sp.csr_matrix(X) if sparse else X, y, l2=l2)
        x = np.linalg.solve(X.T @ X / 50 + l2 * np.eye(6), X.T @ y / 50)
        np.testing.assert_allclose(prob.x_star, x, rtol=1e-9, atol=1e-12)
        r = X @ x - y
        assert prob.f_star == pytest.approx(r @ r / 100 + 0.5 * l2 * x @ x, rel=1e-12)
        assert prob.L == pytest.approx(np.linalg.eigvalsh(X.T @ X)[-1] / 50 + l2, rel=1e-10)
        assert prob.L_max == pytest.approx(np.max(np.sum(X * X, axis=1)) + l2)


def test_logistic_reference_solution_matches_sklearn(tmp_path):
    sklearn_lm = pytest.importorskip("sklearn.linear_model")
    X, y, _ = _logistic_data(5, n=80, d=6)
    n, l2 = 80, 0.01
    prob = LogisticRegression(X, y, l2=l2)
    sol = prob.reference_solution(cache_dir=tmp_path)
    assert sol.converged and sol.grad_norm <= 1e-10
    clf = sklearn_lm.LogisticRegression(
        C=1.0 / (n * l2), fit_intercept=False, tol=1e-12, max_iter=10_000
    ).fit(X, y)
    f_sk = float(prob.fun(clf.coef_.ravel()))
    assert sol.fun <= f_sk + 1e-15
    assert sol.fun == pytest.approx(f_sk, abs=1e-10)
    np.testing.assert_allclose(sol.x, clf.coef_.ravel(), rtol=1e-5, atol=1e-6)


def test_reference_solution_disk_cache(tmp_path, monkeypatch):
    X, y, _ = _logistic_data(7, n=200, d=8)

    def solve(l2=0.0, data=X):
        monkeypatch.setattr(_reference, "_MEMORY", {})  # as in a fresh process
        return LogisticRegression(data, y, l2=l2).reference_solution(cache_dir=tmp_path)

    sol = solve()
    assert sol.converged and sol.nit > 0 and sol.grad_norm <= 1e-10
    files = list((tmp_path / "reference").glob("logreg-*.npz"))
    assert len(files) == 1
    # A fresh problem on the same data reuses the file: no solver iterations.
    again = solve()
    assert again.nit == 0 and again.fun == sol.fun
    np.testing.assert_array_equal(again.x, sol.x)
    # Different l2 or data -> different keys.
    assert solve(l2=1e-3).fun > sol.fun
    X2 = X.copy()
    X2[0, 0] += 1e-9
    assert solve(data=X2).nit > 0
    assert len(list((tmp_path / "reference").glob("*.npz"))) == 3
    # A corrupt cache file is recomputed, not trusted.
    files[0].write_bytes(b"garbage")
    redo = solve()
    assert redo.nit > 0 and redo.fun == pytest.approx(sol.fun, abs=1e-14)
    # In-memory cache: a second call on the same object does no work.
    prob = LogisticRegression(X, y)
    first = prob.reference_solution(cache=False)
    assert prob.reference_solution(cache=False).nit == 0 and prob.f_star == first.fun


def test_reference_solution_a1a():
    sol = LogisticRegression.from_libsvm("a1a").reference_solution(cache=False)
    assert sol.converged and sol.grad_norm <= 1e-10
    # a1a, l2 = 0; scipy trust-exact with the exact Hessian gives 0.29787543883087.
    assert sol.fun == pytest.approx(0.2978754388303, rel=1e-11)


def test_reference_solution_warns_when_gtol_not_reached(tmp_path):
    X, y, _ = _logistic_data(6)
    prob = LogisticRegression(X, y, l2=0.0)
    with pytest.warns(ReferenceSolutionWarning, match="reference solve stopped"):
        sol = prob.reference_solution(gtol=1e-30, maxiter=3, cache=False)
    assert not sol.converged
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prob.reference_solution(cache=False).converged


@pytest.mark.parametrize("noise", [0.0, 0.8])
def test_planted_huber_solution_is_exact(noise):
    prob = HuberRegression.planted(60, 5, delta=0.5, noise=noise, seed=3)
    f, g = prob.value_and_grad(prob.x_star)
    assert np.max(np.abs(g)) < 1e-14
    assert float(f) == pytest.approx(prob.f_star, rel=1e-13, abs=1e-300)
    # An independent numerical solve on the same data agrees.
    X, y = prob._data.host, prob._data.targets
    generic = HuberRegression(X, y, delta=0.5).reference_solution(cache=False)
    assert generic.fun == pytest.approx(prob.f_star, abs=1e-12)
    if noise == 0.0:
        assert prob.f_star == 0.0 and prob.sigma_f2 == 0.0
    else:
        r = X[:30] @ prob.x_star - y[:30]  # the +e half
        h = np.where(np.abs(r) <= 0.5, 0.5 * r * r, 0.5 * (np.abs(r) - 0.25))
        assert prob.f_star == pytest.approx(h.mean(), rel=1e-12)
        assert prob.sigma_f2 == prob.f_star > 0


def test_predict_and_call():
    X, y, rng = _logistic_data(8, n=100, d=3)
    prob = LogisticRegression(X, np.where(y > 0, 2, 1))
    w = rng.standard_normal(3)
    np.testing.assert_array_equal(prob.predict(w), np.where(X @ w >= 0, 2, 1))
    assert float(prob(w)) == float(prob.fun(w))
    labels = rng.integers(0, 3, 100) + 5
    soft = LogisticRegression(X, labels)
    W = rng.standard_normal((3, 3))
    np.testing.assert_array_equal(soft.predict(W.ravel()), np.argmax(X @ W, axis=1) + 5)


# --------------------------------------------------------------------------- degenerate input

_FINITE_SUM = {
    "logistic": lambda X, y: LogisticRegression(X, np.where(y > 0, 1.0, -1.0)),
    "nonconvex": lambda X, y: NonconvexLogisticRegression(X, np.where(y > 0, 1.0, -1.0)),
    "lsq": lambda X, y: LeastSquares(X, y),
    "huber": lambda X, y: HuberRegression(X, y),
}


@pytest.mark.parametrize("kind", list(_FINITE_SUM))
@pytest.mark.parametrize("sparse", [False, True])
def test_all_zero_X_is_rejected(kind, sparse):
    X = np.zeros((5, 3))
    with pytest.raises(ValueError, match=r"X must have at least one nonzero entry.*\(5, 3\)"):
        _FINITE_SUM[kind](sp.csr_matrix(X) if sparse else X, np.arange(5.0) - 2)


@pytest.mark.parametrize("kind", list(_FINITE_SUM))
@pytest.mark.parametrize("sparse", [False, True])
def test_non_finite_X_names_the_entry(kind, sparse):
    X = np.arange(12.0).reshape(4, 3)
    X[2, 1] = np.nan
    X[3, 0] = np.inf
    with pytest.raises(ValueError, match=re.escape("X[2, 1] = nan (2 non-finite in all)")):
        _FINITE_SUM[kind](sp.csr_matrix(X) if sparse else X, np.arange(4.0) - 1.5)


@pytest.mark.parametrize("kind", list(_FINITE_SUM))
def test_non_finite_y_names_the_entry(kind):
    X = np.arange(12.0).reshape(4, 3)
    y = np.array([1.0, -np.inf, 1.0, -1.0])
    with pytest.raises(ValueError, match=re.escape("y[1] = -inf (1 non-finite in all)")):
        {"logistic": LogisticRegression, "nonconvex": NonconvexLogisticRegression}.get(
            kind, _FINITE_SUM[kind]
        )(X, y)


@pytest.mark.parametrize("kind", list(_FINITE_SUM))
def test_empty_and_zero_width_data(kind):
    for shape in [(0, 3), (3, 0)]:
        with pytest.raises(ValueError, match=re.escape(f"got shape {shape}")):
            _FINITE_SUM[kind](np.ones(shape), np.ones(shape[0]))


def test_one_sample_problems_have_the_exact_constants():
    a = np.array([[3.0, -4.0]])  # ||a||^2 = 25
    x = np.array([0.2, 0.1])
    prob = LogisticRegression(a, np.array([-1.0]))
    assert prob.L == pytest.approx(25 / 4) and prob.L_max == pytest.approx(25 / 4)
    assert float(prob.fun(x)) == pytest.approx(math.log1p(math.exp(3 * 0.2 - 4 * 0.1)))
    ls = LeastSquares(a, np.array([1.0]))
    assert ls.L == pytest.approx(25.0)
    assert ls.f_star == pytest.approx(0.0, abs=1e-30)
    assert float((a @ ls.x_star)[0]) == pytest.approx(1.0)


def test_labels_that_do_not_fit_the_model():
    X = np.arange(12.0).reshape(4, 3) + 1
    with pytest.raises(ValueError, match=r"at most 2 distinct values, got 3 in y \(1, 2, 3\)"):
        LogisticRegression(X, np.array([1, 2, 3, 1]), multiclass="binary")
    with pytest.raises(ValueError, match=r"got 3 in y"):
        NonconvexLogisticRegression(X, np.array([1, 2, 3, 1]))
    with pytest.raises(ValueError, match=r"softmax needs at least 2 classes: y has 1 .*\[7\]"):
        LogisticRegression(X, np.full(4, 7), multiclass="softmax")
    with pytest.raises(TypeError, match="y must hold real numbers or strings.*complex128"):
        LogisticRegression(X, np.array([1j, 0, 1j, 0]))
    with pytest.raises(TypeError, match="y must hold real numbers, got dtype <U"):
        LeastSquares(X, ["1", "2", "3", "4"])
    # One class is a valid binary problem: labels <= 0 are the negative class.
    neg = LogisticRegression(X, np.zeros(4))
    w = np.array([0.1, -0.2, 0.3])
    expect = float(np.mean(np.logaddexp(0.0, X @ w)))  # b = -1
    assert float(neg.fun(w)) == pytest.approx(expect, rel=1e-14)
