"""``torch.optim.lr_scheduler`` with the AM optimizers.

Learning rates (and, for ``cycle_momentum=True``, the beta cap) are recomputed
here from the schedules' closed forms; the optimizers' trajectories must equal
the array-API core run with those per-step values. With ``cycle_momentum=True``
the cycled quantity is the cap: ``beta_max`` (alias ``"momentum"``) for AMSGD,
``betas[0]`` for AMAdamW.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.optim import lr_scheduler  # noqa: E402
from torch_optim_info import (  # noqa: E402
    AMADAM_INFO,
    AMADAMW_INFO,
    AMSGD_INFO,
    OPTIM_DB,
    NoisyProblem,
)

from amopt.torch import AMSGD, AMAdamW  # noqa: E402

N = 30
TOL = 1e-10


def _run_with_scheduler(info, kwargs, make_scheduler, n_steps=N):
    """Step optimizer then scheduler; record lr and cap in force at each optimizer step."""
    prob = NoisyProblem()
    params = [torch.nn.Parameter(torch.tensor(a)) for a in prob.x0()]
    opt = info.optim_cls(params, **kwargs)
    sched = make_scheduler(opt)
    lrs, caps, betas, iterates = [], [], [], []
    for t in range(n_steps):
        _, gs = prob([p.detach().numpy().copy() for p in params], t)
        for p, g in zip(params, gs, strict=True):
            p.grad = torch.tensor(g)
        group = opt.param_groups[0]
        lrs.append(group["lr"])
        opt.step()
        caps.append(group["beta_max"] if info is AMSGD_INFO else group["betas"][0])
        betas.append([float(b) for b in opt.latest_betas()[0]])
        iterates.append([p.detach().numpy().copy() for p in params])
        sched.step()
    return np.array(lrs), np.array(caps), np.array(betas), iterates


def _core(info, kwargs, lrs, caps=None):
    prob = NoisyProblem()
    if info is AMSGD_INFO:
        return info.core_run(prob.x0(), prob, len(lrs), kwargs, lrs=list(lrs), caps=caps)
    return info.core_run(prob.x0(), prob, len(lrs), kwargs, lrs=list(lrs), beta1s=caps)


def _assert_trajectory(iterates, ref):
    for xs, rs in zip(iterates, ref, strict=True):
        for a, r in zip(xs, rs, strict=True):
            np.testing.assert_allclose(a, r, rtol=TOL, atol=TOL)


SCHEDULES = {
    "StepLR": (
        lambda opt: lr_scheduler.StepLR(opt, step_size=7, gamma=0.5),
        lambda lr0, t: lr0 * 0.5 ** (t // 7),
    ),
    "CosineAnnealingLR": (
        lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=N, eta_min=1e-3),
        lambda lr0, t: 1e-3 + (lr0 - 1e-3) * (1 + math.cos(math.pi * t / N)) / 2,
    ),
    "LinearLR warm-up": (
        lambda opt: lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=10),
        lambda lr0, t: lr0 * (0.1 + 0.9 * min(t, 10) / 10),
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_lr_schedulers_drive_lr(info, name):
    make, formula = SCHEDULES[name]
    kwargs = dict(info.required)
    lrs, caps, _, iterates = _run_with_scheduler(info, kwargs, make)
    lr0 = kwargs["lr"]
    expected = np.array([formula(lr0, t) for t in range(N)])
    np.testing.assert_allclose(lrs, expected, rtol=1e-13)
    assert np.all(caps == 0.9)  # no momentum cycling
    ref, _ = _core(info, kwargs, expected)
    _assert_trajectory(iterates, ref)


def _cos_anneal(start, end, pct):
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _one_cycle(t, total, max_lr, base_m, max_m, pct_start=0.3, div=25.0, final_div=1e4):
    """OneCycleLR (cos, two phases): lr up / momentum down, then lr down / momentum up."""
    initial = max_lr / div
    end1, end2 = pct_start * total - 1, total - 1
    if t <= end1:
        pct = t / end1
        return _cos_anneal(initial, max_lr, pct), _cos_anneal(max_m, base_m, pct)
    pct = (t - end1) / (end2 - end1)
    return _cos_anneal(max_lr, initial / final_div, pct), _cos_anneal(base_m, max_m, pct)


@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda i: i.name)
def test_one_cycle_with_cycle_momentum_cycles_the_cap(info):
    max_lr = 2 * info.required["lr"]
    kwargs = dict(info.required)

    def make(opt):
        return lr_scheduler.OneCycleLR(
            opt, max_lr=max_lr, total_steps=N, base_momentum=0.6, max_momentum=0.95
        )

    lrs, caps, betas, iterates = _run_with_scheduler(info, kwargs, make)
    expected = np.array([_one_cycle(t, N, max_lr, 0.6, 0.95) for t in range(N)])
    np.testing.assert_allclose(lrs, expected[:, 0], rtol=1e-12)
    np.testing.assert_allclose(caps, expected[:, 1], rtol=1e-12)
    assert caps.min() == pytest.approx(0.6) and caps[0] == pytest.approx(0.95)
    assert np.all(betas <= caps[:, None] + 1e-15)  # beta never exceeds the cycled cap
    assert np.any(np.isclose(betas, caps[:, None]))  # ... and reaches it
    ref, ref_betas = _core(info, kwargs, expected[:, 0], list(expected[:, 1]))
    _assert_trajectory(iterates, ref)


def test_cyclic_lr_cycles_the_amsgd_cap_through_the_momentum_alias():
    kwargs = {"lr": 0.05}

    def make(opt):
        return lr_scheduler.CyclicLR(
            opt, base_lr=0.01, max_lr=0.08, step_size_up=5, base_momentum=0.5, max_momentum=0.9
        )

    lrs, caps, _, iterates = _run_with_scheduler(AMSGD_INFO, kwargs, make)
    t = np.arange(N)
    cycle = np.floor(1 + t / 10)
    x = np.abs(t / 5 - 2 * cycle + 1)
    scale = np.maximum(0.0, 1 - x)
    np.testing.assert_allclose(lrs, 0.01 + 0.07 * scale, rtol=1e-12)
    np.testing.assert_allclose(caps, 0.9 - 0.4 * scale, rtol=1e-12)
    ref, _ = _core(AMSGD_INFO, kwargs, lrs, list(caps))
    _assert_trajectory(iterates, ref)


def test_cycle_momentum_is_accepted_by_every_optimizer():
    """torch's schedulers look for "momentum" or "betas" in the optimizer defaults."""
    for info in (AMSGD_INFO, AMADAMW_INFO, AMADAM_INFO):
        params = [torch.nn.Parameter(torch.zeros(2))]
        opt = info.optim_cls(params, **info.required)
        assert "momentum" in opt.defaults or "betas" in opt.defaults
        lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)


