"""``python -m amopt.bench [--quick] [--check] [--repeat N] [--threads N] [--rows KEY ...]``."""

from amopt.bench._cli import main

raise SystemExit(main())
