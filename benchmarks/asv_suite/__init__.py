"""asv benchmarks of amopt (see ``benchmarks/asv.conf.json``).

The workloads are built by :mod:`amopt.bench.cases` and the harness of
``benchmarks/``, the same code that ``python -m amopt.bench`` and
``python -m benchmarks`` time side by side. Set ``AMOPT_BENCH_QUICK=1`` for
small sizes (what the CI tests use to run every benchmark body once), and
``AMOPT_BENCH_THREADS=1`` for single-threaded torch (stable numbers on a machine
shared with other work).
"""

import sys
from pathlib import Path

# asv imports this suite with benchmarks/ on sys.path, not the repository's root: the
# harness (``benchmarks.host``, ...) is imported from the checkout that holds the suite
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
