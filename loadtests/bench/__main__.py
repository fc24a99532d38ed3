"""``python -m loadtests.bench``."""

from loadtests.bench.cli import main

raise SystemExit(main())
