"""Shared machinery of the experiments: run context, progress bars, JSON, tables, claims.

The plot helpers are in :mod:`amopt.experiments._plots`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RunContext",
    "claim_verdict",
    "downsample",
    "environment",
    "first_below",
    "torch_threads",
    "fmt",
    "markdown_summary",
    "markdown_table",
    "sanitize",
    "write_json",
]


@dataclasses.dataclass
class RunContext:
    """Settings shared by every experiment of one command-line call.

    Attributes
    ----------
    out : pathlib.Path
        Folder of this experiment's files (``<--out>/<name>``); created on demand.
    quick : bool
        Smoke-test scale (about a minute at most) instead of the real run.
    seed : int
        Base seed; every random choice of the experiment derives from it.
    data_dir : pathlib.Path or None
        ``--data-dir``: the data folder (None: ``$AMOPT_DATA_DIR``, else the user
        cache directory; see :mod:`amopt.experiments._data` for its layout).
    download : bool
        Download a missing data set that has a public URL and a checksum into the
        data folder (``--no-download`` turns it off).
    quiet : bool
        No progress bars and no log lines.
    threads : int
        ``torch.set_num_threads`` for the torch experiments.
    device : str
        ``"cpu"``, ``"cuda"`` or ``"auto"`` (cuda when available) for the torch experiments.
    datasets : list of str or None
        LIBSVM data sets (names or paths) for ``logreg`` / ``logreg-adam``.
    full_curves : bool
        Store every step of every curve in the JSON instead of a log-spaced subsample.
    """

    out: Path
    quick: bool = False
    seed: int = 0
    data_dir: Path | None = None
    download: bool = True
    quiet: bool = False
    threads: int = 1
    device: str = "auto"
    datasets: list[str] | None = None
    full_curves: bool = False

    def __post_init__(self) -> None:
        self.out = Path(self.out)

    @property
    def show_progress(self) -> bool:
        """Progress bars only on an interactive terminal and without ``--quiet``."""
        return not self.quiet and sys.stderr.isatty()

    def progress(self, iterable: Iterable | None = None, **kwargs: Any) -> Any:
        """A ``tqdm`` bar (a silent one when not on a TTY or with ``--quiet``)."""
        from tqdm.auto import tqdm

        kwargs.setdefault("leave", False)
        kwargs.setdefault("dynamic_ncols", True)
        return tqdm(iterable, disable=not self.show_progress, **kwargs)

    def log(self, message: str) -> None:
        """One line on stderr (suppressed by ``--quiet``); safe beside a progress bar."""
        if self.quiet:
            return
        if self.show_progress:
            from tqdm.auto import tqdm

            tqdm.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def cache_notices(self) -> Iterator[None]:
        """Inside the block, the ``amopt.cache`` notices (a reference solve of ``f*`` that
        runs past 2 s) are lines of :meth:`log`: beside the progress bars, silenced by
        ``--quiet``."""
        import logging

        from amopt.problems._reference import logger

        ctx = self

        class _ToLog(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                ctx.log(f"amopt: {record.getMessage()}")

        saved = logger.handlers[:]
        logger.handlers = [_ToLog()]
        try:
            yield
        finally:
            logger.handlers = saved

    def curve(self, values: Sequence[float] | np.ndarray, points: int = 300) -> dict[str, list]:
        """A curve for the JSON: every step with ``--full-curves``, else a subsample."""
        return downsample(values, None if self.full_curves else points)

    def torch_device(self) -> str:
        """The torch device string this run uses."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """``torch.set_num_threads(n)`` inside the block; the previous value is restored after."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --------------------------------------------------------------------------- numbers


def downsample(values: Sequence[float] | np.ndarray, points: int | None = 300) -> dict[str, list]:
    """``{"step": [...], "value": [...]}`` at about ``points`` log-spaced steps (all if None).

    The first and last step are always kept; log spacing keeps the early
    iterations that a log-scaled x axis shows.

    Examples
    --------
    >>> c = downsample(np.arange(1000.0), points=5)
    >>> c["step"][0], c["step"][-1], len(c["step"]) <= 6
    (0, 999, True)
    """
    arr = np.asarray(values, dtype=np.float64).ravel()
    n = arr.size
    if points is None or n <= points:
        idx = np.arange(n)
    else:
        idx = np.unique(
            np.concatenate([np.geomspace(1, n, points).astype(np.int64) - 1, [0, n - 1]])
        )
    return {"step": [int(i) for i in idx], "value": [float(f"{v:.6g}") for v in arr[idx]]}