def test_beta_max_and_momentum_alias():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = AMSGD([p], lr=0.1)
    group = opt.param_groups[0]
    assert group["beta_max"] == group["momentum"] == 0.9

    def step(t):
        p.grad = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) * (-1) ** t
        opt.step()

    step(0)
    group["beta_max"] = 0.5  # the canonical key
    step(1)
    assert group["momentum"] == 0.5
    group["momentum"] = 0.3  # the alias, as a scheduler writes it
    step(2)
    assert group["beta_max"] == 0.3
    group["beta_max"], group["momentum"] = 0.2, 0.4
    with pytest.raises(ValueError, match="were both changed since the last step"):
        step(3)
    group["beta_max"] = group["momentum"] = 0.25  # consistent again
    step(3)
    group["momentum"] = 1.5
    with pytest.raises(ValueError, match=r"beta_max must be in \[0, 1\]; got beta_max=1\.5"):
        step(4)
    opt2 = AMSGD([{"params": [torch.nn.Parameter(torch.ones(1))], "momentum": 0.7}], lr=0.1)
    assert opt2.param_groups[0]["beta_max"] == 0.7


def test_alias_cap_is_applied_on_the_step():
    """A cap written through "momentum" clips beta on the very next step."""
    a = torch.nn.Parameter(torch.tensor([1.0, 1.0], dtype=torch.float64))
    opt = AMSGD([a], lr=0.1, lam=0.0, beta_max=1.0)
    a.grad = torch.tensor([1.0, 0.0], dtype=torch.float64)
    opt.step()
    opt.param_groups[0]["momentum"] = 0.25
    a.grad = torch.tensor([0.0, 1.0], dtype=torch.float64)  # <g,g>/||d-g||^2 = 0.5
    opt.step()
    assert float(opt.latest_betas()[0][0]) == 0.25


@pytest.mark.parametrize("info", [AMSGD_INFO, AMADAMW_INFO], ids=lambda i: i.name)
def test_resume_mid_one_cycle_is_bit_identical(info):
    """Optimizer + scheduler state dicts saved between scheduler.step() and opt.step()."""

    def build():
        prob = NoisyProblem()
        params = [torch.nn.Parameter(torch.tensor(a)) for a in prob.x0()]
        opt = info.optim_cls(params, **info.required)
        sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=N)
        return prob, params, opt, sched

    def run(prob, params, opt, sched, ts):
        for t in ts:
            _, gs = prob([p.detach().numpy().copy() for p in params], t)
            for p, g in zip(params, gs, strict=True):
                p.grad = torch.tensor(g)
            opt.step()
            sched.step()

    prob, params, opt, sched = build()
    run(prob, params, opt, sched, range(20))

    prob2, params2, opt2, sched2 = build()
    run(prob2, params2, opt2, sched2, range(10))
    buf = io.BytesIO()
    torch.save(
        {"p": [p.detach() for p in params2], "o": opt2.state_dict(), "s": sched2.state_dict()},
        buf,
    )
    buf.seek(0)
    saved = torch.load(buf)
    prob3, params3, opt3, sched3 = build()
    with torch.no_grad():
        for p, q in zip(params3, saved["p"], strict=True):
            p.copy_(q)
    sched3.load_state_dict(saved["s"])
    opt3.load_state_dict(saved["o"])
    run(prob3, params3, opt3, sched3, range(10, 20))
    for a, b in zip(params, params3, strict=True):
        assert torch.equal(a, b)
    assert opt3.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_amadamw_betas_key_receives_the_cycled_beta1_max():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = AMAdamW([p], lr=1e-3, betas=(0.9, 0.98))
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=10, max_momentum=0.93)
    assert opt.param_groups[0]["betas"] == (0.93, 0.98)
    p.grad = torch.ones(2)
    opt.step()
    sched.step()
    beta1, beta2 = opt.param_groups[0]["betas"]
    assert beta1 < 0.93 and beta2 == 0.98
