"""Side-by-side performance measurements of amopt: ``python -m amopt.bench``.

Each row of the table times an AM implementation and its baseline alternately
in one run (``A B, B A, A B, ...``), and reports the medians of both and the
median of the paired ratios, against the row's target:

* ``AMAdamW(fused=True).step`` / ``torch.optim.AdamW(fused=True).step`` on 25M
  float32 parameters, in 48 tensors with per-layer beta and in one tensor with
  a global beta (target <= 2.0 each);
* ``AMSGD(fused=True).step`` / ``SGD(momentum=0.9, dampening=0.9,
  foreach=True).step`` (<= 1.6);
* ``minimize(method="am-mgd")`` per iteration / a hand-written NumPy
  heavy-ball loop on a9a logistic regression (<= 1.05; reads
  ``<data>/libsvm/a9a`` with ``--data-dir <data>``, default ``$AMOPT_DATA_DIR``
  else ``~/.cache/amopt``; skipped without the file);
* the NumPy core AM-MGD step / MGD step on 10^7 float64 (<= 1.6);
* the peak memory the optimizer adds, AMAdamW / AdamW (<= 1.05);
* a training iteration of a tiny LLaMA (``transformers``, skipped when it is
  not installed) with AM-AdamW / AdamW (<= 1.01, i.e. at most 1% overhead).

``--check`` makes the command exit with status 1 when a target is missed;
``--quick`` runs every row at small sizes (a smoke test, not the targets).
The workloads live in :mod:`amopt.bench.cases`, shared with the asv suite in
``asv_benchmarks/``.

Examples
--------
>>> from amopt.bench import ROWS
>>> [row.key for row in ROWS][:3]
['adamw-layers', 'adamw-global', 'amsgd']
"""

from amopt.bench._cli import EXTRA_ROWS, ROWS, Measured, Result, Row, Settings, main, run_rows

__all__ = ["EXTRA_ROWS", "ROWS", "Measured", "Result", "Row", "Settings", "main", "run_rows"]
