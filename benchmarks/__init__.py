"""The maintainers' harness of amopt: ``python -m benchmarks``, from a checkout.

Not part of the installed package (the wheel holds ``amopt/`` only): these modules
measure the project's own targets, not a user's question. ``python -m benchmarks``
takes the flags of ``python -m amopt.bench`` and runs its rows (the AM optimizers,
``minimize`` and the core against their baselines, timed side by side), through the
same runner, table and JSON (:mod:`amopt.bench._cli`), plus:

* :mod:`benchmarks.standins`: CPU stand-ins of the GPU targets, run by default: the
  Triton driver's host time per step with its launches stubbed
  (:mod:`benchmarks.host`), aten operations per foreach step, host reads and
  operations per ``minimize`` iteration, bytes moved per iteration;
* :mod:`benchmarks.dask_rows` (``--extra``): ``minimize`` on a dask cluster, in
  memory and out of core;
* :mod:`benchmarks.gpu` (``--gpu``): the GPU targets and their profiles;
* :mod:`benchmarks.counters`: the one aten-operation counter and the one host-read
  counter (``TorchDispatchMode``), which the tests use too;
* the asv suite: ``benchmarks/asv.conf.json`` and ``benchmarks/asv_suite/``
  (``cd benchmarks && asv run --python=same --quick``).

Run it from the repository's root (``python -m benchmarks --quick``); the tests,
run from there too (``python -m pytest``), import it as ``benchmarks``.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the repository's root: where ``benchmarks`` and the checkout's ``amopt`` are imported from
ROOT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python process of a row: this one's, with the
    repository's root first on ``PYTHONPATH`` (the child imports ``benchmarks`` too,
    whatever its working folder)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}
