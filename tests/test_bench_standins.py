"""The CPU stand-in rows of the bench: their counters, the Triton launch stub, their arithmetic.

The counters are checked against functions whose operations and host reads are known;
the stub against the interpreter run it replaces; the rows' ratios against the
numbers they are built from. No timing is asserted.
"""

from __future__ import annotations

import ast
import importlib.util
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_bench_suite import STANDIN_TARGETS  # noqa: E402

from amopt.bench._records import Settings  # noqa: E402
from amopt.bench._timing import Paired  # noqa: E402
from benchmarks import cases as layouts  # noqa: E402
from benchmarks import cli as _cli  # noqa: E402
from benchmarks import counters  # noqa: E402
from benchmarks import host as _host  # noqa: E402
from benchmarks import standins as _standins  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "amopt" / "bench"


# --------------------------------------------------------------------------- HostReads


def test_counter_counts_known_ops_and_host_reads():
    x = torch.arange(6.0)
    with counters.HostReads() as c:
        y = x * 2  # mul
        s = y.sum()  # sum
        float(s)  # _local_scalar_dense: a read
        s.item()  # another
        y.tolist()  # a read (no aten op on the CPU)
        np.asarray(y)  # one read: __array__ calls numpy() inside, not counted again
        y.cpu()  # a copy to the host on a GPU
        y.to("cpu")  # likewise
        y.to(torch.float64)  # a dtype conversion: an op, no read
        y.view(2, 3).reshape(6)  # a view (the reshape of a contiguous tensor: a view too)
    assert c.ops["aten.mul.Tensor"] == 1 and c.ops["aten.sum.default"] == 1
    assert c.ops[counters.LOCAL_SCALAR] == 2
    assert c.ops["aten._to_copy.default"] == 1
    assert c.sync_sites == Counter(
        {counters.LOCAL_SCALAR: 2, "tolist": 1, "__array__": 1, "cpu": 1, "to": 1}
    )
    assert c.syncs == 6
    # views: the two, and numpy()'s detach
    assert c.ops["aten.view.default"] == 2 and c.ops["aten.detach.default"] == 1
    assert c.views == 3 and c.kernel_ops == c.total_ops - 3


def test_counter_restores_the_tensor_methods():
    before = {name: torch.Tensor.__dict__.get(name) for name in counters.HOST_METHODS}
    with counters.HostReads():
        assert torch.Tensor.__dict__.get("tolist") is not before["tolist"]
    assert {name: torch.Tensor.__dict__.get(name) for name in counters.HOST_METHODS} == before
    assert torch.arange(3).tolist() == [0, 1, 2]


@pytest.mark.parametrize("method", ["gd", "am-mgd"])
def test_minimize_counts_are_per_iteration(method, monkeypatch):
    """One more op and one more host read in the objective, evaluated once per
    iteration: exactly that many more per iteration (set-up and final evaluation
    cancel in the difference of two runs)."""
    base = _host.minimize_counts(method, n=50)
    original = _host._quadratic

    def heavier(n):
        vg, x0 = original(n)

        def value_and_grad(x):
            f, g = vg(x)
            float(f)  # one read
            return f, g + 0.0  # one op

        return value_and_grad, x0

    monkeypatch.setattr(_host, "_quadratic", heavier)
    more = _host.minimize_counts(method, n=50)
    assert more["syncs"] == base["syncs"] + 1
    assert more["ops"] == base["ops"] + 2  # the add, and the read's _local_scalar_dense
    assert base["syncs"] == int(base["syncs"]) and base["ops"] == int(base["ops"])


def test_minimize_counts_mini_batch_runs_the_sampler():
    out = _host.minimize_counts("am-sgd", batch=True, n=50)
    assert out["ops"] > 0 and out["syncs"] >= 0


