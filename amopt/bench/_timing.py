"""Side-by-side timing: two workloads interleaved, medians and paired ratios."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Paired", "interleave", "machine_info", "load_average"]


@dataclass
class Paired:
    """Samples of two workloads measured alternately (``a[k]`` and ``b[k]`` back to back).

    Attributes
    ----------
    a, b : list of float
        Seconds (or any unit) per run of each side.
    """

    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)

    @property
    def median_a(self) -> float:
        return statistics.median(self.a)

    @property
    def median_b(self) -> float:
        return statistics.median(self.b)

    @property
    def ratio_of_medians(self) -> float:
        return self.median_a / self.median_b

    @property
    def median_ratio(self) -> float:
        """Median over the pairs of ``a[k] / b[k]``: robust to load that drifts between pairs."""
        return statistics.median(x / y for x, y in zip(self.a, self.b, strict=True))

    def spread(self) -> tuple[float, float]:
        """The 25th and 75th percentiles of the paired ratios."""
        ratios = sorted(x / y for x, y in zip(self.a, self.b, strict=True))
        if len(ratios) < 4:
            return ratios[0], ratios[-1]
        q = statistics.quantiles(ratios, n=4)
        return q[0], q[2]


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleave(
    run_a: Callable[[], object],
    run_b: Callable[[], object],
    *,
    repeat: int,
    warmup: int = 2,
    inner: int = 1,
) -> Paired:
    """Time ``run_a`` and ``run_b`` alternately, ``repeat`` pairs after ``warmup`` of each.

    The order within a pair alternates (A B, B A, A B, ...) so that neither side
    always runs right after the other's cache footprint. Each sample is the
    mean over ``inner`` consecutive calls.

    Returns
    -------
    Paired
        Seconds per call of each side.
    """
    for _ in range(warmup):
        run_a()
        run_b()

    def sample(fn: Callable[[], object]) -> float:
        return sum(_timed(fn) for _ in range(inner)) / inner

    out = Paired()
    for k in range(repeat):
        if k % 2 == 0:
            ta = sample(run_a)
            tb = sample(run_b)
        else:
            tb = sample(run_b)
            ta = sample(run_a)
        out.a.append(ta)
        out.b.append(tb)
    return out


def load_average() -> tuple[float, float, float] | None:
    """``os.getloadavg()`` where available."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def machine_info() -> dict[str, str]:
    """CPU model, core count, memory, library versions: the context of a measurement."""
    info: dict[str, str] = {"platform": platform.platform(), "python": platform.python_version()}
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cpu"] = cpu
    info["logical cores"] = str(os.cpu_count())
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            total = int(fh.readline().split()[1])
        info["memory"] = f"{total / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    import numpy
    import scipy

    info["numpy"] = numpy.__version__
    info["scipy"] = scipy.__version__
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch threads"] = str(torch.get_num_threads())
        from amopt.torch._fused import fused_status

        status = fused_status()
        if status["available"]:
            info["fused kernels"] = (
                "compiled, OpenMP" if status["openmp"] else "compiled, no OpenMP"
            )
        else:
            info["fused kernels"] = f"unavailable: {status['error']}"
    except ImportError:
        info["torch"] = "not installed"
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = "not installed"
    return info
