"""``amopt.torch`` optimizers: numerics against independent references, and torch.optim behaviour.

Driven by the OptimizerInfo table of ``torch_optim_info.py``: every valid
input is checked against the array-API core and the NumPy oracle on identical
gradients (float64, 1e-10), foreach against single-tensor (1e-12), and every
error input for its exception and message.
"""

from __future__ import annotations

import copy
import doctest
import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_optim_info as info_db  # noqa: E402
from torch_optim_info import (  # noqa: E402
    AMADAMW_INFO,
    AMSGD_INFO,
    N_STEPS,
    OPTIM_DB,
    NoisyProblem,
    case_id,
    error_cases,
    run_torch,
    valid_cases,
)

import amopt.torch as amtorch  # noqa: E402
from amopt.torch import AMSGD, AMAdam, AMAdamW, am_adamw, amsgd  # noqa: E402

FOREACH_TOL = 1e-12
CORE_TOL = 1e-10
VALID = valid_cases()
ERRORS = error_cases()


def assert_iterates_close(actual, expected, tol, what=""):
    assert len(actual) == len(expected)
    for t, (xs_a, xs_e) in enumerate(zip(actual, expected, strict=True)):
        for i, (a, e) in enumerate(zip(xs_a, xs_e, strict=True)):
            np.testing.assert_allclose(
                a, e, rtol=tol, atol=tol, err_msg=f"{what}: step {t}, tensor {i}"
            )


def _problem():
    return NoisyProblem()


def _params(shapes=info_db.SHAPES, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float64).to(dtype))
        for s in shapes
    ]


def _set_grads(params, t, *, seed=100):
    g = torch.Generator().manual_seed(seed + t)
    for p in params:
        x = p.detach().to(device="cpu", dtype=torch.float64)
        grad = torch.randn(p.shape, generator=g, dtype=torch.float64) + 0.5 * x
        p.grad = grad.to(device=p.device, dtype=p.dtype)


# --------------------------------------------------------------------------- the table


@pytest.mark.parametrize("case", ERRORS, ids=case_id)
def test_error_inputs(case):
    info, err = case
    params = _params()
    if err.in_param_group:
        groups = [{"params": params[:1]}, {"params": params[1:], **err.kwargs}]
        with pytest.raises(err.error_type, match=err.error_regex):
            info.optim_cls(groups, **info.required)
    else:
        with pytest.raises(err.error_type, match=err.error_regex):
            info.optim_cls(params, **{**info.required, **err.kwargs})


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_foreach_matches_single_tensor(case):
    info, inp = case
    prob = _problem()
    kwargs = info.kwargs(inp)
    single, betas_s, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=False)
    multi, betas_m, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=True)
    assert_iterates_close(multi, single, FOREACH_TOL, "foreach vs single")
    np.testing.assert_allclose(betas_m, betas_s, rtol=FOREACH_TOL, atol=FOREACH_TOL)


@pytest.mark.parametrize("chunk", [5, 12])
@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_foreach_in_small_chunks_matches_single_tensor(case, chunk, monkeypatch):
    """The CPU foreach kernels run chunk by chunk: tensors cut into pieces (a 12-element
    tensor into 5 + 5 + 2) and pieces of several tensors packed into one chunk."""
    import amopt.torch._common as common

    info, inp = case
    prob = _problem()
    kwargs = info.kwargs(inp)
    single, betas_s, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=False)
    monkeypatch.setattr(common, "CPU_CHUNK", chunk)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # chunks of CPU_CHUNK elements
    multi, betas_m, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=True)
    assert_iterates_close(multi, single, FOREACH_TOL, "foreach (small chunks) vs single")
    np.testing.assert_allclose(betas_m, betas_s, rtol=FOREACH_TOL, atol=FOREACH_TOL)


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_matches_array_api_core(case, foreach):
    info, inp = case
    prob = _problem()
    kwargs = info.kwargs(inp)
    got, betas, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=foreach)
    ref, ref_betas = info.core_run(prob.x0(), prob, N_STEPS, kwargs)
    assert_iterates_close(got, ref, CORE_TOL, "torch vs amopt core")
    np.testing.assert_allclose(betas, ref_betas, rtol=CORE_TOL, atol=CORE_TOL)


@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_matches_oracle(case):
    info, inp = case
    prob = _problem()
    kwargs = info.kwargs(inp)
    got, betas, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS)
    ref, ref_betas = info.oracle_run(prob.x0(), prob, N_STEPS, kwargs)
    assert_iterates_close(got, ref, CORE_TOL, "torch vs oracle")
    np.testing.assert_allclose(betas, ref_betas, rtol=CORE_TOL, atol=CORE_TOL)


