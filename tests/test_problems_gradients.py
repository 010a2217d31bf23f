"""Every problem's gradient against finite differences (NumPy, torch float64) and autograd."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import amopt
from amopt.problems import (
    HuberRegression,
    LeastSquares,
    LogisticRegression,
    NonconvexLogisticRegression,
    Quadratic,
    Rosenbrock,
)

torch = pytest.importorskip("torch")
xs = pytest.importorskip("array_api_strict")


def _data(seed=0, n=40, d=6, sparse=False):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    if sparse:
        X[rng.random((n, d)) < 0.5] = 0.0
        X = sp.csr_matrix(X)
    return X, rng


def _problems():
    X, rng = _data(0)
    Xs, _ = _data(1, sparse=True)
    y_pm = np.where(rng.random(40) < 0.5, 1.0, -1.0)
    y_12 = np.where(rng.random(40) < 0.4, 1, 2)
    y_3 = rng.integers(0, 3, 40) * 10  # classes {0, 10, 20}
    M = rng.standard_normal((7, 7))
    return {
        "quadratic-dense": Quadratic.from_spectrum(7, cond=50.0, seed=3),
        "quadratic-diag-linear": Quadratic.from_spectrum(
            7, cond=20.0, spacing="linear", dense=False, seed=4
        ),
        "quadratic-matrix": Quadratic(M @ M.T + np.eye(7), b=rng.standard_normal(7)),
        "lsq-dense": LeastSquares(X, rng.standard_normal(40)),
        "lsq-sparse-l2": LeastSquares(Xs, rng.standard_normal(40), l2=0.3),
        "logreg-binary": LogisticRegression(X, y_pm),
        "logreg-binary-12-l2": LogisticRegression(X, y_12, l2=0.05),
        "logreg-sparse": LogisticRegression(Xs, y_pm, l2=0.01),
        "logreg-softmax": LogisticRegression(X, y_3, l2=0.02),
        "logreg-softmax-sparse": LogisticRegression(Xs, y_3),
        "logreg-softmax-2class": LogisticRegression(X, y_pm, multiclass="softmax"),
        "nonconvex-logreg": NonconvexLogisticRegression(X, y_pm, alpha=0.5),
        "nonconvex-logreg-sparse": NonconvexLogisticRegression(Xs, y_12, alpha=0.2),
        "huber": HuberRegression(X, 3.0 * rng.standard_normal(40), delta=0.7),
        "huber-planted-sparse": HuberRegression(Xs, 2.0 * rng.standard_normal(40)),
        "rosenbrock": Rosenbrock(5),
    }


PROBLEMS = _problems()
FINITE_SUMS = [k for k, p in PROBLEMS.items() if isinstance(p, amopt.FiniteSum)]


def _point(prob, seed=7):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(prob.dim) * (0.7 if isinstance(prob, Rosenbrock) else 1.5)


def _fd(f, x, h=1e-6):
    g = np.empty_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def _is_sparse(prob):
    return getattr(getattr(prob, "_data", None), "sparse", False)


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_gradient_matches_finite_differences_numpy(name):
    prob = PROBLEMS[name]
    x = _point(prob)
    f, g = prob.value_and_grad(x)
    assert isinstance(g, np.ndarray) and g.shape == x.shape and g.dtype == np.float64
    fd = _fd(lambda z: float(prob.fun(z)), x)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7 * max(1.0, np.abs(fd).max()))
    assert float(f) == pytest.approx(float(prob.fun(x)), rel=1e-14)
    np.testing.assert_allclose(prob.grad(x), g, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_gradient_matches_finite_differences_torch(name):
    prob = PROBLEMS[name]
    x = _point(prob)
    xt = torch.tensor(x, dtype=torch.float64)  # a sparse X evaluates as torch sparse CSR
    f, g = prob.value_and_grad(xt)
    assert isinstance(g, torch.Tensor) and g.dtype == torch.float64 and g.shape == xt.shape
    assert isinstance(f, torch.Tensor) and f.ndim == 0
    fd = _fd(lambda z: float(prob.fun(torch.tensor(z, dtype=torch.float64))), x)
    np.testing.assert_allclose(g.numpy(), fd, rtol=1e-6, atol=1e-7 * max(1.0, np.abs(fd).max()))
    # ... and against torch autograd through the value computation.
    xa = xt.clone().requires_grad_(True)
    prob.fun(xa).backward()
    np.testing.assert_allclose(g.numpy(), xa.grad.numpy(), rtol=1e-11, atol=1e-13)
    # Same numbers as NumPy.
    fn, gn = prob.value_and_grad(x)
    assert float(f) == pytest.approx(float(fn), rel=1e-12)
    np.testing.assert_allclose(g.numpy(), gn, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("name", [k for k in PROBLEMS if not _is_sparse(PROBLEMS[k])])
def test_array_api_strict_and_float32(name):
    prob = PROBLEMS[name]
    x = _point(prob)
    fn, gn = prob.value_and_grad(x)
    f, g = prob.value_and_grad(xs.asarray(x))
    assert g.dtype == xs.float64
    assert float(f) == pytest.approx(float(fn), rel=1e-12)
    np.testing.assert_allclose(np.asarray(g), gn, rtol=1e-11, atol=1e-13)
    f32, g32 = prob.value_and_grad(torch.tensor(x, dtype=torch.float32))
    assert g32.dtype == torch.float32 and f32.dtype == torch.float32
    np.testing.assert_allclose(g32.numpy(), gn, rtol=1e-4, atol=1e-4 * np.abs(gn).max())


@pytest.mark.parametrize("name", FINITE_SUMS)
def test_batch_gradient(name):
    prob = PROBLEMS[name]
    x = _point(prob)
    idx = np.array([3, 3, 0, 17, 39])  # repeats count twice
    f, g = prob.batch_value_and_grad(x, idx)
    fd = _fd(lambda z: float(prob.batch_value_and_grad(z, idx)[0]), x)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7 * max(1.0, np.abs(fd).max()))
    # The batch mean over all rows is the full objective (regulariser included once).
    fa, ga = prob.batch_value_and_grad(x, np.arange(prob.n_samples))
    ff, gf = prob.value_and_grad(x)
    assert float(fa) == pytest.approx(float(ff), rel=1e-13)
    np.testing.assert_allclose(ga, gf, rtol=1e-12, atol=1e-14)
    # Mean over singletons = full (the finite-sum structure, f = mean_i f_i + r).
    fs = [prob.batch_value_and_grad(x, np.array([i])) for i in range(prob.n_samples)]
    assert np.mean([float(v) for v, _ in fs]) == pytest.approx(float(ff), rel=1e-12)
    np.testing.assert_allclose(np.mean([gi for _, gi in fs], axis=0), gf, atol=1e-12)
    for ix in (idx, torch.as_tensor(idx)):  # host and device indices (sparse X included)
        ft, gt = prob.batch_value_and_grad(torch.tensor(x), ix)
        np.testing.assert_allclose(gt.numpy(), g, rtol=1e-12, atol=1e-14)
    if not _is_sparse(prob):
        fx, gx = prob.batch_value_and_grad(xs.asarray(x), idx)
        np.testing.assert_allclose(np.asarray(gx), g, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", FINITE_SUMS)
def test_finite_sum_protocol_and_index_errors(name):
    prob = PROBLEMS[name]
    assert isinstance(prob, amopt.FiniteSum)
    x = _point(prob)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 39\] \(n_samples=40\)"):
        prob.batch_value_and_grad(x, np.array([0, 40]))
    with pytest.raises(ValueError, match="indices must be a 1-D integer array"):
        prob.batch_value_and_grad(x, np.array([0.5]))
    with pytest.raises(ValueError, match="indices must not be empty"):
        prob.batch_value_and_grad(x, np.array([], dtype=int))


def test_softmax_accepts_matrix_parameters():
    prob = PROBLEMS["logreg-softmax"]
    x = _point(prob)
    W = x.reshape(prob.n_features, prob.n_classes)
    f, G = prob.value_and_grad(W)
    assert G.shape == W.shape
    np.testing.assert_allclose(G.ravel(), prob.grad(x), rtol=1e-14)
    with pytest.raises(ValueError, match=r"x must have shape \(18,\) or \(6, 3\), got \(3, 6\)"):
        prob.value_and_grad(W.T)


def test_problems_on_torch_data():
    X, rng = _data(5)
    y = np.where(rng.random(40) < 0.5, 1, 0)
    ref = LogisticRegression(X, y, l2=0.1)
    tprob = LogisticRegression(torch.tensor(X), torch.tensor(y), l2=0.1)
    x = rng.standard_normal(6)
    fr, gr = ref.value_and_grad(x)
    ft, gt = tprob.value_and_grad(torch.tensor(x))
    fn, gn = tprob.value_and_grad(x)  # NumPy input on torch data: host copy
    assert float(ft) == pytest.approx(float(fr), rel=1e-13)
    np.testing.assert_allclose(gt.numpy(), gr, rtol=1e-12)
    np.testing.assert_allclose(gn, gr, rtol=1e-12)
    assert tprob.L == pytest.approx(ref.L, rel=1e-12)


def test_input_validation():
    q = PROBLEMS["quadratic-dense"]
    with pytest.raises(ValueError, match=r"x must have shape \(7,\), got \(6,\)"):
        q.fun(np.zeros(6))
    with pytest.raises(TypeError, match="x must be an array"):
        q.fun("abc")
    with pytest.raises(TypeError, match="real floating dtype"):
        q.fun(np.zeros(7, dtype=complex))
    assert float(q.fun([0] * 7)) == 0.0  # sequences and integer arrays are promoted
    X, _ = _data()
    with pytest.raises(ValueError, match="X has 40 rows but y has 39 entries"):
        LogisticRegression(X, np.ones(39))
    with pytest.raises(ValueError, match=r"l2 must be a finite number in \[0.0, inf\), got -1"):
        LogisticRegression(X, np.ones(40), l2=-1)
    with pytest.raises(ValueError, match="multiclass must be 'auto', 'binary' or 'softmax'"):
        LogisticRegression(X, np.ones(40), multiclass="ovr")
    with pytest.raises(ValueError, match="binary labels need at most 2 distinct values, got 3"):
        LogisticRegression(X, np.arange(40) % 3, multiclass="binary")
    with pytest.raises(ValueError, match="X contains NaN"):
        LeastSquares(np.full((3, 2), np.nan), np.ones(3))
    with pytest.raises(ValueError, match="X must be 2-D"):
        LeastSquares(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match=r"delta must be a finite number in \(0.0, inf\)"):
        HuberRegression(X, np.ones(40), delta=0.0)
    with pytest.raises(ValueError, match="dim must be an integer >= 2, got 1"):
        Rosenbrock(1)
    with pytest.raises(TypeError, match="dim must be an integer, got float"):
        Rosenbrock(2.0)
