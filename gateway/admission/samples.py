"""A bounded window of recent measurements: the last N, none older than a maximum age."""

from __future__ import annotations

import math
from collections import deque


class RecentSamples:
    """The last `window` values, each forgotten `max_age_s` after it was seen; a nearest-rank quantile."""

    def __init__(self, window: int, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)  # (at, value)
        self._ranked: list[float] | None = None  # the values sorted, until the samples change

    def resize(self, window: int, max_age_s: float) -> None:
        """A reloaded policy's bounds, keeping the most recent samples that still fit."""
        self.max_age_s = max_age_s
        if window != self._samples.maxlen:
            self._samples = deque(self._samples, maxlen=window)
            self._ranked = None

    def add(self, value: float, now: float) -> None:
        self._samples.append((now, value))
        self._ranked = None
        self.expire(now)

    def expire(self, now: float) -> bool:
        """Forget the samples that aged out; True if any did."""
        cutoff = now - self.max_age_s
        expired = False
        while self._samples and self._samples[0][0] <= cutoff:
            self._samples.popleft()
            expired = True
        if expired:
            self._ranked = None
        return expired

    def __len__(self) -> int:
        return len(self._samples)

    def quantile(self, q: float) -> float:
        """The nearest-rank `q` quantile of the samples (there must be one); read on every admission that
        waits, so the sorted values are kept until the samples change."""
        if self._ranked is None:
            self._ranked = sorted(value for _, value in self._samples)
        return self._ranked[max(0, math.ceil(q * len(self._ranked)) - 1)]
