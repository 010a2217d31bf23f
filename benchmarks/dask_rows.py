"""The dask rows of ``python -m benchmarks`` (informational, run with ``--extra``).

* ``dask-iteration``: the time per iteration of ``minimize(method="am-mgd")``
  on least squares with a 10^6 x 100 float64 design held by a
  ``dask.distributed`` LocalCluster (2 worker processes, 1 thread each, the
  design in 4 chunks), against the same run on NumPy arrays in memory; the
  dask overhead of a step is broken down into building the graph, the
  ``dask.persist`` call and the computation.
* ``dask-out-of-core``: the same method on a design stored on disk as ``.npy``
  chunks, larger than the workers' ``memory_limit`` together; a fresh process
  runs it and reports the peak resident memory of each worker against the
  limit.

Both need ``dask[distributed]`` (``pip install amopt[dask]``); without it the
rows are reported as skipped. :class:`DaskMinimizeCase` is shared with the asv
benchmark ``benchmarks/asv_suite/dask_minimize.py``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from amopt.bench._records import Measured, Row, Settings
from amopt.bench._timing import interleave
from benchmarks import child_env

__all__ = ["DaskMinimizeCase", "ROWS", "out_of_core_run", "peak_rss"]

#: The in-memory comparison: rows, features, chunks, iterations per sample.
FULL_SIZE = (1_000_000, 100, 4, 10)
QUICK_SIZE = (20_000, 20, 4, 3)
#: The out-of-core run: rows, features, rows per chunk file, iterations, worker memory_limit.
OUT_OF_CORE = (4_000_000, 100, 100_000, 10, "600MiB")
OUT_OF_CORE_QUICK = (40_000, 20, 5_000, 3, "400MiB")


def _block(i: int, rows: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[i * rows, (i + 1) * rows)`` of the synthetic least-squares data set.

    Columns are scaled from 1 to 10 (condition number ~100 of ``X^T X``); ``y``
    is a planted linear model plus noise. The same ``i`` gives the same block on
    any process.
    """
    rng = np.random.default_rng([seed, i])
    X = rng.standard_normal((rows, features)) * np.geomspace(1.0, 10.0, features)
    w = np.random.default_rng([seed, 1 << 30]).standard_normal(features)
    return X, X @ w + rng.standard_normal(rows)


def peak_rss() -> int:
    """This process's peak resident memory in bytes (``VmHWM``; Linux).

    Unlike ``getrusage``'s ``ru_maxrss``, which a spawned process inherits from
    the process it was forked from, ``VmHWM`` counts this program image alone.
    """
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def _client(n_workers: int = 2, memory_limit: str | None = None) -> tuple[Any, Any]:
    import distributed

    cluster = distributed.LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        memory_limit=memory_limit or "auto",
        silence_logs=50,
    )
    return cluster, distributed.Client(cluster, set_as_default=False)


class DaskMinimizeCase:
    """``minimize(method="am-mgd")`` on one least-squares problem, on a cluster and in memory.

    Parameters
    ----------
    n_rows, n_features, n_chunks : int
        The design's size and its number of row chunks.
    iterations : int
        Steps per run (``gtol = 0``, ``lr = 1/L``).
    seed : int
        Seed of the data.

    Attributes
    ----------
    timings : list of StepTimings
        One per :meth:`run_dask` call.
    """

    def __init__(self, n_rows: int, n_features: int, n_chunks: int, iterations: int, seed=0):
        import dask
        import dask.array as da

        from amopt.problems import LeastSquares

        rows = math.ceil(n_rows / n_chunks)
        self.cluster, self.client = _client()
        blocks = [dask.delayed(_block, nout=2)(i, rows, n_features, seed) for i in range(n_chunks)]
        X = da.concatenate([da.from_delayed(b[0], (rows, n_features), np.float64) for b in blocks])
        y = da.concatenate([da.from_delayed(b[1], (rows,), np.float64) for b in blocks])
        with dask.config.set(scheduler=self.client):
            X, y = dask.persist(X, y)
            self.dask_problem = LeastSquares(X, y)
        parts = [_block(i, rows, n_features, seed) for i in range(n_chunks)]
        self.numpy_problem = LeastSquares(
            np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        )
        del parts
        self.n_features = n_features
        self.options = {"lr": 1.0 / self.numpy_problem.L, "maxiter": iterations, "gtol": 0.0}
        self.timings: list[Any] = []
        self.last: dict[str, np.ndarray] = {}

    def run_dask(self) -> None:
        import dask
        import dask.array as da

        import amopt
        from amopt.backends.dask._session import record

        with dask.config.set(scheduler=self.client), record() as runs:
            res = amopt.minimize(
                self.dask_problem,
                da.zeros(self.n_features, chunks=-1),
                method="am-mgd",
                options=self.options,
            )
            self.last["dask"] = np.asarray(res.x)
        self.timings.append(runs[0])

    def run_numpy(self) -> None:
        import amopt

        res = amopt.minimize(
            self.numpy_problem, np.zeros(self.n_features), method="am-mgd", options=self.options
        )
        self.last["numpy"] = res.x

    def breakdown(self) -> dict[str, float]:
        """Median seconds per graph submission: build, persist, compute."""
        return {
            part: statistics.median(getattr(t, part) / t.submissions for t in self.timings)
            for part in ("build", "persist", "compute")
        }

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def _iteration(s: Settings) -> Measured:
    n, d, chunks, k = QUICK_SIZE if s.quick else FULL_SIZE
    case = DaskMinimizeCase(n, d, chunks, k)
    try:
        p = interleave(case.run_dask, case.run_numpy, repeat=s.repeat, warmup=1)
        parts = case.breakdown()
        diff = float(np.max(np.abs(case.last["dask"] - case.last["numpy"])))
    finally:
        case.close()
    ms = {key: 1e3 * v for key, v in parts.items()}
    return Measured.from_paired(
        p,
        scale=1e3 / k,
        unit="ms/it",
        note=(
            f"{n:,} x {d} float64 in {chunks} chunks, {k} iterations per sample (plus the first "
            f"evaluation); dask overhead per step: graph build {ms['build']:.1f} ms, persist "
            f"(optimise + submit) {ms['persist']:.1f} ms, compute (run + fetch the scalars) "
            f"{ms['compute']:.1f} ms; max |x_dask - x_numpy| = {diff:.1e}"
        ),
    )