def test_betas_of_the_test_problem_are_not_trivial():
    """The table's problem exercises the guard, the interior and the cap of every rule."""
    prob = _problem()
    for info in OPTIM_DB:
        _, betas, _, _ = run_torch(info, info.kwargs(info.inputs[0]), prob, prob.x0(), N_STEPS)
        cap = 0.9
        interior = (betas > 0.05) & (betas < cap - 1e-9)
        assert interior.sum() >= 5, info.name
        assert np.isclose(betas, cap).sum() >= 5, info.name
    _, betas, _, _ = run_torch(AMSGD_INFO, {"lr": 0.05}, prob, prob.x0(), N_STEPS)
    assert betas[0] == 0.0  # step 0: d = g, the guard gives beta = 0


# --------------------------------------------------------------------------- vs torch.optim


def _train_pair(opt_a, params_a, opt_b, params_b, n_steps, seed=3):
    for t in range(n_steps):
        _set_grads(params_a, t, seed=seed)
        _set_grads(params_b, t, seed=seed)
        opt_a.step()
        opt_b.step()


@pytest.mark.parametrize("foreach", [False, True])
def test_amsgd_with_constant_beta_is_torch_damped_sgd(foreach):
    """lam = 0, restart with beta_high = beta_low = b: d = b d + (1-b) g = SGD(b, dampening=b)."""
    pa, pb = _params(), _params()
    b = 0.7
    ours = AMSGD(
        pa, lr=0.1, lam=0.0, variant="restart", beta_high=b, beta_low=b,
        weight_decay=0.01, foreach=foreach,
    )  # fmt: skip
    ref = torch.optim.SGD(pb, lr=0.1, momentum=b, dampening=b, weight_decay=0.01)
    _train_pair(ours, pa, ref, pb, 12)
    for a, r in zip(pa, pb, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-13, atol=1e-14)
        torch.testing.assert_close(
            ours.state[a]["momentum_buffer"],
            ref.state[r]["momentum_buffer"],
            rtol=1e-13,
            atol=1e-14,
        )


