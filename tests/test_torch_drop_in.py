"""``amopt.torch`` as a drop-in for ``torch.optim``: what a copied PyTorch setup expects.

Every keyword of ``torch.optim.AdamW`` / ``Adam`` / ``SGD`` is accepted at torch's
default and refused with a message naming it otherwise; another optimizer's
``state_dict`` is mapped (Adam's state into AM-Adam) or refused (SGD's into AMSGD);
``import amopt.torch`` loads neither the compiler nor ``torch.distributed.fsdp``;
and AMSGD's ``lr`` maps from ``torch.optim.SGD(momentum=m)`` by ``1/(1 - m)``.
References are torch's own optimizers and signatures.
"""

from __future__ import annotations

import copy
import inspect
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")


def _fresh_modules(code: str) -> list[str]:
    """The ``sys.modules`` names matching after ``code`` in a fresh interpreter."""
    script = textwrap.dedent(code) + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    return out.stdout.split()


# --------------------------------------------------------------------------- import cost


def test_import_does_not_load_fsdp_nor_the_compiler():
    # torch.compiler.disable / assume_constant_result import torch._dynamo, which
    # imports torch.distributed.fsdp: ~1.4 s of every import before
    modules = _fresh_modules("import amopt.torch\nfrom amopt.torch import *")
    baseline = _fresh_modules("import torch\nimport amopt")  # what torch loads itself
    assert "amopt.torch" in modules
    for heavy in ("torch.distributed.fsdp", "torch._dynamo"):
        assert heavy in baseline or heavy not in modules
    extra = set(modules) - set(baseline)
    assert not {m for m in extra if m.startswith(("torch._dynamo", "torch.distributed.fsdp"))}


def test_eager_steps_load_no_torch_module_that_torch_optim_does_not():
    # constructing any torch.optim optimizer imports torch._dynamo (torch's own
    # add_param_group is wrapped by torch._compile._disable_dynamo); AM's steps add nothing
    steps = """
        import torch
        w = torch.nn.Parameter(torch.ones(4))
        for make in MAKERS:
            opt = make([w], lr=0.1)
            for _ in range(2):
                opt.zero_grad()
                (w ** 2).sum().backward()
                opt.step()
        """
    am = _fresh_modules(
        "from amopt.torch import AMSGD, AMAdamW\nMAKERS = (AMSGD, AMAdamW)\n"
        + textwrap.dedent(steps)
    )
    reference = _fresh_modules(
        "import amopt\nimport torch\nMAKERS = (torch.optim.SGD, torch.optim.AdamW)\n"
        + textwrap.dedent(steps)
    )
    extra = {m for m in set(am) - set(reference) if m.startswith("torch.")}
    assert not extra


def test_every_public_name_still_imports():
    import amopt.torch as amt
    from amopt.torch import _distributed, _fused, _triton  # noqa: F401

    for name in amt.__all__:
        assert callable(getattr(amt, name))
    for name in _distributed.__all__:
        assert hasattr(_distributed, name)
    for name in _fused.__all__:
        assert hasattr(_fused, name)


# --------------------------------------------------------------------------- torch keywords

from torch_optim_info import OPTIM_DB  # noqa: E402

from amopt.torch import AMAdam, AMAdamW  # noqa: E402

#: the torch keywords AM takes at torch's default only; every other one takes any value
#: torch takes
REFUSED = {
    "AMSGD": {"dampening", "nesterov", "differentiable"},
    "AMAdamW": {"amsgrad", "differentiable"},
    "AMAdam": {"amsgrad", "differentiable"},
}


