"""Command-line parsing the benchmarks share."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def comma_list(kind: Callable[[str], T]) -> Callable[[str], list[T]]:
    """An argparse `type` for `a,b,c`: each part converted by `kind`, empty parts skipped."""
    return lambda text: [kind(x) for x in text.split(",") if x]
