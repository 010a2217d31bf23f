"""``torch.compile`` of a function calling ``opt.step()`` (torch's "Compiling the optimizer").

The single-tensor and foreach steps of every optimizer trace into one graph: no
graph break of their own, no recompilation after the first compiled step (the
state is created in ``_init_group``, which dynamo runs eagerly, and updated in
place afterwards), and the compiled iterates equal the eager ones (float32,
1e-6 relative: the compiled graph may reorder float32 sums, nothing else).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.utils import counters  # noqa: E402

from amopt.torch import AMSGD, AMAdam, AMAdamW  # noqa: E402

N_STEPS = 3
RTOL = 1e-6

CASES = [
    pytest.param(AMSGD, {"lr": 0.05}, id="AMSGD-global"),
    pytest.param(AMSGD, {"lr": 0.05, "per_layer": True, "variant": "clip"}, id="AMSGD-per-layer"),
    pytest.param(AMAdamW, {"lr": 0.01}, id="AMAdamW-per-layer"),
    pytest.param(
        AMAdamW,
        {"lr": 0.01, "per_layer": False, "weight_decay_mode": "proximal"},
        id="AMAdamW-global",
    ),
    pytest.param(AMAdam, {"lr": 0.01, "weight_decay": 0.1, "maximize": True}, id="AMAdam"),
]


class CountingBackend:
    """``aot_eager`` (dynamo and AOT autograd, no code generation), counting the graphs."""

    def __init__(self) -> None:
        self.graphs = 0
        self.targets: set[str] = set()

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        self.graphs += 1
        self.targets |= {str(node.target) for node in gm.graph.nodes}
        return aot_eager(gm, example_inputs)


def _own_graph_breaks() -> dict[str, int]:
    """Graph breaks other than the deliberate ``torch._dynamo.graph_break()`` calls.

    ``torch.optim``'s ``_use_grad_for_differentiable`` wrapper breaks the graph twice per
    step on purpose; the AM optimizers do not use it, but such breaks are not theirs.
    """
    return {
        reason: n for reason, n in counters["graph_break"].items() if "graph_break()" not in reason
    }


def _model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    X, y = torch.randn(16, 6), torch.randn(16, 1)
    return model, X, y


def _train(model, opt, X, y, step_fn):
    iterates = []
    for _ in range(N_STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), y).backward()
        step_fn()
        iterates.append([p.detach().clone() for p in model.parameters()])
    return iterates


CAPTURABLE = [
    pytest.param(AMAdamW, {"lr": 0.01, "capturable": True}, id="AMAdamW-capturable"),
    pytest.param(
        AMAdam, {"lr": 0.01, "per_layer": False, "capturable": True}, id="AMAdam-capturable"
    ),
]


@pytest.mark.parametrize("foreach", [False, True, None], ids=["single", "foreach", "default"])
@pytest.mark.parametrize(("cls", "kwargs"), CASES + CAPTURABLE)
def test_compiled_step_has_no_graph_break_and_no_recompile(cls, kwargs, foreach):
    """Every path, the default one included (on the CPU the fused kernels, which the
    graph holds as one custom operator). ``capturable=True``: the compiled step against
    the eager default one, the reference arithmetic; eagerly the CPU is no capture
    device."""
    model, X, y = _model_and_data()
    eager_model = copy.deepcopy(model)
    opt = cls(model.parameters(), **kwargs, foreach=foreach)
    eager_kwargs = {**kwargs, "capturable": False} if "capturable" in kwargs else kwargs
    eager_opt = cls(eager_model.parameters(), **eager_kwargs, foreach=foreach)
    expected = _train(eager_model, eager_opt, X, y, eager_opt.step)

    torch._dynamo.reset()
    counters.clear()
    backend = CountingBackend()

    @torch.compile(backend=backend)
    def compiled_step():
        opt.step()

    graphs_after = []

    def step_and_count():
        compiled_step()
        graphs_after.append(backend.graphs)

    got = _train(model, opt, X, y, step_and_count)

    assert _own_graph_breaks() == {}
    fused_ops = {t for t in backend.targets if t.startswith("amopt.fused_")}
    assert bool(fused_ops) == (foreach is None), backend.targets  # CPU default: fused
    assert graphs_after[0] == 1, "the step traces into one graph"
    assert graphs_after == [1] * N_STEPS, f"recompiled after the first step: {graphs_after}"
    for t, (xs, refs) in enumerate(zip(got, expected, strict=True)):
        for x, ref in zip(xs, refs, strict=True):
            torch.testing.assert_close(x, ref, rtol=RTOL, atol=RTOL, msg=f"step {t}")
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        for key, value in opt.state[p].items():
            torch.testing.assert_close(value, eager_opt.state[q][key], rtol=RTOL, atol=RTOL)
        assert opt.state[p]["step"].device == p.device


def test_inductor_compiled_step_matches_eager():
    """The default backend (inductor, with generated C++ kernels) gives the eager iterates."""
    model, X, y = _model_and_data()
    eager_model = copy.deepcopy(model)
    opt = AMAdamW(model.parameters(), lr=0.01, foreach=True)
    eager_opt = AMAdamW(eager_model.parameters(), lr=0.01, foreach=True)
    expected = _train(eager_model, eager_opt, X, y, eager_opt.step)
    torch._dynamo.reset()
    counters.clear()
    # a private inductor cache: kernels cached by an earlier run under another
    # ATEN_CPU_CAPABILITY (CI reruns the tests as an AVX2-only CPU) were seen to be
    # reused and give wrong iterates
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        got = _train(model, opt, X, y, torch.compile(opt.step))
    assert _own_graph_breaks() == {}
    assert counters["stats"]["unique_graphs"] == 1
    for xs, refs in zip(got, expected, strict=True):
        for x, ref in zip(xs, refs, strict=True):
            torch.testing.assert_close(x, ref, rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("cls", [AMSGD, AMAdamW], ids=["AMSGD", "AMAdamW"])
def test_default_step_compiles_with_fullgraph(cls):
    """No graph break at all: ``fullgraph=True`` (which torch's own AdamW step cannot pass,
    its wrapper breaks the graph on purpose) compiles the default CPU step."""
    model, X, y = _model_and_data()
    eager_model = copy.deepcopy(model)
    opt = cls(model.parameters(), lr=0.01)
    eager_opt = cls(eager_model.parameters(), lr=0.01)
    expected = _train(eager_model, eager_opt, X, y, eager_opt.step)
    torch._dynamo.reset()
    got = _train(model, opt, X, y, torch.compile(opt.step, fullgraph=True, backend="aot_eager"))
    for xs, refs in zip(got, expected, strict=True):
        for x, ref in zip(xs, refs, strict=True):
            torch.testing.assert_close(x, ref, rtol=RTOL, atol=RTOL)


def test_cuda_default_path_resolves_triton_before_any_trace():
    """On a CUDA machine the Triton module is resolved when ``amopt.torch`` is imported:
    a first attempt inside a ``torch.compile(fullgraph=True)`` trace (a compiled first
    step of CUDA parameters in a fresh process) cannot import it (Dynamo skips importlib).
    Run in a fresh interpreter that reports CUDA as available."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import torch
        available = torch.cuda.is_available
        torch.cuda.is_available = lambda: True  # what a CUDA machine reports
        from amopt.torch import _common
        torch.cuda.is_available = available

        def f(t):
            return t + (1 if _common.triton_unavailable([t]) is None else 2)

        out = torch.compile(f, fullgraph=True, backend="aot_eager")(torch.ones(3))
        assert out.shape == (3,)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
