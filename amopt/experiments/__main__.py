"""``python -m amopt.experiments NAME [--quick] [--out DIR] [--data-dir DIR] [--seed N] ...``"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from . import EXPERIMENTS, RunContext, run_experiment, write_report


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (its ``--help`` lists every experiment)."""
    lines = [f"  {name:12s} {exp.help}" for name, exp in EXPERIMENTS.items()]
    lines.append(f"  {'all':12s} every experiment above, then the combined report SUMMARY.md")
    lines.append(f"  {'report':12s} rebuild SUMMARY.md from the results.json files in --out")
    parser = argparse.ArgumentParser(
        prog="python -m amopt.experiments",
        description="Reproduce the experiments of the Adaptive Memory momentum paper at "
        "small scale. Writes results.json, summary.md and PNG plots to OUT/NAME/.",
        epilog="experiments:\n" + "\n".join(lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "name",
        choices=[*EXPERIMENTS, "all", "report"],
        metavar="NAME",
        help="experiment to run (see the list below)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke-test scale (about a minute at most); default: the real run",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("experiment-results"),
        help="output folder (default: ./experiment-results)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base random seed (default 0)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="data folder, only read apart from downloads (default: $AMOPT_DATA_DIR, else the "
        "user cache directory: $AMOPT_CACHE_DIR, else ~/.cache/amopt on Linux) with the layout "
        "libsvm/<LIBSVM file>, fashion-mnist/<the four *-ubyte.gz IDX files>, "
        "text/tinyshakespeare/input.txt; LIBSVM and tiny-shakespeare downloads go there too",
    )
    parser.add_argument(
        "--no-download",
        dest="download",
        action="store_false",
        help="never download: use only the data folder and the data sets bundled with amopt",
    )
    parser.add_argument(
        "--datasets",
        default=None,
        help="logreg / logreg-adam: comma-separated LIBSVM sets (names a9a, w8a, mushrooms, "
        "phishing, ijcnn1, madelon, bundled a1a, or file paths)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads for vision / llm (default 1; at most 2 on a shared machine)",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="torch device for vision / llm: auto (cuda if available), cpu, cuda",
    )
    parser.add_argument(
        "--full-curves",
        action="store_true",
        help="store every step of every curve in results.json (default: a log-spaced subsample)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars, no log lines")
    return parser


def _unusable_folder(out: Path, folders: list[Path]) -> str | None:
    """Why results cannot be written under ``out`` (``--out``), or None.

    Each folder of ``folders`` (``out`` and ``out/<name>``) is created if missing
    and must take a file: the check writes (and deletes) a temporary file there, so
    a read-only file system, missing permissions or a file in the way are found
    before any experiment runs, not after its minutes of work.
    """
    for folder in folders:
        for parent in (folder, *folder.parents):
            if parent.exists() or parent.is_symlink():
                if parent == folder and not parent.is_dir():
                    return f"{folder} is a file, not a folder"
                if not parent.is_dir():
                    return f"{parent} is a file, so the folder {folder} cannot be created"
                break
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            at = exc.filename and Path(os.fsdecode(exc.filename))
            if at and at != folder and at.parent != folder:  # mkdir failed at a parent
                reason += f" at {at}"
            return f"cannot write to {folder} ({reason})"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads < 1:
        print("--threads must be at least 1", file=sys.stderr)
        return 2
    names = list(EXPERIMENTS) if args.name == "all" else [args.name]
    if args.name == "report":
        names = []
    # report only reads and rewrites files already there (a missing folder is its own error)
    folders = [args.out, *(args.out / name for name in names)]
    if args.name != "report" or args.out.exists():
        problem = _unusable_folder(args.out, folders)
        if problem is not None:
            parser.error(
                f"argument --out: {problem}; nothing was run. Choose a folder that can be "
                "written with --out DIR"
            )
    failed: list[str] = []
    datasets = None
    if args.datasets:
        datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    for name in names:
        ctx = RunContext(
            out=args.out / name,
            quick=args.quick,
            seed=args.seed,
            data_dir=args.data_dir,
            download=args.download,
            quiet=args.quiet,
            threads=args.threads,
            device=args.device,
            datasets=datasets,
            full_curves=args.full_curves,
        )
        t0 = time.perf_counter()
        try:
            result = run_experiment(name, ctx)
        except FileNotFoundError as exc:
            print(f"{name}: missing data.\n{exc}", file=sys.stderr)
            failed.append(name)
            continue
        if not args.quiet:
            print(
                f"{name}: done in {time.perf_counter() - t0:.0f} s; wrote {ctx.out}/results.json, "
                f"summary.md, {', '.join(result.get('plots', []))}",
                file=sys.stderr,
            )
    if args.name in ("all", "report"):
        try:
            path = write_report(args.out)
        except FileNotFoundError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        if not args.quiet:
            print(f"wrote {path}", file=sys.stderr)
    if failed:
        print(f"not run (missing data): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
