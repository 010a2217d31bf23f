"""asv benchmarks of amopt (see ``asv_benchmarks/asv.conf.json``).

The workloads are built by :mod:`amopt.bench.cases`, the same code that
``python -m amopt.bench`` times side by side. Set ``AMOPT_BENCH_QUICK=1`` for
small sizes (what the CI tests use to run every benchmark body once), and
``AMOPT_BENCH_THREADS=1`` for single-threaded torch (stable numbers on a machine
shared with other work).
"""
