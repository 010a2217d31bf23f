"""The Triton driver of the optimizers: planned steps, their host work, torch.compile.

The kernels run in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``) and
the optimizers are made to choose the Triton path, as they do on CUDA; the launch
seam ``amopt.torch._triton._kernels`` is replaced by counting stand-ins where only
the launches matter. References: the single-tensor path (``foreach=False``) on the
same gradients, and counts that must not depend on the number of tensors.
"""

from __future__ import annotations

import copy
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch._dynamo.utils import counters  # noqa: E402

from amopt.torch import AMSGD, AMAdamW  # noqa: E402
from amopt.torch import _triton as tri  # noqa: E402
from benchmarks.counters import OpCounter  # noqa: E402

KERNELS = ("sgd_reduce", "sgd_apply", "adam_reduce", "adam_apply", "segment_sum")
CASES = [
    pytest.param(AMAdamW, {"lr": 0.01}, id="AMAdamW-per-layer"),
    pytest.param(AMAdamW, {"lr": 0.01, "per_layer": False}, id="AMAdamW-global"),
    pytest.param(AMSGD, {"lr": 0.05}, id="AMSGD-global"),
    pytest.param(AMSGD, {"lr": 0.05, "per_layer": True}, id="AMSGD-per-layer"),
]


@pytest.fixture(autouse=True)
def triton_path(triton_interpreter):
    """Every test here on the Triton path, in the interpreter (``conftest.py``)."""
    yield


class _Launches:
    """Stand-in kernels: count the launches, run nothing."""

    def __init__(self):
        self.count = 0

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        self.count += 1


def _stub_kernels(monkeypatch) -> _Launches:
    launches = _Launches()
    monkeypatch.setattr(tri, "_kernels", lambda interpret: dict.fromkeys(KERNELS, launches))
    return launches


def _params(n, seed=0, dtypes=(torch.float64,)):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(int(k) + 1,) for k in torch.randint(0, 70, (n,), generator=gen)]
    return [
        torch.nn.Parameter(
            torch.randn(s, generator=gen, dtype=torch.float64).to(dtypes[i % len(dtypes)])
        )
        for i, s in enumerate(shapes)
    ]


def _grads(params, t):
    gen = torch.Generator().manual_seed(100 + t)
    sign = -1.0 if t == 1 else 1.0  # a reversal: betas inside (0, beta_max)
    return [
        (
            sign * p.detach().double()
            + 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        ).to(p.dtype)
        for p in params
    ]


def _set_grads(params, grads):
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()  # a new tensor each step, as zero_grad(set_to_none=True) leaves it


def _with_reference(cls, kw, n):
    """Parameters of two float dtypes, the optimizer under test (default flags) on them
    and the single-tensor one on copies."""
    params = _params(n, dtypes=(torch.float64, torch.float32))
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    return params, ref_params, cls(params, **kw), cls(ref_params, **kw, foreach=False)


def _assert_as_reference(params, ref_params):
    for p, q in zip(params, ref_params, strict=True):
        # float64 parameters share a global scope with float32 ones, whose terms the
        # kernels and the reference round differently: 1e-8 is far above that, far
        # below a wrong step
        tol = 1e-8 if p.dtype == torch.float64 else 1e-5
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol)


def _adam_state(params):
    """exp_avgs, exp_avg_sqs, step counters and beta1 products of a first step."""
    return (
        [torch.zeros_like(p) for p in params],
        [torch.zeros_like(p) for p in params],
        [torch.zeros(()) for _ in params],
        [torch.ones((), dtype=torch.float64) for _ in params],
    )


