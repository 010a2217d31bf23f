"""The fast paths behind the performance targets give the reference iterates.

* ``fused=True`` (C kernels of ``amopt.torch._fused``) against the readable
  single-tensor reference, on every valid input of the OptimizerInfo table, at
  the foreach tolerance (1e-12, float64); with several OpenMP threads; in
  float32; and the fallback to foreach (with a warning) where the kernels do
  not apply.
* The NumPy path of ``am_momentum_step`` (``amopt.backends.numpy``) against the
  array-API path: bit for bit on arrays of at most ``BLOCK`` elements, to float
  rounding on larger ones (blocked reductions), and caller arrays untouched.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import amopt
from amopt.backends import numpy as _numpy_fast
from amopt.optimize import steps as _core

torch = pytest.importorskip("torch")

import torch_optim_info as info_db  # noqa: E402
from torch_optim_info import (  # noqa: E402
    AMADAMW_INFO,
    AMSGD_INFO,
    N_STEPS,
    OPTIM_DB,
    NoisyProblem,
    case_id,
    run_torch,
    valid_cases,
)

from amopt.torch import (  # noqa: E402
    AMSGD,
    AMAdamW,
    _fused,  # noqa: E402
)

FOREACH_TOL = 1e-12  # the tolerance of foreach against single-tensor in test_torch_optim
VALID = valid_cases()


def assert_iterates_close(actual, expected, tol, what=""):
    assert len(actual) == len(expected)
    for t, (xs_a, xs_e) in enumerate(zip(actual, expected, strict=True)):
        for i, (a, e) in enumerate(zip(xs_a, xs_e, strict=True)):
            np.testing.assert_allclose(
                a, e, rtol=tol, atol=tol, err_msg=f"{what}: step {t}, tensor {i}"
            )


@pytest.fixture(autouse=True)
def _no_fallback_warnings():
    """Any FusedFallbackWarning inside a test is an error unless the test expects it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", _fused.FusedFallbackWarning)
        yield


@pytest.fixture
def kernels_unavailable(monkeypatch):
    """Pretend the fused kernels could not be built (and forget the warnings given)."""
    monkeypatch.setitem(_fused._state, "tried", True)
    monkeypatch.setitem(_fused._state, "lib", None)
    monkeypatch.setitem(_fused._state, "error", "RuntimeError: simulated for the test")
    monkeypatch.setattr(_fused, "_warned", set())


def _grads(params, t, seed=100):
    g = torch.Generator().manual_seed(seed + t)
    for p in params:
        grad = torch.randn(p.shape, generator=g, dtype=torch.float64) + 0.5 * p.detach().double()
        p.grad = grad.to(p.dtype)


# --------------------------------------------------------------------------- fused kernels


def test_fused_kernels_are_built_where_there_is_a_compiler():
    """With a C compiler the fused path must really run (the other tests would otherwise
    only check the foreach fallback); without one, the fallback is the documented path."""
    if not _fused._compiler():
        pytest.skip("no C compiler here: fused=True falls back to foreach")
    status = _fused.fused_status()
    assert status["available"], status["error"]


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_fused_matches_single_tensor(case):
    info, inp = case
    prob = NoisyProblem()
    kwargs = info.kwargs(inp)
    single, betas_s, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=False)
    fused, betas_f, _, _ = run_torch(
        info, {**kwargs, "fused": True}, prob, prob.x0(), N_STEPS, foreach=False
    )
    assert_iterates_close(fused, single, FOREACH_TOL, "fused vs single")
    np.testing.assert_allclose(betas_f, betas_s, rtol=FOREACH_TOL, atol=FOREACH_TOL)


@pytest.mark.parametrize("info", [AMSGD_INFO, AMADAMW_INFO], ids=lambda i: i.name)
@pytest.mark.parametrize("per_layer", [False, True])
def test_fused_large_tensors_several_threads(info, per_layer):
    """A tensor above the OpenMP threshold, split across threads, still matches at 1e-12."""
    shapes = ((257, 271), (5,))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        runs = []
        for fused in (False, True):
            g = torch.Generator().manual_seed(0)
            params = [
                torch.nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float64))
                for s in shapes
            ]
            opt = info.optim_cls(
                params, **{**info.required, "per_layer": per_layer, "fused": fused}
            )
            for t in range(4):
                _grads(params, t)
                opt.step()
            runs.append(([p.detach().clone() for p in params], opt.latest_betas()[0]))
    finally:
        torch.set_num_threads(threads)
    (xs_s, betas_s), (xs_f, betas_f) = runs
    for a, b in zip(xs_f, xs_s, strict=True):
        torch.testing.assert_close(a, b, rtol=FOREACH_TOL, atol=FOREACH_TOL)
    for a, b in zip(betas_f, betas_s, strict=True):
        torch.testing.assert_close(a, b, rtol=FOREACH_TOL, atol=FOREACH_TOL)


