"""The CPU rows of ``python -m amopt.bench``: the AM optimizers and the array-API core
against their baselines, timed side by side (see :mod:`amopt.bench`)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from amopt.bench import cases
from amopt.bench._records import Measured, Row, Settings
from amopt.bench._timing import interleave

__all__ = ["A9A_ENV", "EXTRA_ROWS", "N_PARAMS", "ROWS"]

#: The variable :func:`amopt.bench.cases.a9a_path` reads the a9a file's path from.
A9A_ENV = "AMOPT_A9A"


# --------------------------------------------------------------------------- measurements

N_PARAMS = 25_000_000


def _sizes(s: Settings, n_params: int, n_tensors: int) -> tuple[int, int]:
    return (200_000, min(n_tensors, 8)) if s.quick else (n_params, n_tensors)


def _fresh_compiler() -> None:
    """Start a row with Dynamo's caches empty: every optimizer's ``step`` is one code
    object to Dynamo (``torch.optim``'s wrapper), so the compiled rows before a row would
    spend its recompile limit and leave that row's steps uncompiled."""
    import torch

    torch._dynamo.reset()


def _paired_steps(
    make_a: Callable[[int, int], Any],
    kind_b: str | Callable[[int, int], Any],
    n_tensors: int,
    per_layer: bool,
    *,
    compiled: bool = False,
    note: str = "",
) -> Callable:
    """A row's measurement: ``make_a(n, t).run`` against ``OptimizerCase(kind_b)`` (or
    ``kind_b(n, t)`` where it is a callable), interleaved; ``compiled``: the note also
    counts the AM side's graphs and breaks."""

    def measure(s: Settings) -> Measured:
        s.apply_threads()
        _fresh_compiler()
        n, t = _sizes(s, N_PARAMS, n_tensors)
        a = make_a(n, t)
        counts = _compile_counts(a) if compiled else ""
        if callable(kind_b):
            b = kind_b(n, t)
        else:
            b = cases.OptimizerCase(kind_b, n, t, per_layer=per_layer)
        p = interleave(a.run, b.run, repeat=s.repeat, warmup=3, max_seconds=s.row_seconds)
        tensors = f"{t} tensor" + ("s" if t != 1 else "")
        return Measured.from_paired(
            p, scale=1e3, unit="ms", note=f"{n:,} params, {tensors}{counts}{note}"
        )

    return measure


def _optimizers(kind_a: str, kind_b: str, n_tensors: int, per_layer: bool) -> Callable:
    return _paired_steps(
        lambda n, t: cases.OptimizerCase(kind_a, n, t, per_layer=per_layer),
        kind_b,
        n_tensors,
        per_layer,
        compiled=kind_a.endswith("_compiled"),
    )


def _traffic(n_tensors: int, per_layer: bool) -> Callable:
    return _paired_steps(
        lambda n, t: cases.TrafficCase(n, t, per_layer=per_layer),
        "adamw_fused",
        n_tensors,
        per_layer,
        note="; the AM side reads and writes what the fused step does",
    )


def _read_floor() -> Callable:
    return _paired_steps(
        lambda n, t: cases.ReadFloorCase(n, t),
        "sgd_single_compiled",
        48,
        False,
        note="; the AM side is a compiled read of the gradients and buffers, then the same "
        "compiled SGD step",
    )


def _over_floor(n_tensors: int, per_layer: bool) -> Callable:
    """The fused AMAdamW step against :class:`~amopt.bench.cases.TrafficCase` on its own
    tensors: what the step costs beyond its memory traffic, on this machine."""

    def measure(s: Settings) -> Measured:
        s.apply_threads()
        n, t = _sizes(s, N_PARAMS, n_tensors)
        floor = cases.TrafficCase(n, t, per_layer=per_layer)
        p = interleave(
            floor.case.run, floor.run, repeat=s.repeat, warmup=3, max_seconds=s.row_seconds
        )
        tensors = f"{t} tensor" + ("s" if t != 1 else "")
        return Measured.from_paired(
            p,
            scale=1e3,
            unit="ms",
            note=f"{n:,} params, {tensors}; both sides on the same tensors",
        )

    return measure


def _compiled_over_floor(kind: str) -> Callable:
    """A compiled AMSGD step against :class:`~amopt.bench.cases.ReadFloorCase` (a
    compiled read of the gradients and buffers, then a compiled SGD step): what the
    step costs beyond the two passes any global-scope AM step makes, on this machine."""
    return _paired_steps(
        lambda n, t: cases.OptimizerCase(kind, n, t, per_layer=False),
        cases.ReadFloorCase,
        48,
        False,
        compiled=True,
        note="; the floor: a compiled read of the gradients and buffers, then a compiled "
        "SGD step, on tensors of the same sizes",
    )


def _compile_counts(case: cases.OptimizerCase) -> str:
    """Three compiled steps of ``case``: its graphs, recompilations and graph breaks.

    Graph breaks that are ``torch.optim``'s own deliberate ``graph_break()`` calls are
    not counted (the AM optimizers make none; torch's AdamW wrapper makes two).
    """
    from torch._dynamo.utils import counters

    counters.clear()
    case.run()
    first = counters["stats"]["unique_graphs"]
    case.run()
    case.run()
    graphs = counters["stats"]["unique_graphs"]
    own = sum(n for why, n in counters["graph_break"].items() if "graph_break()" not in why)
    if first == 0:
        raise RuntimeError(
            "the compiled step made no graph at its first step (Dynamo's recompile limit "
            "spent?): the row would time an eager step"
        )
    return (
        f"; compiled step: {first} graph(s) at the first step, {graphs - first} "
        f"recompilation(s) in the next two, {own} graph break(s)"
    )


def _core_step(s: Settings) -> Measured:
    n = 100_000 if s.quick else 10_000_000
    a = cases.CoreStepCase("am-mgd", n)
    b = cases.CoreStepCase("mgd", n)
    p = interleave(a.run, b.run, repeat=s.repeat, warmup=2, max_seconds=s.row_seconds)
    return Measured.from_paired(p, scale=1e3, unit="ms", note=f"n = {n:,}, float64")


def _minimize_a9a(s: Settings) -> Measured:
    path = cases.a9a_path()
    if not path.is_file():
        raise cases.SkipCase(
            f"a9a not found at {path}; put the LIBSVM file a9a at <data>/libsvm/a9a and pass "
            f"--data-dir <data> (default: $AMOPT_DATA_DIR, else ~/.cache/amopt), or set "
            f"{A9A_ENV} to the file"
        )
    k = 10 if s.quick else 500
    a = cases.MinimizeCase("am-mgd", iterations=k)
    b = cases.MinimizeCase("heavy-ball", iterations=k)
    p = interleave(a.run, b.run, repeat=s.repeat, warmup=1, max_seconds=s.row_seconds)
    return Measured.from_paired(
        p, scale=1e6 / k, unit="us/it", note=f"{k} iterations per sample, from near x*"
    )


def _peak_memory(s: Settings) -> Measured:
    return _peak_memory_kinds("am_adamw_fused", "adamw_fused")(s)


def _peak_memory_kinds(kind_a: str, kind_b: str) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        return _peak_memory_of(s, kind_a, kind_b)

    return measure


def _peak_memory_of(s: Settings, kind_a: str, kind_b: str) -> Measured:
    if not sys.platform.startswith("linux"):
        raise cases.SkipCase("peak memory is read from /proc (Linux only)")
    n, t = _sizes(s, N_PARAMS, 48)
    out = {}
    for kind in (kind_a, kind_b):
        code = (
            "import json, torch\n"
            f"torch.set_num_threads({max(s.threads, 1)})\n"
            "from amopt.bench.cases import peak_state_memory\n"
            f"print(json.dumps(peak_state_memory({kind!r}, {n}, {t}, True)))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            raise RuntimeError(f"peak-memory child for {kind} failed:\n{proc.stderr[-2000:]}")
        out[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    am, ref = out[kind_a], out[kind_b]
    extra_mib = (am["peak_extra_bytes"] - ref["peak_extra_bytes"]) / 2**20
    state_ratio = am["state_bytes"] / ref["state_bytes"]
    return Measured(
        a=am["peak_extra_bytes"] / 2**20,
        b=ref["peak_extra_bytes"] / 2**20,
        ratio=am["peak_extra_bytes"] / ref["peak_extra_bytes"],
        unit="MiB",
        note=(
            f"peak RSS added by the optimizer over 3 steps, fresh process each "
            f"({extra_mib:+.1f} MiB, parameters {n * 4 / 2**20:.1f} MiB); "
            f"state bytes {am['state_bytes'] / 2**20:.1f} / {ref['state_bytes'] / 2**20:.1f} "
            f"MiB = {state_ratio:.4f}"
        ),
    )


def _llama(batch: int, path: str = "fused") -> Callable[[Settings], Measured]:
    """Whole training iterations, AM-AdamW against AdamW, estimated robustly.

    Both models run the same forward and backward computation (same architecture,
    batch and initial weights); only the optimizer step differs. The iteration time
    of each side is estimated as ``T_fb + T_step``: the median forward+backward time
    of both models pooled, plus the median step time of that side. On a machine
    shared with other work the raw whole-iteration times scatter by several percent
    (more than the effect measured); the raw paired ratio and its spread, and the
    forward+backward medians of each side, are given in the note.
    """

    def measure(s: Settings) -> Measured:
        s.apply_threads()
        size: dict = {"batch": batch}
        if s.quick:
            size = {"batch": 2, "seq_len": 32, "hidden": 64, "layers": 2, "vocab": 512}
        a = cases.LlamaCase("am-adamw", path=path, **size)
        b = cases.LlamaCase("adamw", path=path, **size)
        b.model.load_state_dict(a.model.state_dict())
        p = interleave(a.run, b.run, repeat=s.repeat, warmup=2, max_seconds=s.row_seconds)
        med = statistics.median
        fb = med(a.fb_seconds + b.fb_seconds)
        it_a, it_b = fb + med(a.step_seconds), fb + med(b.step_seconds)
        q1, q3 = p.spread()
        return Measured(
            a=it_a * 1e3,
            b=it_b * 1e3,
            ratio=it_a / it_b,
            unit="ms",
            note=(
                f"{a.n_params:,} params in {a.n_tensors} tensors, batch {tuple(a.ids.shape)}; "
                f"iteration = forward+backward ({med(a.fb_seconds) * 1e3:.0f} ms with AM-AdamW, "
                f"{med(b.fb_seconds) * 1e3:.0f} ms with AdamW, pooled median "
                f"{fb * 1e3:.0f} ms) + step ({med(a.step_seconds) * 1e3:.1f} ms vs "
                f"{med(b.step_seconds) * 1e3:.1f} ms); raw whole-iteration paired ratio "
                f"{p.median_ratio:.3f} (IQR {q1:.3f}-{q3:.3f})"
            ),
        )

    return measure


ROWS: tuple[Row, ...] = (
    Row(
        "adamw-layers",
        "AMAdamW.step / AdamW(fused=True).step, 25M params in 48 tensors, per-layer beta "
        "(its target is the next row's: the step over its own memory-traffic floor)",
        "AMAdamW(fused=True)",
        "AdamW(fused=True)",
        None,
        _optimizers("am_adamw_fused", "adamw_fused", 48, True),
    ),
    Row(
        "adamw-layers-over-floor",
        "AMAdamW.step / its memory-traffic floor (the same two passes over the same tensors, "
        "no arithmetic), 25M params in 48 tensors, per-layer beta: the fused per-layer "
        "target on every CPU",
        "AMAdamW(fused=True)",
        "two passes, no arithmetic",
        1.25,
        _over_floor(48, True),
    ),
    Row(
        "adamw-global",
        "AMAdamW.step / AdamW(fused=True).step, one 25M-parameter tensor, global beta",
        "AMAdamW(fused=True)",
        "AdamW(fused=True)",
        2.0,
        _optimizers("am_adamw_fused", "adamw_fused", 1, False),
    ),
    Row(
        "amsgd",
        "AMSGD.step / SGD(momentum=0.9, dampening=0.9, foreach=True).step, 25M params, 48 tensors",
        "AMSGD(fused=True)",
        "SGD(foreach=True)",
        1.6,
        _optimizers("amsgd_fused", "sgd_foreach", 48, False),
    ),
    Row(
        "adamw-default",
        "AMAdamW().step / AdamW().step, default flags, 25M params in 48 tensors",
        "AMAdamW()",
        "AdamW()",
        1.0,
        _optimizers("am_adamw_default", "adamw_default", 48, True),
    ),
    Row(
        "adamw-foreach",
        "AMAdamW(foreach=True).step / AdamW(foreach=True).step, 25M params, 48 tensors",
        "AMAdamW(foreach=True)",
        "AdamW(foreach=True)",
        2.0,
        _optimizers("am_adamw_foreach", "adamw_foreach", 48, True),
    ),
    Row(
        "adamw-compiled",
        "torch.compile(AMAdamW.step) / torch.compile(AdamW.step), 25M params, 48 tensors",
        "AMAdamW() compiled",
        "AdamW() compiled",
        1.6,
        _optimizers("am_adamw_compiled", "adamw_compiled", 48, True),
    ),
    Row(
        "amsgd-foreach",
        "AMSGD(foreach=True).step / SGD(momentum=0.9, dampening=0.9, foreach=True).step, "
        "25M params, 48 tensors",
        "AMSGD(foreach=True)",
        "SGD(foreach=True)",
        2.0,
        _optimizers("amsgd_foreach", "sgd_foreach", 48, False),
    ),
    Row(
        "adamw-single-compiled",
        "torch.compile(AMAdamW(foreach=False).step) / torch.compile(AdamW(foreach=False).step), "
        "25M params, 48 tensors",
        "AMAdamW(foreach=False) compiled",
        "AdamW(foreach=False) compiled",
        1.6,
        _optimizers("am_adamw_single_compiled", "adamw_single_compiled", 48, True),
    ),
    Row(
        "adamw-foreach-compiled",
        "torch.compile(AMAdamW(foreach=True).step) / torch.compile(AdamW(foreach=True).step), "
        "25M params, 48 tensors",
        "AMAdamW(foreach=True) compiled",
        "AdamW(foreach=True) compiled",
        1.6,
        _optimizers("am_adamw_foreach_compiled", "adamw_foreach_compiled", 48, True),
    ),
    Row(
        "amsgd-single-compiled",
        "torch.compile(AMSGD(foreach=False).step) / torch.compile(SGD(momentum=0.9, "
        "dampening=0.9, foreach=False).step), 25M params, 48 tensors (its target is the "
        "amsgd-single-compiled-over-floor row's: on one core the floor row, the least "
        "a two-pass step can cost, reaches 1.6 against SGD)",
        "AMSGD(foreach=False) compiled",
        "SGD(foreach=False) compiled",
        None,
        _optimizers("amsgd_single_compiled", "sgd_single_compiled", 48, False),
    ),
    Row(
        "amsgd-foreach-compiled",
        "torch.compile(AMSGD(foreach=True).step) / torch.compile(SGD(momentum=0.9, "
        "dampening=0.9, foreach=True).step), 25M params, 48 tensors (its target is the "
        "amsgd-foreach-compiled-over-floor row's: on one core the floor row, the least "
        "a two-pass step can cost, reaches 1.6 against SGD)",
        "AMSGD(foreach=True) compiled",
        "SGD(foreach=True) compiled",
        None,
        _optimizers("amsgd_foreach_compiled", "sgd_foreach_compiled", 48, False),
    ),
    Row(
        "amsgd-compiled-floor",
        "floor of a compiled AMSGD step / torch.compile(SGD(momentum=0.9, dampening=0.9, "
        "foreach=False).step): a compiled pass reading the gradients and buffers (an AM "
        "step's reduce) plus the same SGD step, 25M params, 48 tensors (what the 1.6 of "
        "the compiled AMSGD rows asks of the memory system)",
        "read pass + SGD step",
        "SGD(foreach=False) compiled",
        None,
        _read_floor(),
    ),
    Row(
        "amsgd-single-compiled-over-floor",
        "torch.compile(AMSGD(foreach=False).step) / its floor (the amsgd-compiled-floor "
        "row's AM side: a compiled read of the gradients and buffers, then a compiled "
        "SGD step), 25M params, 48 tensors, global beta: the compiled AMSGD target on "
        "every CPU",
        "AMSGD(foreach=False) compiled",
        "read pass + SGD step",
        1.25,
        _compiled_over_floor("amsgd_single_compiled"),
    ),
    Row(
        "amsgd-foreach-compiled-over-floor",
        "torch.compile(AMSGD(foreach=True).step) / its floor (as the row above), 25M "
        "params, 48 tensors, global beta: the compiled AMSGD target on every CPU",
        "AMSGD(foreach=True) compiled",
        "read pass + SGD step",
        1.25,
        _compiled_over_floor("amsgd_foreach_compiled"),
    ),
    Row(
        "amsgd-default",
        "AMSGD(per_layer=True).step / SGD(momentum=0.9, dampening=0.9).step, default flags, "
        "25M params in 48 tensors, per-layer beta",
        "AMSGD(per_layer=True)",
        "SGD()",
        1.3,
        _optimizers("amsgd_default", "sgd_default", 48, True),
    ),
    Row(
        "amsgd-default-global",
        "AMSGD().step / SGD(momentum=0.9, dampening=0.9).step, default flags, 25M params in "
        "48 tensors, global beta (AMSGD's default scope; bound: 7 array passes over memory "
        "against SGD's 5)",
        "AMSGD()",
        "SGD()",
        None,
        _optimizers("amsgd_default", "sgd_default", 48, False),
    ),
    Row(
        "foreach-peakmem",
        "peak memory of an AMAdamW / AdamW step, foreach=True (25M params, 48 tensors)",
        "AMAdamW(foreach=True)",
        "AdamW(foreach=True)",
        None,
        _peak_memory_kinds("am_adamw_foreach", "adamw_foreach"),
    ),
    Row(
        "minimize-a9a",
        "minimize(method='am-mgd') per iteration / hand-written NumPy heavy-ball loop, a9a",
        "minimize am-mgd",
        "heavy-ball loop",
        1.05,
        _minimize_a9a,
    ),
    Row(
        "core-numpy",
        "NumPy core am_momentum_step (AM-MGD) / heavy_ball_step (MGD), 10^7 float64",
        "AM-MGD step",
        "MGD step",
        1.6,
        _core_step,
    ),
    Row(
        "peakmem",
        "peak memory of AMAdamW / AdamW state (25M params, 48 tensors, fused)",
        "AMAdamW(fused=True)",
        "AdamW(fused=True)",
        1.05,
        _peak_memory,
    ),
    Row(
        "llama",
        "tiny LLaMA training iteration (batch 16 x 256), AM-AdamW / AdamW (overhead <= 1%)",
        "AMAdamW(fused=True)",
        "AdamW(fused=True)",
        1.01,
        _llama(16),
    ),
)

#: informational rows, run with ``--extra``
EXTRA_ROWS: tuple[Row, ...] = (
    Row(
        "adamw-layers-floor",
        "memory traffic of the fused per-layer AMAdamW step, without its arithmetic / "
        "AdamW(fused=True).step, 25M params in 48 tensors (a floor of the adamw-layers row)",
        "two passes, no arithmetic",
        "AdamW(fused=True)",
        None,
        _traffic(48, True),
    ),
    Row(
        "adamw-global-floor",
        "memory traffic of the fused global-beta AMAdamW step, without its arithmetic / "
        "AdamW(fused=True).step, one 25M-parameter tensor (a floor of the adamw-global row)",
        "two passes, no arithmetic",
        "AdamW(fused=True)",
        None,
        _traffic(1, False),
    ),
    Row(
        "adamw-layers-amp",
        "AMAdamW.step / AdamW(fused=True).step with a GradScaler's scale (torch.amp), 25M "
        "params in 48 tensors, per-layer beta",
        "AMAdamW(fused=True)",
        "AdamW(fused=True)",
        None,
        _optimizers("am_adamw_fused_amp", "adamw_fused_amp", 48, True),
    ),
    Row(
        "adamw-foreach-vs-fused",
        "AMAdamW(foreach=True).step / AdamW(fused=True).step, 25M params, 48 tensors",
        "AMAdamW(foreach=True)",
        "AdamW(fused=True)",
        None,
        _optimizers("am_adamw_foreach", "adamw_fused", 48, True),
    ),
    Row(
        "adamw-foreach-torch",
        "AdamW(foreach=True).step / AdamW(fused=True).step, 25M params, 48 tensors",
        "AdamW(foreach=True)",
        "AdamW(fused=True)",
        None,
        _optimizers("adamw_foreach", "adamw_fused", 48, True),
    ),
    Row(
        "llama-foreach",
        "tiny LLaMA training iteration (batch 16 x 256), AM-AdamW / AdamW, both foreach=True",
        "AMAdamW(foreach=True)",
        "AdamW(foreach=True)",
        None,
        _llama(16, "foreach"),
    ),
    Row(
        "llama-default",
        "tiny LLaMA training iteration (batch 16 x 256), AM-AdamW / AdamW, default flags",
        "AMAdamW()",
        "AdamW()",
        None,
        _llama(16, "default"),
    ),
    Row(
        "llama-compiled",
        "tiny LLaMA training iteration (batch 16 x 256), AM-AdamW / AdamW, torch.compile(step)",
        "AMAdamW() compiled",
        "AdamW() compiled",
        None,
        _llama(16, "compiled"),
    ),
    Row(
        "llama-b8",
        "tiny LLaMA training iteration (batch 8 x 256), AM-AdamW / AdamW",
        "AMAdamW(fused=True)",
        "AdamW(fused=True)",
        None,
        _llama(8),
    ),
)