def test_amsgd_without_momentum_is_sgd():
    pa, pb = _params(), _params()
    ours = AMSGD(pa, lr=0.1, lam=0.0, beta_max=0.0)
    ref = torch.optim.SGD(pb, lr=0.1)
    _train_pair(ours, pa, ref, pb, 5)
    for a, r in zip(pa, pb, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-15, atol=1e-15)
    assert all(float(b) == 0.0 for b in ours.latest_betas()[0])


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("per_layer", [True, False])
def test_amadamw_with_constant_beta_is_torch_adamw(foreach, per_layer):
    """lam = 0 and beta fixed at beta1: bias correction 1 - beta1 * prod = 1 - beta1**t: AdamW."""
    pa, pb = _params(), _params()
    b1 = 0.9
    ours = AMAdamW(
        pa, lr=0.01, betas=(b1, 0.99), weight_decay=0.05, lam=0.0, variant="restart",
        beta_high=b1, beta_low=b1, per_layer=per_layer, foreach=foreach,
    )  # fmt: skip
    ref = torch.optim.AdamW(pb, lr=0.01, betas=(b1, 0.99), weight_decay=0.05)
    _train_pair(ours, pa, ref, pb, 15)
    for a, r in zip(pa, pb, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(ours.state[a]["exp_avg_sq"], ref.state[r]["exp_avg_sq"])
        assert float(ours.state[a]["beta1_prod"]) == pytest.approx(b1**15, rel=1e-13)


def test_amadam_with_constant_beta_is_torch_adam_with_l2():
    pa, pb = _params(), _params()
    ours = AMAdam(
        pa, lr=0.01, weight_decay=0.1, lam=0.0, variant="restart", beta_high=0.9, beta_low=0.9
    )
    ref = torch.optim.Adam(pb, lr=0.01, weight_decay=0.1)
    _train_pair(ours, pa, ref, pb, 15)
    for a, r in zip(pa, pb, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-13)


def test_amadamw_first_step_is_adamw_up_to_the_lam_factor():
    """Step 1: beta = beta1_max and x moves by lr * g / (eps + sqrt(v_hat)) / (1 + lam p)."""
    (w,) = _params(shapes=((5, 3),))
    w0 = w.detach().clone()
    opt = AMAdamW([w], lr=0.01, lam=0.3, weight_decay=0.0)
    _set_grads([w], 0)
    g = w.grad.clone()
    opt.step()
    assert float(opt.latest_betas()[0][0]) == 0.9
    denom = 1e-8 + g.abs()  # sqrt(v_hat) = |g| on the first step
    p = 0.1 * denom
    expected = w0 - 0.01 * g / denom / (1 + 0.3 * p)
    torch.testing.assert_close(w.detach(), expected, rtol=1e-13, atol=1e-15)


# --------------------------------------------------------------------------- state dict, deepcopy


def _step_all(opt, params, ts, seed=7):
    for t in ts:
        _set_grads(params, t, seed=seed)
        opt.step()


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_state_dict_round_trip_is_bit_identical(case, foreach):
    info, inp = case
    kwargs = {**info.kwargs(inp), "foreach": foreach}
    full = _params()
    opt_full = info.optim_cls(full, **kwargs)
    _step_all(opt_full, full, range(10))

    first = _params()
    opt_first = info.optim_cls(first, **kwargs)
    _step_all(opt_first, first, range(5))
    buffer = io.BytesIO()
    torch.save({"params": [p.detach() for p in first], "optim": opt_first.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)

    resumed = [torch.nn.Parameter(p.clone()) for p in saved["params"]]
    opt_resumed = info.optim_cls(resumed, **kwargs)
    opt_resumed.load_state_dict(saved["optim"])
    _step_all(opt_resumed, resumed, range(5, 10))

    for a, b in zip(resumed, full, strict=True):
        assert torch.equal(a, b)
        for key in info.state_keys:
            va, vb = opt_resumed.state[a][key], opt_full.state[b][key]
            assert va.dtype == vb.dtype and torch.equal(va, vb), key


def test_state_dict_holds_every_piece_of_state():
    for info in OPTIM_DB:
        params = _params()
        opt = info.optim_cls(params, **info.required)
        _step_all(opt, params, range(3))
        sd = opt.state_dict()
        assert len(sd["state"]) == len(params)
        for entry in sd["state"].values():
            assert set(entry) == info.state_keys, info.name
            assert float(entry["step"]) == 3.0
            assert entry["step"].device.type == "cpu"
            assert entry["beta"].shape == ()
        group = sd["param_groups"][0]
        assert group["lr"] == info.required["lr"] and "lam" in group and "variant" in group


def test_bf16_state_keeps_float32_betas_through_load_state_dict():
    """torch's load_state_dict casts state to the param dtype; beta, beta1_prod stay float32."""
    for info in (AMSGD_INFO, AMADAMW_INFO):
        params = _params(dtype=torch.bfloat16)
        opt = info.optim_cls(params, **info.required)
        _step_all(opt, params, range(4))
        sd = copy.deepcopy(opt.state_dict())
        clone = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt2 = info.optim_cls(clone, **info.required)
        opt2.load_state_dict(sd)
        for p, q in zip(params, clone, strict=True):
            for key in ("beta", "beta1_prod"):
                if key in opt.state[p]:
                    assert opt2.state[q][key].dtype == torch.float32
                    assert torch.equal(opt2.state[q][key], opt.state[p][key])
        _step_all(opt, params, range(4, 7))
        _step_all(opt2, clone, range(4, 7))
        for p, q in zip(params, clone, strict=True):
            assert torch.equal(p, q)


@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_deepcopy_continues_identically(info):
    params = _params()
    opt = info.optim_cls(params, **info.required)
    _step_all(opt, params, range(4))
    params2, opt2 = copy.deepcopy((params, opt))
    assert opt2.param_groups[0]["params"][0] is params2[0]
    _step_all(opt, params, range(4, 9))
    _step_all(opt2, params2, range(4, 9))
    for a, b in zip(params, params2, strict=True):
        assert torch.equal(a, b)
        assert a.data_ptr() != b.data_ptr()


@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_setstate_backfills_defaults_of_older_states(info):
    """An older pickled state (fewer group keys, Python-number steps) loads and steps on."""
    params = _params()
    opt = info.optim_cls(params, **info.required)
    _step_all(opt, params, range(3))
    reference = copy.deepcopy((params, opt))
    state = opt.__getstate__()
    for group in state["param_groups"]:
        for key in (
            "variant",
            "beta_min",
            "theta",
            "beta_high",
            "beta_low",
            "maximize",
            "foreach",
        ):
            del group[key]
        group.pop("momentum", None)
    for s in state["state"].values():
        s["step"] = float(s["step"])  # states from before tensor steps
    opt.__setstate__(state)
    assert opt.param_groups[0]["variant"] is None and opt.param_groups[0]["foreach"] is None
    if info is AMSGD_INFO:
        assert opt.param_groups[0]["momentum"] == opt.param_groups[0]["beta_max"]
    assert all(torch.is_tensor(opt.state[p]["step"]) for p in params)
    ref_params, ref_opt = reference
    _step_all(opt, params, range(3, 6))
    _step_all(ref_opt, ref_params, range(3, 6))
    for a, b in zip(params, ref_params, strict=True):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- groups, grads


@pytest.mark.parametrize("foreach", [False, True])
def test_param_groups_with_different_hyperparameters(foreach):
    """Each group steps on its own with its own hyper-parameters (checked with the core)."""
    prob = _problem()
    x0 = prob.x0()
    cases = [
        (AMSGD_INFO, {"lr": 0.05, "lam": 0.0, "beta_max": 1.0}, {"lr": 0.02, "per_layer": True}),
        (
            AMADAMW_INFO,
            {"lr": 0.3, "per_layer": False, "weight_decay": 0.1},
            {"lr": 0.1, "lam": 0.5, "weight_decay_mode": "proximal", "betas": (0.8, 0.99)},
        ),
    ]
    for info, kw_a, kw_b in cases:
        params = [torch.nn.Parameter(torch.tensor(a)) for a in x0]
        groups = [{"params": params[:2], **kw_a}, {"params": params[2:], **kw_b}]
        opt = info.optim_cls(groups, lr=1.0, foreach=foreach)
        for t in range(N_STEPS):
            _, gs = prob([p.detach().numpy().copy() for p in params], t)
            for p, g in zip(params, gs, strict=True):
                p.grad = torch.tensor(g)
            opt.step()
        # the same gradients, replayed on each group alone by the core
        full_traj = _replay_core(info, prob, x0, groups_kwargs=[kw_a, kw_b], split=2)
        for p, ref in zip(params, full_traj, strict=True):
            np.testing.assert_allclose(p.detach().numpy(), ref, rtol=CORE_TOL, atol=CORE_TOL)


def _replay_core(info, prob, x0, groups_kwargs, split):
    """Run the core on the two groups in lock-step (the gradient couples nothing across arrays)."""
    import amopt

    xs = [np.array(a) for a in x0]
    parts = [slice(0, split), slice(split, len(xs))]
    states = []
    for sl in parts:
        if info is AMSGD_INFO:
            states.append(amopt.am_momentum_init(xs[sl]))
        else:
            states.append(amopt.am_adam_init(xs[sl]))
    for t in range(N_STEPS):
        _, gs = prob([a.copy() for a in xs], t)
        for k, (sl, kw) in enumerate(zip(parts, groups_kwargs, strict=True)):
            if info is AMSGD_INFO:
                full = {**info_db.AMSGD_DEFAULTS, **kw}
                full.pop("maximize")
                new, states[k], _ = amopt.am_momentum_step(
                    xs[sl], gs[sl], states[k], numerator="linear", **full
                )
            else:
                full = {**info_db.ADAM_DEFAULTS, "weight_decay": 1e-2, **kw}
                full.pop("maximize")
                new, states[k], _ = amopt.am_adam_step(xs[sl], gs[sl], states[k], **full)
            xs[sl] = list(new)
    return xs


@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_closure_is_evaluated_with_grad_enabled(info):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    reference = copy.deepcopy(model)
    X, y = torch.randn(32, 4, dtype=torch.float64), torch.randn(32, 1, dtype=torch.float64)
    opt = info.optim_cls(model.parameters(), **info.required)
    ref_opt = info.optim_cls(reference.parameters(), **info.required)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X), y)
        loss.backward()
        return loss

    losses = []
    with torch.no_grad():  # step must enable grad for the closure itself
        for _ in range(5):
            losses.append(float(opt.step(closure)))
    for _ in range(5):
        ref_opt.zero_grad()
        expected = torch.nn.functional.mse_loss(reference(X), y)
        expected.backward()
        ref_opt.step()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
    assert losses[-1] < losses[0]
    assert opt.step() is None


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_params_without_grad_are_skipped(info, foreach):
    """A None grad: the tensor is untouched, gets no state, takes no part in the group's beta."""
    prob = _problem()
    x0 = prob.x0()
    kwargs = {**info.required, "per_layer": False, "foreach": foreach}
    params = [torch.nn.Parameter(torch.tensor(a)) for a in x0]
    frozen_before = params[1].detach().clone()
    opt = info.optim_cls(params, **kwargs)
    for t in range(N_STEPS):
        _, gs = prob([p.detach().numpy().copy() for p in params], t)
        params[0].grad, params[2].grad = torch.tensor(gs[0]), torch.tensor(gs[2])
        opt.step()
    assert torch.equal(params[1].detach(), frozen_before)
    assert len(opt.state[params[1]]) == 0
    assert opt.latest_betas()[0][1] is None

    def sub_oracle(xs, t):
        full = [xs[0], x0[1], xs[1]]
        f, gs = prob(full, t)
        return f, [gs[0], gs[2]]

    ref, ref_betas = info.core_run([x0[0], x0[2]], sub_oracle, N_STEPS, kwargs)
    np.testing.assert_allclose(params[0].detach().numpy(), ref[-1][0], rtol=CORE_TOL)
    np.testing.assert_allclose(params[2].detach().numpy(), ref[-1][1], rtol=CORE_TOL)
    assert float(opt.latest_betas()[0][0]) == pytest.approx(ref_betas[-1], rel=CORE_TOL)