def test_minimize_counts_reject_an_early_stop(monkeypatch):
    def flat(n):
        x0 = torch.zeros(n, dtype=torch.float64)
        return (lambda x: ((x * 0).sum(), x * 0)), x0  # converged at x0

    monkeypatch.setattr(_host, "_quadratic", flat)
    with pytest.raises(RuntimeError, match="stopped after"):
        _host.minimize_counts("gd", n=10)


# --------------------------------------------------------------------------- Triton stub


needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)
SHAPES = [(40,), (3, 7), (1,), (65,)]


@needs_triton
@pytest.mark.parametrize("optimizer", ["am_adamw", "amsgd"])
def test_launch_stub_stubs_the_kernels(optimizer):
    """Under the stub the driver launches (counted) and nothing is written; the same
    step with the interpreter's kernels moves the parameters."""
    from amopt.torch import _common, _triton

    kernels, path = _triton._kernels, _common.default_path
    case = _host.TritonHostCase(optimizer, SHAPES, dtype="float32")
    for p in case.params:
        with torch.no_grad():
            p.copy_(torch.linspace(-1, 1, p.numel()).reshape(p.shape))
            p.grad.copy_(0.5 * torch.ones_like(p))
    before = [p.detach().clone() for p in case.params]
    launched = sum(case.launches.values())
    case.run()
    assert sum(case.launches.values()) > launched
    assert set(case.launches) <= {"adam_reduce", "adam_apply", "sgd_reduce", "sgd_apply",
                                  "segment_sum", "rule"}  # fmt: skip
    assert "rule" in case.launches  # the rule kernel is stubbed too
    assert all(torch.equal(a, p) for a, p in zip(before, case.params, strict=True))
    # restored on exit
    assert _triton._kernels is kernels and _common.default_path is path
    # the interpreter's kernels (other shapes and a fresh optimizer: nothing a driver may
    # have cached for the stubbed steps is reused) move the parameters
    real = [torch.nn.Parameter(torch.linspace(-1, 1, n)) for n in (33, 70)]
    for p in real:
        p.grad = 0.5 * torch.ones_like(p)
    start = [p.detach().clone() for p in real]
    with _host.triton_on_cpu(stub=False):
        type(case.optimizer)(real, lr=0.1).step()
    assert all(not torch.equal(a, p) for a, p in zip(start, real, strict=True))


@needs_triton
def test_forced_path_is_triton_only_where_a_cuda_group_would_be():
    from amopt.torch import _common

    x = [torch.zeros(3)]
    with _host.triton_on_cpu():
        assert _common.default_path(x, x, fused=None, foreach=None) == ("triton", None)
        assert _common.default_path(x, x, fused=True, foreach=None) == ("triton", None)
        assert _common.default_path(x, x, fused=None, foreach=True)[0] == "foreach"
        assert _common.default_path(x, x, fused=False, foreach=None)[0] == "single"
        ints = [torch.zeros(3, dtype=torch.int64)]
        assert _common.default_path(ints, ints, fused=None, foreach=None)[0] != "triton"


@needs_triton
def test_triton_host_case_says_when_the_driver_is_not_reached(monkeypatch):
    monkeypatch.setattr(_host, "_force_triton", lambda original: original)
    with pytest.raises(RuntimeError, match="launched no Triton kernel"):
        _host.TritonHostCase("am_adamw", SHAPES, dtype="float32")


# --------------------------------------------------------------------------- layouts, rows


def test_layouts_hold_gpt2_small_in_148_and_1480_tensors():
    small, many = _standins.layout(148), _standins.layout(1480)
    assert len(small) == 148 and len(many) == 1480
    total = sum(math.prod(s) for s in small)
    assert total == sum(math.prod(s) for s in many) == 124_439_808
    assert len(_standins.layout(148, quick=True)) == 148
    with pytest.raises(ValueError, match="n_tensors must be"):
        _standins.layout(100)


def test_standin_rows_carry_the_targets():
    assert {r.key: r.target for r in _standins.ROWS} == STANDIN_TARGETS
    cli = {r.key: r.target for r in _cli.ROWS}
    assert {k: cli[k] for k in STANDIN_TARGETS} == STANDIN_TARGETS


