"""The dask bench rows' out-of-core run, at a small size, in this process.

``python -m benchmarks --extra --rows dask`` runs it at full size (a data set
larger than the workers' memory); here it only has to work: the chunk files
are written, the cluster reads them, the objective decreases, and each
worker's peak resident memory stays under its limit.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest

pytest.importorskip("distributed")

from benchmarks import dask_rows as _dask  # noqa: E402


def test_out_of_core_run_reads_the_chunks_from_disk(tmp_path):
    def expire(signum, frame):
        raise TimeoutError("the out-of-core run did not finish within 60 s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 60)
    try:
        out = _dask.out_of_core_run(4000, 5, 500, 3, "400MiB", str(tmp_path))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert sorted(p.name for p in tmp_path.iterdir())[:2] == ["X0000.npy", "X0001.npy"]
    assert out["chunks"] == 8 and out["nit"] == 3 and out["workers"] == 2
    assert out["data_bytes"] == 4000 * 6 * 8
    assert np.isfinite(out["f"]) and out["f"] < out["f0"]
    assert max(out["worker_peak_rss_bytes"]) < out["memory_limit_bytes"] == 400 * 2**20