def out_of_core_run(
    n_rows: int, n_features: int, chunk_rows: int, iterations: int, memory_limit: str, where: str
) -> dict[str, Any]:
    """Write the data set as ``.npy`` chunks under ``where`` and minimise on it from disk.

    Returns
    -------
    dict
        Sizes, seconds (writing, setting up the problem, per step), the first
        and last objective values, and the peak RSS (bytes) of each worker and
        of this process.
    """
    import dask
    import dask.array as da
    from dask.utils import parse_bytes

    import amopt
    from amopt.problems import LeastSquares

    n_chunks = math.ceil(n_rows / chunk_rows)
    t0 = time.perf_counter()
    paths = []
    for i in range(n_chunks):
        X, y = _block(i, chunk_rows, n_features, seed=1)
        paths.append((os.path.join(where, f"X{i:04d}.npy"), os.path.join(where, f"y{i:04d}.npy")))
        np.save(paths[-1][0], X)
        np.save(paths[-1][1], y)
    del X, y
    t_write = time.perf_counter() - t0

    X = da.concatenate([
        da.from_delayed(dask.delayed(np.load)(px), (chunk_rows, n_features), np.float64)
        for px, _ in paths
    ])  # fmt: skip
    y = da.concatenate([
        da.from_delayed(dask.delayed(np.load)(py), (chunk_rows,), np.float64) for _, py in paths
    ])  # fmt: skip
    cluster, client = _client(memory_limit=memory_limit)
    try:
        with dask.config.set(scheduler=client):
            t0 = time.perf_counter()
            prob = LeastSquares(X, y)
            lr = 1.0 / prob.L
            t_setup = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = amopt.minimize(
                prob,
                da.zeros(n_features, chunks=-1),
                method="am-mgd",
                options={"lr": lr, "maxiter": iterations, "gtol": 0.0},
            )
            t_run = time.perf_counter() - t0
            f0 = float(prob.value_and_grad(np.zeros(n_features))[0])
        worker_peaks = client.run(peak_rss)
    finally:
        client.close()
        cluster.close()
    return {
        "data_bytes": int(n_rows * (n_features + 1) * 8),
        "chunks": n_chunks,
        "memory_limit_bytes": int(parse_bytes(memory_limit)),
        "workers": len(worker_peaks),
        "write_s": t_write,
        "setup_s": t_setup,
        "step_s": t_run / (res.nit + 1),
        "nit": int(res.nit),
        "f0": f0,
        "f": float(res.fun),
        "worker_peak_rss_bytes": sorted(worker_peaks.values()),
        "client_peak_rss_bytes": peak_rss(),
    }


def _out_of_core(s: Settings) -> Measured:
    import distributed  # noqa: F401  (skips the row without it)

    if not sys.platform.startswith("linux"):
        from amopt.bench.cases import SkipCase

        raise SkipCase("peak memory is read from /proc (Linux only)")
    size = OUT_OF_CORE_QUICK if s.quick else OUT_OF_CORE
    where = tempfile.mkdtemp(prefix="amopt-dask-")
    try:
        code = (
            "import json\n"
            "from benchmarks.dask_rows import out_of_core_run\n"
            f"print(json.dumps(out_of_core_run(*{size!r}, {where!r})))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=1800,
            env=child_env(),
        )
    finally:
        shutil.rmtree(where, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"out-of-core child failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    mib = 2.0**20
    peak = max(out["worker_peak_rss_bytes"])
    limit = out["memory_limit_bytes"]
    total = out["workers"] * limit
    return Measured(
        a=peak / mib,
        b=limit / mib,
        ratio=peak / limit,
        unit="MiB",
        note=(
            f"{out['data_bytes'] / 2**30:.2f} GiB of npy chunks on disk ({out['chunks']} files, "
            f"{out['data_bytes'] / total:.1f}x the {out['workers']} workers' memory_limit "
            f"together); {out['nit']} steps at {out['step_s']:.2f} s each (setup, the "
            f"validation and Gram passes: {out['setup_s']:.1f} s); f {out['f0']:.4g} -> "
            f"{out['f']:.4g}; peak RSS per worker "
            + ", ".join(f"{b / mib:.0f}" for b in out["worker_peak_rss_bytes"])
            + f" MiB, client {out['client_peak_rss_bytes'] / mib:.0f} MiB"
        ),
    )


ROWS: tuple[Row, ...] = (
    Row(
        "dask-iteration",
        "minimize(am-mgd) per iteration, 10^6 x 100 dask array on a LocalCluster "
        "(2 workers x 1 thread, 4 chunks) / the same on NumPy in memory",
        "dask LocalCluster",
        "NumPy",
        None,
        _iteration,
    ),
    Row(
        "dask-out-of-core",
        "peak worker RSS / worker memory_limit, minimize(am-mgd) on npy chunks on disk "
        "larger than the workers' memory",
        "peak worker RSS",
        "memory_limit",
        None,
        _out_of_core,
    ),
)
