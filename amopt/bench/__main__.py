"""``python -m amopt.bench [--gpu] [--extra] [--quick] [--check] [--repeat N] [--threads N]
[--rows KEY ...] [--json FILE]``."""

from amopt.bench._cli import main

raise SystemExit(main())
