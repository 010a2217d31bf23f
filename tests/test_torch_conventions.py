"""``torch.optim`` conventions of the AM optimizers, as torch's own optimizer suite checks them.

Hyper-parameters (tensor ``lr`` and ``betas``, the default ``lr``, non-finite
values, ``fused`` with ``foreach``), ``fused=True`` on devices without fused
kernels, the implementation the defaults choose per device and dtype,
``torch.amp.GradScaler``'s protocol, float16 parameters, and steps that read no
tensor value on the host. References are computed independently: the same
optimizer with float hyper-parameters, a run without a GradScaler, a float32 run,
``torch.optim.AdamW``.
"""

from __future__ import annotations

import copy
import inspect
import math
import types
import warnings

import pytest

torch = pytest.importorskip("torch")


from amopt.torch import AMSGD, AMAdam, AMAdamW, _common, _fused, am_adamw, amsgd  # noqa: E402
from amopt.torch._fused import FusedFallbackWarning  # noqa: E402
from benchmarks.counters import LOCAL_SCALAR, HostReads, OpCounter  # noqa: E402

CLASSES = [AMSGD, AMAdamW, AMAdam]
IMPLS = {
    "single": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
    "default": {},
}
F16_EPS = torch.finfo(torch.float16).eps


def _ids(cls):
    return cls.__name__


def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model.to(dtype)


def _data(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 4, generator=g).to(dtype), torch.randn(16, 1, generator=g)


def _loss(model, X, y):
    return torch.nn.functional.mse_loss(model(X).float(), y)


def _backward(model, opt, X, y):
    opt.zero_grad()
    _loss(model, X, y).backward()


def _train(cls, kwargs, n_steps=5, dtype=torch.float32, scheduler=None):
    model = _model(dtype)
    X, y = _data(dtype)
    opt = cls(model.parameters(), **kwargs)
    sched = scheduler(opt) if scheduler else None
    for _ in range(n_steps):
        _backward(model, opt, X, y)
        opt.step()
        if sched is not None:
            sched.step()
    return model, opt


def _assert_same_run(run_a, run_b, exact=True):
    (model_a, opt_a), (model_b, opt_b) = run_a, run_b
    tol = {"rtol": 0.0, "atol": 0.0} if exact else {}
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(p, q, **tol)
        assert opt_a.state[p].keys() == opt_b.state[q].keys()
        for key, value in opt_a.state[p].items():
            torch.testing.assert_close(value, opt_b.state[q][key], **tol)


@pytest.fixture
def quiet_fallback():
    """fused=True on half precision runs foreach with a FusedFallbackWarning: expected here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FusedFallbackWarning)
        yield


# --------------------------------------------------------------------------- hyper-parameters


@pytest.mark.parametrize("impl", ["single", "fused", "default"])
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_tensor_lr_gives_the_float_lr_iterates(cls, impl):
    """A 0-d (or 1-element) tensor lr is accepted wherever torch.optim.Adam accepts one."""
    floats = _train(cls, {"lr": 0.01, **IMPLS[impl]})
    tensors = _train(cls, {"lr": torch.tensor([0.01], dtype=torch.float64), **IMPLS[impl]})
    _assert_same_run(tensors, floats)


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_tensor_lr_follows_a_scheduler(cls):
    """torch's schedulers fill a tensor lr in place; the steps follow the scheduled values."""

    def sched(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    floats = _train(cls, {"lr": 0.02, "foreach": False}, scheduler=sched)
    lr = torch.tensor(0.02, dtype=torch.float64)
    tensors = _train(cls, {"lr": lr, "foreach": False}, scheduler=sched)
    assert tensors[1].param_groups[0]["lr"] is lr and float(lr) == 0.02 * 0.5**5
    _assert_same_run(tensors, floats)


def test_functional_forms_take_a_tensor_lr():
    xs = [torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64) for _ in range(2)]
    g = torch.tensor([0.5, 0.25, -1.0], dtype=torch.float64)
    amsgd([xs[0]], [g], [None], [torch.tensor(0.0)], foreach=False, lr=0.1)
    amsgd(
        [xs[1]],
        [g],
        [None],
        [torch.tensor(0.0)],
        foreach=False,
        lr=torch.tensor(0.1, dtype=torch.float64),
    )
    assert torch.equal(xs[0], xs[1])
    ys = [torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64) for _ in range(2)]
    for y, lr in zip(ys, (0.1, torch.tensor(0.1, dtype=torch.float64)), strict=True):
        state = [torch.zeros(3, dtype=torch.float64) for _ in range(2)]
        prods = [torch.ones((), dtype=torch.float64)]
        am_adamw([y], [g], state[:1], state[1:], [torch.tensor(0.0)], prods, lr=lr, foreach=False)
    assert torch.equal(ys[0], ys[1])


