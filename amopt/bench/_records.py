"""The records of ``python -m amopt.bench``: settings, a row, its measurement and result.

The bottom of the bench package: the row modules (``_rows``, ``_problem_set``, and the
harness's in ``benchmarks/``) build :class:`Row` objects from these, and ``_cli`` runs
and reports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from amopt.bench._timing import Paired

__all__ = ["Measured", "Result", "Row", "Settings", "STATUSES"]

#: what a :class:`Result` can say about its row
STATUSES = ("met", "MISSED", "info", "skipped", "error")


@dataclass(frozen=True)
class Settings:
    """How to measure: pairs per row, small sizes, torch threads, a time cap per row.

    ``row_seconds``: the rows that honour it stop taking pairs once their timed
    samples have run that long (at least three pairs are taken); ``None``: no cap.
    """

    repeat: int = 15
    quick: bool = False
    threads: int = 1
    row_seconds: float | None = None

    def apply_threads(self) -> None:
        """``torch.set_num_threads(threads)`` for a torch row (``threads`` 0: torch's default)."""
        if self.threads > 0:
            import torch

            torch.set_num_threads(self.threads)


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
    """A measured, skipped or failed row.

    ``status`` is "met", "MISSED", "info", "skipped" (the row cannot run here: no
    GPU, data set or package) or "error" (it raised: e.g. a feature it measures is
    not there yet; ``error`` says what).
    """

    row: Row
    measured: Measured | None = None
    skipped: str | None = None
    error: str | None = None
    seconds: float = 0.0
    status: str = field(init=False, default="")

    def __post_init__(self) -> None:
        if self.error is not None:
            self.status = "error"
        elif self.skipped is not None:
            self.status = "skipped"
        elif self.row.target is None:
            self.status = "info"
        else:
            assert self.measured is not None
            self.status = "met" if self.measured.ratio <= self.row.target else "MISSED"