# --------------------------------------------------------------------------- planned steps


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_planned_steps_match_the_single_tensor_path(cls, kw):
    """Steps on the group's plan, a scheduler changing lr and the cap, a state_dict round
    trip and a parameter moved to new storage: the single-tensor iterates and betas."""
    params = _params(7, dtypes=(torch.float64, torch.float32))
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, ref = cls(params, **kw), cls(ref_params, **kw, foreach=False)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.7) for o in (opt, ref)]
    for t in range(6):
        grads = _grads(params, t)
        for ps, o, sch in zip((params, ref_params), (opt, ref), schedulers, strict=True):
            _set_grads(ps, grads)
            o.step()
            sch.step()
        if t == 1:
            assert opt.__dict__.get("_am_plans"), "the group has a plan after its first step"
        if t == 2:  # checkpoint round trip into a fresh optimizer
            saved = copy.deepcopy(opt.state_dict())
            opt = cls(params, **kw)
            opt.load_state_dict(saved)
            schedulers[0] = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)
            schedulers[0].last_epoch = schedulers[1].last_epoch
        if t == 3:  # p.data elsewhere: the plan no longer applies and is rebuilt
            params[0].data = params[0].data.clone()
        if t == 4:
            for o in (opt, ref):
                for g in o.param_groups:
                    key = "betas" if cls is AMAdamW else "beta_max"
                    g[key] = (0.8, g["betas"][1]) if cls is AMAdamW else 0.8
        for p, q in zip(params, ref_params, strict=True):
            # float64 parameters share a global scope with float32 ones, whose terms the
            # kernels and the reference round differently (float32 eps 6e-8 on their part
            # of the sums, damped by lr in the step): 1e-8 is far above it, far below a
            # wrong step
            tol = 1e-8 if p.dtype == torch.float64 else 1e-5
            torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol)
            for key in ("step", "beta", "beta1_prod"):
                if key in ref.state[q]:
                    assert float(opt.state[p][key]) == pytest.approx(
                        float(ref.state[q][key]), rel=1e-6, abs=1e-9
                    ), (t, key)


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_state_entries_are_views_of_the_group_state(cls, kw):
    params = _params(5)
    opt = cls(params, **kw)
    for t in range(2):
        _set_grads(params, _grads(params, t))
        opt.step()
    plan = opt._am_plans[id(opt.param_groups[0])]
    for p in params:
        assert opt.state[p]["step"]._base is plan.state.steps
        assert float(opt.state[p]["step"]) == 2
    betas = [opt.state[p]["beta"] for p in params]
    if kw.get("per_layer", cls is AMAdamW):
        assert len({id(b) for b in betas}) == len(params)
    else:
        assert all(b is betas[0] for b in betas)  # one scope, one shared tensor


# --------------------------------------------------------------------------- host work


def _counted_step(opt):
    """One ``opt.step()`` under the shared op counter: its operations in order (``ops``),
    and those that made an integer tensor (``int_outputs``)."""
    int_outputs: list[str] = []

    def integer_outputs(func, args, kwargs, out):
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dtype != torch.bool:
                int_outputs.append(str(func))

    with OpCounter(integer_outputs) as counter:
        opt.step()
    return types.SimpleNamespace(ops=counter.sequence, int_outputs=int_outputs)


def _planned_step(cls, kw, n, monkeypatch):
    """Launches and tensor operations of one planned step over ``n`` tensors."""
    launches = _stub_kernels(monkeypatch)
    params = _params(n)
    opt = cls(params, **kw)
    for t in range(2):  # the first builds the plan
        _set_grads(params, _grads(params, t))
        opt.step()
    for p, g in zip(params, _grads(params, 2), strict=True):
        p.grad.copy_(g)  # the gradients where they were (zero_grad(set_to_none=False))
    launches.count = 0
    ops = _counted_step(opt)
    return launches.count, ops


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_host_work_of_a_planned_step_does_not_grow_with_the_tensors(cls, kw, monkeypatch):
    """12 or 120 tensors: the same launches and the same tensor operations per step, no
    integer tensor made (address tables, block maps) and no value read on the host."""
    small_launches, small = _planned_step(cls, kw, 12, monkeypatch)
    large_launches, large = _planned_step(cls, kw, 120, monkeypatch)
    # per dtype: reduce (whole and partial chunks), apply (both), and one segment sum per array
    assert small_launches == large_launches == 5
    assert small.ops == large.ops
    assert len(small.ops) <= 40, small.ops
    assert small.int_outputs == []
    host_reads = {"aten._local_scalar_dense.default", "aten.item.default"}
    assert not host_reads & set(small.ops)
    assert not any("pin_memory" in op for op in small.ops), small.ops


