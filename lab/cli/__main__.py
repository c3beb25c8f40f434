"""`python -m lab.cli`: the same command line as `envlab`."""

from lab.cli import main

raise SystemExit(main())
