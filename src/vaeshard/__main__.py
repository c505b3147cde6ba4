"""`python -m vaeshard ...`: the same command line as `vaeshard ...`."""

from .cli import entry

if __name__ == "__main__":
    entry()
