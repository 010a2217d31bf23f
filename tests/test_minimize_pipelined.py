"""The pipelined device loop: the host reads iterate t while the step to t + 1 is queued.

On an asynchronous device (torch CUDA tensors, CuPy arrays) ``minimize`` runs its
loop, full-batch or mini-batch, one step ahead of its reads
(``amopt.optimize.loop._PipelinedReader``). torch
tensors on the CPU take it when ``amopt.optimize.loop._PIPELINE`` forces it; a read there is
made when the loop waits for it, so the order of evaluations and waits is the
pipeline's. The reference is the waiting loop (``_PIPELINE = False``) on the same
tensors and, for the non-finite runs, NumPy.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import amopt
from amopt.backends import device as _device
from amopt.backends import library_available
from amopt.optimize import loop as _loop

from test_minimize_device_syncs import (
    ADAM_FAMILY,
    FULL,
    STOCHASTIC,
    _Blowup,
    _DeviceLeastSquares,
    _per_iteration,
)

#: methods whose pipelined step is another formulation of the same rule (the whole
#: core step, its sums formed otherwise): equal within rounding, not bit for bit
REFORMULATED = {"am-adam", "am-adamw"}


@pytest.fixture
def pipelined(monkeypatch):
    def run(flag, *args, **kwargs):
        monkeypatch.setattr(_loop, "_PIPELINE", flag)
        return amopt.minimize(*args, **kwargs)

    return run


def _list_problem():
    """Two arrays, float64 and float32, and the least-squares objective over both."""
    gen = torch.Generator().manual_seed(1)
    targets = [
        torch.randn(5, 3, generator=gen, dtype=torch.float64),
        torch.randn(3, generator=gen),
    ]

    def fun(xs):
        return sum(0.5 * ((x - t) ** 2).sum() for x, t in zip(xs, targets, strict=True))

    def jac(xs):
        return [x - t for x, t in zip(xs, targets, strict=True)]

    return fun, jac, [torch.zeros(5, 3, dtype=torch.float64), torch.zeros(3)]


CASES = {
    "maxiter": {"maxiter": 30, "gtol": 0.0, "lr": 0.01},
    "gtol": {"maxiter": 500, "gtol": 1e-3, "lr": 0.05},
    "gtol-at-x0": {"maxiter": 5, "gtol": 1e9, "lr": 0.05},
    "maxiter-0": {"maxiter": 0, "lr": 0.05},
    "decay": {"maxiter": 40, "gtol": 1e-4, "lr": 0.05, "weight_decay": 0.1},
}


def _extra_evaluations(res, maxiter):
    """Evaluations the pipeline queued past the stop: the step after the returned
    iterate's successor was queued before the successor's values were read."""
    if res.status == 0:  # gtol at iterate nit: the step from it was queued if nit >= 1
        return 1 if 0 < res.nit < maxiter else 0
    if res.status == 2:  # iterate nit + 1 non-finite: the one after it queued too
        return 1 if res.nit + 1 < maxiter else 0
    return 0


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", FULL)
def test_pipelined_runs_are_the_runs_of_the_waiting_loop(pipelined, method, case):
    opts = dict(CASES[case])
    if method == "am-mgd" and case == "decay":
        opts["numerator"] = "exact"  # f + wd/2 |x|^2 enters the rule: formed on the device
    prob = _DeviceLeastSquares()
    x0 = torch.zeros(20, dtype=torch.float64)
    want = pipelined(False, prob, x0, method=method, options=opts)
    got = pipelined(True, prob, x0, method=method, options=opts)
    assert (got.nit, got.status, got.message) == (want.nit, want.status, want.message)
    assert got.nfev == want.nfev + _extra_evaluations(want, opts["maxiter"])
    if case == "gtol":
        assert want.status == 0 and 0 < want.nit < opts["maxiter"]  # the case is a gtol stop
    _assert_same_result(method, got, want)


def _assert_same_result(method, got, want):
    if method in REFORMULATED:
        # float64, a well-conditioned problem: the two formulations round differently
        np.testing.assert_allclose(got.x, want.x, rtol=1e-12, atol=1e-14)
        assert math.isclose(float(got.fun), float(want.fun), rel_tol=1e-12, abs_tol=1e-300)
        np.testing.assert_allclose(got.betas, want.betas, rtol=0, atol=1e-9)
    else:
        # the same operations on the same values in the same order
        assert torch.equal(got.x, want.x) and torch.equal(got.jac, want.jac)
        assert float(got.fun) == float(want.fun)
        if "betas" in want:
            np.testing.assert_array_equal(got.betas, want.betas)


class _Batches(_DeviceLeastSquares):
    """A consistent least-squares FiniteSum (``b = A x*``: mini-batch gradients vanish at
    the solution, so ``gtol`` can stop a mini-batch run) that records its batches."""

    def __init__(self):
        super().__init__(n=120, d=8)
        x_star = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)
        self.b = self.A @ x_star
        self.batches = []

    def batch_value_and_grad(self, x, idx):
        self.batches.append(idx)
        return super().batch_value_and_grad(x, idx)


BATCH_CASES = {
    "steps": {"maxiter": 30, "gtol": 0.0, "lr": 0.05},
    "gtol": {"maxiter": 3000, "gtol": 1e-3, "lr": 0.2},
    "maxiter-1": {"maxiter": 1, "lr": 0.05},
    "maxiter-0": {"maxiter": 0, "lr": 0.05},
    "replace": {"maxiter": 25, "lr": 0.05, "replace": True, "batch_size": 7},
    "decay": {"maxiter": 40, "gtol": 1e-4, "lr": 0.05, "weight_decay": 0.1},
}


def _extra_batches(res, maxiter):
    """Mini-batches the pipeline drew past a stop at iterate ``nit`` on its batch's
    values: the one at ``nit + 1``, when it was queued (none is drawn at ``maxiter``,
    where a run of its steps stops)."""
    return 1 if res.status in (0, 2) and 0 < res.nit and res.nit + 1 < maxiter else 0


@pytest.mark.parametrize("case", list(BATCH_CASES))
@pytest.mark.parametrize("method", STOCHASTIC + ADAM_FAMILY)
def test_pipelined_mini_batch_runs_are_the_runs_of_the_waiting_loop(pipelined, method, case):
    opts = {"batch_size": 16, "seed": 3} | BATCH_CASES[case]
    if method == "am-sgd" and case == "decay":
        opts["numerator"] = "exact"  # F of the mini-batch enters the rule, on the device
    runs = []
    for flag in (False, True):
        prob = _Batches()
        res = pipelined(
            flag, prob, torch.zeros(8, dtype=torch.float64), method=method, options=opts
        )
        runs.append((res, [idx.tolist() for idx in prob.batches]))
    (want, want_batches), (got, got_batches) = runs
    assert (got.nit, got.status, got.message) == (want.nit, want.status, want.message)
    extra = _extra_batches(want, opts["maxiter"])
    assert got.nfev == want.nfev + extra
    # the same mini-batches, drawn in the same order (one more past a stop)
    assert got_batches[: len(want_batches)] == want_batches
    assert len(got_batches) == len(want_batches) + extra
    if case == "gtol":
        assert want.status == 0 and 0 < want.nit < opts["maxiter"]  # the case is a gtol stop
    _assert_same_result(method, got, want)


@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("method", ["mgd", "am-mgd", "adamw", "am-adamw"])
def test_pipelined_parameter_lists_of_two_dtypes(pipelined, method, per_layer):
    fun, jac, x0 = _list_problem()
    opts = {"lr": 0.1, "gtol": 1e-3, "maxiter": 200}
    if method.startswith("am-"):
        opts["per_layer"] = per_layer
    want = pipelined(False, fun, x0, jac=jac, method=method, options=opts)
    got = pipelined(True, fun, x0, jac=jac, method=method, options=opts)
    assert (got.nit, got.status) == (want.nit, want.status)
    if method not in REFORMULATED:
        assert all(torch.equal(a, b) for a, b in zip(got.x, want.x, strict=True))
        if method.startswith("am-"):
            np.testing.assert_array_equal(got.betas, want.betas)
        return
    # the float32 array makes its scope's sums float32: the two formulations' betas
    # round apart at float32 resolution times the cancellation in the numerator (a
    # difference of sums, ~10 here), and so do the steps of both arrays
    for a, b in zip(got.x, want.x, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert got.betas.shape == want.betas.shape == ((want.nit, 2) if per_layer else (want.nit,))
    np.testing.assert_allclose(got.betas, want.betas, rtol=0, atol=1e-5)


def test_the_host_waits_one_step_behind_the_device_on_mini_batches(monkeypatch):
    """As in full batch, the mini-batch at t + 1 is drawn and evaluated before the wait
    for iterate t's values; none is drawn at ``maxiter``, whose iterate is read alone,
    and the last wait is the result's full objective."""
    prob = _Batches()
    waits = []
    real_values = _device.Pending.values

    def values(self):
        waits.append(len(prob.batches))
        return real_values(self)

    monkeypatch.setattr(_device.Pending, "values", values)
    monkeypatch.setattr(_loop, "_PIPELINE", True)
    maxiter = 8
    opts = {"maxiter": maxiter, "lr": 0.01, "batch_size": 16, "seed": 0}
    res = amopt.minimize(prob, torch.zeros(8, dtype=torch.float64), method="am-sgd", options=opts)
    assert res.nit == maxiter and res.message == amopt.STATUS_MESSAGES["maxiter"][1]
    assert waits == [1] + [min(t + 2, maxiter) for t in range(1, maxiter + 1)] + [maxiter]