def _fresh_grads_step(cls, kw, n, monkeypatch):
    """Operations of one planned step whose gradients are new tensors at new addresses
    (``zero_grad()`` then backward), the old ones kept alive so that no address repeats."""
    _stub_kernels(monkeypatch)
    params = _params(n)
    opt = cls(params, **kw)
    kept = []
    for t in range(2):
        _set_grads(params, _grads(params, t))
        kept.append([p.grad for p in params])
        opt.step()

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the plan was built again for gradients at new addresses")

    _set_grads(params, _grads(params, 2))
    build_plan = tri.build_plan
    monkeypatch.setattr(tri, "build_plan", no_rebuild)
    ops = _counted_step(opt)
    monkeypatch.setattr(tri, "build_plan", build_plan)
    plan = opt._am_plans[id(opt.param_groups[0])]
    for launch in plan.plan.launches:  # the grads column holds this step's addresses
        want = [params[i].grad.data_ptr() for i in launch.members]
        assert launch.table[:, 1].tolist() == want
        assert launch.table[:, 0].tolist() == [params[i].data_ptr() for i in launch.members]
    return ops


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_new_gradients_rewrite_only_their_addresses(cls, kw, monkeypatch):
    """Gradients reallocated at every step: the plan stays (no rebuild), the address
    column is rewritten with the same few operations at 12 and 120 tensors, and nothing
    is read back from a tensor to the host."""
    small = _fresh_grads_step(cls, kw, 12, monkeypatch)
    large = _fresh_grads_step(cls, kw, 120, monkeypatch)
    assert small.ops == large.ops
    _, steady = _planned_step(cls, kw, 12, monkeypatch)
    extra = list(small.ops)
    for op in steady.ops:
        extra.remove(op)
    # the addresses as a tensor, then per launch (one dtype here) the gather of its
    # members' addresses, the column written and the table copied
    assert len(extra) <= 5, extra
    assert not any("pin_memory" in op for op in small.ops)  # the CPU tables take no staging
    host_reads = {"aten._local_scalar_dense.default", "aten.item.default"}
    assert not host_reads & set(small.ops)


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_steps_with_reallocated_gradients_match_the_single_tensor_path(cls, kw):
    """Every step's gradients at new addresses (two float dtypes, two launches): the
    kernels read them through the rewritten tables and give the single-tensor iterates."""
    params, ref_params, opt, ref = _with_reference(cls, kw, 5)
    kept = []
    for t in range(4):
        grads = _grads(params, t)
        _set_grads(params, grads)
        kept.append([p.grad for p in params])
        _set_grads(ref_params, grads)
        opt.step()
        ref.step()
        _assert_as_reference(params, ref_params)
    assert opt.__dict__.get("_am_plans")


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_gradients_updated_in_place_or_given_new_storage_are_read(cls, kw):
    """The same gradient tensors at every step: written in place (``zero_grad(
    set_to_none=False)``, then backward), or given new storage (``p.grad.data = ...``):
    a planned step reads what they hold now, as the single-tensor path does."""
    params, ref_params, opt, ref = _with_reference(cls, kw, 5)
    _set_grads(params, _grads(params, 0))
    _set_grads(ref_params, _grads(params, 0))
    for t in range(1, 5):
        grads = _grads(params, t)
        for ps in (params, ref_params):
            for p, g in zip(ps, grads, strict=True):
                if t % 2:
                    p.grad.copy_(g)
                else:
                    p.grad.data = g.clone()
        opt.step()
        ref.step()
        _assert_as_reference(params, ref_params)
    assert opt.__dict__.get("_am_plans")