@pytest.mark.parametrize("foreach", [False, True])
def test_global_product_stays_shared_when_grads_come_and_go(foreach):
    """AMAdamW per_layer=False: a tensor skipped on some steps keeps the group's beta1_prod."""
    params = _params()
    opt = AMAdamW(params, lr=0.05, per_layer=False, foreach=foreach)
    product = 1.0
    for t in range(8):
        _set_grads(params, t)
        if t % 2 == 1:
            params[2].grad = None
        opt.step()
        beta = float(opt.latest_betas()[0][0])
        product *= beta
        prods = [float(opt.state[p]["beta1_prod"]) for p in params]
        assert prods == pytest.approx([product] * 3, rel=1e-14)
        assert [float(b) for b in opt.latest_betas()[0]] == [beta] * 3
    assert float(opt.state[params[2]]["step"]) == 4.0
    assert float(opt.state[params[0]]["step"]) == 8.0


def test_late_parameter_joins_with_d_equal_g():
    """AMSGD: a tensor whose first grad arrives late starts with d = g (v = 0) inside the group."""
    a, b = _params(shapes=((4,), (3,)))
    opt = AMSGD([a, b], lr=0.1)
    _set_grads([a, b], 0)
    b.grad = None
    opt.step()
    _set_grads([a, b], 1)
    g_a, g_b = a.grad.clone(), b.grad.clone()
    d_a = opt.state[a]["momentum_buffer"].clone()
    opt.step()
    # beta over the group, b contributing <g,g> to num and ref and nothing to den
    v = d_a - g_a
    gg = float(g_a @ g_a + g_b @ g_b)
    den = float(v @ v)
    beta = min(max((1.1 * gg - 0.1 * den) / den, 0.0), 0.9)
    assert float(opt.latest_betas()[0][0]) == pytest.approx(beta, rel=1e-13)
    torch.testing.assert_close(opt.state[b]["momentum_buffer"], g_b, rtol=0, atol=0)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_sparse_gradients_raise(info, foreach):
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = info.optim_cls(emb.parameters(), **{**info.required, "foreach": foreach})
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match=rf"{info.name} does not support sparse gradients"):
        opt.step()


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_complex_parameters_are_optimised_as_real_views(info, foreach):
    """A complex tensor steps exactly as the float tensor of its real view."""
    torch.manual_seed(0)
    z = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.complex128))
    r = torch.nn.Parameter(torch.view_as_real(z.detach()).clone())
    other_z = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    other_r = torch.nn.Parameter(other_z.detach().clone())
    kwargs = {**info.required, "per_layer": False, "foreach": foreach}
    opt_z = info.optim_cls([z, other_z], **kwargs)
    opt_r = info.optim_cls([r, other_r], **kwargs)
    for t in range(6):
        g = torch.Generator().manual_seed(t)
        gz = torch.randn(4, 3, dtype=torch.complex128, generator=g)
        go = torch.randn(5, dtype=torch.float64, generator=g)
        z.grad, other_z.grad = gz, go
        r.grad, other_r.grad = torch.view_as_real(gz).clone(), go.clone()
        opt_z.step()
        opt_r.step()
    torch.testing.assert_close(torch.view_as_real(z.detach()), r.detach(), rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(other_z, other_r, rtol=1e-14, atol=1e-15)
    assert z.dtype == torch.complex128
    assert float(opt_z.latest_betas()[0][0]) == pytest.approx(
        float(opt_r.latest_betas()[0][0]), rel=1e-13
    )


# --------------------------------------------------------------------------- maximize, dtypes


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_maximize_follows_the_gradient(info, foreach):
    """maximize=True on -f takes exactly the steps of maximize=False on f (the fused
    kernels, which fold the sign into their arithmetic, to float rounding: fused tests)."""
    pa, pb = _params(), _params()
    kwargs = {**info.required, "weight_decay": 0.01, "foreach": foreach}
    opt_a = info.optim_cls(pa, **kwargs, maximize=True)
    opt_b = info.optim_cls(pb, **kwargs)
    for t in range(6):
        _set_grads(pb, t)
        for a, b in zip(pa, pb, strict=True):
            a.grad = -b.grad
        opt_a.step()
        opt_b.step()
    for a, b in zip(pa, pb, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("foreach", [False, True])
def test_half_precision_amsgd_beta_accumulates_in_float32(dtype, foreach):
    """A 2**16-element half tensor: beta agrees with a float64 evaluation of the same values."""
    g_ = torch.Generator().manual_seed(0)
    n = 1 << 16
    x = torch.nn.Parameter(torch.randn(n, generator=g_).to(dtype))
    opt = AMSGD([x], lr=1e-3, lam=0.1, beta_max=1.0, foreach=foreach)
    x.grad = torch.randn(n, generator=g_).to(dtype)
    opt.step()
    d = opt.state[x]["momentum_buffer"].clone()
    g = (0.2 * d.float() + 0.5 * torch.randn(n, generator=g_)).to(dtype)
    x.grad = g.clone()
    opt.step()
    v = (d - g).double()  # the optimizer forms v = d - g in the parameter dtype
    gg, vv = float(g.double() @ g.double()), float(v @ v)
    expected = min(max((1.1 * gg - 0.1 * vv) / vv, 0.0), 1.0)
    beta = opt.latest_betas()[0][0]
    assert beta.dtype == torch.float32
    assert 0.05 < expected < 0.95
    # float32 accumulation: torch.sum is pairwise (~1e-7 here); torch's CPU norm kernel
    # behind the foreach path accumulates sequentially per lane (~1e-5 on 2**16 terms).
    assert float(beta) == pytest.approx(expected, rel=3e-5 if foreach else 1e-6)


@pytest.mark.parametrize("foreach", [False, True])
def test_bf16_amadamw_beta_accumulates_in_float32(foreach):
    g_ = torch.Generator().manual_seed(1)
    n = 1 << 16
    x = torch.nn.Parameter(torch.randn(n, generator=g_).to(torch.bfloat16))
    lam, lr, eps, wd = 0.1, 1e-3, 1e-8, 0.01
    opt = AMAdamW([x], lr=lr, lam=lam, eps=eps, weight_decay=wd, foreach=foreach)
    x.grad = torch.randn(n, generator=g_).to(torch.bfloat16)
    opt.step()
    state = opt.state[x]
    d, v_prev = state["exp_avg"].clone(), state["exp_avg_sq"].clone()
    prod = state["beta1_prod"].clone()  # the state is updated in place
    x_before = x.detach().clone()
    g = (0.1 * torch.randn(n, generator=g_) - 3.0 * d.float()).to(torch.bfloat16)
    x.grad = g.clone()
    opt.step()
    # replay steps 1-3 of section 3 as the optimizer does (v stored in bf16, p in
    # float32), then N and D in float64
    v = v_prev.mul(0.999).addcmul(g, g, value=1 - 0.999)
    c = 1.0 - 0.9 * prod
    p = (v.float() / (1 - 0.999**2)).sqrt().add(eps).mul(c)
    g64, d64, x64, p64 = (t.double() for t in (g, d, x_before, p))
    u = 1 / (1 + lam * p64)
    w = u / p64
    N = torch.sum(
        g64 * g64 / p64 - lam * u * (d64 - g64) ** 2 + wd * lr * g64 * d64 / p64
        + wd * (2 + wd * lr) * g64 * x64 - wd * d64 * x64
    )  # fmt: skip
    D = torch.sum(w * (d64 - g64) ** 2)
    expected = min(max(float(N / D), 0.0), 0.9)
    beta = opt.latest_betas()[0][0]
    assert beta.dtype == torch.float32 and state["beta1_prod"].dtype == torch.float32
    assert 0.05 < expected < 0.85
    assert float(beta) == pytest.approx(expected, rel=3e-5 if foreach else 1e-6)


@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_bf16_training_reduces_the_loss(info):
    torch.manual_seed(0)
    X = torch.randn(256, 8)
    y = X @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
    model = torch.nn.Linear(8, 1).to(torch.bfloat16)
    lr = 0.05 if info is AMSGD_INFO else 0.02
    opt = info.optim_cls(model.parameters(), lr=lr)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X.bfloat16()).float(), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    betas = [b for b in opt.latest_betas()[0]]
    assert all(b.dtype == torch.float32 and math.isfinite(float(b)) for b in betas)
    assert losses[-1] < 0.1 * losses[0], losses[::10]


def test_float64_scope_accumulates_in_float64():
    """A global scope with a float64 tensor reduces in float64, also over its float32 members."""
    a = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    b = torch.nn.Parameter(torch.randn(5, dtype=torch.float32))
    for cls in (AMSGD, AMAdamW):
        opt = cls([a, b], lr=0.01, per_layer=False)
        for t in range(3):
            _set_grads([a, b], t)
            opt.step()
        assert opt.latest_betas()[0][0].dtype == torch.float64
        opt = cls([a, b], lr=0.01, per_layer=True)
        _set_grads([a, b], 0)
        opt.step()
        assert [t.dtype for t in opt.latest_betas()[0]] == [torch.float64, torch.float32]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_beta_is_never_nan(info, foreach):
    """Zero gradients (d = g = 0) and overflowing reductions give beta = 0 or a clipped value."""
    x = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    opt = info.optim_cls([x], **{**info.required, "foreach": foreach, "per_layer": False})
    grads = [
        torch.zeros(4, dtype=torch.float64),
        torch.zeros(4, dtype=torch.float64),
        torch.full((4,), 1e200, dtype=torch.float64),  # squares overflow to inf
        torch.full((4,), -1e200, dtype=torch.float64),
    ]
    for g in grads:
        x.grad = g.clone()
        opt.step()
        beta = float(opt.latest_betas()[0][0])
        assert math.isfinite(beta) and 0.0 <= beta <= 0.9
    if info is AMSGD_INFO:  # d = g = 0 on the first two steps: the guard gives exactly 0
        opt = AMSGD([x], lr=0.1, foreach=foreach)
        x.grad = torch.zeros(4, dtype=torch.float64)
        opt.step()
        opt.step()
        assert float(opt.latest_betas()[0][0]) == 0.0


# --------------------------------------------------------------------------- host sync, telemetry


_HOST_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_step_reads_no_tensor_value_on_the_host(info, per_layer, foreach, monkeypatch):
    """step() never calls .item()/bool()/float()/... on a tensor (so it never syncs a device)."""
    params = _params()
    opt = info.optim_cls(
        params, **{**info.required, "per_layer": per_layer, "foreach": foreach, "variant": "clip"}
    )
    for t in range(2):  # first steps create the state; later ones use every code path
        _set_grads(params, t)
        opt.step()

    def forbidden(self, *args, **kwargs):
        raise AssertionError("a tensor value was read on the host inside step()")

    _set_grads(params, 2)
    with monkeypatch.context() as m:
        for name in _HOST_READS:
            m.setattr(torch.Tensor, name, forbidden)
        opt.step()
        opt.latest_betas()
    assert all(b is not None for b in opt.latest_betas()[0])


@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_latest_betas_layout(info):
    params = _params()
    extra = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    groups = [
        {"params": params[:2], "per_layer": False},
        {"params": [params[2], extra], "per_layer": True},
    ]
    opt = info.optim_cls(groups, **info.required)
    assert opt.latest_betas() == [[None, None], [None, None]]
    _set_grads(params, 0)
    opt.step()
    (g0, g1) = opt.latest_betas()
    assert g0[0] is g0[1] and g0[0] is opt.state[params[0]]["beta"]
    assert g1[0] is opt.state[params[2]]["beta"] and g1[1] is None
    assert all(b.shape == () and b.dtype == torch.float64 for b in (g0[0], g1[0]))


# --------------------------------------------------------------------------- functional API, docs


def test_functional_forms_match_the_classes():
    prob = _problem()
    x0 = prob.x0()
    for info, functional in ((AMSGD_INFO, amsgd), (AMADAMW_INFO, am_adamw)):
        cls_iter, _, _, _ = run_torch(info, info.required, prob, x0, 8)
        xs = [torch.tensor(a) for a in x0]
        steps = [torch.tensor(0.0) for _ in xs]
        if info is AMSGD_INFO:
            bufs = [None] * len(xs)
        else:
            d = [torch.zeros_like(x) for x in xs]
            v = [torch.zeros_like(x) for x in xs]
            prods = [torch.ones((), dtype=torch.float64) for _ in xs]
        for t in range(8):
            _, gs = prob([x.numpy().copy() for x in xs], t)
            gs = [torch.tensor(g) for g in gs]
            if info is AMSGD_INFO:
                functional(xs, gs, bufs, steps, foreach=False, lr=info.required["lr"])
            else:
                _, prods = functional(
                    xs, gs, d, v, steps, prods, foreach=False, lr=info.required["lr"]
                )
        for x, ref in zip(xs, cls_iter[-1], strict=True):
            np.testing.assert_array_equal(x.numpy(), ref)


def test_public_api():
    assert amtorch.__all__ == ["AMAdam", "AMAdamW", "AMSGD", "am_adamw", "amsgd"]
    for name in amtorch.__all__:
        assert getattr(amtorch, name).__doc__
    assert issubclass(AMAdam, AMAdamW) and issubclass(AMSGD, torch.optim.Optimizer)
    assert AMSGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).defaults["beta_max"] == 0.9


