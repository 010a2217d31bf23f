"""``python -m benchmarks``: the rows of ``python -m amopt.bench`` and the harness's.

The row sets by flag; the runner, table, JSON and flags are
:func:`amopt.bench._cli.main`'s.

Examples
--------
>>> from amopt.bench import ROWS as USER_ROWS
>>> ROWS[: len(USER_ROWS)] == USER_ROWS  # the user's table first, then the stand-ins
True
"""

from __future__ import annotations

from collections.abc import Sequence

from amopt.bench import _cli
from amopt.bench._cli import GPU_ROW_SECONDS, PROBLEM_SET_ROWS, Suite, run_rows
from amopt.bench._records import Measured, Result, Row, Settings
from benchmarks import dask_rows, gpu, standins

__all__ = [
    "EXTRA_ROWS",
    "GPU_ROWS",
    "GPU_ROW_SECONDS",
    "Measured",
    "PROBLEM_SET_ROWS",
    "ROWS",
    "Result",
    "Row",
    "Settings",
    "main",
    "run_rows",
]

#: the rows run by default: ``python -m amopt.bench``'s, and the CPU stand-ins of the GPU
#: targets
ROWS: tuple[Row, ...] = _cli.ROWS + standins.ROWS
#: informational rows, run with ``--extra``
EXTRA_ROWS: tuple[Row, ...] = (
    _cli.EXTRA_ROWS + standins.EXTRA_ROWS + dask_rows.ROWS + gpu.gpu_rows()
)
#: the GPU targets, run with ``--gpu`` ("no GPU" where there is none)
GPU_ROWS: tuple[Row, ...] = gpu.ROWS


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks``: :func:`amopt.bench._cli.main` over
    this module's rows (read at each call, so that a test can replace them)."""
    suite = Suite("python -m benchmarks", ROWS, EXTRA_ROWS, GPU_ROWS, PROBLEM_SET_ROWS)
    return _cli.main(argv, suite)