def _torch_defaults(torch_cls):
    return {
        name: p.default
        for name, p in inspect.signature(torch_cls).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def _other_value(value):
    """A value of the keyword's kind other than torch's default."""
    if isinstance(value, bool):
        return not value
    if value is None:  # foreach, fused
        return True
    if isinstance(value, tuple):  # betas
        return (0.8, 0.99)
    return 0.5 * float(value) + 0.05


def _param():
    return [torch.nn.Parameter(torch.ones(3))]


@pytest.mark.parametrize("info", OPTIM_DB, ids=lambda info: info.name)
def test_every_torch_keyword_at_its_default_is_accepted(info):
    defaults = _torch_defaults(info.torch_cls)
    assert set(REFUSED[info.name]) <= set(defaults)
    opt = info.optim_cls(_param(), **defaults)
    reference = info.torch_cls(_param(), **defaults)
    ours, theirs = opt.param_groups[0], reference.param_groups[0]
    shared = set(ours) & set(theirs) - {"params"}
    assert {"lr", "weight_decay", "maximize", "foreach", "fused"} <= shared
    for key in shared:
        assert ours[key] == theirs[key], key


def _non_default_cases():
    cases = []
    for info in OPTIM_DB:
        for name, value in _torch_defaults(info.torch_cls).items():
            cases.append((info, name, _other_value(value)))
    return cases


@pytest.mark.parametrize(
    "case", _non_default_cases(), ids=lambda c: f"{c[0].name}-{c[1]}={c[2]!r}"
)
def test_each_torch_keyword_at_another_value_is_taken_or_refused_by_name(case):
    info, name, value = case
    if name in REFUSED[info.name]:
        pattern = rf"{name}={re.escape(repr(value))} is not supported by {info.name}: .+; allowed"
        with pytest.raises(ValueError, match=pattern):
            info.optim_cls(_param(), **{name: value})
        # and in a param group, as torch's param groups may carry it
        with pytest.raises(ValueError, match=pattern):
            info.optim_cls([{"params": _param()}, {"params": _param(), name: value}])
        return
    info.torch_cls(_param(), **{name: value})  # torch takes it
    opt = info.optim_cls(_param(), **{name: value})
    group = opt.param_groups[0]
    if name == "decoupled_weight_decay":
        assert group["weight_decay_mode"] == "decoupled"
    else:
        assert group[name] == value


def test_amadam_with_decoupled_weight_decay_steps_as_amadamw():
    # torch.optim.Adam(decoupled_weight_decay=True) is AdamW; AMAdam's is AMAdamW
    for decay in (0.0, 0.1):
        runs = []
        for make in (
            lambda p, decay=decay: AMAdam(
                p, lr=0.1, weight_decay=decay, decoupled_weight_decay=True
            ),
            lambda p, decay=decay: AMAdamW(p, lr=0.1, weight_decay=decay),
        ):
            g = torch.Generator().manual_seed(0)
            w = torch.nn.Parameter(torch.randn(5, generator=g, dtype=torch.float64))
            opt = make([w])
            for _ in range(6):
                opt.zero_grad()
                ((w - 1.0) ** 4).sum().backward()
                opt.step()
            runs.append(w.detach().clone())
        torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


# --------------------------------------------------------------------------- foreign state dicts

from amopt.torch import AMSGD  # noqa: E402


def _objective(w):
    scale = torch.arange(1, w.numel() + 1, dtype=w.dtype).reshape(w.shape)
    return (scale * (w - 1.0) ** 2).sum() + 0.01 * (w**4).sum()


def _steps(opt, params, n):
    for _ in range(n):
        opt.zero_grad()
        sum(_objective(w) for w in params).backward()
        opt.step()


def _start(seed=0, shapes=((5,), (2, 3))):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float64)) for s in shapes]


