"""What a backend's prefix cache is expected to hold: the chunk chains (prefix_key.py) of the prompts the
gateway sent it recently, bounded as the engine's cache is bounded, forgotten as the engine forgets.

SGLang keeps a finished request's prompt in its radix tree until KV pressure evicts it, least recently
used leaves first. The index keeps a token budget (the backend's KV pool, `max_total_tokens`, once its
scrape told it; a default before), each chunk weighing its priced tokens, and evicts the least recently
used chunks while over it. A prompt sent touches its chunks deepest first, so a prefix is always at least
as recent as anything below it: eviction takes the deepest chunks of the oldest chains first, as the
engine takes leaves, and a prefix present means every shorter one is (a lookup is a binary search).

It is this replica's view: prompts other replicas sent to the same engine are not in it (the engine may
hold more than the index says, never placed for by this replica).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gateway.request.ticket import PrefixKey

DEFAULT_CAPACITY_TOKENS = 1 << 18  # until the backend's KV pool is known


@dataclass(slots=True)
class PrefixStats:
    """What the index predicted for the requests placed on its backend, and what the engine reported."""

    requests: int = 0  # placed on the backend with a prefix key
    hits: int = 0  # of them, with a cached prefix predicted
    prompt_tokens: int = 0  # their priced prompts
    predicted_tokens: int = 0  # the cached prefix predicted for them
    reported_prompt_tokens: int = 0  # the prompts of the answers that reported cached tokens
    reported_cached_tokens: int = 0  # and the cached tokens they reported

    def as_dict(self) -> dict[str, float | int | None]:
        prompt, reported = self.prompt_tokens, self.reported_prompt_tokens
        return {
            "requests": self.requests,
            "hits": self.hits,
            "hit_rate": round(self.hits / self.requests, 4) if self.requests else None,
            "predicted_token_share": round(self.predicted_tokens / prompt, 4) if prompt else None,
            "engine_token_share": round(self.reported_cached_tokens / reported, 4) if reported else None,
        }


class PrefixIndex:
    def __init__(self, capacity_tokens: int = DEFAULT_CAPACITY_TOKENS) -> None:
        self.capacity_tokens = capacity_tokens
        self.tokens = 0
        self._chunks: OrderedDict[bytes, int] = OrderedDict()  # key → its chunk's tokens, oldest first
        self.stats = PrefixStats()

    def __len__(self) -> int:
        return len(self._chunks)

    def match(self, key: PrefixKey | None) -> int:
        """Priced prompt tokens of the longest prefix of `key` the backend is expected to hold (0: none)."""
        if key is None or not key.keys or key.keys[0] not in self._chunks:
            return 0
        lo, hi = 0, len(key.keys) - 1  # keys[lo] is held; find the last one held
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if key.keys[mid] in self._chunks:
                lo = mid
            else:
                hi = mid - 1
        return key.ends[lo]

    def sent(self, key: PrefixKey, predicted: int, capacity_tokens: int | None) -> None:
        """A prompt went to the backend with `predicted` tokens of it expected cached: count it, hold its
        chunks as the most recent, and evict down to `capacity_tokens` (None: keep the last capacity)."""
        stats = self.stats
        stats.requests += 1
        stats.hits += predicted > 0
        stats.prompt_tokens += key.tokens
        stats.predicted_tokens += predicted
        if capacity_tokens is not None:
            self.capacity_tokens = capacity_tokens
        chunks = self._chunks
        for i in range(len(key.keys) - 1, -1, -1):  # deepest first: the prefix ends up the most recent
            k = key.keys[i]
            if k in chunks:
                chunks.move_to_end(k)
                continue
            weight = max(1, key.ends[i] - (key.ends[i - 1] if i else 0))
            chunks[k] = weight
            self.tokens += weight
        while self.tokens > self.capacity_tokens and chunks:
            self.tokens -= chunks.popitem(last=False)[1]

    def reported(self, prompt_tokens: int, cached_tokens: int) -> None:
        """An answer from the backend reported `cached_tokens` of its `prompt_tokens` served from cache."""
        self.stats.reported_prompt_tokens += prompt_tokens
        self.stats.reported_cached_tokens += cached_tokens

    def snapshot(self) -> dict[str, object]:
        """For /admin/state: its size against its budget, and how often it predicted a cached prefix."""
        return {
            "chunks": len(self._chunks),
            "tokens": self.tokens,
            "capacity_tokens": self.capacity_tokens,
            **self.stats.as_dict(),
        }
