"""``python -m benchmarks [--gpu] [--extra] [--problem-set] [--quick] [--check] [--repeat N]
[--threads N] [--rows KEY ...] [--json FILE]``, from the repository's root."""

from benchmarks.cli import main

raise SystemExit(main())
