"""prometheus-client's Counter and Histogram with each child's numbers held as plain floats.

prometheus-client takes a lock around every value it updates (a histogram observation takes two) and finds
a histogram's bucket with a Python loop over its bounds; a whole request makes about a dozen such updates.
The gateway updates and scrapes its metrics on its event loop, one thread per process, so the locks guard
nothing: these classes keep prometheus-client's registration, labels, samples and exposition and replace
only the update (a bucket found by bisection). Exemplars are not kept.
"""

from __future__ import annotations

import bisect
import math
import time

from prometheus_client import Counter, Histogram


class _Value:
    """A child's float: the part of prometheus-client's value interface that its samples read."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def get(self) -> float:
        return self.value

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.value = value

    def get_exemplar(self) -> None:
        return None


def _no_exemplar(exemplar: dict[str, str] | None) -> None:
    if exemplar:
        raise ValueError("loop metrics keep no exemplars")


class LoopCounter(Counter):
    """A Counter updated on one thread."""

    def _metric_init(self) -> None:
        self._value = _Value()
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        _no_exemplar(exemplar)
        self._value.value += amount


class LoopHistogram(Histogram):
    """A Histogram updated on one thread."""

    def _metric_init(self) -> None:
        self._created = time.time()
        self._sum = _Value()
        self._buckets = [_Value() for _ in self._upper_bounds]

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        _no_exemplar(exemplar)
        self._sum.value += amount
        if not math.isnan(amount):  # a NaN is in no bucket, as prometheus-client counts it
            self._buckets[bisect.bisect_left(self._upper_bounds, amount)].value += 1