@pytest.mark.parametrize("impl", ["foreach", "single", "fused", "default"])
def test_amsgd_takes_a_tensor_lr_on_every_path_as_torch_sgd(impl):
    """torch.optim.SGD takes a tensor lr with foreach=True too; so does AMSGD, on every path,
    following a scheduler that fills the tensor in place."""

    def sched(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    torch.optim.SGD(_model().parameters(), lr=torch.tensor(0.01), momentum=0.9, foreach=True)
    floats = _train(AMSGD, {"lr": 0.02, **IMPLS[impl]}, scheduler=sched)
    lr = torch.tensor([0.02], dtype=torch.float64)
    tensors = _train(AMSGD, {"lr": lr, **IMPLS[impl]}, scheduler=sched)
    assert tensors[1].param_groups[0]["lr"] is lr and float(lr) == 0.02 * 0.5**5
    _assert_same_run(tensors, floats)
    xs = [torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64) for _ in range(2)]
    g = torch.tensor([0.5, 0.25, -1.0], dtype=torch.float64)
    for x, lr in zip(xs, (0.1, torch.tensor(0.1, dtype=torch.float64)), strict=True):
        amsgd([x], [g], [None], [torch.tensor(0.0)], lr=lr, **IMPLS[impl])
    assert torch.equal(xs[0], xs[1])


@pytest.mark.parametrize("cls", [AMAdamW, AMAdam], ids=_ids)
def test_tensor_lr_with_foreach_in_a_param_group_is_a_value_error(cls):
    """As in torch.optim.AdamW, which needs capturable=True for it."""
    params = list(_model().parameters())
    opt = cls(params[:2], lr=0.01)
    with pytest.raises(ValueError, match="lr as a Tensor is not supported for capturable=False"):
        opt.add_param_group({"params": params[2:], "lr": torch.tensor(0.01), "foreach": True})


def test_amsgd_default_lr_is_torch_sgd_default():
    sgd_default = inspect.signature(torch.optim.SGD).parameters["lr"].default
    assert inspect.signature(AMSGD).parameters["lr"].default == sgd_default == 1e-3
    _assert_same_run(
        _train(AMSGD, {"foreach": False}), _train(AMSGD, {"lr": 1e-3, "foreach": False})
    )


@pytest.mark.parametrize("impl", ["single", "fused", "default"])
@pytest.mark.parametrize("cls", [AMAdamW, AMAdam], ids=_ids)
def test_tensor_betas_give_the_float_betas_iterates(cls, impl):
    floats = _train(cls, {"lr": 0.01, "betas": (0.85, 0.99), **IMPLS[impl]})
    betas = (torch.tensor([0.85], dtype=torch.float64), torch.tensor(0.99, dtype=torch.float64))
    tensors = _train(cls, {"lr": 0.01, "betas": betas, **IMPLS[impl]})
    _assert_same_run(tensors, floats)
    stored = tensors[1].param_groups[0]["betas"]
    assert all(isinstance(b, torch.Tensor) and b.shape == () for b in stored)


def _inputs_for(cls, key, value):
    if key == "eps" and cls is AMSGD:
        return None
    return {key: value}


NON_FINITE = [
    pytest.param(key, value, id=f"{key}={value}")
    for key in ("lr", "lam", "weight_decay", "eps")
    for value in (math.inf, -math.inf, math.nan)
]


@pytest.mark.parametrize(("key", "value"), NON_FINITE)
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_non_finite_hyperparameters_are_value_errors(cls, key, value):
    if key == "eps" and cls is AMSGD:
        pytest.skip("AMSGD has no eps")
    expected = (
        rf"{key} must not be NaN; got {key}=nan"
        if math.isnan(value)
        else rf"{key} must be a finite number >= 0; got {key}=-?inf"
    )
    params = list(_model().parameters())
    with pytest.raises(ValueError, match=expected):
        cls(params, **{key: value})
    opt = cls(params[:2])
    with pytest.raises(ValueError, match=expected):
        opt.add_param_group({"params": params[2:], key: value})
    if key == "lr":
        with pytest.raises(ValueError, match=expected):
            cls(params, lr=torch.tensor(value))


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_fused_and_foreach_together_are_a_runtime_error(cls):
    params = list(_model().parameters())
    message = r"`fused` and `foreach` cannot be `True` together; got fused=True, foreach=True"
    with pytest.raises(RuntimeError, match=message):
        cls(params, fused=True, foreach=True)
    opt = cls(params[:2], foreach=True)
    with pytest.raises(RuntimeError, match=message):
        opt.add_param_group({"params": params[2:], "fused": True})