def _clone(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


# AM-Adam with beta pinned at beta1 (the restart variant with both betas 0.9) and lam 0 is
# Adam step for step: d = g + 0.9 (d - g), x -= lr d / ((1 - 0.9 pi)(eps + sqrt(v_hat)))
PINNED = {"lam": 0.0, "variant": "restart", "beta_high": 0.9, "beta_low": 0.9}


@pytest.mark.parametrize(
    ("torch_cls", "am", "torch_kwargs", "am_kwargs"),
    [
        (torch.optim.AdamW, AMAdamW, {"weight_decay": 0.05}, {"per_layer": True}),
        (torch.optim.AdamW, AMAdamW, {"weight_decay": 0.05}, {"per_layer": False}),
        (torch.optim.Adam, AMAdam, {"weight_decay": 0.05}, {}),
        (torch.optim.AdamW, AMAdam, {}, {"decoupled_weight_decay": True}),
    ],
)
def test_an_adam_state_dict_continues_adams_run(torch_cls, am, torch_kwargs, am_kwargs):
    start = _start()
    through = _clone(start)
    reference = torch_cls(through, lr=0.05, **torch_kwargs)
    _steps(reference, through, 10)

    first = _clone(start)
    saved = torch_cls(first, lr=0.05, **torch_kwargs)
    _steps(saved, first, 5)
    resumed = _clone(first)
    opt = am(resumed, lr=1.0, **PINNED, **am_kwargs)  # lr comes from the state dict
    with pytest.warns(UserWarning, match=r"beta1_prod set to betas\[0\] \*\* step"):
        opt.load_state_dict(saved.state_dict())
    assert opt.param_groups[0]["lr"] == 0.05
    assert opt.param_groups[0]["lam"] == 0.0  # AM's own, kept from the constructor
    _steps(opt, resumed, 5)
    # ten float64 Adam steps of O(1) coordinates, rounding only
    for a, b in zip(resumed, through, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_an_adam_state_dict_keeps_the_am_hyper_parameters():
    params = _start()
    saved = torch.optim.AdamW(params, lr=0.01)
    _steps(saved, params, 3)
    opt = AMAdamW(_clone(params), lr=0.5, lam=0.3, per_layer=False, variant="clip")
    with pytest.warns(UserWarning):
        opt.load_state_dict(saved.state_dict())
    group = opt.param_groups[0]
    assert (group["lam"], group["per_layer"], group["variant"]) == (0.3, False, "clip")
    state = [opt.state[p] for p in group["params"]]
    assert state[0]["beta1_prod"] is state[1]["beta1_prod"]  # one product per global scope
    assert float(state[0]["beta1_prod"]) == pytest.approx(0.9**3, rel=1e-15)


@pytest.mark.parametrize(
    ("make_saved", "am", "match"),
    [
        (
            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            lambda p: AMSGD(p, lr=1.0),
            r"AMSGD\.load_state_dict: .*momentum_buffer.*lr = lr_SGD / \(1 - momentum\)",
        ),
        (
            lambda p: torch.optim.SGD(p, lr=0.1),
            lambda p: AMSGD(p, lr=1.0),
            r"AMSGD\.load_state_dict: this state dict was saved by another optimizer",
        ),
        (
            lambda p: torch.optim.AdamW(p, amsgrad=True),
            lambda p: AMAdamW(p),
            r"AMAdamW\.load_state_dict: .*\['max_exp_avg_sq'\]",
        ),
        (
            lambda p: torch.optim.Adam(p, weight_decay=0.1),
            lambda p: AMAdamW(p),
            r"Adam's L2 weight decay .*weight_decay_mode='decoupled'; load it into AMAdam$",
        ),
        (
            lambda p: torch.optim.AdamW(p),
            lambda p: AMAdam(p),
            r"AdamW's decoupled weight decay .*weight_decay_mode='l2'; load it into AMAdamW$",
        ),
        (
            lambda p: AMSGD(p, lr=0.1),
            lambda p: AMAdamW(p),
            r"AMAdamW\.load_state_dict: .*\['momentum_buffer'\], which AMAdamW cannot take",
        ),
        (
            lambda p: AMAdamW(p),
            lambda p: AMSGD(p),
            r"AMSGD\.load_state_dict: .*\['beta1_prod', 'exp_avg', 'exp_avg_sq'\]",
        ),
    ],
)
def test_a_state_dict_that_means_something_else_is_refused(make_saved, am, match):
    params = _start()
    saved = make_saved(params)
    _steps(saved, params, 2)
    opt = am(_clone(params))
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(saved.state_dict())
    assert opt.state_dict() == before  # nothing loaded


# --------------------------------------------------------------------------- AMSGD's lr


def _pinned(m):
    """AMSGD's beta held at ``m`` with lam 0: gamma = m, d = g + m (d - g) = m d + (1 - m) g."""
    return {"momentum": m, "lam": 0.0, "variant": "restart", "beta_high": m, "beta_low": m}


@pytest.mark.parametrize("impl", [{"foreach": False}, {"foreach": True}, {}])
@pytest.mark.parametrize("m", [0.5, 0.9])
def test_amsgd_with_beta_pinned_is_torch_sgd_with_dampening_m(m, impl):
    # the damped heavy ball: torch's b = m b + (1 - dampening) g with b_0 = g_0 and
    # dampening = m is AM's d = m d + (1 - m) g
    start = _start()
    runs = []
    for make in (
        lambda p: AMSGD(p, lr=0.02, **_pinned(m), **impl),
        lambda p: torch.optim.SGD(p, lr=0.02, momentum=m, dampening=m),
    ):
        params = _clone(start)
        _steps(make(params), params, 40)
        runs.append(params)
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("m", [0.5, 0.9])
def test_amsgd_lr_a_over_1_minus_m_tracks_torch_sgd_lr_a(m):
    # with the same gradients g_0, g_1, ... (fed, not computed at the iterates), torch's
    # b_t = m b + g and AM's d_t = m d + (1 - m) g differ by e_t = b_t - d_t / (1 - m) =
    # m^t e_0, e_0 = -m g_0 / (1 - m) (both start at g_0): the iterates differ by
    # a sum_{s<t} e_s, i.e. x_sgd - x_am = a m (1 - m^t) / (1 - m)^2 g_0 exactly
    a, steps = 0.01, 60
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(7, generator=g, dtype=torch.float64) for _ in range(steps)]
    x0 = torch.randn(7, generator=g, dtype=torch.float64)
    sgd_x, am_x = torch.nn.Parameter(x0.clone()), torch.nn.Parameter(x0.clone())
    sgd = torch.optim.SGD([sgd_x], lr=a, momentum=m)
    am = AMSGD([am_x], lr=a / (1 - m), **_pinned(m))
    for t, grad in enumerate(grads, start=1):
        for x, opt in ((sgd_x, sgd), (am_x, am)):
            x.grad = grad.clone()
            opt.step()
        offset = a * m * (1 - m**t) / (1 - m) ** 2 * grads[0]
        torch.testing.assert_close(sgd_x - am_x, offset, rtol=0, atol=1e-13)
    # the copied config, AMSGD(lr=a, momentum=m), takes steps 1 - m times as long
    short = torch.nn.Parameter(x0.clone())
    copied = AMSGD([short], lr=a, **_pinned(m))
    for grad in grads:
        short.grad = grad.clone()
        copied.step()
    torch.testing.assert_close(short - x0, (am_x - x0) * (1 - m), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cls", [AMAdamW, AMAdam])
def test_adamws_positional_amsgrad_is_a_type_error_that_says_so(cls):
    # AdamW(params, lr, betas, eps, weight_decay, amsgrad): here the sixth is lam
    torch.optim.AdamW(_param(), 1e-3, (0.9, 0.999), 1e-8, 0.01, False)
    with pytest.raises(TypeError, match=r"lam=False: the sixth positional argument .* amsgrad"):
        cls(_param(), 1e-3, (0.9, 0.999), 1e-8, 0.01, False)


@pytest.mark.parametrize("cls", [AMSGD, AMAdamW])
def test_an_am_state_dict_with_an_entry_of_a_later_version_still_loads(cls):
    params = _start()
    opt = cls(params, lr=0.01)
    _steps(opt, params, 2)
    saved = copy.deepcopy(opt.state_dict())
    saved["state"][0]["later_entry"] = torch.tensor(1.0)
    other = cls(_clone(params), lr=0.01)
    other.load_state_dict(saved)
    assert float(other.state[other.param_groups[0]["params"][0]]["later_entry"]) == 1.0