@pytest.mark.parametrize("module", ["amopt.torch._amsgd", "amopt.torch._amadamw"])
def test_docstring_examples_run(module):
    import importlib

    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("info", [AMSGD_INFO, AMADAMW_INFO], ids=lambda i: i.name)
def test_foreach_without_foreach_powsum(info, monkeypatch):
    """torch releases before _foreach_powsum: the foreach path falls back to _foreach_norm."""
    prob = _problem()
    kwargs = {**info.required, "weight_decay": 0.05}
    single, betas_s, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=False)
    monkeypatch.delattr(torch, "_foreach_powsum")
    multi, betas_m, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=True)
    assert_iterates_close(multi, single, FOREACH_TOL, "foreach (norm fallback) vs single")
    np.testing.assert_allclose(betas_m, betas_s, rtol=FOREACH_TOL, atol=FOREACH_TOL)


def test_step_hooks_see_the_new_betas():
    """torch.optim step hooks work; a post-hook is a natural place to log beta every step."""
    params = _params()
    opt = AMAdamW(params, lr=0.01)
    logged = []
    handle = opt.register_step_post_hook(
        lambda optimizer, args, kwargs: logged.append(torch.stack(optimizer.latest_betas()[0]))
    )
    for t in range(3):
        _set_grads(params, t)
        opt.step()
    handle.remove()
    assert len(logged) == 3 and logged[0].shape == (len(params),)
    assert torch.equal(logged[-1], torch.stack(opt.latest_betas()[0]))
    assert torch.all(logged[0] == 0.9)  # step 1: beta = beta1_max


