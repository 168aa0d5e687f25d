"""Expected output tokens, learned online per (tenant, bucket) from the usage the backend reports.

An EWMA of completion tokens: cheap, forgets old behaviour at a known rate (alpha), and needs no clock.
Until `min_samples` observations exist the policy default stands in. The caller bounds the result by the
request's own cap (max_tokens) — a learned mean must never exceed what the client allowed. Keys are kept
in LRU order and capped, so a flood of tenant names cannot grow memory without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class _Stat:
    mean: float
    count: int


class KeyedEwma:
    """An EWMA per key pair, e.g. (tenant, bucket) (a plain average over the first 1/alpha samples),
    LRU-capped at `max_keys`."""

    def __init__(self, alpha: float = 0.1, min_samples: int = 5, max_keys: int = 10_000) -> None:
        self.alpha = alpha
        self.min_samples = min_samples
        self.max_keys = max_keys
        self._stats: OrderedDict[tuple[str, str], _Stat] = OrderedDict()

    def mean(self, first: str, second: str) -> float | None:
        """The learned mean once `min_samples` observations exist, else None."""
        stat = self._stats.get((first, second))
        return stat.mean if stat is not None and stat.count >= self.min_samples else None

    def observe(self, first: str, second: str, actual: float) -> None:
        key = (first, second)
        stat = self._stats.get(key)
        if stat is None:
            self._stats[key] = _Stat(float(actual), 1)
            if len(self._stats) > self.max_keys:
                self._stats.popitem(last=False)
            return
        self._stats.move_to_end(key)
        # Plain average while few samples exist, so the first observations are not biased to the first one.
        weight = max(self.alpha, 1.0 / (stat.count + 1))
        stat.mean += weight * (actual - stat.mean)
        stat.count += 1

    def snapshot(self) -> dict[tuple[str, str], tuple[float, int]]:
        """(mean, count) per key, for the admin API and tests."""
        return {k: (s.mean, s.count) for k, s in self._stats.items()}


class OutputEstimator(KeyedEwma):
    def __init__(
        self, default: int, alpha: float = 0.1, min_samples: int = 5, max_keys: int = 10_000
    ) -> None:
        super().__init__(alpha, min_samples, max_keys)
        self.default = default

    def expected(self, tenant: str, bucket: str, cap: int) -> int:
        """Expected completion tokens for a new request, never above `cap` and at least 1."""
        value = self.mean(tenant, bucket)
        return max(1, min(cap, round(self.default if value is None else value)))
