"""Side-by-side timing: workloads interleaved in rounds, medians and paired ratios.

The one timing harness of amopt: ``python -m amopt.bench`` and the experiments
(``amopt.experiments.llm``) both measure with it, and both describe the machine
with :func:`machine_info` / :func:`cpu_model`.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = [
    "Paired",
    "PhaseClock",
    "cpu_model",
    "interleave",
    "interleave_counted",
    "load_average",
    "cpu_family_model",
    "machine_info",
    "memory_bandwidth",
    "timed_rounds",
]

K = TypeVar("K", bound=Hashable)

#: Phase name of a workload that the harness times itself (one that returns no phases).
TOTAL = "total"


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


class PhaseClock:
    """Wall-clock seconds between the phases of one call, measured after a device sync.

    A workload that times parts of itself (forward+backward, then the optimizer
    step) calls :meth:`start`, then :meth:`lap` after each phase; with a GPU,
    ``sync`` (e.g. ``torch.cuda.synchronize``) makes each mark wait for the
    queued kernels.

    Parameters
    ----------
    sync : callable, optional
        Called before every mark.

    Examples
    --------
    >>> clock = PhaseClock()
    >>> clock.start()
    >>> first = clock.lap()
    >>> second = clock.lap()
    >>> first >= 0 and second >= 0 and clock.total == first + second
    True
    """

    def __init__(self, sync: Callable[[], object] | None = None) -> None:
        self._sync = sync
        self._start = self._last = time.perf_counter()

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def start(self) -> None:
        """Begin a call: the next :meth:`lap` measures from here."""
        self._start = self._last = self._now()

    def lap(self) -> float:
        """Seconds since the previous mark (or :meth:`start`)."""
        now = self._now()
        elapsed, self._last = now - self._last, now
        return elapsed

    @property
    def total(self) -> float:
        """Seconds from :meth:`start` to the latest :meth:`lap`."""
        return self._last - self._start


def timed_rounds(
    workloads: Mapping[K, Callable[[], object]],
    *,
    rounds: int,
    inner: int = 1,
    warmup: int = 0,
    reduce: Callable[[list[float]], float] = statistics.fmean,
    alternate: bool = True,
    progress: Callable[[range], Iterable[int]] | None = None,
    max_seconds: float | None = None,
    min_rounds: int = 3,
) -> dict[K, dict[str, list[float]]]:
    """Time several workloads in rounds, each round running every workload ``inner`` times.

    Within a round the workloads run one after the other, in the mapping's order
    on even rounds and in reverse order on odd rounds (with ``alternate``), so
    that no workload always runs right after the same other one. Load that
    drifts during the measurement then affects every workload alike.

    Parameters
    ----------
    workloads : mapping of key -> callable
        A call either returns nothing, and the harness times it (phase
        ``"total"``), or returns a mapping ``{phase: seconds}`` it measured
        itself (e.g. with a :class:`PhaseClock`).
    rounds : int
        Number of rounds (samples per workload and phase).
    inner : int, default 1
        Calls per workload and round; their times are combined by ``reduce``.
    warmup : int, default 0
        Untimed calls of each workload (interleaved the same way) before the rounds.
    reduce : callable, default statistics.fmean
        Combines the ``inner`` times of one round into its sample.
    alternate : bool, default True
        Reverse the order on odd rounds.
    progress : callable, optional
        Wraps ``range(rounds)`` (e.g. a progress bar).
    max_seconds : float, optional
        Stop after the round during which the timed rounds (warm-up excluded) have
        run this long, once ``min_rounds`` rounds are done: a time cap for workloads
        measured on a machine lent for minutes.
    min_rounds : int, default 3
        Rounds taken whatever ``max_seconds`` says (at most ``rounds``).

    Returns
    -------
    dict
        ``{key: {phase: [one sample per round]}}``.

    Examples
    --------
    >>> out = timed_rounds({"a": lambda: None, "b": lambda: {"x": 2.0}}, rounds=3, inner=2)
    >>> len(out["a"]["total"]), out["b"]
    (3, {'x': [2.0, 2.0, 2.0]})
    """
    if rounds < 1 or inner < 1 or warmup < 0:
        raise ValueError(
            f"need rounds >= 1, inner >= 1 and warmup >= 0, got {rounds}, {inner}, {warmup}"
        )
    keys = list(workloads)
    for _ in range(warmup):
        for key in keys:
            workloads[key]()

    def call(fn: Callable[[], object]) -> Mapping[str, float]:
        start = time.perf_counter()
        phases = fn()
        elapsed = time.perf_counter() - start
        return phases if isinstance(phases, Mapping) else {TOTAL: elapsed}

    out: dict[K, dict[str, list[float]]] = {key: {} for key in keys}
    rng = range(rounds) if progress is None else progress(range(rounds))
    began = time.perf_counter()
    for k in rng:
        if (
            max_seconds is not None
            and k >= min_rounds
            and time.perf_counter() - began >= max_seconds
        ):
            break
        order = keys[::-1] if alternate and k % 2 else keys
        for key in order:
            calls = [call(workloads[key]) for _ in range(inner)]
            for phase in calls[0]:
                sample = reduce([float(c[phase]) for c in calls])
                out[key].setdefault(phase, []).append(sample)
    return out


def interleave(
    run_a: Callable[[], object],
    run_b: Callable[[], object],
    *,
    repeat: int,
    warmup: int = 2,
    inner: int = 1,
    max_seconds: float | None = None,
) -> Paired:
    """Time ``run_a`` and ``run_b`` alternately, ``repeat`` pairs after ``warmup`` of each.

    The order within a pair alternates (A B, B A, A B, ...) so that neither side
    always runs right after the other's cache footprint. Each sample is the
    mean over ``inner`` consecutive calls. Built on :func:`timed_rounds`;
    ``max_seconds`` caps the timed pairs' total time (at least three pairs).

    Returns
    -------
    Paired
        Seconds per call of each side.
    """

    def timed(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            fn()

        return run

    out = timed_rounds(
        {"a": timed(run_a), "b": timed(run_b)},
        rounds=repeat,
        inner=inner,
        warmup=warmup,
        max_seconds=max_seconds,
    )
    return Paired(a=out["a"][TOTAL], b=out["b"][TOTAL])


def interleave_counted(
    run_a: Callable[[], float],
    run_b: Callable[[], float],
    *,
    repeat: int,
    warmup: int = 2,
    max_seconds: float | None = None,
    min_rounds: int = 3,
) -> Paired:
    """:func:`interleave` for workloads that time themselves: each call returns the
    seconds it wants counted (a run with set-up or a closing pass to leave out).

    The order within a pair alternates; at least ``min_rounds`` pairs, ``repeat`` at
    most, within ``max_seconds`` of timed pairs.
    """
    for _ in range(warmup):
        run_a()
        run_b()
    out = Paired()
    started = time.perf_counter()
    for r in range(repeat):
        if r % 2 == 0:
            a = run_a()
            b = run_b()
        else:
            b = run_b()
            a = run_a()
        out.a.append(a)
        out.b.append(b)
        over = max_seconds is not None and time.perf_counter() - started > max_seconds
        if over and r + 1 >= min_rounds:
            break
    return out


def memory_bandwidth(mib: int = 256, repeat: int = 5, threads: int = 1) -> float | None:
    """GB/s of copying one float32 tensor of ``mib`` MiB into another with torch.

    Read and written bytes both count; the median of ``repeat`` copies after one warm-up,
    on ``threads`` torch threads (0: torch's default). The optimizer steps of the bench
    stream from memory, so a host whose memory bandwidth is shared with other work shows
    it here, before and after the rows. ``None`` without torch.

    Examples
    --------
    >>> bw = memory_bandwidth(mib=4, repeat=3)
    >>> bw is None or bw > 0
    True
    """
    try:
        import torch
    except ImportError:
        return None
    old = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        src = torch.ones(mib << 18)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(old)
    return 2 * src.numel() * src.element_size() / statistics.median(times) / 1e9


def load_average() -> tuple[float, float, float] | None:
    """``os.getloadavg()`` where available."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else the processor or architecture.

    Examples
    --------
    >>> isinstance(cpu_model(), str) and cpu_model() != ""
    True
    """
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown"


def _cpuinfo() -> dict[str, str]:
    """The fields of the first processor of ``/proc/cpuinfo`` (empty where there is none):
    every processor of a machine reports the same model and flags."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    if fields:  # the end of the first processor's block
                        break
                    continue
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_family_model() -> dict[str, str]:
    """``{"cpu family/model": "25/17"}`` from ``/proc/cpuinfo``; empty elsewhere.

    A model name such as "AMD EPYC" covers several generations (family 25 model 17 is
    Zen 4, family 26 Zen 5).
    """
    info = _cpuinfo()
    if "cpu family" not in info or "model" not in info:
        return {}
    return {"cpu family/model": f"{info['cpu family']}/{info['model']}"}


def vector_isa() -> str:
    """The widest x86 vector extension the CPU reports (``/proc/cpuinfo`` flags), and what
    NumPy and torch dispatch to (they can be limited, e.g. by ``ATEN_CPU_CAPABILITY``)."""
    flags = set(_cpuinfo().get("flags", "").split())
    if "avx512f" in flags:
        isa = "AVX-512"
    elif "avx2" in flags:
        isa = "AVX2"
    elif flags:
        isa = "SSE"
    else:
        isa = platform.machine()
    try:
        import torch

        isa += f" (torch dispatch: {torch.backends.cpu.get_cpu_capability()})"
    except (ImportError, AttributeError):
        pass
    return isa


def machine_info() -> dict[str, str]:
    """CPU model, core count, memory, library versions: the context of a measurement."""
    import amopt

    info: dict[str, str] = {
        "amopt": amopt.__version__,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "vector ISA": vector_isa(),
        "logical cores": str(os.cpu_count()),
    }
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
        info["gpu"] = (
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (no GPU)"
        )
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
