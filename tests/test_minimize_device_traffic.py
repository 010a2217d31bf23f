"""``minimize`` on device arrays moves little more memory than a hand-written loop.

On a large array a GPU iteration costs the bytes its operations read and write. These
tests count them on the CPU with torch tensors, which take the path of CuPy and torch
CUDA arrays, with :class:`benchmarks.counters.Traffic` (a ``TorchDispatchMode``:
the sizes of each operation's tensor inputs and outputs, 0-d tensors and views aside),
against the heavy-ball loop of the ``gpu-quad-*`` bench rows written in torch. They
also check what the loop gave up to get there: the per-iteration copy of the returned
gradient, reading the iterate's finiteness, and ``max|g|`` for the AM momentum
methods, while the statuses and the iterates stay NumPy's.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import amopt  # noqa: E402
from amopt.problems import LogisticRegression  # noqa: E402
from benchmarks.counters import HostReads, Traffic  # noqa: E402
from benchmarks.standins import minimize_traffic  # noqa: E402

N = 20_000


def test_traffic_counts_inputs_and_outputs_once_and_skips_views():
    x = torch.ones(1000, dtype=torch.float64)
    y = torch.ones(1000, dtype=torch.float64)
    with Traffic(full=1000) as t:
        z = x + y  # reads 2 arrays, writes 1
        s = x @ x  # reads x once; a 0-d result
        v = z.reshape(10, 100)  # a view: no traffic
        w = z[:500] * 2.0  # a half-size view read, a half-size write
    assert (t.bytes, t.full_ops) == (3 * 8000 + 8000 + 8000, 2)
    assert t.total_ops == 5 and float(s) == 1000.0 and v.shape == (10, 100) and w.shape == (500,)


@pytest.fixture(scope="module")
def hand():
    return minimize_traffic(None, N)


def test_the_hand_loop_makes_nineteen_array_passes(hand):
    # h*x (3), hx*x (3), sum (1), beta*d (2), (1-beta)*g (2), + (3), lr*d (2), x - (3)
    assert hand["bytes"] == pytest.approx(19.0, abs=1e-3)
    assert hand["full_ops"] == 8


@pytest.mark.parametrize(
    ("method", "options", "ratio", "extra_full_ops"),
    [
        ("gd", {}, 1.0, 0),
        ("mgd", {}, 1.1, 1),
        ("mgd", {"gtol": 0.0}, 1.1, 1),
        ("am-mgd", {}, 1.3, 3),
        ("am-mgd", {"gtol": 0.0}, 1.3, 3),
        ("am-mgd", {"numerator": "linear"}, 1.3, 3),
    ],
)
def test_bytes_per_iteration_against_the_hand_loop(hand, method, options, ratio, extra_full_ops):
    got = minimize_traffic(method, N, **options)
    assert got["bytes"] <= ratio * hand["bytes"] + 1e-3
    assert got["full_ops"] <= hand["full_ops"] + extra_full_ops


@pytest.mark.parametrize("method", ["adam", "am-adamw"])
def test_the_adam_family_reads_x_and_g_once_each(method):
    """The Adam family has no bound on its iterates: one sum of x and one min/max of g,
    one pass each, on top of the objective and the step."""
    full = minimize_traffic(method, N, lr=1e-3)
    quad = 7.0  # h*x, hx*x, sum
    step = minimize_traffic(method, N, lr=1e-3, gtol=0.0)["bytes"] - quad - 2.0
    assert full["bytes"] == pytest.approx(quad + step + 2.0, abs=1e-3)


def _buffered(xp, n):
    """f = |x - 1|^2 / 2 whose gradient is returned in one buffer, overwritten by each call."""
    buf = xp.zeros(n, dtype=xp.float64)

    def fun(x):
        if isinstance(buf, np.ndarray):
            np.subtract(x, 1.0, out=buf)
        else:
            torch.sub(x, 1.0, out=buf)
        return 0.5 * (buf * buf).sum(), buf

    return fun, buf


@pytest.mark.parametrize("method", ["gd", "mgd", "am-mgd", "adam", "am-adamw"])
def test_a_reused_gradient_buffer_and_x0_are_safe(method):
    results = []
    for xp, x0 in ((np, np.arange(5.0)), (torch, torch.arange(5.0, dtype=torch.float64))):
        keep = x0.clone() if xp is torch else x0.copy()
        fun, buf = _buffered(xp, 5)
        res = amopt.minimize(fun, x0, jac=True, method=method, options={"lr": 0.1, "maxiter": 7})
        assert (x0 == keep).all()  # the caller's x0 is never written
        assert res.jac is not buf
        fun(xp.zeros(5, dtype=xp.float64))  # the caller's buffer changes: the result must not
        results.append((np.asarray(res.x.tolist()), np.asarray(res.jac.tolist()), res.nit))
    (x_np, g_np, nit_np), (x_t, g_t, nit_t) = results
    assert nit_np == nit_t == 7
    np.testing.assert_allclose(x_t, x_np, rtol=0, atol=1e-13)
    np.testing.assert_allclose(g_t, g_np, rtol=0, atol=1e-13)
    np.testing.assert_allclose(g_np, x_np - 1.0, rtol=0, atol=1e-15)


def _quadratic(xp):
    h = xp.asarray(np.geomspace(0.5, 1.0, 50), dtype=xp.float64)

    def fun(x):
        hx = h * x
        return 0.5 * (hx * x).sum(), hx

    return fun


@pytest.mark.parametrize("method", ["mgd", "am-mgd", "am-mgd-linear"])
@pytest.mark.parametrize("gtol", [1e-3, 1e-6])
def test_gtol_stops_where_numpy_stops(method, gtol):
    """The AM methods test gtol on bounds from <g,g> until they cannot decide; then on
    max|g| itself: the run stops at NumPy's iteration either way."""
    opts = {"lr": 1.0, "maxiter": 2000, "gtol": gtol}
    if method.startswith("am"):
        opts |= {"lam": 0.1, "beta_max": 0.9}
    if method == "am-mgd-linear":
        method, opts = "am-mgd", {**opts, "numerator": "linear"}
    want = amopt.minimize(_quadratic(np), np.ones(50), jac=True, method=method, options=opts)
    got = amopt.minimize(
        _quadratic(torch), torch.ones(50, dtype=torch.float64), jac=True, method=method,
        options=opts,
    )  # fmt: skip
    assert want.status == 0 and 1 < want.nit < 2000
    assert (got.status, got.nit) == (want.status, want.nit)
    assert np.max(np.abs(np.asarray(got.jac.tolist()))) <= gtol