def first_below(values: Sequence[float] | np.ndarray, threshold: float) -> int | None:
    """The first index with ``values[i] <= threshold``, or None.

    Examples
    --------
    >>> first_below([3.0, 2.0, 1.0], 2.0), first_below([3.0], 1.0)
    (1, None)
    """
    arr = np.asarray(values, dtype=np.float64)
    hit = np.flatnonzero(arr <= threshold)
    return int(hit[0]) if hit.size else None


def sanitize(obj: Any) -> Any:
    """A JSON-safe copy: NumPy scalars/arrays to Python, non-finite floats to ``None``.

    Examples
    --------
    >>> sanitize({"a": np.float64(1.5), "b": [math.inf, np.int64(2)], "c": (1, None)})
    {'a': 1.5, 'b': [None, 2], 'c': [1, None]}
    """
    if isinstance(obj, dict):
        return {str(k): sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [sanitize(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [sanitize(v) for v in obj.tolist()]
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def claim_verdict(wins: int, n: int) -> str:
    """The verdict on a claim that held in ``wins`` of ``n`` cases.

    Examples
    --------
    >>> claim_verdict(3, 3), claim_verdict(1, 3), claim_verdict(0, 3), claim_verdict(0, 0)
    ('holds', 'partly', 'does not hold', 'does not hold')
    """
    if n and wins == n:
        return "holds"
    return "does not hold" if wins == 0 else "partly"


def write_json(path: Path, obj: Any) -> None:
    """Write ``sanitize(obj)`` as compact JSON (strict: no NaN or infinity)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(sanitize(obj), separators=(",", ":"), allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def fmt(value: Any, digits: int = 3) -> str:
    """Compact text for a table cell: ``-`` for None/NaN, scientific for small/large floats.

    Examples
    --------
    >>> fmt(None), fmt(0.123456), fmt(1.5e-9), fmt(12), fmt(1228.4), fmt("x")
    ('-', '0.123', '1.50e-09', '12', '1228', 'x')
    """
    if value is None:
        return "-"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        v = float(value)
        if not math.isfinite(v):
            return "-"
        if v == 0.0:
            return "0"
        if abs(v) < 1e-3 or abs(v) >= 1e5:
            return f"{v:.{max(digits - 1, 1)}e}"
        if abs(v) >= 10**digits:
            return f"{v:.0f}"
        return f"{v:.{digits}g}" if abs(v) >= 1 else f"{v:.{digits}f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table; cells go through :func:`fmt` unless already strings.

    Examples
    --------
    >>> print(markdown_table(["a", "b"], [[1, 0.5]]))
    | a | b |
    |---|---|
    | 1 | 0.500 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [c if isinstance(c, str) else fmt(c) for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_summary(
    result: dict[str, Any], *blocks: str | tuple[Sequence[str], Iterable[Sequence[Any]]]
) -> str:
    """``summary.md`` of a result: its title as a heading, then the blocks separated by
    blank lines; a block is a paragraph or a table given as ``(header, rows)``.

    Examples
    --------
    >>> markdown_summary({"title": "T"}, "text", (["a"], [[1]]))
    '## T\\n\\ntext\\n\\n| a |\\n|---|\\n| 1 |\\n'
    """
    texts = [b if isinstance(b, str) else markdown_table(*b) for b in blocks]
    return "\n\n".join([f"## {result['title']}", *texts]) + "\n"


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded with every result.

    The amopt version, Python, NumPy and SciPy versions, the CPU model and core
    count, and the torch and transformers versions where installed (read from the
    package metadata, so a run that does not use torch does not import it); the
    CUDA device when torch is already imported and sees one.
    """
    import numpy
    import scipy

    import amopt
    from amopt.bench._timing import cpu_model

    env: dict[str, Any] = {
        "amopt": amopt.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    for package in ("torch", "transformers"):
        version = _installed_version(package)
        if version is not None:
            env[package] = version
    if "torch" in sys.modules:
        import torch

        env["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return env


def _installed_version(package: str) -> str | None:
    """The version of an imported or installed distribution, or None (nothing imported)."""
    module = sys.modules.get(package)
    if module is not None and hasattr(module, "__version__"):
        return str(module.__version__)
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def optimizer_path(params: Any) -> str:
    """The implementation amopt's torch optimizers run by default on ``params``.

    ``"fused"`` (the C kernels, CPU), ``"triton"`` (CUDA), ``"foreach"`` or
    ``"single"``, as :func:`amopt.torch._common.default_path` picks it when neither
    ``foreach`` nor ``fused`` is given; recorded with the results because the default
    has changed between versions (``"unknown"`` if it cannot be determined).
    """
    try:
        from amopt.torch._common import default_path

        path, reason = default_path(list(params), [], fused=None, foreach=None)
    except Exception as exc:  # an older or partial install: say so rather than fail the run
        return f"unknown ({type(exc).__name__})"
    return path if reason is None else f"{path} ({reason})"


def implementation_note(config: dict[str, Any], optimizer: str) -> str:
    """The sentence of a summary that says which implementation the training runs used."""
    path = config.get("optimizer_implementation")
    if path is None:  # results stored before the implementation was recorded
        return (
            f"{optimizer} ran its default implementation of the time, the single-tensor path "
            "(today's default is the fused kernels on CPU, Triton on CUDA; same iterates up "
            "to rounding)."
        )
    names = {
        "fused": "the fused C kernels",
        "triton": "the Triton kernels",
        "foreach": "the foreach implementation",
        "single": "the single-tensor implementation",
    }
    first, _, why = path.partition(" ")  # "foreach (<why the kernels could not run>)"
    described = names.get(first, first) + (f" {why}" if why else "")
    return f"{optimizer} ran its default implementation: {described}."


# --------------------------------------------------------------------------- full-batch runs


def trace_minimize(
    value_and_grad: Any,
    x0: np.ndarray,
    method: str,
    options: dict[str, Any],
    *,
    bar: Any = None,
) -> dict[str, Any]:
    """Run :func:`amopt.minimize` and record ``f(x_t)`` for t = 0..nit, the betas and timings.

    Parameters
    ----------
    value_and_grad : callable
        ``x -> (f, g)`` (passed with ``jac=True``).
    x0 : numpy.ndarray
        Start.
    method : str
        An :data:`amopt.METHODS` name.
    options : dict
        ``minimize`` options (``gtol = 0`` is added unless given).
    bar : tqdm, optional
        Advanced by one per iteration.

    Returns
    -------
    dict
        ``f`` (array, length nit + 1), ``betas`` (array or None), ``seconds`` (array:
        wall time when ``x_t`` was available, t = 0..nit, the first evaluation of
        ``f(x_0)`` excluded), ``time_s``, ``nit``, ``status``, ``message``, ``x``.
    """
    from amopt import minimize

    f0 = float(value_and_grad(x0)[0])
    fs = [f0]
    stamps = [0.0]
    start = time.perf_counter()

    def callback(intermediate_result: Any) -> None:
        fs.append(float(intermediate_result.fun))
        stamps.append(time.perf_counter() - start)
        if bar is not None:
            bar.update(1)

    opts = {"gtol": 0.0, **options}
    res = minimize(value_and_grad, x0, jac=True, method=method, options=opts, callback=callback)
    elapsed = time.perf_counter() - start
    betas = None
    if "betas" in res and len(res.betas):
        betas = np.asarray([float(np.mean(np.asarray(b, dtype=np.float64))) for b in res.betas])
    return {
        "f": np.asarray(fs),
        "betas": betas,
        "seconds": np.asarray(stamps),
        "time_s": elapsed,
        "nit": int(res.nit),
        "status": int(res.status),
        "message": str(res.message),
        "x": np.asarray(res.x),
    }
