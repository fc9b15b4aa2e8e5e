"""python -m harness.model: the command line, harness.model.cli."""

import sys

from harness.model.cli import main

if __name__ == "__main__":
    sys.exit(main())