def _row(rows, key):
    return next(r for r in rows if r.key == key)


def test_foreach_ops_row_ratio_is_ops_over_the_allowance(monkeypatch):
    def fake(kind, shapes, as_on_gpu=False):
        c = counters.HostReads()
        n = (500 if as_on_gpu else 700) if kind.startswith("am") else 300
        c.calls += [torch.ops.aten.dot.default] * n
        c.as_on_gpu = as_on_gpu
        return c

    monkeypatch.setattr(_host, "foreach_step_ops", fake)
    m = _row(_standins.ROWS, "foreach-ops").measure(Settings(quick=True))
    assert (m.a, m.b) == (500, 300) and "CPU strategy (cache-sized chunks): 700 ops" in m.note
    assert m.ratio == pytest.approx(500 / (1.5 * 300 + 40))


def test_device_strategy_is_restored():
    from amopt.torch import _common

    before = getattr(_common, "FORCE_DEVICE_STRATEGY", None)
    with _host.device_strategy() as applied:
        assert applied == hasattr(_common, "FORCE_DEVICE_STRATEGY")
        if applied:
            assert _common.FORCE_DEVICE_STRATEGY is True
    assert getattr(_common, "FORCE_DEVICE_STRATEGY", None) == before


def test_foreach_ops_counts_a_real_step():
    shapes = [(30,), (4, 5)]
    ours = _host.foreach_step_ops("am_adamw_foreach", shapes)
    torchs = _host.foreach_step_ops("adamw_foreach", shapes)
    assert torchs.total_ops > 0 and ours.total_ops > 0
    # torch's foreach AdamW makes a fixed number of multi-tensor calls, whatever the count
    more = _host.foreach_step_ops("adamw_foreach", shapes * 3)
    assert more.ops["aten._foreach_mul_.Scalar"] == torchs.ops["aten._foreach_mul_.Scalar"]


def test_minimize_rows_arithmetic(monkeypatch):
    def fake(method, *, batch=False, n=1000, iterations=(4, 12), pipelined=False):
        syncs = 4.0 if (method == "am-sgd" and batch) else 1.0
        ops = {"am-mgd": 40.0, "mgd": 20.0}.get(method, 10.0)
        return {"syncs": syncs, "ops": ops + (30.0 if pipelined and method == "am-mgd" else 0)}

    monkeypatch.setattr(_host, "minimize_counts", fake)
    m = _row(_standins.ROWS, "minimize-syncs").measure(Settings(quick=True))
    assert m.a == m.ratio == 4.0 and "worst: am-sgd (batch)" in m.note
    m = _row(_standins.ROWS, "minimize-ops").measure(Settings(quick=True))
    assert (m.a, m.b, m.ratio) == (40.0, 20.0, pytest.approx(40 / 32))
    m = _row(_standins.EXTRA_ROWS, "minimize-ops-pipelined").measure(Settings(quick=True))
    assert (m.a, m.b, m.ratio) == (70.0, 20.0, pytest.approx(70 / 32)) and "pipelined" in m.note


def test_minimize_bytes_rows_are_measured_against_the_hand_loop():
    m = _row(_standins.ROWS, "minimize-bytes-mgd").measure(Settings(quick=True))
    # the hand loop: h*x, hx*x, sum, beta*d, (1-beta)*g, +, lr*d, x - : 19 array passes
    assert m.b == pytest.approx(19.0, abs=1e-3)
    assert m.ratio == pytest.approx(m.a / m.b) and m.ratio <= 1.1
    assert "full-size ops per iteration" in m.note