def test_functional_fused_and_foreach_together_are_a_runtime_error():
    x, g = torch.zeros(3), torch.ones(3)
    message = r"`fused` and `foreach` cannot be `True` together"
    with pytest.raises(RuntimeError, match=message):
        amsgd([x], [g], [None], [torch.tensor(0.0)], fused=True, foreach=True, lr=0.1)
    d, v, prods = [torch.zeros(3)], [torch.zeros(3)], [torch.ones(())]
    with pytest.raises(RuntimeError, match=message):
        am_adamw([x], [g], d, v, [torch.tensor(0.0)], prods, fused=True, foreach=True)
    assert torch.equal(x, torch.zeros(3)) and torch.equal(d[0], torch.zeros(3))


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_zero_gradients_without_weight_decay_leave_the_parameters(cls, impl):
    """With weight decay (AMAdamW's default 1e-2, decoupled) parameters shrink as in AdamW."""
    x = torch.nn.Parameter(torch.randn(5, 1))
    x0 = x.detach().clone()
    opt = cls([x], lr=0.1, weight_decay=0.0, **IMPLS[impl])
    for _ in range(2):
        x.grad = torch.zeros_like(x)
        opt.step()
    assert torch.equal(x, x0)
    decayed = torch.nn.Parameter(x0.clone())
    adamw = AMAdamW([decayed], lr=0.1, weight_decay=0.5, **IMPLS[impl])
    decayed.grad = torch.zeros_like(decayed)
    adamw.step()
    torch.testing.assert_close(decayed.detach(), x0 * (1 - 0.1 * 0.5))