def test_local_gradients_that_are_copies_are_found_anew_at_every_step():
    """A sharded group whose local gradients are copies (a ``DTensor`` gradient
    redistributed to its parameter's placements) reads this step's values when the
    gradients are the same tensors updated in place; local pieces that are views of
    the gradients are kept."""
    from amopt.torch._records import Sharded

    params = _params(3)
    _set_grads(params, _grads(params, 0))
    grads = [p.grad for p in params]
    bufs = [torch.zeros_like(p) for p in params]
    plan = tri.build_plan([params, grads, bufs], False, wide=True)
    for copies in (True, False):
        calls = []

        def local_of_grads(ps, gs, copies=copies, calls=calls):
            calls.append(1)
            return [g.clone() for g in gs] if copies else list(gs)

        locals_ = local_of_grads(params, grads)
        sharded = Sharded(params, locals_, [bufs], None, local_of_grads, lambda p: p)
        flags = ("flags",)
        group = {"params": params}
        gp = tri.GroupPlan(flags, params, params, grads, (bufs,), plan, None, sharded)
        for t in (1, 2):
            new = _grads(params, t)
            for g, v in zip(grads, new, strict=True):
                g.copy_(v)
            got = gp.grads(group, flags)
            for a, b in zip(got, new, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert len(calls) == (3 if copies else 1)


@pytest.mark.parametrize("per_layer", [True, False])
def test_functional_step_rewrites_the_addresses_of_new_gradients(per_layer, monkeypatch):
    """The unplanned driver (compiled and sharded steps): gradients at new addresses,
    the rest where it was, take the cached plan with its gradient column rewritten."""
    from amopt.core.config import AMConfig
    from amopt.torch._records import AdamHyper, AdamTensors

    _stub_kernels(monkeypatch)
    params = [p.detach() for p in _params(6, dtypes=(torch.float64, torch.float32))]
    state = _adam_state(params)
    config = AMConfig(beta_max=0.9, per_layer=per_layer)
    h = AdamHyper(1e-3, 0.999, 1e-8, 0.0, "decoupled", False, config)
    kept = [_grads(params, 0)]
    tri.triton_am_adamw(AdamTensors(params, kept[0], *state), h)
    build_plan = tri.build_plan
    monkeypatch.setattr(tri, "build_plan", None)  # a new plan would fail
    for t in (1, 2):
        kept.append(_grads(params, t))  # the older gradients stay alive: new addresses
        tri.triton_am_adamw(AdamTensors(params, kept[-1], *state), h)
        plan = next(reversed(tri._PLANS.values()))
        for launch in plan.launches:
            assert launch.table[:, 1].tolist() == [kept[-1][i].data_ptr() for i in launch.members]
            assert launch.table[:, 0].tolist() == [params[i].data_ptr() for i in launch.members]
    assert [float(s) for s in state[2]] == [3.0] * len(params)
    monkeypatch.setattr(tri, "build_plan", build_plan)


def test_functional_plans_of_many_groups_each_built_once(monkeypatch):
    """A compiled step or a functional call finds its group's plan in a cache the
    groups share (least recently used out): twenty groups stepped in turn, for three
    rounds, build twenty plans (a cache of the first eight in, first out rebuilt every
    plan at every step)."""
    from amopt.core.config import AMConfig
    from amopt.torch._records import AdamHyper, AdamTensors

    _stub_kernels(monkeypatch)
    monkeypatch.setattr(tri, "_PLANS", {})
    monkeypatch.setattr(tri, "_BY_STATE", {})
    built = []
    build_plan = tri.build_plan

    def counted(*args, **kwargs):
        built.append(1)
        return build_plan(*args, **kwargs)

    monkeypatch.setattr(tri, "build_plan", counted)
    config = AMConfig(beta_max=0.9, per_layer=True)
    h = AdamHyper(1e-3, 0.999, 1e-8, 0.0, "decoupled", False, config)
    groups = []
    for seed in range(20):
        params = [p.detach() for p in _params(2, seed=seed)]
        state = _adam_state(params)
        groups.append(AdamTensors(params, _grads(params, 0), *state))
    for _ in range(3):
        for t in groups:
            tri.triton_am_adamw(t, h)
    assert len(built) == len(groups)
    assert [float(s) for t in groups for s in t.state_steps] == [3.0] * 40


def test_plans_used_while_a_cuda_graph_is_captured_outlive_the_caches(monkeypatch):
    """A captured graph replays a plan's launches with the addresses of its tables:
    a CUDA plan used during a capture is kept for the process, others are not."""
    import types

    plan = types.SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(tri, "_CAPTURED", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert tri._in_use(plan) is plan and tri._CAPTURED == {}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert tri._in_use(plan) is plan and list(tri._CAPTURED.values()) == [plan]
    cpu = types.SimpleNamespace(device=torch.device("cpu"))
    assert tri._in_use(cpu) is cpu and len(tri._CAPTURED) == 1


def test_functional_step_checks_what_its_cached_plan_cannot_see(monkeypatch):
    """The unplanned driver skips its per-tensor checks for the tensors of a cached plan
    (same addresses, sizes and dtypes); a tensor at a known address that is now of
    another dtype, or not contiguous, still gets the checks' error."""
    from amopt.core.config import AMConfig
    from amopt.torch._records import AdamHyper, AdamTensors

    _stub_kernels(monkeypatch)
    params = [torch.zeros(4, 4) for _ in range(3)]
    grads = [torch.ones(4, 4) for _ in range(3)]
    state = _adam_state(params)
    h = AdamHyper(1e-3, 0.999, 1e-8, 0.0, "decoupled", False, AMConfig(beta_max=0.9))
    tri.triton_am_adamw(AdamTensors(params, grads, *state), h)
    available = tri.available
    monkeypatch.setattr(tri, "available", None)  # the cached plan's step checks nothing else
    tri.triton_am_adamw(AdamTensors(params, grads, *state), h)
    monkeypatch.setattr(tri, "available", available)
    as_int = [grads[0].view(torch.int32), *grads[1:]]  # same address, size and shape
    with pytest.raises(ValueError, match=r"grads\[0\] has shape \(4, 4\) and dtype torch.int32"):
        tri.triton_am_adamw(AdamTensors(params, as_int, *state), h)
    transposed = [grads[0].t(), *grads[1:]]  # same address and size, not contiguous
    with pytest.raises(ValueError, match="non-contiguous"):
        tri.triton_am_adamw(AdamTensors(params, transposed, *state), h)
    assert [float(s) for s in state[2]] == [2.0] * len(params)


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_compiled_step_is_one_node_fullgraph_without_recompiles(cls, kw):
    """``fullgraph=True``, a scheduler changing a tensor ``lr`` at every step (a float
    ``lr`` is a constant of the graph, as for torch's optimizers): one graph holding the
    Triton operator, compiled once over four steps, and the eager iterates."""
    params = _params(4)
    eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    lr = torch.tensor(kw["lr"], dtype=torch.float64)
    opt = cls(params, **{**kw, "lr": lr})
    eager = cls(eager_params, **{**kw, "lr": lr.clone()})
    torch._dynamo.reset()
    counters.clear()
    targets: set[str] = set()

    def backend(gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        targets.update(str(node.target) for node in gm.graph.nodes)
        return aot_eager(gm, example_inputs)

    step = torch.compile(opt.step, fullgraph=True, backend=backend)
    # made after compiling the bound step: a scheduler wraps ``opt.step`` in a function
    # dynamo does not trace
    schedulers = [torch.optim.lr_scheduler.ExponentialLR(o, 0.8) for o in (opt, eager)]
    for t in range(4):
        grads = _grads(params, t)
        _set_grads(params, grads)
        step()
        _set_grads(eager_params, grads)
        eager.step()
        for sch in schedulers:  # a new lr in the tensor at every step
            sch.step()
        for p, q in zip(params, eager_params, strict=True):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-12)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    name = "amopt.triton_amsgd_" if cls is AMSGD else "amopt.triton_am_adamw_"
    assert any(name in t for t in targets), targets


def _compiled_graph(cls, kw, n):
    """The call nodes of a compiled step over ``n`` tensors (the graph dynamo hands its
    backend), and dynamo's counters, after three steps with new gradients."""
    params = _params(n)
    lr = torch.tensor(kw["lr"], dtype=torch.float64)
    opt = cls(params, **{**kw, "lr": lr})
    torch._dynamo.reset()
    counters.clear()
    graphs = []

    def backend(gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    step = torch.compile(opt.step, fullgraph=True, backend=backend)
    for t in range(3):
        _set_grads(params, _grads(params, t))
        step()
    calls = [
        str(node.target)
        for gm in graphs
        for node in gm.graph.nodes
        if node.op in ("call_function", "call_method", "call_module")
    ]
    return calls, dict(counters["stats"]), dict(counters["graph_break"])


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_compiled_graph_does_not_grow_with_the_tensors(cls, kw, monkeypatch):
    """8 or 80 tensors: the same operations in the compiled step's graph (the tensors are
    its inputs, the per-parameter betas and products are stored inside the operator),
    one graph, no recompile, no graph break."""
    _stub_kernels(monkeypatch)
    small, small_stats, small_breaks = _compiled_graph(cls, kw, 8)
    large, large_stats, large_breaks = _compiled_graph(cls, kw, 80)
    assert small == large, (len(small), len(large))
    for stats, breaks in ((small_stats, small_breaks), (large_stats, large_breaks)):
        assert stats["unique_graphs"] == 1, stats
        assert not breaks, breaks
    assert len(small) <= 16, small


@pytest.mark.parametrize(
    ("cls", "kw"), [c for c in CASES if c.values[1].get("per_layer", c.values[0] is AMAdamW)]
)
def test_compiled_per_layer_step_with_a_grad_scaler(cls, kw):
    """GradScaler's protocol through the per-layer operator: the gradients unscaled, and a
    step with ``found_inf`` set keeps parameters, betas, products and counters, as the
    eager Triton step does."""
    params = _params(4)
    eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, eager = cls(params, **kw), cls(eager_params, **kw)
    step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
    for t, inf in enumerate((0.0, 1.0, 0.0)):
        grads = _grads(params, t)
        for o, ps in ((opt, params), (eager, eager_params)):
            _set_grads(ps, [4.0 * g for g in grads])
            o.grad_scale = torch.tensor(4.0)
            o.found_inf = torch.tensor(inf)
        before = [p.detach().clone() for p in params]
        step()
        eager.step()
        if inf:
            for p, b in zip(params, before, strict=True):
                torch.testing.assert_close(p.detach(), b, rtol=0, atol=0)
        for p, q in zip(params, eager_params, strict=True):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-12)
            for key in ("step", "beta", "beta1_prod"):
                if key in eager.state[q]:
                    assert float(opt.state[p][key]) == float(eager.state[q][key]), (t, key)
    assert float(opt.state[params[0]]["step"]) == 2


def test_the_triton_operators_pass_opcheck():
    from amopt.torch import _fused_ops

    params = [p.detach() for p in _params(3)]
    grads = [g for g in _grads(params, 0)]
    numbers_rule = [0.1, 0.9, 0.5, 0.7, 0.9, 0.1]
    adam_args = (
        [p.clone() for p in params],
        grads,
        *_adam_state(params),
        None,
        None,
        torch.tensor(1e-2, dtype=torch.float64),
        torch.tensor(2e-2, dtype=torch.float64),  # the previous lr, with a tensor lr
        [0.0, 0.0, 0.99, 1e-8, 0.01, *numbers_rule],
        "decoupled",
        False,
        True,
        None,
    )
    torch.library.opcheck(_fused_ops._triton_am_adamw_op, adam_args)
    sgd_args = (
        [p.clone() for p in params],
        grads,
        [g.clone() for g in grads],
        [torch.zeros(()) for _ in params],
        None,
        None,
        None,
        None,
        [0.05, 1.25, 0.0, *numbers_rule],
        False,
        False,
        None,
    )
    torch.library.opcheck(_fused_ops._triton_amsgd_op, sgd_args)
    layers_adam = (
        *adam_args[:6],
        [torch.zeros((), dtype=torch.float64) for _ in params],
        *adam_args[6:12],
        adam_args[12],
        adam_args[14],
    )
    torch.library.opcheck(_fused_ops._triton_am_adamw_layers_op, layers_adam)
    layers_sgd = (
        *sgd_args[:4],
        [torch.zeros((), dtype=torch.float64) for _ in params],
        *sgd_args[4:10],
        sgd_args[11],
    )
    torch.library.opcheck(_fused_ops._triton_amsgd_layers_op, layers_sgd)


def _layers_adam_args():
    """Arguments of ``amopt::triton_am_adamw_layers_`` on three float64 tensors."""
    params = [p.detach() for p in _params(3)]
    exp_avgs, exp_avg_sqs, steps, prods = _adam_state(params)
    betas = [torch.zeros((), dtype=torch.float64) for _ in params]
    numbers = [1e-2, 1.0, 0.99, 1e-8, 0.01, 0.1, 0.9, 0.5, 0.7, 0.9, 0.1]
    return (params, _grads(params, 0), exp_avgs, exp_avg_sqs, steps, prods, betas, None, None,
            None, None, numbers, "decoupled", False, None)  # fmt: skip


def test_the_operators_run_their_kernel_without_python_layers_between():
    """A call of a Triton operator runs the driver and nothing of ``torch._library`` (the
    Python autograd kernel, per-tensor version bumps and aliasing checks that
    ``torch.library.custom_op`` puts around its function cost more host time than the
    driver at a few hundred tensors)."""
    import sys

    op = torch.ops.amopt.triton_am_adamw_layers_.default
    args = _layers_adam_args()
    op(*args)  # the plan is built
    files = []

    def record(frame, event, arg):
        if event == "call":
            files.append(frame.f_code.co_filename)

    sys.setprofile(record)
    try:
        op(*args)
    finally:
        sys.setprofile(None)
    assert any(f.endswith("_triton.py") for f in files), files
    assert not [f for f in files if "_library" in f.replace("\\", "/").split("/")]


@pytest.mark.parametrize(("cls", "kw"), CASES)
def test_steps_bump_the_version_counters_of_what_they_write(cls, kw):
    """As with torch's optimizers, autograd refuses a backward pass through parameters
    that a step overwrote after a forward pass saved them, on every Triton path:
    the first (functional) step, the planned steps, and the operator a compiled step
    runs."""
    params = _params(4)
    opt = cls(params, **kw)
    for t in range(2):
        _set_grads(params, _grads(params, t))
        loss = sum((p * p).sum() for p in params)
        before = [p._version for p in params]
        opt.step()
        assert all(p._version > v for p, v in zip(params, before, strict=True))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    args = _layers_adam_args()
    before = [[t._version for t in col] for col in args[:4]]
    torch.ops.amopt.triton_am_adamw_layers_.default(*args)
    assert all(t._version > v for t, v in zip(args[0], before[0], strict=True))
    assert [t._version for t in args[1]] == before[1]  # the gradients are read only


# --------------------------------------------------------------------------- layering


def test_the_torch_package_has_no_import_circles():
    """Every import between the modules of ``amopt.torch`` (function-level ones included)
    points down: optimizer classes, then the drivers, then the shared records."""
    import ast
    from pathlib import Path

    import amopt.torch

    root = Path(amopt.torch.__file__).parent
    modules = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for m in modules:
        for node in ast.walk(ast.parse((root / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "amopt.torch":
                    edges[m] |= {a.name for a in node.names if a.name in modules}
                elif node.module.startswith("amopt.torch."):
                    edges[m].add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("amopt.torch."):
                        edges[m].add(a.name.split(".")[2])
    assert edges["_records"] == set()
    assert {"_amsgd", "_amadamw"}.isdisjoint(
        set().union(*(edges[m] for m in modules - {"_amsgd", "_amadamw"}))
    )

    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in edges[m]:
            assert state.get(n) != 1, f"import circle: {' -> '.join([*path, m, n])}"
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m, [])