@pytest.mark.parametrize("batch, method", [(False, "mgd"), (True, "msgd")])
def test_host_time_rows_hand_loops_are_the_methods_iterates(batch, method):
    """The baselines of the minimize-host rows run the heavy-ball method that minimize
    runs: the same iterates as minimize(method="mgd" / "msgd") with beta 0.9 (the same
    epochs of batches for the same seed)."""
    hand, k = _standins.host_time_setup(None, batch)
    ours, _ = _standins.host_time_setup(method, batch)
    k = 40  # more than one epoch of batches: 4096 rows in batches of 256
    x_hand, res = hand(k), ours(k)
    assert int(res.nit) == k
    # float64, a few dozen steps of a well-conditioned problem: rounding only
    np.testing.assert_allclose(x_hand.numpy(), res.x, rtol=1e-12, atol=1e-14)


def test_host_time_rows_measure_per_iteration(monkeypatch):
    """A row's figures are each side's seconds per run over the run's iterations, in us,
    the AM side minimize and the baseline the hand loop."""
    ran = []

    def setup(method, batch, quick=False):
        return (lambda k: ran.append((method, batch, k))), 300

    def paired(run_a, run_b, **kw):
        run_a(), run_b()
        return Paired(a=[3e-3] * 3, b=[1e-3] * 3)

    monkeypatch.setattr(_standins, "host_time_setup", setup)
    monkeypatch.setattr(_standins, "interleave", paired)
    m = _row(_standins.ROWS, "minimize-host-am-sgd").measure(Settings(quick=False, repeat=3))
    assert ran == [("am-sgd", True, 300), (None, True, 300)]
    assert m.a == pytest.approx(10.0) and m.b == pytest.approx(10.0 / 3)
    assert m.ratio == pytest.approx(3.0) and m.unit == "us/it"


def test_host_time_row_is_over_the_budget(monkeypatch):
    class Case:
        def __init__(self, optimizer, shapes):
            self.n_tensors, self.launches = len(shapes), Counter(adam_reduce=1)

        def run(self):
            pass

    monkeypatch.setattr(_host, "TritonHostCase", Case)
    monkeypatch.setattr(_standins, "timed_rounds", lambda w, **kw: {"a": {"total": [1e-3] * 5}})
    m = _row(_standins.ROWS, "triton-host-adamw").measure(Settings(quick=True, repeat=5))
    assert m.a == pytest.approx(1.0) and m.b == _standins.HOST_BUDGET_MS
    assert m.ratio == pytest.approx(1.0 / _standins.HOST_BUDGET_MS)


def test_many_tensor_host_row_is_over_three_budgets(monkeypatch):
    """The 1480-tensor row: its median against 3x the 148-tensor budget; the paired ratio
    to the 148-tensor step (what the tensors add) in its note."""

    class Case:
        def __init__(self, optimizer, shapes):
            self.n_tensors, self.launches = len(shapes), Counter(sgd_reduce=1)

        def run(self):
            pass

    def paired(run_a, run_b, **kw):
        return Paired(a=[0.9e-3, 1.2e-3, 1.2e-3, 1.5e-3], b=[0.3e-3, 0.3e-3, 0.4e-3, 0.3e-3])

    monkeypatch.setattr(_host, "TritonHostCase", Case)
    monkeypatch.setattr(_standins, "interleave", paired)
    m = _row(_standins.ROWS, "triton-host-amsgd-1480").measure(Settings(quick=True, repeat=4))
    budget = _standins.SCALING * _standins.HOST_BUDGET_MS
    assert m.a == pytest.approx(1.2) and m.b == pytest.approx(budget)
    assert m.ratio == pytest.approx(1.2 / budget)
    # paired ratios 3, 4, 3, 5: median 3.5
    assert "1480 tensors / 148" in m.note and ": 3.50 (IQR" in m.note


@needs_triton
def test_standin_rows_run_quick():
    """Every stand-in row measures at small sizes, through the command."""
    keys = ["triton-host-amsgd-1480", "foreach-ops", "minimize-ops", "minimize-host-am-sgd"]
    results = _cli.run_rows([_row(_cli.ROWS, k) for k in keys], Settings(repeat=2, quick=True))
    assert [r.status for r in results] != [] and all(r.error is None for r in results)
    assert all(r.measured is not None and r.measured.ratio > 0 for r in results)


