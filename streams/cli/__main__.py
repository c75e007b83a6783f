"""`python -m streams.cli`: the `preemptctl` command without the console script."""

from streams.cli.main import main

raise SystemExit(main())
