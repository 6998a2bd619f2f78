"""Argument types shared by the experiments' command lines: bad values are refused by argparse,
naming the argument, before any work starts."""

from __future__ import annotations

import argparse
import math

from experiments import _methods


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def method_name(text: str) -> str:
    """A backward method's name as ``experiments._methods`` knows it."""
    try:
        _methods.parse_method(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text