@pytest.mark.parametrize("foreach", [False, True])
def test_a_global_scope_does_not_depend_on_how_tensors_are_split(foreach):
    """One complex tensor or its real and imaginary parts: the same global beta and iterates
    (to float rounding of the sums). A per-tensor scope changes with the split, by design."""
    torch.manual_seed(0)
    z = torch.randn(6, dtype=torch.complex128, requires_grad=True)
    parts = [z.real.detach().clone().requires_grad_(), z.imag.detach().clone().requires_grad_()]
    opt_z = AMSGD([z], lr=0.05, foreach=foreach)
    opt_parts = AMSGD(parts, lr=0.05, foreach=foreach)
    target = torch.randn(6, dtype=torch.complex128)
    for _ in range(5):
        opt_z.zero_grad()
        opt_parts.zero_grad()
        ((z - target).abs() ** 2).sum().backward()
        ((torch.complex(*parts) - target).abs() ** 2).sum().backward()
        opt_z.step()
        opt_parts.step()
        torch.testing.assert_close(z.real, parts[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(z.imag, parts[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(opt_z.latest_betas()[0][0], opt_parts.latest_betas()[0][0])


# --------------------------------------------------------------------------- fused devices


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_fused_on_a_device_without_fused_kernels_is_a_runtime_error(cls, monkeypatch):
    # no Triton here: the registry's answer (amopt.backends.library_available)
    monkeypatch.setattr(_common.backends, "library_available", lambda name: name != "triton")
    with torch.device("meta"):
        model = _model()
    opt = cls(model.parameters(), fused=True)  # as torch.optim: checked at the first step
    with torch.device("meta"):
        for p in model.parameters():
            p.grad = torch.rand_like(p)
    message = (
        r"`fused=True` requires all the params to be floating point Tensors of supported "
        r"devices: \['cpu'\] but torch.float32 and meta"
    )
    with pytest.raises(RuntimeError, match=message):
        opt.step()
    assert not any(opt.state.values())
    opt.zero_grad(set_to_none=True)
    opt.step()  # no gradient: nothing to check, nothing to raise
    # on the CPU the same configuration steps, as the single-tensor reference does
    fused = _train(cls, {"lr": 0.01, "fused": True}, n_steps=3)
    _assert_same_run(fused, _train(cls, {"lr": 0.01, "foreach": False}, n_steps=3), exact=False)


# --------------------------------------------------------------------------- default path


@pytest.fixture
def kernels_available(monkeypatch):
    monkeypatch.setattr(_fused, "library", lambda: object())


@pytest.fixture
def kernels_unavailable(monkeypatch):
    monkeypatch.setitem(_fused._state, "tried", True)
    monkeypatch.setitem(_fused._state, "lib", None)
    monkeypatch.setitem(_fused._state, "error", "RuntimeError: no compiler (simulated)")


def _fake_cuda(n=2):
    return [types.SimpleNamespace(device=torch.device("cuda", 0), is_cpu=False) for _ in range(n)]


def _triton(monkeypatch, available):
    module = types.SimpleNamespace(available=available)
    monkeypatch.setattr(_common, "triton_module", lambda: module)


def _choose(params, grads=None, fused=None, foreach=None):
    grads = [torch.zeros_like(p) for p in params] if grads is None else grads
    return _common.default_path(params, grads, fused=fused, foreach=foreach)


@pytest.mark.parametrize(
    ("dtypes", "expected"),
    [
        ((torch.float32,), "fused"),
        ((torch.float64, torch.float64), "fused"),
        ((torch.complex64, torch.float32), "fused"),
        ((torch.bfloat16,), "foreach"),
        ((torch.float16, torch.float16), "foreach"),
        ((torch.float32, torch.float64), "foreach"),
    ],
)
def test_default_path_on_the_cpu(dtypes, expected, kernels_available):
    params = [torch.zeros(3, dtype=dt) for dt in dtypes]
    assert _choose(params) == (expected, None)


def test_default_path_on_the_cpu_falls_back_and_says_why(kernels_available, monkeypatch):
    strided = [torch.zeros(4, 4)[:, 0]]
    path, reason = _choose(strided, [torch.zeros(4)])
    assert path == "foreach" and "contiguous" in reason
    monkeypatch.setitem(_fused._state, "tried", True)
    monkeypatch.setitem(_fused._state, "lib", None)
    monkeypatch.setitem(_fused._state, "error", "RuntimeError: no compiler (simulated)")
    monkeypatch.setattr(_fused, "library", lambda: None)
    path, reason = _choose([torch.zeros(3)])
    assert path == "foreach" and "no compiler (simulated)" in reason


def test_default_path_on_cuda_is_triton_where_it_imports(monkeypatch):
    params = _fake_cuda()
    _triton(monkeypatch, lambda tensors: None)
    assert _choose(params, grads=_fake_cuda()) == ("triton", None)
    _triton(monkeypatch, lambda tensors: "bfloat16 is not supported (simulated)")
    assert _choose(params, grads=_fake_cuda()) == (
        "foreach",
        "bfloat16 is not supported (simulated)",
    )
    monkeypatch.setattr(_common, "triton_module", lambda: None)
    path, reason = _choose(params, grads=_fake_cuda())
    assert path == "foreach" and reason.startswith("the Triton kernels are unavailable")


def test_default_path_elsewhere_is_foreach():
    params = [torch.zeros(3, device="meta")]
    assert _choose(params) == ("foreach", None)


def test_explicit_flags_are_respected(kernels_available, monkeypatch):
    cpu = [torch.zeros(3, dtype=torch.bfloat16)]
    assert _choose(cpu, fused=True) == ("fused", None)
    assert _choose(cpu, foreach=True) == ("foreach", None)
    assert _choose([torch.zeros(3)], foreach=False) == ("single", None)
    assert _choose([torch.zeros(3)], fused=False) == ("single", None)  # as torch.optim
    monkeypatch.setattr(_common, "triton_module", lambda: None)
    assert _choose(_fake_cuda(), grads=_fake_cuda(), fused=True) == ("triton", None)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        _choose(cpu, fused=True, foreach=True)


def _spy(monkeypatch, module, names):
    calls = []
    for name in names:
        original = getattr(module, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_default_step_runs_the_fused_kernels_for_cpu_float32(cls, monkeypatch):
    if not _fused.fused_status()["available"]:
        pytest.skip("no C compiler here: the defaults run foreach (tested below)")
    calls = _spy(monkeypatch, _fused, ["fused_amsgd", "fused_am_adamw"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusedFallbackWarning)
        default = _train(cls, {"lr": 0.01}, n_steps=3)
    assert len(calls) == 3
    _assert_same_run(default, _train(cls, {"lr": 0.01, "fused": True}, n_steps=3))


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_default_step_runs_foreach_for_bfloat16(cls, monkeypatch):
    module = inspect.getmodule(cls)
    calls = _spy(monkeypatch, module, [n for n in dir(module) if n.startswith("_multi_tensor")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusedFallbackWarning)
        default = _train(cls, {"lr": 0.01}, n_steps=3, dtype=torch.bfloat16)
    assert len(calls) == 3
    _assert_same_run(default, _train(cls, {"lr": 0.01, "foreach": True}, 3, torch.bfloat16))


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_fallback_warns_once_per_optimizer(cls, kernels_unavailable):
    for _ in range(2):  # a second optimizer warns again
        with pytest.warns(FusedFallbackWarning, match="no compiler \\(simulated\\)") as record:
            model, _ = _train(cls, {"lr": 0.01}, n_steps=4)
        assert len([w for w in record if w.category is FusedFallbackWarning]) == 1
    _assert_same_run((model, _), _train(cls, {"lr": 0.01, "foreach": True}, n_steps=4))


@pytest.fixture
def triton_everywhere(monkeypatch):
    """Every step runs the Triton kernels, on CPU tensors in Triton's interpreter."""
    pytest.importorskip("triton")
    from amopt.torch import _step, _triton

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if _triton.available([torch.zeros(1)]) is not None:
        pytest.skip(_triton.available([torch.zeros(1)]))
    original = _common.default_path

    def default_path(params, grads, *, fused, foreach):
        if fused or (fused is None and foreach is None):  # fused=True on the CPU here
            return "triton", None
        return original(params, grads, fused=fused, foreach=foreach)

    for module in (_common, _step):
        monkeypatch.setattr(module, "default_path", default_path)
    return _spy(monkeypatch, _triton, ["triton_amsgd", "triton_am_adamw"])


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_triton_path_gets_the_step_and_the_grad_scaler(cls, triton_everywhere):
    """Where the Triton path is chosen, the optimizers hand it their state and GradScaler's
    scale and found_inf: the iterates of the single-tensor path, and a skipped step."""
    model, X, y = _model(torch.float64), *_data(torch.float64)
    reference = copy.deepcopy(model)
    opt = cls(model.parameters(), lr=0.01)
    ref_opt = cls(reference.parameters(), lr=0.01, foreach=False)
    for _ in range(3):
        for m, o in ((model, opt), (reference, ref_opt)):
            _backward(m, o, X, y)
            o.step()
    assert len(triton_everywhere) == 3
    _assert_same_run((model, opt), (reference, ref_opt), exact=False)
    scaled, scaled_opt, before, _ = _scaled_run(
        cls, {"lr": 0.01}, torch.float32, inf_at=(1,), n_steps=2
    )
    assert len(triton_everywhere) == 3 + 2
    for p, old in zip(scaled.parameters(), before[1][0], strict=True):
        assert torch.equal(p, old)  # the inf step left the parameters as they were
        assert float(scaled_opt.state[p]["step"]) == 1
    unscaled = _train(cls, {"lr": 0.01, "foreach": False}, n_steps=1)
    _assert_same_run((scaled, scaled_opt), unscaled, exact=False)


# --------------------------------------------------------------------------- GradScaler


def _scaled_run(cls, kwargs, dtype, inf_at=(), n_steps=4):
    """Train with a GradScaler (scale 2**10); an inf gradient at the steps ``inf_at``.

    Returns the model and optimizer, and for each step the state before it.
    """
    model = _model(dtype)
    X, y = _data(dtype)
    opt = cls(model.parameters(), **kwargs)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    before = []
    for t in range(n_steps):
        before.append(
            (
                [p.detach().clone() for p in model.parameters()],
                copy.deepcopy([opt.state[p] for p in model.parameters()]),
            )
        )
        opt.zero_grad()
        scaler.scale(_loss(model, X, y)).backward()
        if t in inf_at:
            next(model.parameters()).grad[0, 0] = math.inf
        scaler.step(opt)
        scaler.update()
    return model, opt, before, scaler


PRECISIONS = [torch.float32, torch.bfloat16]


def _c_kernels(impl, dtype):
    """Whether ``impl`` runs the fused C kernels for ``dtype`` on the CPU."""
    return impl in ("fused", "default") and dtype in (torch.float32, torch.float64)


@pytest.mark.usefixtures("quiet_fallback")
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("dtype", PRECISIONS, ids=str)
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_grad_scaler_steps_equal_the_unscaled_steps(cls, dtype, impl):
    """The optimizer unscales itself (GradScaler hands it grad_scale): a power-of-two scale
    makes the scaled run bit-identical to a run without GradScaler (the C kernels, which
    fold the scale into their arithmetic, to float rounding)."""
    assert cls._step_supports_amp_scaling
    model, opt, _, scaler = _scaled_run(cls, {"lr": 0.01, **IMPLS[impl]}, dtype)
    assert scaler.get_scale() == 2.0**10
    reference = _train(cls, {"lr": 0.01, **IMPLS[impl]}, 4, dtype)
    _assert_same_run((model, opt), reference, exact=not _c_kernels(impl, dtype))


@pytest.mark.usefixtures("quiet_fallback")
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("dtype", PRECISIONS, ids=str)
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_grad_scaler_inf_gradient_skips_the_step(cls, dtype, impl):
    model, opt, before, scaler = _scaled_run(
        cls, {"lr": 0.01, **IMPLS[impl]}, dtype, inf_at=(2,), n_steps=3
    )
    params_before, state_before = before[2]
    assert scaler.get_scale() == 2.0**9  # the scaler saw the inf
    for p, old, old_state in zip(model.parameters(), params_before, state_before, strict=True):
        assert torch.equal(p, old)
        assert opt.state[p].keys() == old_state.keys()
        for key, value in old_state.items():
            assert torch.equal(opt.state[p][key], value), key
        assert float(opt.state[p]["step"]) == 2


@pytest.mark.usefixtures("quiet_fallback")
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_grad_scaler_skipped_first_step_then_starts_afresh(cls, impl):
    """A first step skipped for an inf gradient: the next step is a first step."""
    kwargs = {"lr": 0.01, **IMPLS[impl]}
    model, opt, _, _ = _scaled_run(cls, kwargs, torch.float32, inf_at=(0,), n_steps=3)
    reference = _train(cls, kwargs, n_steps=2)
    _assert_same_run((model, opt), reference, exact=not _c_kernels(impl, torch.float32))


@pytest.mark.parametrize("found", [0.0, 1.0])
def test_skipped_step_blends_the_0d_state_in_a_constant_number_of_operations(found):
    """With a per-layer scope every parameter has its own 0-d entries: a GradScaler's
    skipped step puts them back with a few operations per dtype, not one per parameter;
    a skipped step keeps the old value even where the new one is NaN, and 0 where there
    was none."""
    counts = {}
    for n in (8, 80):
        olds = [torch.tensor(float(i), dtype=torch.float64) for i in range(n)]
        olds += [torch.tensor([float(i)]) for i in range(n)]  # a (1,) entry, float32
        news = [torch.tensor(-float(i), dtype=torch.float64) for i in range(n)]
        news += [torch.tensor(math.nan) for _ in range(n)]
        skip = _common.InfSkip(torch.tensor(found), [])
        with OpCounter() as ops:
            out = skip.blend_all(olds, news)
        counts[n] = ops.kernel_ops
        for old, new, got in zip(olds, news, out, strict=True):
            want = old.reshape(()).to(new.dtype) if found else new
            assert got.shape == new.shape and got.dtype == new.dtype
            assert torch.equal(got, want) or (not found and math.isnan(got))
    assert counts[8] == counts[80] <= 8, counts  # two dtypes: 2 stacks and a where each
    missing = _common.InfSkip(torch.tensor(1.0), []).blend_all([None], [torch.tensor(3.0)])
    assert torch.equal(missing[0], torch.tensor(0.0))


def test_functional_found_inf_leaves_everything_as_it_was():
    x = torch.tensor([1.0, -2.0, 3.0])
    g = torch.tensor([math.inf, 0.5, 1.0])
    d, v, steps = torch.full((3,), 0.5), torch.full((3,), 0.25), [torch.tensor(4.0)]
    prods = [torch.tensor(0.5)]
    found = torch.ones(())
    for foreach in (False, True):
        xs, ds, vs = [x.clone()], [d.clone()], [v.clone()]
        _, new_prods = am_adamw(
            xs, [g], ds, vs, steps, prods, foreach=foreach, found_inf=found, lr=0.1
        )
        assert torch.equal(xs[0], x) and torch.equal(ds[0], d) and torch.equal(vs[0], v)
        assert float(steps[0]) == 4.0 and torch.equal(new_prods[0], prods[0])
        bufs = [None]
        amsgd(xs, [g], bufs, steps, foreach=foreach, found_inf=found, lr=0.1)
        assert torch.equal(xs[0], x) and torch.equal(bufs[0], torch.zeros(3))


# --------------------------------------------------------------------------- float16


def _f16_params_and_grads(n_steps):
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(64, generator=g).to(torch.float16)
    grads = []
    for _ in range(n_steps):
        magnitude = torch.empty(64).uniform_(256.0, 4096.0, generator=g)
        sign = torch.randint(0, 2, (64,), generator=g) * 2 - 1
        grads.append((magnitude * sign).to(torch.float16))
    return x0, grads


def _run_on(x0, grads, dtype, cls, kwargs):
    x = torch.nn.Parameter(x0.to(dtype, copy=True))
    opt = cls([x], **kwargs)
    for g in grads:
        x.grad = g.to(dtype)
        opt.step()
    return x.detach(), opt


@pytest.mark.usefixtures("quiet_fallback")
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_float16_large_gradients_stay_finite(cls, impl):
    """|g| >= 256 overflows g*g and v / (1 - beta2^t) in float16; torch's AdamW stays finite,
    and so does every AM path (extreme gradients included: a stored v = inf saturates)."""
    x0, grads = _f16_params_and_grads(5)
    grads.append(torch.full((64,), 60000.0, dtype=torch.float16))
    adamw, _ = _run_on(x0, grads, torch.float16, torch.optim.AdamW, {"lr": 1e-3})
    assert torch.isfinite(adamw).all()
    x, opt = _run_on(x0, grads, torch.float16, cls, {"lr": 1e-3, **IMPLS[impl]})
    assert torch.isfinite(x).all() and not torch.equal(x, x0)
    for value in opt.state[opt.param_groups[0]["params"][0]].values():
        if value.dtype != torch.float16:
            assert torch.isfinite(value).all()


@pytest.mark.parametrize("lam", [0.0, 0.1])
@pytest.mark.parametrize("impl", ["single", "foreach"])
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_float16_steps_match_a_float32_run_to_float16_rounding(cls, impl, lam):
    """Computed in float32 and stored in float16: on the same (float16) data a float32
    run, rounded to float16, equals the float16 run after one step, and after n steps
    differs by the float16 rounding of x at each step, at most (n + 1) / 2 ulps."""
    n_steps = 4
    x0, grads = _f16_params_and_grads(n_steps)
    kwargs = {"lr": 1e-4 if cls is AMSGD else 1e-2, "lam": lam, **IMPLS[impl]}
    x16, opt = _run_on(x0, grads[:1], torch.float16, cls, kwargs)
    x32, _ = _run_on(x0, grads[:1], torch.float32, cls, kwargs)
    assert torch.equal(x16, x32.half())
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert {
        state[k].dtype for k in ("momentum_buffer", "exp_avg", "exp_avg_sq") if k in state
    } == {torch.float16}
    x16, _ = _run_on(x0, grads, torch.float16, cls, kwargs)
    x32, _ = _run_on(x0, grads, torch.float32, cls, kwargs)
    tol = (n_steps + 1) / 2 * F16_EPS
    torch.testing.assert_close(x16.float(), x32.half().float(), rtol=tol, atol=tol)


def test_float16_first_am_step_with_lam_0_is_adamws():
    """On the first step beta = beta1_max, so AM-AdamW with lam = 0 steps as AdamW does."""
    x0, grads = _f16_params_and_grads(1)
    am, _ = _run_on(x0, grads, torch.float16, AMAdamW, {"lr": 1e-2, "lam": 0.0, "foreach": False})
    ref, _ = _run_on(x0, grads, torch.float16, torch.optim.AdamW, {"lr": 1e-2})
    torch.testing.assert_close(am.float(), ref.float(), rtol=F16_EPS, atol=F16_EPS)


# --------------------------------------------------------------------------- host reads


def _no_host_reads():
    """The shared host-read counter, failing on every operator that copies a tensor value to
    a Python number."""
    return HostReads(forbid=(LOCAL_SCALAR, "aten.item.default"))


@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
@pytest.mark.parametrize("impl", ["single", "foreach"])
@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_step_reads_no_tensor_value_on_the_host(cls, impl, per_layer):
    model = _model(torch.float32)
    X, y = _data()
    kwargs = {"lr": 0.01, "per_layer": per_layer, "variant": "clip", **IMPLS[impl]}
    opt = cls(model.parameters(), **kwargs)
    for _ in range(2):
        _backward(model, opt, X, y)
        opt.step()
    _backward(model, opt, X, y)
    with _no_host_reads():
        opt.step()
        opt.latest_betas()
    # the mode sees what a host read looks like
    with pytest.raises(AssertionError, match="_local_scalar_dense"), _no_host_reads():
        float(torch.ones(()))


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_state_tensors_keep_their_identity_across_steps(cls):
    """The state is updated in place (what keeps a compiled step from recompiling)."""
    model, opt = _train(cls, {"lr": 0.01, "per_layer": False, "foreach": True}, n_steps=1)
    ids = {
        (i, k): id(v) for i, p in enumerate(model.parameters()) for k, v in opt.state[p].items()
    }
    X, y = _data()
    for _ in range(2):
        _backward(model, opt, X, y)
        opt.step()
    after = {
        (i, k): id(v) for i, p in enumerate(model.parameters()) for k, v in opt.state[p].items()
    }
    assert after == ids
    betas = opt.latest_betas()[0]
    assert all(b is betas[0] for b in betas)  # a global scope shares its beta


# --------------------------------------------------------------------------- capturable

ADAMS = [AMAdamW, AMAdam]


def _host_ops():
    """The shared op counter, recording in ``ops`` every operator that makes a CPU tensor."""
    host = OpCounter()
    host.ops_on_cpu = []

    def on_cpu(func, args, kwargs, out):
        flat = out if isinstance(out, list | tuple) else [out]
        if any(isinstance(t, torch.Tensor) and t.is_cpu for t in flat):
            host.ops_on_cpu.append(str(func))

    host.watch = on_cpu
    return host


def _meta_group():
    """Parameters on the ``meta`` device, a stand-in accelerator: values are never
    computed, and reading one on the host raises."""
    params = [torch.nn.Parameter(torch.empty(4, 3, device="meta")) for _ in range(2)]
    params.append(torch.nn.Parameter(torch.empty(5, device="meta")))
    for p in params:
        p.grad = torch.empty_like(p)
    return params


@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
@pytest.mark.parametrize("impl", ["single", "foreach"])
@pytest.mark.parametrize("cls", ADAMS, ids=_ids)
def test_capturable_step_runs_nothing_on_the_host(monkeypatch, cls, impl, per_layer):
    """``capturable=True``: counters, bias corrections, beta and products stay on the
    parameters' device; not one operator of the step makes a CPU tensor. Without it the
    bias corrections are computed on the CPU counters (the check sees those)."""
    monkeypatch.setattr(_common, "capturable_devices", lambda: ["cuda", "meta"])
    for capturable in (True, False):
        params = _meta_group()
        opt = cls(params, capturable=capturable, per_layer=per_layer, **IMPLS[impl])
        opt.step()
        host = _host_ops()
        with host:
            opt.step()
            opt.latest_betas()
        state = opt.state[params[0]]
        if capturable:
            assert host.ops_on_cpu == []
            assert {state[k].device.type for k in ("step", "beta", "beta1_prod")} == {"meta"}
        else:
            assert "aten.pow.Scalar" in host.ops_on_cpu and state["step"].is_cpu


@pytest.mark.parametrize("cls", ADAMS, ids=_ids)
def test_capturable_on_an_unsupported_device_names_the_devices(cls):
    model = _model()
    X, y = _data()
    opt = cls(model.parameters(), capturable=True)
    _backward(model, opt, X, y)
    with pytest.raises(
        RuntimeError, match=r"capturable=True.*supported devices.*params\[0\] on cpu"
    ):
        opt.step()


@pytest.mark.parametrize("cls", ADAMS, ids=_ids)
def test_capturable_takes_number_hyper_parameters(cls):
    model = _model()
    with pytest.raises(ValueError, match="lr as a Tensor is not supported with capturable=True"):
        cls(model.parameters(), lr=torch.tensor(0.01), capturable=True)
    betas = (torch.tensor(0.9), torch.tensor(0.999))
    with pytest.raises(ValueError, match=r"betas\[0\] as a Tensor .* capturable=True"):
        cls(model.parameters(), betas=betas, capturable=True)
    with pytest.raises(TypeError, match="capturable must be True or False"):
        cls(model.parameters(), capturable="yes")


def test_capturable_iterates_equal_the_default_ones(monkeypatch):
    """Where the counters live changes nothing in the arithmetic."""
    monkeypatch.setattr(_common, "capturable_devices", lambda: ["cpu"])
    X, y = _data()
    runs = []
    for capturable in (False, True):
        model = _model()
        opt = AMAdamW(model.parameters(), lr=0.01, capturable=capturable, foreach=True)
        for _ in range(3):
            _backward(model, opt, X, y)
            opt.step()
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_capturable_state_dict_moves_the_counters_to_the_device(monkeypatch):
    """A capturable checkpoint read back on the CPU (``map_location="cpu"``) loads with
    its counters on the parameters' device; a default optimizer keeps them on the CPU."""
    monkeypatch.setattr(_common, "capturable_devices", lambda: ["cuda", "meta"])
    params = _meta_group()
    captured = AMAdamW(params, capturable=True)
    captured.step()
    saved = captured.state_dict()
    for state in saved["state"].values():
        state["step"] = torch.ones((), dtype=state["step"].dtype)  # meta holds no value
    fresh = AMAdamW(params, capturable=True)
    fresh.load_state_dict(saved)
    assert fresh.state[params[0]]["step"].device.type == "meta"
    assert fresh.param_groups[0]["capturable"] is True
    saved["param_groups"][0]["capturable"] = False  # as torch.optim: the saved groups rule
    fresh.load_state_dict(saved)
    assert fresh.state[params[0]]["step"].is_cpu


def test_capturable_is_back_filled_for_old_pickles():
    model = _model()
    opt = AMAdamW(model.parameters())
    state = opt.__getstate__()
    for group in state["param_groups"]:
        del group["capturable"]
    opt.__setstate__(state)
    assert all(g["capturable"] is False for g in opt.param_groups)
