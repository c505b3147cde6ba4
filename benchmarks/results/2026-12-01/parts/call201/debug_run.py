"""Runs a script with vaeshard's loggers at DEBUG (for torchrun)."""
import logging
import runpy
import sys

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("vaeshard").setLevel(logging.DEBUG)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