# --------------------------------------------------------------------------- CUDA (when present)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@cuda
@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("case", VALID, ids=case_id)
def test_cuda_matches_array_api_core(case, foreach):
    info, inp = case
    prob = _problem()
    kwargs = info.kwargs(inp)
    got, betas, _, _ = run_torch(
        info, kwargs, prob, prob.x0(), N_STEPS, foreach=foreach, device="cuda"
    )
    ref, ref_betas = info.core_run(prob.x0(), prob, N_STEPS, kwargs)
    assert_iterates_close(got, ref, CORE_TOL, "cuda vs amopt core")
    np.testing.assert_allclose(betas, ref_betas, rtol=CORE_TOL, atol=CORE_TOL)


@cuda
@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_cuda_step_never_synchronises(info, dtype, per_layer, foreach):
    params = [p.detach().cuda().requires_grad_() for p in _params(dtype=dtype)]
    opt = info.optim_cls(
        params, **{**info.required, "per_layer": per_layer, "foreach": foreach, "variant": "clip"}
    )
    for t in range(2):
        _set_grads(params, t)
        opt.step()
    _set_grads(params, 2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
        opt.latest_betas()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    betas = [float(b) for b in opt.latest_betas()[0]]
    assert all(0.0 <= b <= 0.9 for b in betas)
    assert all(opt.state[p]["beta"].is_cuda for p in params)
