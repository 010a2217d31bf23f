"""Side-by-side performance measurements of amopt: ``python -m amopt.bench``.

Each row of the table times an AM implementation and its baseline alternately
in one run (``A B, B A, A B, ...``), and reports the medians of both and the
median of the paired ratios, against the row's target:

* ``AMAdamW(fused=True).step`` on 25M float32 parameters in 48 tensors with
  per-layer beta over its own memory-traffic floor (the same two passes over the
  same tensors without the arithmetic, ``adamw-layers-over-floor``; <= 1.25 on every
  CPU), and against ``torch.optim.AdamW(fused=True).step`` (information), in one
  tensor with a global beta (<= 2.0);
* ``AMSGD(fused=True).step`` / ``SGD(momentum=0.9, dampening=0.9,
  foreach=True).step`` (<= 1.6);
* the foreach paths against torch's foreach steps (<= 2.0) and the compiled
  default, single-tensor and foreach steps against compiled torch steps (<= 1.6;
  compiled AMSGD against its own floor, a compiled read of the gradients and
  buffers followed by the compiled SGD step, <= 1.25 on every CPU: on one core that
  floor alone reaches 1.6 against SGD);
* ``minimize(method="am-mgd")`` per iteration / a hand-written NumPy
  heavy-ball loop on a9a logistic regression (<= 1.05; reads
  ``<data>/libsvm/a9a`` with ``--data-dir <data>``, default ``$AMOPT_DATA_DIR``
  else ``~/.cache/amopt``; skipped without the file);
* the NumPy core AM-MGD step / MGD step on 10^7 float64 (<= 1.6);
* the peak memory the optimizer adds, AMAdamW / AdamW (<= 1.05);
* a training iteration of a tiny LLaMA (``transformers``, skipped when it is
  not installed) with AM-AdamW / AdamW (<= 1.01, i.e. at most 1% overhead).

``--extra`` adds informational rows; ``--problem-set`` runs the problem set
(iterations to a gradient test of every method on every problem); ``--check``
makes the command exit with status 1 when a target is missed or a row fails;
``--quick`` runs every row at small sizes (a smoke test, not the targets);
``--json FILE`` also writes the results. The workloads live in
:mod:`amopt.bench.cases`; the timing helpers (:mod:`amopt.bench._timing`) are
shared with :mod:`amopt.experiments`.

The maintainers' harness is not part of the package: in a checkout of the
repository, ``python -m benchmarks`` runs these rows with the same flags, plus
the CPU stand-ins of the GPU targets (the Triton driver's host time with its
launches stubbed, aten operations and host reads counted per step and per
``minimize`` iteration), the dask rows, and with ``--gpu`` the GPU rows; the asv
suite is there too (``benchmarks/asv.conf.json``).

Examples
--------
>>> from amopt.bench import ROWS
>>> [row.key for row in ROWS][:3]
['adamw-layers', 'adamw-layers-over-floor', 'adamw-global']
"""

from amopt.bench._cli import (
    EXTRA_ROWS,
    ROWS,
    Measured,
    Result,
    Row,
    Settings,
    main,
    run_rows,
)

__all__ = [
    "EXTRA_ROWS",
    "ROWS",
    "Measured",
    "Result",
    "Row",
    "Settings",
    "main",
    "run_rows",
]
