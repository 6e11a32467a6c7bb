"""Argument types for the scripts in scripts/: a count or amount out of range is argparse's one
error line naming the flag, before any work (a zero worker count, image size or GPU count was a
traceback, or an empty or negative result, after it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(low: float, kind: type = int, high: float | None = None) -> Callable[[str], float]:
    """`type=at_least(1)`: an int of at least 1; `at_least(0, float)`: a float of 0 or more."""

    def parse(text: str) -> float:
        value = kind(text)  # a ValueError is argparse's "invalid int value"
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text}: must be {low} or more" + (f" and {high} or less" if high else ""))
        return value

    parse.__name__ = kind.__name__
    return parse


def above(low: float) -> Callable[[str], float]:
    """`type=above(0)`: a float greater than `low` (a rate, a fraction that divides)."""

    def parse(text: str) -> float:
        value = float(text)
        if not value > low:
            raise argparse.ArgumentTypeError(f"{text}: must be above {low}")
        return value

    parse.__name__ = "float"
    return parse
