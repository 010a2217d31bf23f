"""``python -m amopt.bench [--extra] [--problem-set] [--quick] [--check] [--repeat N]
[--threads N] [--rows KEY ...] [--json FILE]``."""

from amopt.bench._cli import main

raise SystemExit(main())
