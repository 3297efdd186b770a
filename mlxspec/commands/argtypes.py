"""argparse value types shared by the commands: bad values fail with what is allowed."""

from __future__ import annotations

import argparse


def num_draft(s: str):
    """'auto' -> None (the cost model picks), else an integer in [0, MAX_DRAFT]."""
    from mlxspec.prompts import MAX_DRAFT

    if s == "auto":
        return None
    try:
        n = int(s)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_DRAFT:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer in 0..{MAX_DRAFT}, got {s!r}")
    return n


def non_negative(s: str) -> float:
    try:
        x = float(s)
    except ValueError:
        x = -1.0
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {s!r}")
    return x


def positive(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}")
    return n


def tree(s: str):
    """'auto' or 'off' as given, else a node cap: an integer in [1, MAX_DRAFT]."""
    from mlxspec.prompts import MAX_DRAFT

    if s in ("auto", "off"):
        return s
    try:
        n = int(s)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_DRAFT:
        raise argparse.ArgumentTypeError(f"expected 'auto', 'off' or an integer in 1..{MAX_DRAFT}, got {s!r}")
    return n


def on_off(s: str) -> str:
    if s not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected 'on' or 'off', got {s!r}")
    return s
