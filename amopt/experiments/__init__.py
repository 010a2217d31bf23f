"""The paper's experiments at a scale a small CPU machine can run: ``python -m amopt.experiments``.

Each experiment is a function ``run(ctx) -> dict`` of its module; the command
line (:mod:`amopt.experiments.__main__`) writes, under ``<out>/<name>/``:

``results.json``
    Every number (configuration, environment, per-run metrics, curves at up to
    a few hundred log-spaced points; ``--full-curves`` for every step).
``summary.md``
    The tables.
``*.png``
    The plots.

``all`` runs every experiment, then writes ``<out>/SUMMARY.md`` (every table,
the paper's claims next to what was measured). ``report`` rebuilds that file
from the ``results.json`` files already in ``<out>``.

Data: one folder, ``--data-dir DIR`` (else ``$AMOPT_DATA_DIR``, else the user
cache directory, ``~/.cache/amopt`` on Linux), only read apart from downloads;
laid out as ``libsvm/<LIBSVM file>``, ``fashion-mnist/<the four IDX files>``
and ``text/tinyshakespeare/input.txt`` (see :mod:`amopt.experiments._data`).
``--quick`` needs none of it: ``logreg`` then uses the LIBSVM sets bundled with
amopt; ``vision`` needs Fashion-MNIST in the folder (or the Debian package
``dataset-fashion-mnist``); ``llm`` downloads tiny-shakespeare into the folder
unless ``--no-download``. The reference solutions ``f*`` of ``logreg`` are
cached in the user cache directory (``$AMOPT_CACHE_DIR``, else the platform's),
never in the data folder; a solve that takes longer than 2 s says so in the log
(``docs/caching.md``). An ``--out`` folder that cannot be written is refused
before anything runs.

Needs the ``experiments`` extra (matplotlib, tqdm, scikit-learn; torch and
transformers for ``vision`` / ``llm``).
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import RunContext, environment, write_json

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "RunContext",
    "render_summary",
    "run_experiment",
    "write_report",
]


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment of the command line.

    Attributes
    ----------
    name : str
        Command-line name.
    module : str
        Module (relative to this package) holding the functions.
    run : str
        ``run(ctx) -> dict``.
    summary : str
        ``summary(result) -> str`` (Markdown).
    help : str
        One line for ``--help``.
    """

    name: str
    module: str
    run: str
    summary: str
    help: str

    def functions(self) -> tuple[Callable[[RunContext], dict], Callable[[dict], str]]:
        """The run and summary functions (imports the module)."""
        mod = importlib.import_module(f"{__name__}.{self.module}")
        return getattr(mod, self.run), getattr(mod, self.summary)


#: Every experiment, in the order ``all`` runs them.
EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "quadratic",
            "quadratic",
            "run",
            "summary_markdown",
            "Fig. 1: ill-conditioned quadratics, fixed-beta heavy ball (grid) vs AM-MGD "
            "(exact and linearised numerator)",
        ),
        Experiment(
            "logreg",
            "logreg",
            "run",
            "summary_markdown",
            "Fig. 3: LIBSVM logistic regression, lr = 1/L, 10k iterations: GD, MGD(0.9), "
            "MGD(beta*), AM-MGD; scipy L-BFGS-B and CG to the same suboptimality",
        ),
        Experiment(
            "logreg-adam",
            "logreg",
            "run_adam",
            "summary_markdown_adam",
            "Supplement: LIBSVM logistic regression, Adam vs AM-Adam, lr = 1e-3, 1000 iterations",
        ),
        Experiment(
            "theory",
            "theory",
            "run",
            "summary_markdown",
            "Theorems 3.1 / 3.2 / fixed cap: measured vs bound for T up to 10^4",
        ),
        Experiment(
            "vision",
            "vision",
            "run",
            "summary_markdown",
            "small CNN on Fashion-MNIST: MGD (SGD dampening 0.9) vs AMSGD, beta_t traces; "
            "ablations over lam, batch size, lr",
        ),
        Experiment(
            "llm",
            "llm",
            "run",
            "summary_markdown",
            "tiny LLaMA (transformers, byte vocab) on tiny-shakespeare: AdamW vs AM-AdamW, "
            "warm-up, beta_max, clip/restart, two sizes, per-step overhead",
        ),
    )
}


def run_experiment(name: str, ctx: RunContext) -> dict[str, Any]:
    """Run one experiment and write its ``results.json`` and ``summary.md`` under ``ctx.out``.

    Parameters
    ----------
    name : str
        A key of :data:`EXPERIMENTS`.
    ctx : RunContext
        Its ``out`` is the experiment's own folder.

    Returns
    -------
    dict
        The result, with ``environment``, ``quick``, ``seed``, ``torch_threads`` and
        ``wall_time_s`` added.
    """
    exp = EXPERIMENTS[name]
    run, summary = exp.functions()
    ctx.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result = run(ctx)
    result.setdefault("wall_time_s", time.perf_counter() - t0)
    result.update(
        {
            "experiment": name,
            "quick": ctx.quick,
            "seed": ctx.seed,
            "torch_threads": ctx.threads,
            "environment": environment(),
        }
    )
    write_json(ctx.out / "results.json", result)
    (ctx.out / "summary.md").write_text(render_summary(name, result), encoding="utf-8")
    return result


def render_summary(name: str, result: dict[str, Any]) -> str:
    """The Markdown tables of one experiment (``summary.md``) from its result.

    Works on the in-memory result and on the one read back from ``results.json``.
    """
    _, summary = EXPERIMENTS[name].functions()
    text = summary(result)
    mode = "quick" if result.get("quick") else "real"
    return text + f"\nWall time: {result['wall_time_s']:.0f} s ({mode} run).\n"


def write_report(out: Path) -> Path:
    """Write ``<out>/SUMMARY.md`` from every ``<out>/<name>/results.json`` present.

    Each ``<out>/<name>/summary.md`` is first rendered again from its
    ``results.json`` (so table changes need no re-run). Returns the path written.
    """
    from .report import build_report, load_results

    for name, result in load_results(Path(out)).items():
        text = render_summary(name, result)
        (Path(out) / name / "summary.md").write_text(text, encoding="utf-8")
    path = Path(out) / "SUMMARY.md"
    path.write_text(build_report(Path(out)), encoding="utf-8")
    return path
