"""``python -m amopt.bench``: the performance targets of amopt, measured side by side."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from amopt.bench import cases
from amopt.bench._timing import Paired, interleave, load_average, machine_info, memory_bandwidth

__all__ = ["Settings", "Measured", "Row", "Result", "ROWS", "run_rows", "format_report", "main"]


@dataclass(frozen=True)
class Settings:
    """How to measure: pairs per row, small sizes, torch threads."""

    repeat: int = 15
    quick: bool = False
    threads: int = 1


@dataclass
class Measured:
    """One row's numbers: medians of each side (in ``unit``) and their ratio."""

    a: float
    b: float
    ratio: float
    unit: str
    ratio_of_medians: float | None = None
    spread: tuple[float, float] | None = None
    note: str = ""

    @classmethod
    def from_paired(cls, p: Paired, *, scale: float, unit: str, note: str = "") -> Measured:
        """From interleaved samples in seconds; ``scale`` converts them to ``unit``."""
        return cls(
            a=p.median_a * scale,
            b=p.median_b * scale,
            ratio=p.median_ratio,
            unit=unit,
            ratio_of_medians=p.ratio_of_medians,
            spread=p.spread(),
            note=note,
        )


@dataclass(frozen=True)
class Row:
    """A line of the table: what is compared, its target, and how to measure it.

    ``target`` is the largest acceptable ratio (AM side / baseline), or
    ``None`` for an informational row.
    """

    key: str
    metric: str
    side_a: str
    side_b: str
    target: float | None
    measure: Callable[[Settings], Measured]


@dataclass
class Result:
    """A measured (or skipped) row; ``status`` is "met", "MISSED", "info" or "skipped"."""

    row: Row
    measured: Measured | None = None
    skipped: str | None = None
    seconds: float = 0.0
    status: str = field(init=False, default="")

    def __post_init__(self) -> None:
        if self.skipped is not None:
            self.status = "skipped"
        elif self.row.target is None:
            self.status = "info"
        else:
            assert self.measured is not None
            self.status = "met" if self.measured.ratio <= self.row.target else "MISSED"


# --------------------------------------------------------------------------- measurements

N_PARAMS = 25_000_000
#: MiB copied by the memory-bandwidth probe of the report's header, by ``Settings.quick``
_PROBE_MIB = {False: 256, True: 16}


def _sizes(s: Settings, n_params: int, n_tensors: int) -> tuple[int, int]:
    return (200_000, min(n_tensors, 8)) if s.quick else (n_params, n_tensors)


def _set_threads(s: Settings) -> None:
    import torch

    if s.threads > 0:
        torch.set_num_threads(s.threads)


def _paired_steps(
    make_a: Callable[[int, int], Any],
    kind_b: str,
    n_tensors: int,
    per_layer: bool,
    *,
    compiled: bool = False,
    note: str = "",
) -> Callable:
    """A row's measurement: ``make_a(n, t).run`` against ``OptimizerCase(kind_b)``,
    interleaved; ``compiled``: the note also counts the AM side's graphs and breaks."""

    def measure(s: Settings) -> Measured:
        _set_threads(s)
        n, t = _sizes(s, N_PARAMS, n_tensors)
        a = make_a(n, t)
        counts = _compile_counts(a) if compiled else ""
        b = cases.OptimizerCase(kind_b, n, t, per_layer=per_layer)
        p = interleave(a.run, b.run, repeat=s.repeat, warmup=3)
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
    return (
        f"; compiled step: {first} graph(s) at the first step, {graphs - first} "
        f"recompilation(s) in the next two, {own} graph break(s)"
    )


def _core_step(s: Settings) -> Measured:
    n = 100_000 if s.quick else 10_000_000
    a = cases.CoreStepCase("am-mgd", n)
    b = cases.CoreStepCase("mgd", n)
    p = interleave(a.run, b.run, repeat=s.repeat, warmup=2)
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
    p = interleave(a.run, b.run, repeat=s.repeat, warmup=1)
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
        _set_threads(s)
        size: dict = {"batch": batch}
        if s.quick:
            size = {"batch": 2, "seq_len": 32, "hidden": 64, "layers": 2, "vocab": 512}
        a = cases.LlamaCase("am-adamw", path=path, **size)
        b = cases.LlamaCase("adamw", path=path, **size)
        b.model.load_state_dict(a.model.state_dict())
        p = interleave(a.run, b.run, repeat=s.repeat, warmup=2)
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
        "AMAdamW.step / AdamW(fused=True).step, 25M params in 48 tensors, per-layer beta",
        "AMAdamW(fused=True)",
        "AdamW(fused=True)",
        1.6,
        _optimizers("am_adamw_fused", "adamw_fused", 48, True),
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

