"""`python -m lab.cli`: the same command line as `envlab`."""

import sys

try:
    from lab.cli import main

    status = main()
except KeyboardInterrupt:  # Ctrl+C before the command could take it (while it imports): one line, no traceback
    print(f"envlab {' '.join(sys.argv[1:2])}: interrupted".replace(" :", ":"), file=sys.stderr)
    status = 130
raise SystemExit(status)
