"""`python -m vaeshard ...`: the same command line as `vaeshard ...`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