def test_asv_and_cli_share_the_host_cases():
    assert layouts.gpt2_small_shapes() == _standins.layout(148)


# --------------------------------------------------------------------------- imports


def _bench_imports():
    graph = {}
    for path in BENCH.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "amopt.bench":
                    deps |= {a.name for a in node.names}
                elif node.module.startswith("amopt.bench."):
                    deps.add(node.module.rsplit(".", 1)[1])
        graph[path.stem] = deps
    return graph


def test_bench_modules_import_only_those_below_them():
    graph = _bench_imports()
    assert not any("_cli" in deps for name, deps in graph.items() if name not in
                   ("__init__", "__main__"))  # fmt: skip
    # acyclic: repeatedly remove modules with no remaining dependencies
    remaining = {k: v & set(graph) for k, v in graph.items()}
    while remaining:
        leaves = [k for k, v in remaining.items() if not v - {k}]
        assert leaves, f"import cycle among {sorted(remaining)}"
        for k in leaves:
            del remaining[k]
        for v in remaining.values():
            v -= set(leaves)
    assert graph["_records"] <= {"_timing"}


def test_the_package_never_imports_the_harness():
    """The wheel holds ``amopt/`` alone: no module of it imports ``benchmarks``."""
    importers = []
    for path in (BENCH.parents[1] / "amopt").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(n == "benchmarks" or n.startswith("benchmarks.") for n in names):
                importers.append(path.name)
    assert importers == []


@needs_triton
def test_compiled_host_case_steps_through_the_operator():
    """The compiled stand-in runs one graph whose Triton operator reaches the stubbed
    launches, and moves the parameters as the eager driver would not (stubs write
    nothing): only the host work is timed."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    case = _host.TritonHostCase("am_adamw", SHAPES, dtype="float32", compiled=True)
    before = [p.detach().clone() for p in case.params]
    launched = sum(case.launches.values())
    for _ in range(2):
        case.run()
    assert sum(case.launches.values()) - launched == 2 * launched  # the same per step
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    # bit for bit: the case's parameters are untouched memory (torch.empty), which may
    # hold NaN patterns that equal themselves only as bits
    assert all(
        torch.equal(a.view(torch.uint8), p.detach().view(torch.uint8))
        for a, p in zip(before, case.params, strict=True)
    )


@needs_triton
def test_sharded_host_case_steps_on_a_sharded_plan():
    """The DTensor stand-in (FSDP2's layout on a one-rank mesh) reaches the Triton driver
    and, from its second step, the group's plan over the local tensors, with gradients
    at new addresses at every step; the process group it made is gone afterwards."""
    import torch.distributed as dist

    with _host.one_rank_mesh() as mesh:
        case = _host.TritonHostCase("am_adamw", SHAPES, dtype="float32", mesh=mesh, new_grads=True)
        per_step = sum(case.launches.values())
        addresses = set()
        for _ in range(3):
            case.new_gradients()
            addresses.add(case.params[0].grad.to_local().data_ptr())
            case.run()
        (plan,) = case.optimizer.__dict__["_am_plans"].values()
        assert plan.sharded is not None and plan.sync is None  # one rank: nothing to combine
        assert len(addresses) == 2
        assert sum(case.launches.values()) == 4 * per_step
    assert not dist.is_initialized()


def test_interleave_counted_keeps_what_the_runs_count():
    from amopt.bench._timing import interleave_counted

    order = []

    def run(side, value):
        def go():
            order.append(side)
            return value

        return go

    p = interleave_counted(run("a", 2.0), run("b", 1.0), repeat=4, warmup=1)
    assert p.a == [2.0] * 4 and p.b == [1.0] * 4 and p.median_ratio == 2.0
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, alternating
    q = interleave_counted(run("a", 1.0), run("b", 1.0), repeat=50, warmup=0, max_seconds=0.0)
    assert len(q.a) == 3  # the minimum number of pairs once the time is up
