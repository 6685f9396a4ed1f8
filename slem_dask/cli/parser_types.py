"""The value types of the command line's options: argparse ``type=`` functions that say
what a value must be, and the help text of --lam that they share."""

from __future__ import annotations

import argparse
import math


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _lam(text: str):
    """--lam: a number > 0 (absolute) or "<c>x" (c times the negatives' tr(Sigma))."""
    return _absolute_or_relative(text, "Cx is C times the negatives' total variance, e.g. 0.01x")


def _gamma(text: str):
    """--gamma: a number > 0 (absolute) or "<c>x" (c over the negatives' median squared
    distance)."""
    return _absolute_or_relative(
        text, "Cx is C over the negatives' median squared distance, e.g. 0.0625x"
    )


def _absolute_or_relative(text: str, relative_means: str):
    """A number > 0, or "<c>x" (c > 0) kept as text; refused quoting the whole value
    as given (``0x`` was quoted as '0')."""
    relative = text.strip().lower().endswith("x")
    try:
        value = _positive_float(text.strip()[:-1] if relative else text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a finite number > 0 or Cx with C > 0, got {text!r} (a number is "
            f"absolute; {relative_means})"
        ) from None
    return f"{value:g}x" if relative else value


#: What --lam means, for the help texts.
_LAM_HELP = (
    "ridge lambda of linear SLEM: a number > 0 is absolute (the data's squared "
    "units); Cx is C times the negatives' total variance tr(Sigma), whatever "
    "their scale (default: 0.01x; about 3e-3 on L2-normalized descriptors). "
    "Kernel SLEM takes a number (default: 1e-3)"
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _grid(convert):
    """argparse type: one value or a comma-separated list of them, as a list."""

    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(
                f"expected comma-separated values such as 1e-3,1e-2, got {text!r}"
            )
        values = [convert(t) for t in items]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} repeats a value")
        return values

    return parse


def _at_least_two(text: str) -> int:
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 2 (a model needs at least 2 negatives), got {text!r}"
        )
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value
