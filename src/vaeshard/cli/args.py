"""The command line's parser and its argument types.

`Parser` prints an argparse error's one useful line first (what is wrong), then where to read the
options, instead of argparse's usage block first: a subcommand's usage runs to a dozen lines.
"""

from __future__ import annotations

import argparse

from vaeshard import MODES


class Parser(argparse.ArgumentParser):
    """argparse's parser, its subcommands' too (add_subparsers makes them of the parent's class),
    with the error line first."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers like 1,2,4, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers of at least 1, got {text!r}")
    return values


def shape(text: str) -> tuple[int, ...]:
    values = tuple(int_list(text))
    if len(values) not in (4, 5):
        raise argparse.ArgumentTypeError(f"expected B,C,T,H,W (five numbers; B,C,H,W for an image VAE), got {text!r}")
    return values


def mode_list(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown mode(s) {', '.join(unknown) or text!r}: choose from {', '.join(MODES)}"
        )
    return modes
