"""``python -m amopt.bench``: the performance targets of amopt, measured side by side.

The top of the bench package: it runs the rows that ``_rows`` (the optimizers and the
core against their baselines) and ``_problem_set`` build from the records of
``_records``, and reports them; nothing below imports it. The maintainers' harness in
the repository (``python -m benchmarks``: CPU stand-ins of the GPU targets, GPU and
dask rows) runs its own rows through :func:`main` too, with the same flags, table and
JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from amopt.bench import _problem_set, _rows, cases
from amopt.bench._records import Measured, Result, Row, Settings
from amopt.bench._rows import A9A_ENV
from amopt.bench._timing import cpu_family_model, load_average, machine_info, memory_bandwidth

__all__ = [
    "A9A_ENV",
    "EXTRA_ROWS",
    "Measured",
    "PROBLEM_SET_ROWS",
    "ROWS",
    "Result",
    "Row",
    "Settings",
    "Suite",
    "format_report",
    "main",
    "run_rows",
]

#: the rows run by default: the AM optimizers, minimize and the core against their baselines
ROWS: tuple[Row, ...] = _rows.ROWS
#: informational rows, run with ``--extra``
EXTRA_ROWS: tuple[Row, ...] = _rows.EXTRA_ROWS
#: the problem set (``--problem-set``): iterations to a gradient test of every method
#: on every problem, minimize's default against GD (see amopt.bench._problem_set)
PROBLEM_SET_ROWS: tuple[Row, ...] = _problem_set.ROWS
#: seconds of timed pairs per GPU row (``--gpu``), so that all of them take a few minutes
GPU_ROW_SECONDS = 3.0
#: MiB copied by the memory-bandwidth probe of the report's header, by ``Settings.quick``
_PROBE_MIB = {False: 256, True: 16}


#: where the GPU rows are: they measure the project's GPU targets, not a user's question
GPU_HOME = "python -m benchmarks --gpu, from a checkout of the repository"


@dataclass(frozen=True)
class Suite:
    """The rows one command runs, by flag: ``python -m amopt.bench``'s or the harness's.

    ``gpu_rows`` empty: ``--gpu`` says where the GPU rows are and exits.
    """

    prog: str
    rows: tuple[Row, ...]
    extra_rows: tuple[Row, ...] = ()
    gpu_rows: tuple[Row, ...] = ()
    problem_set_rows: tuple[Row, ...] = ()


def _own_suite() -> Suite:
    # read at each call, so that a test can replace this module's ROWS
    return Suite("python -m amopt.bench", ROWS, EXTRA_ROWS, (), PROBLEM_SET_ROWS)


# --------------------------------------------------------------------------- running, report


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
    rows: Sequence[Row],
    settings: Settings,
    *,
    progress: Callable[[str], None] | None = None,
    done: Callable[[list[Result]], None] | None = None,
) -> list[Result]:
    """Measure ``rows`` one after the other.

    A row that cannot run here (:class:`~amopt.bench.cases.SkipCase`, a missing
    package) is skipped; a row that raises anything else is reported as an error (the
    exception's type and message) and the next row runs. ``done`` is called with the
    results so far after each row.
    """
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
        except Exception as exc:  # noqa: BLE001 - one failing row must not stop the others
            where = traceback.extract_tb(exc.__traceback__)[-1]
            message = " ".join(str(exc).split())
            if len(message) > 600:  # a compiler's command line first, its error last
                message = f"{message[:200]} ... {message[-400:]}"
            result = Result(
                row,
                error=f"{type(exc).__name__}: {message} "
                f"({Path(where.filename).name}:{where.lineno})",
            )
        result.seconds = time.perf_counter() - start
        results.append(result)
        if done is not None:
            done(results)
    return results


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if 0 < abs(value) < 0.01:  # e.g. the problem set's suboptimalities
        return f"{value:.2e}"
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
            why = f"error: {r.error}" if r.error is not None else f"skipped: {r.skipped}"
            lines.append(f"| {r.row.metric} | - | - | - | {target} | {why} |")
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
        "peakmem (one fresh process per side), llama and gpu-gpt2-train (forward+backward "
        "pooled over both sides plus each side's median step; the raw paired ratio is in "
        "its note), and the rows whose baseline is a budget or a count (their metric says "
        "how the ratio is formed).",
    ]
    return "\n".join(lines)


def _parser(suite: Suite) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=suite.prog,
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
        "--gpu",
        action="store_true",
        help="the GPU rows (alone, unless --rows, --extra or --all add others; each row "
        f"times at most about {GPU_ROW_SECONDS:g} s of pairs; 'no GPU' where there is none)"
        if suite.gpu_rows
        else f"not here: the GPU rows are the maintainers' harness ({GPU_HOME})",
    )
    p.add_argument(
        "--problem-set",
        action="store_true",
        help="the problem set alone (with --rows, --extra, --gpu or --all: beside those; "
        "not part of --all, its logistic rows take minutes): "
        "quadratics, least squares, logistic regression, Rosenbrock, a non-convex case; "
        "iterations and time to max|g| <= 1e-6 max|g(x0)| of GD, damped MGD, heavy ball, "
        "Nesterov, AM-MGD (exact, linear), minimize's default, scipy L-BFGS-B and CG, "
        "and the full table after the report",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="every row: default, extra" + (" and GPU" if suite.gpu_rows else ""),
    )
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
    p.add_argument(
        "--row-seconds",
        type=float,
        default=None,
        metavar="S",
        help="cap each row's timed pairs at about S seconds (at least 3 pairs); "
        f"default: none, {GPU_ROW_SECONDS:g} with --gpu",
    )
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    return p


def _write_json(
    path: str, info: dict[str, str], settings: Settings, measures: dict, results: list[Result]
) -> None:
    payload = {
        "machine": info,
        "date": measures.get("date"),
        "command": measures.get("command"),
        "settings": asdict(settings),
        "load_before": measures.get("load_before"),
        "load_after": measures.get("load_after"),
        "memory_bandwidth_gbs_before": measures.get("memory_bandwidth_gbs_before"),
        "memory_bandwidth_gbs_after": measures.get("memory_bandwidth_gbs_after"),
        "complete": "load_after" in measures,
        "rows": [
            {
                "key": r.row.key,
                "metric": r.row.metric,
                "side_a": r.row.side_a,
                "side_b": r.row.side_b,
                "target": r.row.target,
                "status": r.status,
                "skipped": r.skipped,
                "error": r.error,
                "seconds": r.seconds,
                "measured": None if r.measured is None else asdict(r.measured),
            }
            for r in results
        ],
    }
    if any(r.row in PROBLEM_SET_ROWS for r in results):
        payload["problem_set"] = _problem_set_outcomes()
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2)
    os.replace(tmp, path)


def _problem_set_outcomes() -> dict:
    """Every method's outcome on every measured problem of the set: the table of
    ``--problem-set`` as numbers (``nit`` None: the test not reached in ``maxiter``)."""
    problems = []
    for case in _problem_set.PROBLEMS:
        got = _problem_set._CACHE.get(case.key)
        if got is not None:
            problems.append(
                {
                    "key": case.key,
                    "label": case.label,
                    "convex": case.convex,
                    "f_best": _problem_set._best(got),
                    "methods": {m: asdict(o) for m, o in got.items()},
                }
            )
    return {
        "rtol": _problem_set.RTOL,
        "maxiter": _problem_set.MAXITER,
        "methods": list(_problem_set.METHODS),
        "problems": problems,
    }


def _select(args: argparse.Namespace, suite: Suite) -> list[Row]:
    """The rows the flags ask for, in table order."""
    gpu_rows, problem_set = suite.gpu_rows, suite.problem_set_rows
    if args.all:
        rows = [
            *suite.rows,
            *suite.extra_rows,
            *gpu_rows,
            *(problem_set if args.problem_set else ()),
        ]
    elif (args.gpu or args.problem_set) and not args.rows and not args.extra:
        # alone, or the two together
        rows = [*(gpu_rows if args.gpu else ()), *(problem_set if args.problem_set else ())]
    else:
        rows = [
            *suite.rows,
            *(suite.extra_rows if args.extra else ()),
            *(gpu_rows if args.gpu else ()),
        ]
        rows += [r for r in problem_set if args.problem_set]
        if args.rows:  # --rows reaches a GPU row by its key, or with a selector naming "gpu"
            rows += [
                r
                for r in gpu_rows
                if r not in rows and any(sel == r.key or "gpu" in sel for sel in args.rows)
            ]
    if args.rows:
        keys = {r.key for r in rows}
        # an exact key selects that row; otherwise a selector matches the keys containing it
        rows = [
            r
            for r in rows
            if any(sel == r.key or (sel not in keys and sel in r.key) for sel in args.rows)
        ]
    return rows


def main(argv: Sequence[str] | None = None, suite: Suite | None = None) -> int:
    """Entry point of ``python -m amopt.bench``.

    Parameters
    ----------
    argv : sequence of str, optional
        Command-line arguments (default ``sys.argv[1:]``); ``--help`` lists them.
    suite : Suite, optional
        The rows to run (default: this module's ``ROWS``, ``EXTRA_ROWS`` and
        ``PROBLEM_SET_ROWS``; the harness in ``benchmarks/`` passes its own).

    Returns
    -------
    int
        0, or 1 with ``--check`` when a row misses its target or fails with an error
        (skipped rows do not count as missed).
    """
    suite = _own_suite() if suite is None else suite
    args = _parser(suite).parse_args(argv)
    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    if args.gpu and not suite.gpu_rows:
        raise SystemExit(f"{suite.prog} has no GPU rows: they are in {GPU_HOME}")
    rows = _select(args, suite)
    if args.list:
        for r in rows:
            target = "info" if r.target is None else f"<= {r.target:g}"
            print(f"{r.key:22s} {target:8s} {r.metric}")
        return 0
    row_seconds = args.row_seconds
    if row_seconds is None and args.gpu:
        row_seconds = GPU_ROW_SECONDS
    settings = Settings(
        repeat=args.repeat, quick=args.quick, threads=args.threads, row_seconds=row_seconds
    )
    mib = _PROBE_MIB[settings.quick]
    before, bw_before = load_average(), memory_bandwidth(mib, threads=settings.threads)
    info = {**machine_info(), **cpu_family_model()}
    measures = {
        "load_before": before,
        "memory_bandwidth_gbs_before": bw_before,
        # when and how the run was made, for a table shown without its report
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python -m amopt.bench", *(sys.argv[1:] if argv is None else argv)]),
    }

    def write_json(results: list[Result]) -> None:
        # after every row, so that a run cut short by a time limit keeps what it measured
        if args.json:
            _write_json(args.json, info, settings, measures, results)

    def report_row(results: list[Result]) -> None:
        r = results[-1]
        ratio = "-" if r.measured is None else f"{r.measured.ratio:.3f}"
        why = r.error or r.skipped or ""
        print(f"  {r.row.key}: {r.status} {ratio} ({r.seconds:.1f} s) {why}"[:300],
              file=sys.stderr, flush=True)  # fmt: skip
        write_json(results)

    with _a9a_from(args.data_dir):
        results = run_rows(
            rows,
            settings,
            progress=lambda m: print(m, file=sys.stderr, flush=True),
            done=report_row,
        )
    after, bw_after = load_average(), memory_bandwidth(mib, threads=settings.threads)
    measures.update(load_after=after, memory_bandwidth_gbs_after=bw_after)
    print(format_report(results, info, settings, (before, after), (bw_before, bw_after)))
    if any(r.row in suite.problem_set_rows for r in results):
        print("\nProblem set: iterations to max|g| <= 1e-6 max|g(x0)| (wall time of the run)\n")
        print(_problem_set.format_table())
    write_json(results)
    missed = [r for r in results if r.status in ("MISSED", "error")]
    if args.check and missed:
        print(
            "\n--check: targets missed: " + ", ".join(r.row.key for r in missed), file=sys.stderr
        )
        return 1
    return 0
