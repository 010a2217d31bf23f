"""The finite-sum problems on a dask design matrix, against the same problems in memory.

A dask ``X`` (dense or SciPy sparse chunks) is never gathered: the constants
come from chunked reductions, evaluations are one task per chunk, and a
mini-batch reads only the chunks its rows fall in. The in-memory problem on
the same data is the oracle. Tests use the synchronous or threaded scheduler
and run under a deadline.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

import amopt
from amopt.problems import LeastSquares, LogisticRegression, NonconvexLogisticRegression

from _deadline import deadline

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")

from amopt.backends.dask import _design  # noqa: E402

N, D, CHUNK = 300, 6, 75


@pytest.fixture(autouse=True)
def _deadline_and_scheduler(request):
    with deadline(30, request.node.name), dask.config.set(scheduler="threads"):
        yield


def _dense(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D)) * np.geomspace(0.5, 5.0, D)
    w = rng.standard_normal(D)
    return X, X @ w + 0.3 * rng.standard_normal(N), rng.integers(0, 3, N), w


def _sparse(seed=1):
    X = sp.random(N, D, density=0.4, format="csr", random_state=seed)
    X.data = np.random.default_rng(seed).standard_normal(X.nnz)
    return X


def _chunked(a):
    if sp.issparse(a):
        return da.from_array(a, chunks=(CHUNK, D), asarray=False)
    return da.from_array(a, chunks=(CHUNK,) + a.shape[1:])


def _pairs():
    """(name, in-memory problem, dask problem) on the same data."""
    X, y, classes3, w = _dense()
    binary = (classes3 > 0).astype(int)
    S = _sparse()
    Xd, Sd = _chunked(X), _chunked(S)
    return [
        ("ls", LeastSquares(X, y, l2=0.01), LeastSquares(Xd, _chunked(y), l2=0.01)),
        ("ls-numpy-y", LeastSquares(X, y), LeastSquares(Xd, y)),
        ("ls-sparse", LeastSquares(S, y), LeastSquares(Sd, _chunked(y))),
        ("logreg", LogisticRegression(X, binary, l2=1e-3),
         LogisticRegression(Xd, _chunked(binary), l2=1e-3)),
        ("logreg-sparse", LogisticRegression(S, binary), LogisticRegression(Sd, binary)),
        ("softmax", LogisticRegression(X, classes3), LogisticRegression(Xd, _chunked(classes3))),
        ("nonconvex", NonconvexLogisticRegression(X, binary),
         NonconvexLogisticRegression(Xd, _chunked(binary))),
    ]  # fmt: skip


PAIRS = {name: (a, b) for name, a, b in _pairs()}


# --------------------------------------------------------------------------- constants


@pytest.mark.parametrize("name", list(PAIRS))
def test_constants_match_the_in_memory_problem(name):
    ref, prob = PAIRS[name]
    assert (prob.n_samples, prob.dim) == (ref.n_samples, ref.dim)
    np.testing.assert_allclose(prob.L, ref.L, rtol=1e-12)
    np.testing.assert_allclose(prob.L_max, ref.L_max, rtol=1e-14)
    if hasattr(ref, "G2"):
        np.testing.assert_allclose(prob.G2, ref.G2, rtol=1e-14)


@pytest.mark.parametrize("name", ["ls", "ls-sparse", "softmax"])
def test_lanczos_on_the_chunked_operator(name, monkeypatch):
    # the path for many features: products with the chunks instead of the Gram matrix
    monkeypatch.setattr(_design, "GRAM_MAX_FEATURES", 0)
    ref, _ = PAIRS[name]
    prob = next(b for n, _, b in _pairs() if n == name)
    calls = []
    original = _design.DaskDesign.matvec
    monkeypatch.setattr(
        _design.DaskDesign, "matvec", lambda self, X, w: calls.append(1) or original(self, X, w)
    )
    np.testing.assert_allclose(prob.L, ref.L, rtol=1e-10)
    assert len(calls) >= 2


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("name", list(PAIRS))
def test_values_and_gradients_match(name):
    ref, prob = PAIRS[name]
    x = np.random.default_rng(5).standard_normal(ref.dim) * 0.3
    idx = np.array([7, 250, 7, 0, 299, 120, 75])
    for args in ((), (idx,)):
        method = "batch_value_and_grad" if args else "value_and_grad"
        f_ref, g_ref = getattr(ref, method)(x, *args)
        # NumPy x: computed, returned as NumPy
        f, g = getattr(prob, method)(x, *args)
        assert type(f) is np.float64 and type(g) is np.ndarray and g.dtype == np.float64
        np.testing.assert_allclose(f, f_ref, rtol=1e-13)
        np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-14 * np.max(np.abs(g_ref)))
        # dask x: lazy
        f, g = getattr(prob, method)(da.from_array(x, chunks=-1), *args)
        assert isinstance(f, da.Array) and isinstance(g, da.Array) and g.shape == (ref.dim,)
        f, g = dask.compute(f, g)
        np.testing.assert_allclose(f, f_ref, rtol=1e-13)
        np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-14 * np.max(np.abs(g_ref)))


def test_softmax_accepts_the_matrix_shape_and_float32():
    ref, prob = PAIRS["softmax"]
    W = np.random.default_rng(2).standard_normal((D, 3)) * 0.2
    f_ref, g_ref = ref.value_and_grad(W.astype(np.float32))
    f, g = prob.value_and_grad(da.from_array(W.astype(np.float32), chunks=(3, 2)))
    f, g = dask.compute(f, g)
    assert g.dtype == np.float32 and g.shape == (D, 3)
    np.testing.assert_allclose(f, f_ref, rtol=1e-5)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["logreg", "softmax", "logreg-sparse"])
def test_predict_and_hessian(name):
    ref, prob = PAIRS[name]
    x = np.random.default_rng(3).standard_normal(ref.dim)
    np.testing.assert_array_equal(prob.predict(x), ref.predict(x))
    np.testing.assert_allclose(prob.hess(x), ref.hess(x), rtol=1e-12, atol=1e-15)


def test_a_minibatch_reads_only_the_chunks_it_indexes():
    X, y, _, _ = _dense()
    loaded = []
    lock = threading.Lock()

    def load(i):
        with lock:
            loaded.append(i)
        return X[i * CHUNK : (i + 1) * CHUNK]

    blocks = [
        da.from_delayed(dask.delayed(load)(i), shape=(CHUNK, D), dtype=np.float64)
        for i in range(N // CHUNK)
    ]
    prob = LeastSquares(da.concatenate(blocks), y)
    ref = LeastSquares(X, y)
    loaded.clear()
    idx = np.array([80, 230, 81, 149])  # rows of chunks 1 and 3
    x = da.from_array(np.ones(D), chunks=-1)
    f, g = dask.compute(*prob.batch_value_and_grad(x, idx))
    f_ref, g_ref = ref.batch_value_and_grad(np.ones(D), idx)
    assert sorted(loaded) == [1, 3]
    np.testing.assert_allclose(g, g_ref, rtol=1e-13)
    np.testing.assert_allclose(f, f_ref, rtol=1e-13)


# --------------------------------------------------------------------------- solutions, runs


@pytest.mark.parametrize("name", ["ls", "ls-numpy-y", "ls-sparse"])
def test_least_squares_solution(name):
    ref, prob = PAIRS[name]
    np.testing.assert_allclose(prob.x_star, ref.x_star, rtol=0, atol=1e-10)
    np.testing.assert_allclose(prob.f_star, ref.f_star, rtol=1e-12)


def test_logistic_reference_solution():
    ref, prob = PAIRS["logreg"]
    a, b = ref.reference_solution(cache=False), prob.reference_solution(cache=False)
    assert a.converged and b.converged
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-8)
    np.testing.assert_allclose(b.fun, a.fun, rtol=1e-13)


@pytest.mark.parametrize("name", ["ls-sparse", "logreg-sparse"])
def test_minimize_on_sparse_chunks_follows_the_in_memory_run(name):
    ref, prob = PAIRS[name]
    options = {"lr": 1.0 / ref.L, "maxiter": 20, "gtol": 0.0}
    a = amopt.minimize(ref, np.zeros(ref.dim), method="am-mgd", options=options)
    b = amopt.minimize(prob, da.zeros(ref.dim, chunks=-1), method="am-mgd", options=options)
    # X^T r summed over chunks rounds differently from one CSR product, and the
    # exact numerator's f decrease / lr magnifies that: ~2e-13 of max|x| here
    scale = float(np.max(np.abs(a.x)))
    np.testing.assert_allclose(np.asarray(b.x), a.x, rtol=0, atol=1e-11 * scale)
    assert b.nit == a.nit == 20


# --------------------------------------------------------------------------- errors


def test_nonfinite_and_all_zero_data_are_rejected_as_in_memory():
    # the same messages as the in-memory problems: the first bad entry, the count
    X, y, _, _ = _dense()
    bad = X.copy()
    bad[200, 3] = np.nan
    bad[250, 1] = -np.inf
    S = _sparse()
    S.data[[5, 9]] = np.inf
    bad_y = y.copy()
    bad_y[[80, 3]] = np.inf
    binary = (y > 0).astype(int)
    cases = [
        (lambda X, y: LeastSquares(X, y), bad, y, r"X\[200, 3\] = nan \(2 non-finite in all\)"),
        (lambda X, y: LogisticRegression(X, y), S, binary, r"X\[\d+, \d+\] = inf \(2 non"),
        (lambda X, y: LeastSquares(X, y), X, bad_y, r"y\[3\] = inf \(2 non-finite in all\)"),
        (lambda X, y: LeastSquares(X, y), np.zeros((N, D)), y, "all-zero X of shape"),
    ]
    for make, data, targets, message in cases:
        with pytest.raises(ValueError) as in_memory:
            make(data, targets)
        lazy_targets = _chunked(targets) if targets.dtype.kind == "f" else targets
        with pytest.raises(ValueError, match=message) as chunked:
            make(_chunked(data), lazy_targets)
        assert str(chunked.value) == str(in_memory.value)


def test_shapes_and_types_are_checked():
    X, y, _, _ = _dense()
    Xd = _chunked(X)
    with pytest.raises(ValueError, match=r"X has 300 rows but y has 299 entries"):
        LeastSquares(Xd, _chunked(y[:-1]))
    with pytest.raises(ValueError, match=r"X must be 2-D \(n_samples, n_features\), got shape"):
        LeastSquares(_chunked(y), y)
    with pytest.raises(ValueError, match=r"y must be 1-D, got shape \(300, 1\)"):
        LeastSquares(Xd, _chunked(y[:, None]))
    with pytest.raises(TypeError, match="X must hold real numbers, got dtype complex128"):
        LeastSquares(Xd.astype(complex), y)
    unknown = Xd[Xd[:, 0] > 0]
    with pytest.raises(ValueError, match=r"known chunk sizes.*compute_chunk_sizes"):
        LeastSquares(unknown, y[:10])
    prob = LeastSquares(Xd, y)
    strict = pytest.importorskip("array_api_strict")
    with pytest.raises(TypeError, match="evaluates dask or NumPy arrays, got array_api_strict"):
        prob.value_and_grad(strict.zeros(D, dtype=strict.float64))


def test_integer_design_is_used_as_float64():
    X, y, _, _ = _dense()
    Xi = np.round(X * 4).astype(np.int32)
    ref, prob = LeastSquares(Xi, y), LeastSquares(_chunked(Xi), y)
    np.testing.assert_allclose(prob.L, ref.L, rtol=1e-12)
    f, g = prob.value_and_grad(np.ones(D))
    np.testing.assert_allclose(g, ref.grad(np.ones(D)), rtol=1e-13)
