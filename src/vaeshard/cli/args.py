"""The command line's parser class, its argument types, and the fast tier's flags.

`Parser` prints an argparse error's one useful line first (what is wrong), then where to read the
options, instead of argparse's usage block first: a subcommand's usage runs to a dozen lines.
`DeprecatedAlias` keeps a renamed flag's old spelling working for one release, with a warning.
"""

from __future__ import annotations

import argparse
import os
import sys

from vaeshard import MODES, FastOptions


class Parser(argparse.ArgumentParser):
    """argparse's parser, its subcommands' too (add_subparsers makes them of the parent's class),
    with the error line first."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n")


class DeprecatedAlias(argparse.Action):
    """The old spelling of a renamed flag: stores into the new flag's `dest` and says on stderr (once per
    run, on rank 0 only under torchrun) which flag replaces it. Hidden from --help."""

    def __init__(self, option_strings, dest, replacement: str, removal: str = "0.4", **kwargs):
        self.replacement, self.removal = replacement, removal
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if os.environ.get("RANK", "0") == "0":
            print(
                f"{parser.prog}: warning: {option_string} is deprecated and will be removed in vaeshard "
                f"{self.removal}: use {self.replacement}",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, values)


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


def tier_arguments() -> argparse.ArgumentParser:
    """The parent parser of --exact and one option per FastOptions knob (its flag and one-line doc), the
    same on `decode`, `serve` and `bench`; `tier_options` reads them back."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("fast tier")
    group.add_argument(
        "--exact", action="store_true", help="every layer exactly as diffusers computes it (default: the fast tier)"
    )
    for name, default, doc, flag, parse, metavar in FastOptions.knobs():
        if parse is None:  # a switch: --no-X turns a default True off, --X a default False on
            group.add_argument(
                flag,
                dest=name,
                action="store_false" if default else "store_true",
                help=f"fast tier: {'turn off ' + name + ' (' + doc + ')' if default else doc}",
            )
        else:
            group.add_argument(
                flag,
                dest=name,
                type=_argument(parse),
                default=default,
                metavar=metavar,
                help=f"fast tier: {doc} (default: {default})",
            )
    return parent


def _argument(parse):
    """An argparse type from a FastOptions parser (its ValueError becomes argparse's message)."""

    def typed(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    typed.__name__ = getattr(parse, "__name__", "value")
    return typed


def tier_options(args) -> dict:
    """`parallelize`'s `exact` and `fast` from the options `tier_arguments` made."""
    return {"exact": args.exact, "fast": FastOptions(**{name: getattr(args, name) for name, *_ in FastOptions.knobs()})}
