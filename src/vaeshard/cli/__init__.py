"""`vaeshard` command line: demo, decode, bench, serve.

Thin: cli/parser.py defines the flags, cli/commands.py checks the arguments (before any process starts, so
a mistake costs no model load) and runs each command through the public API (`import vaeshard`) on ranks
started by cli/launch.py; the measuring lives in cli/bench.py. A mistake in what was asked for prints one
line, `vaeshard: error: ...`, and exits with 2; a failure while running exits with 1; SIGTERM or SIGINT
stops every rank and exits with 128 plus the signal (143, 130).
"""

from __future__ import annotations

import os
import sys

from . import commands, launch
from .commands import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .parser import DEFAULT_TIMEOUT_S, build_parser
from .placement import error


def entry() -> None:
    """The `vaeshard` command and `python -m vaeshard`: `main`, then exit with its status.

    Under torchrun the process exits without the interpreter's teardown once its output is flushed:
    the gloo backend's threads can outlive the destroyed process group, and tearing them down with
    the interpreter sometimes aborts a rank after its work succeeded (torchrun then reports the run
    failed). Every file the command writes is complete before `main` returns.
    """
    code = main()
    if launch.torchrun_env():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = commands.run(args)
        launch.close_group()  # under torchrun: every rank is past its last collective
        return code
    except ValueError as exc:  # InputError, or the library refusing a request (bad input)
        return error(str(exc), EXIT_USAGE)
    except KeyboardInterrupt as exc:  # Ctrl-C, or launch.Interrupted: SIGTERM or SIGINT, ranks stopped
        signum = getattr(exc, "signum", 2)
        return error(str(exc) or "interrupted", 128 + signum)  # the shell's convention: 130 SIGINT, 143 SIGTERM
    except launch.WorkerFailed as exc:
        if exc.user_error:
            return error(exc.message, EXIT_USAGE)
        if exc.detail:
            sys.stderr.write(exc.detail if exc.detail.endswith("\n") else exc.detail + "\n")
        return error(f"rank {exc.rank} failed: {exc.exc_type + ': ' if exc.exc_type else ''}{exc.message}", EXIT_FAILED)
    except launch.LaunchError as exc:
        return error(str(exc), EXIT_FAILED)


__all__ = ["DEFAULT_TIMEOUT_S", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "entry", "main"]
