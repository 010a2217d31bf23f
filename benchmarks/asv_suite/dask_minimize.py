"""``minimize(method="am-mgd")`` per iteration on a dask array, relative to NumPy in memory.

Least squares with a 10^6 x 100 float64 design in 4 chunks, held by a
LocalCluster of 2 worker processes with 1 thread each, against the same run on
NumPy arrays (see ``benchmarks.dask_rows``). ``track_ratio`` records the median,
over interleaved pairs of runs, of (dask time / NumPy time); a ratio that does
not grow with the number of iterations is the point of the lazy loop.
``time_iteration`` times one dask run. Skipped without ``dask[distributed]``.
"""

from __future__ import annotations

from amopt.bench import cases

PAIRS = 5


class DaskIteration:
    timeout = 900
    unit = "dask / NumPy per iteration"

    def setup(self) -> None:
        try:
            import distributed  # noqa: F401
        except ImportError as exc:
            raise NotImplementedError(f"missing package: {exc}") from None
        from benchmarks import dask_rows as _dask

        n, d, chunks, k = _dask.QUICK_SIZE if cases.quick() else _dask.FULL_SIZE
        self.iterations = k
        self.case = _dask.DaskMinimizeCase(n, d, chunks, k)
        self.case.run_dask()  # warm the workers and the imports

    def teardown(self) -> None:
        self.case.close()

    def track_ratio(self) -> float:
        from amopt.bench._timing import interleave

        pairs = 1 if cases.quick() else PAIRS
        p = interleave(self.case.run_dask, self.case.run_numpy, repeat=pairs, warmup=0)
        return p.median_ratio

    def time_iteration(self) -> None:
        self.case.run_dask()