@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_fused_float32_matches_single_tensor_to_float32_rounding(info):
    params_by_path = {}
    for fused in (False, True):
        g = torch.Generator().manual_seed(3)
        params = [
            torch.nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float32))
            for s in ((64, 33), (1000,))
        ]
        opt = info.optim_cls(params, **{**info.required, "fused": fused, "lr": 1e-2})
        for t in range(10):
            _grads(params, t)
            opt.step()
        params_by_path[fused] = (params, opt.latest_betas()[0])
        assert all(b.dtype == torch.float32 for b in opt.latest_betas()[0])
    (ps, bs), (pf, bf) = params_by_path[False], params_by_path[True]
    for a, b in zip(pf, ps, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(bf, bs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("info", [AMSGD_INFO, AMADAMW_INFO], ids=lambda i: i.name)
def test_fused_state_dict_round_trip_and_deepcopy(info):
    params = [torch.nn.Parameter(torch.randn(5, 4, dtype=torch.float64)) for _ in range(2)]
    opt = info.optim_cls(params, **{**info.required, "fused": True})
    for t in range(3):
        _grads(params, t)
        opt.step()
    assert set(opt.state[params[0]]) == set(info.state_keys)
    params2, opt2 = copy.deepcopy((params, opt))
    params3 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt3 = info.optim_cls(params3, **{**info.required, "fused": True})
    opt3.load_state_dict(copy.deepcopy(opt.state_dict()))
    for t in range(3, 6):
        for ps, o in ((params, opt), (params2, opt2), (params3, opt3)):
            _grads(ps, t)
            o.step()
    for a, b, c in zip(params, params2, params3, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_fused_step_bumps_version_counters():
    p = torch.nn.Parameter(torch.randn(10, dtype=torch.float64))
    opt = AMAdamW([p], lr=0.1, fused=True)
    _grads([p], 0)
    before = p._version
    opt.step()
    assert p._version > before
    assert opt.state[p]["exp_avg"]._version > 0


def test_fused_and_foreach_together_are_rejected():
    p = [torch.nn.Parameter(torch.zeros(3))]
    # as torch.optim: a RuntimeError
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together"):
        AMAdamW(p, fused=True, foreach=True)
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together"):
        AMSGD(p, lr=0.1, fused=True, foreach=True)
    with pytest.raises(TypeError, match=r"fused must be True, False or None; got fused=1"):
        AMSGD(p, lr=0.1, fused=1)


@pytest.mark.parametrize("info", [AMSGD_INFO, AMADAMW_INFO], ids=lambda i: i.name)
def test_fused_without_kernels_falls_back_to_foreach(info, kernels_unavailable):
    prob = NoisyProblem()
    kwargs = info.kwargs(info.inputs[0])
    foreach, betas_m, _, _ = run_torch(info, kwargs, prob, prob.x0(), 5, foreach=True)
    with pytest.warns(_fused.FusedFallbackWarning, match="simulated for the test"):
        fused, betas_f, _, _ = run_torch(
            info, {**kwargs, "fused": True}, prob, prob.x0(), 5, foreach=False
        )
    assert_iterates_close(fused, foreach, 0.0, "fallback vs foreach")
    np.testing.assert_array_equal(betas_f, betas_m)


@pytest.mark.parametrize("info", [AMSGD_INFO, AMADAMW_INFO], ids=lambda i: i.name)
def test_fused_unsupported_dtype_falls_back_with_a_warning(info, monkeypatch):
    monkeypatch.setattr(_fused, "_warned", set())
    params = [torch.nn.Parameter(torch.randn(6, dtype=torch.bfloat16))]
    opt = info.optim_cls(params, **{**info.required, "fused": True})
    _grads(params, 0)
    with pytest.warns(_fused.FusedFallbackWarning, match="float32/float64"):
        opt.step()
    assert opt.latest_betas()[0][0].dtype == torch.float32


def test_fused_kernels_can_be_disabled(monkeypatch):
    """AMOPT_FUSED=0 disables the kernels (the library is looked up again)."""
    monkeypatch.setenv("AMOPT_FUSED", "0")
    monkeypatch.setattr(
        _fused, "_state", {"tried": False, "lib": None, "error": None, "path": None}
    )
    status = _fused.fused_status()
    assert not status["available"] and "AMOPT_FUSED=0" in status["error"]


def test_shapes_of_the_info_table_are_covered():
    """The OptimizerInfo problem has tensors of several shapes (a 2-D one among them)."""
    assert any(len(s) == 2 for s in info_db.SHAPES)


# --------------------------------------------------------------------------- NumPy core path

AM_OPTIONS = [
    {},
    {"numerator": "linear", "lam": 0.1, "beta_max": 0.9},
    {"lam": 0.3},
    {"weight_decay": 0.05},
    {"per_layer": True},
    {"variant": "clip", "beta_min": 0.4},
    {"variant": "restart", "numerator": "linear"},
]


def _generic(monkeypatch):
    monkeypatch.setattr(_numpy_fast, "eligible", lambda *groups: False)


def _trajectory(xs, n_steps, dtype, options, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    xs = [x.astype(dtype) for x in xs]
    state = amopt.am_momentum_init(xs)
    out = []
    for t in range(n_steps):
        gs = [(1.5 * x + 0.3 * rng.standard_normal(x.shape)).astype(dtype) for x in xs]
        f = float(sum(0.75 * np.sum(x.astype(np.float64) ** 2) for x in xs)) + 0.01 * t
        xs, state, beta = _core.am_momentum_step(list(xs), gs, state, lr=0.1, f=f, **options)
        xs = list(xs)
        out.append(([x.copy() for x in xs], beta))
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("options", AM_OPTIONS, ids=repr)
def test_numpy_path_is_bit_identical_on_small_arrays(options, dtype, monkeypatch):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((7, 3)), rng.standard_normal(11)]
    fast = _trajectory(xs, 12, dtype, options)
    _generic(monkeypatch)
    ref = _trajectory(xs, 12, dtype, options)
    for (xf, bf), (xr, br) in zip(fast, ref, strict=True):
        for a, b in zip(xf, xr, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
        bf = bf if isinstance(bf, tuple) else (bf,)
        br = br if isinstance(br, tuple) else (br,)
        for a, b in zip(bf, br, strict=True):
            assert type(a) is type(b) and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("f_type", [float, np.float64, np.float32])
def test_numpy_path_float32_scope_with_any_f_type(f_type, monkeypatch):
    """float32 arrays: the same iterates and betas (float64 sums) whatever the type of f."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(9).astype(np.float32)
    runs = []
    for generic in (False, True):
        if generic:
            _generic(monkeypatch)
        xs, state, out = x, amopt.am_momentum_init(x), []
        for t in range(5):
            g = (2.0 * xs + 0.1 * t).astype(np.float32)
            xs, state, beta = _core.am_momentum_step(xs, g, state, lr=0.1, f=f_type(3.0 - t))
            out.append((xs.copy(), beta))
        runs.append(out)
    for (xf, bf), (xr, br) in zip(*runs, strict=True):
        np.testing.assert_array_equal(xf, xr)
        assert xf.dtype == np.float32
        assert bf.dtype == br.dtype == np.float64
        np.testing.assert_array_equal(bf, br)


@pytest.mark.parametrize("options", AM_OPTIONS[:5], ids=repr)
def test_numpy_path_on_large_arrays_matches_to_rounding(options, monkeypatch):
    rng = np.random.default_rng(2)
    n = _numpy_fast.BLOCK * 3 + 17
    xs = [rng.standard_normal(n), rng.standard_normal(40)]
    fast = _trajectory(xs, 6, np.float64, options)
    _generic(monkeypatch)
    ref = _trajectory(xs, 6, np.float64, options)
    for (xf, bf), (xr, br) in zip(fast, ref, strict=True):
        for a, b in zip(xf, xr, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(bf), np.asarray(br), rtol=1e-12, atol=1e-12)


def test_numpy_path_leaves_caller_arrays_alone():
    rng = np.random.default_rng(3)
    for n in (5, _numpy_fast.BLOCK + 5):
        x, g, d = (rng.standard_normal(n) for _ in range(3))
        copies = [a.copy() for a in (x, g, d)]
        state = _core.AMState(step=1, d=(d,), f_prev=2.0)
        new_x, new_state, _ = _core.am_momentum_step(x, g, state, lr=0.1, f=1.0)
        for a, c in zip((x, g, d), copies, strict=True):
            np.testing.assert_array_equal(a, c)
        assert not np.shares_memory(new_x, x) and not np.shares_memory(new_state.d[0], d)


def test_numpy_path_first_step_and_degenerate_scope():
    """d = g (step 0) and g = d = 0 give beta = 0 on the fast path, as on the reference."""
    x = np.array([1.0, -2.0])
    _, state, beta = _core.am_momentum_step(x, np.zeros(2), _core.am_momentum_init(x), lr=0.1)
    assert float(beta) == 0.0
    _, _, beta = _core.am_momentum_step(x, np.zeros(2), state, lr=0.1, f=1.0)
    assert float(beta) == 0.0 and np.isfinite(beta)


def test_numpy_path_not_taken_for_mixed_or_foreign_arrays():
    a32, a64 = np.zeros(3, np.float32), np.zeros(3)
    assert _numpy_fast.eligible((a64,), (a64,))
    assert not _numpy_fast.eligible((a32,), (a64,))
    assert not _numpy_fast.eligible((np.zeros(3, np.float16),))
    assert not _numpy_fast.eligible((a64.view(np.matrix),))
    assert not _numpy_fast.eligible((torch.zeros(3),))
