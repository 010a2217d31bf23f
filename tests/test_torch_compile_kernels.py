"""What inductor generates for a compiled single-tensor or foreach step on the CPU.

Each tensor costs two loops, a reduce and an apply (the reduce's sums of one tensor in
one loop), the rule between them is one operator node, and no power is formed inside
a loop (the bias corrections are an operator node too): the compiled step's memory
traffic is the reduce -> rule -> apply shape of ``docs/architecture.md``. The compiled
iterates equal the eager ones.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from torch._inductor.utils import fresh_cache, run_and_get_code  # noqa: E402

from amopt.torch import (  # noqa: E402
    AMSGD,
    AMAdamW,
    _traced_ops,  # noqa: E402
)

#: More tensors than the 16 up to which inductor fused every reduction of a tensor into
#: one loop even when the graph added the sums up itself; distinct sizes name the loops.
SIZES = [1000 + 16 * k for k in range(20)]


def _group(cls, **kwargs):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SIZES]
    opt = cls(params, lr=1e-3, **kwargs)
    return params, opt, gen


def _new_grads(params, gen):
    for p in params:
        p.grad = 1e-2 * torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        pytest.param(AMSGD, {"foreach": False}, id="AMSGD-single-global"),
        pytest.param(AMSGD, {"foreach": True, "per_layer": True}, id="AMSGD-foreach-per-layer"),
        pytest.param(AMAdamW, {"foreach": False}, id="AMAdamW-single-per-layer"),
        pytest.param(
            AMAdamW,
            {"foreach": True, "per_layer": False, "weight_decay": 0.1},
            id="AMAdamW-foreach-global",
        ),
    ],
)
def test_compiled_step_is_a_reduce_and_an_apply_loop_per_tensor(cls, kwargs):
    params, opt, gen = _group(cls, **kwargs)
    eager_params, eager_opt, eager_gen = _group(cls, **kwargs)
    for ps, o in ((params, opt), (eager_params, eager_opt)):  # the state, eagerly
        _new_grads(ps, torch.Generator().manual_seed(1))
        o.step()
    torch._dynamo.reset()
    step = torch.compile(opt.step, fullgraph=True)
    with fresh_cache():
        _new_grads(params, gen)
        _, code = run_and_get_code(step)
        for _ in range(2):
            _new_grads(params, gen)
            step()
    code = "\n".join(code)

    loops = {s: len(re.findall(rf"x0<static_cast<int64_t>\({s}L\)", code)) for s in SIZES}
    assert set(loops.values()) == {2}, loops
    assert "std::pow" not in code
    ops = set(re.findall(r"torch\.ops\.amopt\.(\w+)", code))
    expected = {"rule_from_sums"} | ({"bias_correction_roots"} if cls is AMAdamW else set())
    assert ops == expected

    for _ in range(3):  # the same gradients, drawn from the same generator state
        _new_grads(eager_params, eager_gen)
        eager_opt.step()
    for x, ref in zip(params, eager_params, strict=True):
        torch.testing.assert_close(x.detach(), ref.detach(), rtol=1e-6, atol=1e-7)


def test_the_compiled_step_operators_pass_opcheck():
    steps = [torch.tensor(3.0), torch.tensor(4.0)]
    torch.library.opcheck(_traced_ops._roots_op, (steps, 0.999))
    numbers = [0.1, 0.9, 0.0, 0.0, 0.9, 0.1]
    sums = [torch.tensor(v, dtype=torch.float64) for v in (0.5, 2.0, -0.25, 0.4, 1.5, 0.1)]
    torch.library.opcheck(
        _traced_ops._rule_from_sums_op,
        ("momentum", sums, [], numbers, True, None, None, 0.0, torch.float32),
    )
    adam = [torch.tensor(v) for v in (1.0, 0.2, 0.3, 2.0, 0.5, 0.25)]
    torch.library.opcheck(
        _traced_ops._rule_from_sums_op,
        ("adam", adam, [1.0, -0.1, 0.01], numbers, False, "clip", 1e-3, 0.01, torch.float32),
    )
    rows = torch.tensor([[0.5, 2.0, 2.2], [0.1, 0.2, 0.3]])
    torch.library.opcheck(_traced_ops._rule_op, ("momentum", rows, numbers, True, None, None, 0.0))


def test_rule_from_sums_gives_the_rule_of_the_added_sums():
    """The operator's sums (per tensor) added up and <d,d> formed from <v,g> give the beta
    of the rule on the sums formed directly."""
    from amopt.core import rule as _rule
    from amopt.core.config import AMConfig

    gen = torch.Generator().manual_seed(3)
    gs = [torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(3)]
    ds = [g + 0.3 * torch.randn(50, generator=gen, dtype=torch.float64) for g in gs]
    config = AMConfig(lam=0.1, beta_max=0.9, per_layer=False)
    parts = []
    for g, d in zip(gs, ds, strict=True):
        v = d - g
        parts += [v @ v, g @ g, v @ g]
    beta, gamma = _traced_ops.rule_from_sums(_rule.momentum_beta, parts, config, torch.float64)
    g, d = torch.cat(gs), torch.cat(ds)
    v = d - g
    ref_beta, ref_gamma = _rule.momentum_beta(
        torch, torch.stack([v @ v, g @ g, d @ d])[None], config
    )
    torch.testing.assert_close(beta, ref_beta, rtol=1e-12, atol=0)
    torch.testing.assert_close(gamma, ref_gamma, rtol=1e-12, atol=0)


def test_adam_rule_from_sums_weighs_as_the_eager_step_and_makes_no_tensor_of_data():
    """The AM-Adam numerator is the weighted sum of each tensor's term sums, weighted
    term by term with the weights as numbers (the eager step's expression, to the bit):
    no tensor is made from host data in the operator (on a GPU a copy per step, which
    a CUDA graph cannot capture)."""
    from amopt.core import rule as _rule
    from amopt.core.config import AMConfig
    from amopt.torch._records import rule_numbers
    from benchmarks.counters import OpCounter

    gen = torch.Generator().manual_seed(5)
    weights = [1.0, -0.1, 0.003, 0.0201]
    per_tensor = [torch.randn(len(weights) + 3, generator=gen, dtype=torch.float64) for _ in "ab"]
    for row in per_tensor:
        row[len(weights) :] = row[len(weights) :].abs()  # D and ref are sums of squares
    config = AMConfig(lam=0.1, beta_max=0.9, per_layer=False)
    parts = [s for row in per_tensor for s in row.unbind()]
    beta = _traced_ops.rule_from_sums(
        _rule.adam_beta, parts, config, torch.float64, weights=weights, lr=1e-3
    )
    # the operator's body, run where the mode sees its operations
    numbers = rule_numbers(config)
    body = _traced_ops._rule_from_sums_op._init_fn
    with OpCounter() as ops:
        body("adam", parts, weights, numbers, False, None, 1e-3, 0.0, torch.float64)
    lifts = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
    made = [f for f in ops.calls if f in lifts]
    assert made == []
    nums, dens, refs = [], [], []
    for row in per_tensor:
        num = weights[0] * row[0]
        for j in range(1, len(weights)):
            num = num + weights[j] * row[j]
        k = len(weights)
        nums.append(num), dens.append(row[k]), refs.append(row[k + 1] + row[k + 2])
    rows = torch.stack([torch.stack(nums).sum(), torch.stack(dens).sum(), torch.stack(refs).sum()])
    ref = _rule.adam_beta(torch, rows[None], config, lr=1e-3)
    torch.testing.assert_close(beta, ref, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [AMSGD, AMAdamW], ids=["AMSGD", "AMAdamW"])
def test_the_compiled_rule_is_looked_up_when_it_runs(cls, monkeypatch):
    """The operator calls ``amopt.core.rule``'s function of the moment, as every surface
    does: a rule replaced after compilation is the one a compiled step runs."""
    from amopt.core import rule as _rule

    name = "momentum_beta" if cls is AMSGD else "adam_beta"
    params, opt, gen = _group(cls, foreach=False)
    _new_grads(params, gen)
    opt.step()
    torch._dynamo.reset()
    step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
    step()
    calls = []
    original = getattr(_rule, name)

    def zero_beta(xp, sums, cfg, **kwargs):
        calls.append(sums.shape)
        out = original(xp, sums, cfg, **kwargs)
        return tuple(xp.zeros_like(o) for o in out) if isinstance(out, tuple) else out * 0

    monkeypatch.setattr(_rule, name, zero_beta)
    _new_grads(params, gen)
    step()
    assert calls
    assert all(float(b) == 0.0 for b in opt.latest_betas()[0])


def test_a_tensor_lr_is_read_when_the_operator_runs_and_refused_under_capture(monkeypatch):
    """The compiled Triton step reads a tensor ``lr`` when it runs (a scheduler's new
    value needs no new graph); while a CUDA graph is captured that read would be
    replayed as the captured number, so the operator refuses it, naming ``lr``."""
    from amopt.core.config import AMConfig
    from amopt.torch import _fused_ops
    from amopt.torch._records import rule_numbers

    numbers = [0.0, 1.0, 0.0, *rule_numbers(AMConfig())]  # lr, lr_ratio, weight_decay, rule
    h = _fused_ops._sgd_hyper(numbers, torch.tensor(0.25), False, False, None)
    assert h.lr == 0.25
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match=r"lr as a Tensor .* CUDA graph is captured.*lr=tensor"):
        _fused_ops._sgd_hyper(numbers, torch.tensor(0.25), False, False, None)
    with pytest.raises(ValueError, match="lr as a Tensor"):
        _fused_ops._adam_hyper(
            [0.0, 1.0, 0.999, 1e-8, *numbers[2:]],
            torch.tensor(0.25),
            "decoupled",
            False,
            False,
            None,
        )
