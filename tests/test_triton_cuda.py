"""The optimizers' Triton path on a CUDA GPU: planned eager steps, torch.compile,
CUDA-graph capture (skipped without CUDA; the interpreter tests cover the CPU)."""

from __future__ import annotations

import contextlib
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from amopt.torch import AMSGD, AMAdamW  # noqa: E402
from benchmarks.counters import LOCAL_SCALAR, OpCounter  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CASES = [
    pytest.param(AMAdamW, {"lr": 1e-2}, id="AMAdamW"),
    pytest.param(AMAdamW, {"lr": 1e-2, "per_layer": False}, id="AMAdamW-global"),
    pytest.param(AMSGD, {"lr": 0.05}, id="AMSGD"),
    pytest.param(AMSGD, {"lr": 0.05, "per_layer": True}, id="AMSGD-per-layer"),
]
SHAPES = [(768, 768), (3072, 768), (768,), (50, 7), (1,), (4096 * 5 + 3,)]


def _params(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to("cuda", dtype)) for s in SHAPES]


def _grads(params, t):
    """Step ``t``'s gradients: a function of ``t`` and the initial parameters only, so
    that both optimizers of a pair get the same ones whichever has stepped first."""
    init = torch.Generator().manual_seed(0)
    gen = torch.Generator().manual_seed(10 + t)
    sign = -1.0 if t == 1 else 1.0
    return [
        (
            sign * torch.randn(p.shape, generator=init).to(p.dtype).float()
            + 0.3 * torch.randn(p.shape, generator=gen)
        ).to("cuda", p.dtype)
        for p in params
    ]


def _pair(cls, kw, dtype=torch.float32, **extra):
    a = _params(dtype)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    return a, b, cls(a, **kw, **extra), cls(b, **kw, foreach=False)


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_default_steps_match_single_tensor(cls, kw):
    a, b, opt, ref = _pair(cls, kw)
    for t in range(6):
        for ps, o in ((a, opt), (b, ref)):
            for p, g in zip(ps, _grads(a, t), strict=True):
                p.grad = g
            o.step()
    assert opt.__dict__.get("_am_plans")
    assert opt.state[a[0]]["step"].is_cuda
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=2e-6)
        assert float(opt.state[p]["beta"]) == pytest.approx(float(ref.state[q]["beta"]), abs=1e-4)


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_compiled_fullgraph_no_recompile(cls, kw):
    from torch._dynamo.utils import counters

    lr = torch.tensor(kw["lr"])
    a, b, opt, ref = _pair(cls, {**kw, "lr": lr})
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(opt.step, fullgraph=True)
    sch = [torch.optim.lr_scheduler.ExponentialLR(o, 0.8) for o in (opt, ref)]
    for t in range(4):
        g = _grads(a, t)
        for p, x in zip(a, g, strict=True):
            p.grad = x
        step()
        for p, x in zip(b, g, strict=True):
            p.grad = x
        ref.step()
        for s in sch:
            s.step()
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_capturable_step_replays_in_a_cuda_graph(cls, kw):
    extra = {"capturable": True} if cls is AMAdamW else {}
    a, b, opt, ref = _pair(cls, kw, **extra)
    static = [torch.zeros_like(p) for p in a]
    for p, s in zip(a, static, strict=True):
        p.grad = s
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for t in range(2):  # warm-up: the first step plans the group
            for s, g in zip(static, _grads(a, t), strict=True):
                s.copy_(g)
            opt.step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for t in range(2):
        for p, g in zip(b, _grads(a, t), strict=True):
            p.grad = g
        ref.step()
    for t in range(2, 5):
        g = _grads(a, t)
        for s, x in zip(static, g, strict=True):
            s.copy_(x)
        graph.replay()
        for p, x in zip(b, g, strict=True):
            p.grad = x
        ref.step()
    torch.cuda.synchronize()
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(("cls", "kw"), CASES[:1] + CASES[2:3])
def test_reduce_overhead_compile(cls, kw):
    a, b, opt, ref = _pair(cls, kw)
    step = torch.compile(opt.step, mode="reduce-overhead")
    for t in range(5):
        g = _grads(a, t)
        for p, x in zip(a, g, strict=True):
            p.grad = x
        step()
        for p, x in zip(b, g, strict=True):
            p.grad = x
        ref.step()
    torch.cuda.synchronize()
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=2e-6)


@contextlib.contextmanager
def _copies():
    """Host-to-device copies (is the source page-locked, is the copy blocking) and reads,
    seen by the shared op counter; ``reads`` filled when the block ends."""
    seen = types.SimpleNamespace(uploads=[], reads=[])

    def uploads(func, args, kwargs, out):
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            if dst.is_cuda and not src.is_cuda:
                blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking"))
                seen.uploads.append((src.is_pinned(), blocking))
        if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu":
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                seen.uploads.append((args[0].is_pinned(), not kwargs.get("non_blocking")))

    with OpCounter(uploads) as counter:
        yield seen
    seen.reads = [op for op in counter.sequence if op == LOCAL_SCALAR]


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_reallocated_gradients_copy_their_addresses_asynchronously(cls, kw, monkeypatch):
    """Gradients at new addresses every step (``zero_grad()``): the plan is kept, its
    address tables reach the device by non-blocking copies from page-locked memory, and
    nothing is read back to the host; the iterates match the single-tensor path."""
    from amopt.torch import _triton as tri

    a, b, opt, ref = _pair(cls, kw)
    kept = []
    for t in range(5):
        grads = _grads(a, t)
        for ps in (a, b):
            for p, g in zip(ps, grads, strict=True):
                p.grad = g.clone()
        kept.append([p.grad for p in a])
        if t >= 2:
            build_plan = tri.build_plan
            monkeypatch.setattr(tri, "build_plan", None)  # a rebuild would fail
            with _copies() as copies:
                opt.step()
            monkeypatch.setattr(tri, "build_plan", build_plan)
            assert copies.uploads, "the new addresses reached the device"
            assert all(pinned and not blocking for pinned, blocking in copies.uploads), (
                copies.uploads
            )
            assert copies.reads == []
        else:
            opt.step()
        ref.step()
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("per_layer", [True, False])
def test_functional_step_with_host_counters_does_not_wait(per_layer):
    """The unplanned driver (compiled steps, sharded groups) with host step counters,
    as the optimizers keep them: the counters reach the device in one non-blocking copy
    from page-locked memory, not one blocking copy each, and nothing is read back."""
    from amopt.core.config import AMConfig
    from amopt.torch._records import AdamHyper, AdamTensors
    from amopt.torch._triton import triton_am_adamw

    params = [p.detach() for p in _params()]
    grads = _grads(params, 0)
    t = AdamTensors(
        params,
        grads,
        [torch.zeros_like(p) for p in params],
        [torch.zeros_like(p) for p in params],
        [torch.tensor(3.0) for _ in params],
        [torch.full((), 0.5, device="cuda") for _ in params],
    )
    h = AdamHyper(
        1e-3, 0.999, 1e-8, 0.0, "decoupled", False, AMConfig(beta_max=0.9, per_layer=per_layer)
    )
    triton_am_adamw(t, h)  # the plan is built (its tables are copied once)
    with _copies() as copies:
        triton_am_adamw(t, h)
    assert len(copies.uploads) == 1, copies.uploads
    assert all(pinned and not blocking for pinned, blocking in copies.uploads), copies.uploads
    assert copies.reads == []
    assert [float(s) for s in t.state_steps] == [5.0] * len(params)