@pytest.mark.parametrize("method", ["gd", "mgd", "am-mgd", "sgd", "msgd"])
def test_iterates_near_the_largest_float_are_checked_as_numpy_checks_them(method):
    """float32 iterates that triple every step: the bound of max|x| first proves them
    finite, then passes its limit (float32's max / 16), after which the loop reads their
    finiteness again, until they overflow where NumPy's overflow."""
    opts = {"lr": 4.0, "maxiter": 60, "gtol": 0.0}
    if method in ("sgd", "msgd"):
        opts |= {"batch_size": 2, "seed": 0}
    if method == "am-mgd":
        opts |= {"numerator": "linear", "lam": 0.1, "beta_max": 0.9}
    x0 = np.array([1e30, -3e30, 5.0], dtype=np.float32)

    class Growing:
        n_samples = 4

        def __init__(self, xp):
            self.xp = xp

        def value_and_grad(self, x):
            return self.xp.sum(x * 0.0), -0.5 * x  # a gradient step multiplies x by 3

        def batch_value_and_grad(self, x, idx):
            return self.value_and_grad(x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = amopt.minimize(Growing(np), x0, method=method, options=opts)
        got = amopt.minimize(Growing(torch), torch.from_numpy(x0), method=method, options=opts)
    assert want.status == 2 and want.nit >= 10
    assert (got.status, got.nit) == (want.status, want.nit)
    np.testing.assert_array_equal(np.asarray(got.x.tolist(), dtype=np.float32), want.x)


def test_a_finite_x0_whose_sum_overflows_is_finite():
    x0 = np.array([3e38, 3e38, -1.0], dtype=np.float32)
    for method in ("gd", "adam"):
        res = amopt.minimize(
            lambda x: (x[2] * x[2], torch.stack([x[0] * 0, x[1] * 0, 2 * x[2]])),
            torch.from_numpy(x0.copy()), jac=True, method=method,
            options={"lr": 0.25, "maxiter": 3, "gtol": 0.0},
        )  # fmt: skip
        assert res.status == 1 and res.nit == 3, method


def _dense_logistic(n=2000, d=20):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    y = np.where(X @ rng.standard_normal(d) > 0, 1.0, -1.0)
    return X, y


def test_the_binary_logistic_batch_is_a_handful_of_operations():
    X, y = _dense_logistic()
    prob = LogisticRegression(torch.from_numpy(X), y)
    x = torch.full((20,), 0.1, dtype=torch.float64)
    idx = torch.arange(7, 263)
    prob.batch_value_and_grad(x, idx)  # the design's device copy is made once
    counter = HostReads()
    with counter:
        f, g = prob.batch_value_and_grad(x, idx)
    # two gathers, X x, t *, -, logaddexp, sum, / m, -, exp, t *, X^T s (and its view), / m
    assert counter.total_ops <= 14 and counter.syncs == 0
    assert "aten.where.self" not in counter.ops and "aten._to_copy.default" not in counter.ops
    want_f, want_g = LogisticRegression(X, y).batch_value_and_grad(x.numpy(), idx.numpy())
    assert math.isclose(float(f), want_f, rel_tol=1e-14)
    np.testing.assert_allclose(g.numpy(), want_g, rtol=1e-13, atol=1e-16)


def test_am_sgd_on_a_device_design_reads_once_per_iteration():
    X, y = _dense_logistic()
    prob = LogisticRegression(torch.from_numpy(X), y)
    x0 = torch.zeros(20, dtype=torch.float64)
    counts = []
    for k in (10, 30):
        counter = HostReads()
        with counter:
            res = amopt.minimize(
                prob, x0, method="am-sgd", options={"lr": 0.1, "maxiter": k, "batch_size": 256}
            )
        assert res.nit == k
        counts.append(counter)
    a, b = counts
    assert (b.syncs - a.syncs) / 20 == 1.0
    # the batch (14), the AM sums (v, 3 dots), the apply (4), the read's stack, the slice
    assert (b.total_ops - a.total_ops) / 20 <= 24