@pytest.mark.parametrize("with_callback", [False, True])
def test_the_host_waits_one_step_behind_the_device(monkeypatch, with_callback):
    """At the wait for iterate t's values the evaluation at t + 1 is already queued
    (none past ``maxiter``); with a callback, which needs iterate t at once, the loop
    waits for each iterate before the next step."""
    prob = _DeviceLeastSquares()
    evaluations = []
    waits = []
    real_eval, real_values = prob.value_and_grad, _device.Pending.values

    def counted(x):
        evaluations.append(None)
        return real_eval(x)

    def values(self):
        waits.append(len(evaluations))
        return real_values(self)

    prob.value_and_grad = counted
    monkeypatch.setattr(_device.Pending, "values", values)
    monkeypatch.setattr(_loop, "_PIPELINE", True)
    maxiter = 8
    cb = (lambda r: None) if with_callback else None
    res = amopt.minimize(
        prob,
        torch.zeros(20, dtype=torch.float64),
        method="am-mgd",
        callback=cb,
        options={"maxiter": maxiter, "gtol": 1e-30, "lr": 0.01},
    )
    assert res.nit == maxiter
    # wait t (t = 0 .. maxiter) is for iterate t, whose evaluation is the (t + 1)-th
    if with_callback:
        assert waits[: maxiter + 1] == [t + 1 for t in range(maxiter + 1)]
    else:
        assert waits == [1] + [min(t + 2, maxiter + 1) for t in range(1, maxiter + 1)]


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("gd", {"lr": 3.0}),
        ("am-mgd", {"lr": 1e306}),
        ("adam", {"lr": 1e308}),
        ("mgd", {"lr": 3.0}),
        ("sgd", {"lr": 3.0}),
        ("am-sgd", {"lr": 3.0}),
        ("sgd", {"lr": 1e306}),  # the first step's iterate overflows
        ("msgd", {"lr": 1e306, "maxiter": 1}),  # ... and it is the last one
        ("am-adamw", {"lr": 1e308, "batch_size": 3}),
    ],
)
def test_pipelined_non_finite_runs_stop_where_numpy_stops(pipelined, method, options):
    opts = {"maxiter": 500, "gtol": 0.0, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = amopt.minimize(_Blowup(np), np.ones(3), method=method, options=opts)
        got = pipelined(
            True, _Blowup(torch), torch.ones(3, dtype=torch.float64), method=method, options=opts
        )
    assert got.status == want.status == 2 and got.nit == want.nit < 499
    np.testing.assert_array_equal(np.asarray(got.x.tolist()), want.x)
    assert float(got.fun) == want.fun
    assert len(got.get("betas", [])) == len(want.get("betas", []))


@pytest.mark.parametrize(
    ("method", "batch"), [(m, False) for m in FULL + STOCHASTIC] + [(m, True) for m in ADAM_FAMILY]
)
def test_one_synchronisation_per_pipelined_iteration(monkeypatch, method, batch):
    """Still one read per iteration; the rule on the device is its only extra work.

    Above the waiting loop: nothing for the fixed-momentum and Adam methods; for the
    AM methods the rule's arithmetic on 0-d arrays (algorithms.md's guarded ratio, its
    numerator and gamma: about 20 elementwise operations) and the forming of its sums
    and coefficients, fewer than 40 aten ops (views included).
    """
    waiting = _per_iteration(method, batch)
    monkeypatch.setattr(_loop, "_PIPELINE", True)
    syncs, ops = _per_iteration(method, batch)
    assert syncs <= 1.0
    if method.startswith("am-"):
        assert 0 < ops - waiting[1] < 40
    else:
        assert ops == waiting[1]


def test_which_arrays_are_pipelined():
    assert not _device.asynchronous([torch.zeros(2)])
    assert not _device.asynchronous([np.zeros(2)])
    assert not _device.asynchronous([])


def test_a_read_started_is_the_read(monkeypatch):
    """``start_read`` then ``values``: host numbers and device values in their order."""
    xp = _loop.array_namespace(torch.zeros(1))
    a, b = torch.tensor(2.5, dtype=torch.float64), torch.tensor(-1.0, dtype=torch.float32)
    pending = _device.start_read(xp, [a, 7, np.float64(3.0), b])
    assert pending.values() == [2.5, 7.0, 3.0, -1.0] == _device.read(xp, [a, 7, 3.0, b])


# --------------------------------------------------------------------------- GPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("method", "batch"),
    [("mgd", None), ("am-mgd", None), ("am-adamw", None), ("am-sgd", 16), ("am-adamw", 16)],
)
def test_cuda_runs_are_pipelined_and_the_waiting_runs(method, batch):
    prob = _DeviceLeastSquares()
    prob.A, prob.b = prob.A.cuda(), prob.b.cuda()
    x0 = torch.zeros(20, dtype=torch.float64, device="cuda")
    assert _device.asynchronous([x0])
    opts = {"maxiter": 300, "gtol": 1e-4, "lr": 0.05}
    if batch is not None:
        opts |= {"batch_size": batch, "seed": 0, "gtol": 0.0}
    got = amopt.minimize(prob, x0, method=method, options=opts)
    _loop._PIPELINE = False
    try:
        want = amopt.minimize(prob, x0, method=method, options=opts)
    finally:
        _loop._PIPELINE = None
    assert (got.nit, got.status) == (want.nit, want.status)
    np.testing.assert_allclose(got.x.cpu(), want.x.cpu(), rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(not library_available("cupy"), reason="needs CuPy and a GPU")
def test_cupy_reads_are_asynchronous_and_exact():
    import array_api_compat.cupy as cpx
    import cupy

    values = [cupy.asarray(1.5), 4, cupy.asarray(np.float32(0.25)), cupy.asarray(-2.0)]
    assert _device.asynchronous([values[0]])
    pending = _device.start_read(cpx, values)
    assert pending.values() == [1.5, 4.0, 0.25, -2.0]


def test_the_device_rule_takes_the_library_behind_the_compat_namespace():
    """torch's and CuPy's own functions for the rule (compat's CuPy ``clip`` assigns
    through boolean masks, which read their counts to the host); others unchanged."""
    import array_api_compat.numpy as npx
    import array_api_compat.torch as tx

    from amopt.backends import plain_namespace

    assert plain_namespace(tx) is torch
    assert plain_namespace(npx) is npx


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("scopes", [1, 3])
def test_the_device_rule_on_a_numpy_like_module_is_the_host_rule(exact, scopes):
    """The device rule's calls on a NumPy-like library module (CuPy's API is NumPy's),
    here NumPy itself, give the host rule's betas and gammas bit for bit."""
    from amopt.core import rule as _rule
    from amopt.core.config import AMConfig
    from amopt.optimize import split as _split

    rng = np.random.default_rng(3)
    values = []
    for _ in range(scopes):  # <v,v>, <g,g>, <v,g> with |<v,g>| <= |v||g|
        vv, gg = rng.uniform(0.1, 2.0, 2)
        values += [vv, gg, rng.uniform(-1, 1) * math.sqrt(vv * gg)]
    config = AMConfig.from_options({"per_layer": scopes > 1})
    f_dec = 0.3 if exact else None
    host = _split._host_rule(
        _rule.momentum_beta,
        _split._momentum_sums_of(values, exact),
        5 if exact else 3,
        config,
        lr=0.1,
        f_decrease=f_dec,
    )
    device = _rule.momentum_beta_of_dots(
        np,
        np.reshape(np.stack([np.asarray(v) for v in values]), (-1, 3)),
        config,
        lr=0.1,
        exact=exact,
        f_decrease=None if f_dec is None else np.asarray(f_dec),
    )
    for h, d in zip(host, device, strict=True):
        np.testing.assert_array_equal(np.reshape(h, -1), np.reshape(d, -1))