from amopt.bench import _dask  # noqa: E402  (its rows are built from Row and Measured above)

EXTRA_ROWS += _dask.ROWS

from amopt.bench import _gpu  # noqa: E402  (likewise)

EXTRA_ROWS += _gpu.gpu_rows()


# --------------------------------------------------------------------------- running, report

#: The variable :func:`amopt.bench.cases.a9a_path` reads the a9a file's path from.
A9A_ENV = "AMOPT_A9A"


def a9a_file(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<data>/libsvm/a9a``: ``data_dir``, else ``$AMOPT_DATA_DIR``, else ``~/.cache/amopt``.

    The same layout (and folder) as :mod:`amopt.datasets`' download cache.

    Examples
    --------
    >>> a9a_file("/data").as_posix()
    '/data/libsvm/a9a'
    """
    from amopt.datasets import get_data_home

    return get_data_home(data_dir) / "libsvm" / "a9a"


@contextlib.contextmanager
def _a9a_from(data_dir: str | os.PathLike[str] | None) -> Iterator[None]:
    """Point the a9a case at :func:`a9a_file` while measuring.

    ``--data-dir`` wins over ``$AMOPT_A9A``; without either, the data folder's copy
    is used. The previous environment is restored afterwards.
    """
    previous = os.environ.get(A9A_ENV)
    if data_dir is not None or not previous:
        os.environ[A9A_ENV] = str(a9a_file(data_dir))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(A9A_ENV, None)
        else:
            os.environ[A9A_ENV] = previous


def run_rows(
    rows: Sequence[Row], settings: Settings, *, progress: Callable[[str], None] | None = None
) -> list[Result]:
    """Measure ``rows`` one after the other; a row that cannot run here is skipped."""
    results = []
    for row in rows:
        if progress is not None:
            progress(f"measuring {row.key} ...")
        start = time.perf_counter()
        try:
            result = Result(row, measured=row.measure(settings))
        except cases.SkipCase as exc:
            result = Result(row, skipped=str(exc))
        except ImportError as exc:
            result = Result(row, skipped=f"missing package: {exc}")
        result.seconds = time.perf_counter() - start
        results.append(result)
    return results


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_report(
    results: Sequence[Result],
    info: dict[str, str],
    settings: Settings,
    loads: tuple[object, object],
    bandwidth: tuple[float | None, float | None] = (None, None),
) -> str:
    """The markdown report: machine, settings, load and memory bandwidth before and after,
    the table, notes.

    Parameters
    ----------
    results : sequence of Result
    info : dict
        From :func:`amopt.bench._timing.machine_info`.
    settings : Settings
    loads : (load before, load after)
        ``os.getloadavg()`` triples, or ``None`` where unavailable.
    bandwidth : (GB/s before, GB/s after)
        :func:`amopt.bench._timing.memory_bandwidth`, or ``None`` where unavailable.
    """
    lines = ["Machine: " + "; ".join(f"{k}: {v}" for k, v in info.items())]
    lines.append(
        f"Settings: {settings.repeat} interleaved pairs per row, torch threads "
        f"{settings.threads if settings.threads > 0 else 'default'}"
        + (", QUICK sizes (not the targets' sizes)" if settings.quick else "")
    )

    def fmt_load(load: object) -> str:
        return "n/a" if load is None else " ".join(f"{v:.2f}" for v in load)  # type: ignore[attr-defined]

    lines.append(
        f"Load average (1, 5, 15 min): before {fmt_load(loads[0])}, after {fmt_load(loads[1])}"
    )

    def fmt_bw(bw: float | None) -> str:
        return "n/a" if bw is None else f"{bw:.1f} GB/s"

    lines.append(
        f"Memory bandwidth (one torch copy, {_PROBE_MIB[settings.quick]} MiB, "
        f"{settings.threads if settings.threads > 0 else 'default'} thread(s)): before "
        f"{fmt_bw(bandwidth[0])}, after {fmt_bw(bandwidth[1])}"
    )
    lines.append("")
    lines.append("| metric | AM side | baseline | ratio | target | status |")
    lines.append("|---|---|---|---|---|---|")
    for r in results:
        target = "-" if r.row.target is None else f"<= {r.row.target:g}"
        if r.measured is None:
            lines.append(f"| {r.row.metric} | - | - | - | {target} | skipped: {r.skipped} |")
            continue
        m = r.measured
        spread = "" if m.spread is None else f" (IQR {m.spread[0]:.3f}-{m.spread[1]:.3f})"
        lines.append(
            f"| {r.row.metric} | {r.row.side_a}: {_fmt(m.a)} {m.unit} | "
            f"{r.row.side_b}: {_fmt(m.b)} {m.unit} | {m.ratio:.3f}{spread} | {target} | "
            f"{r.status} |"
        )
    notes = [
        f"- {r.row.key}: {r.measured.note}" for r in results if r.measured and r.measured.note
    ]
    if notes:
        lines += ["", "Notes:"] + notes
    lines += [
        "",
        "ratio = median over the pairs of (AM side / baseline), each pair measured back to "
        "back in alternating order; IQR = interquartile range of those ratios. Except: "
        "peakmem (one fresh process per side) and llama (forward+backward pooled over both "
        "sides plus each side's median step; the raw paired ratio is in its note).",
    ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m amopt.bench",
        description=(
            "Measure amopt's performance targets side by side (the AM side and its baseline "
            "interleaved in one run) and print a markdown table."
        ),
    )
    p.add_argument("--check", action="store_true", help="exit with status 1 if a target is missed")
    p.add_argument("--repeat", type=int, default=15, help="interleaved pairs per row (15)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads for the torch rows (1: per-core ratios, stable on a "
        "shared machine; 0: leave torch's default)",
    )
    p.add_argument(
        "--rows", nargs="*", default=None, help="only rows whose key contains one of these"
    )
    p.add_argument("--extra", action="store_true", help="also the informational rows")
    p.add_argument(
        "--quick", action="store_true", help="small sizes (a smoke test, not the targets)"
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="data folder holding libsvm/a9a for the minimize-a9a row (default: "
        f"$AMOPT_DATA_DIR, else ~/.cache/amopt; ${A9A_ENV}=FILE names the file directly)",
    )
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m amopt.bench``.

    Parameters
    ----------
    argv : sequence of str, optional
        Command-line arguments (default ``sys.argv[1:]``); ``--help`` lists them.

    Returns
    -------
    int
        0, or 1 with ``--check`` when a row misses its target (skipped rows do not
        count as missed).
    """
    args = _parser().parse_args(argv)
    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    rows = list(ROWS) + (list(EXTRA_ROWS) if args.extra else [])
    if args.rows:
        keys = {r.key for r in rows}
        # an exact key selects that row; otherwise a selector matches the keys containing it
        rows = [
            r
            for r in rows
            if any(sel == r.key or (sel not in keys and sel in r.key) for sel in args.rows)
        ]
    if args.list:
        for r in rows:
            target = "info" if r.target is None else f"<= {r.target:g}"
            print(f"{r.key:22s} {target:8s} {r.metric}")
        return 0
    settings = Settings(repeat=args.repeat, quick=args.quick, threads=args.threads)
    mib = _PROBE_MIB[settings.quick]
    before, bw_before = load_average(), memory_bandwidth(mib, threads=settings.threads)
    with _a9a_from(args.data_dir):
        results = run_rows(
            rows, settings, progress=lambda m: print(m, file=sys.stderr, flush=True)
        )
    after, bw_after = load_average(), memory_bandwidth(mib, threads=settings.threads)
    info = machine_info()
    print(format_report(results, info, settings, (before, after), (bw_before, bw_after)))
    if args.json:
        payload = {
            "machine": info,
            "settings": asdict(settings),
            "load_before": before,
            "load_after": after,
            "memory_bandwidth_gbs_before": bw_before,
            "memory_bandwidth_gbs_after": bw_after,
            "rows": [
                {
                    "key": r.row.key,
                    "metric": r.row.metric,
                    "target": r.row.target,
                    "status": r.status,
                    "skipped": r.skipped,
                    "seconds": r.seconds,
                    "measured": None if r.measured is None else asdict(r.measured),
                }
                for r in results
            ],
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
    missed = [r for r in results if r.status == "MISSED"]
    if args.check and missed:
        print(
            "\n--check: targets missed: " + ", ".join(r.row.key for r in missed), file=sys.stderr
        )
        return 1
    return 0
