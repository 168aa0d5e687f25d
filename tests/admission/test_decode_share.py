"""The share of a request's decode its engine spent on the prefill the gateway sent it (decode_share.py)."""

from __future__ import annotations

import pytest

from gateway.admission.decode_share import PrefillSeen
from tests.admission.helpers import ticket


def test_share_counts_the_prompts_sent_to_its_backend_after_its_first_byte() -> None:
    seen = PrefillSeen()
    decoding, other = ticket(prompt=10), ticket(prompt=10)
    seen.sent("http://b0", 5000)  # before its first byte: not its decode's
    seen.started(decoding, "http://b0", 10.0)
    seen.sent("http://b0", 3000)
    seen.sent("http://b1", 9000)  # another engine's prefill
    assert seen.share(decoding, 14.0, rate=1000.0) == pytest.approx(0.75)  # 3000 / 1000 / 4 s
    assert seen.share(decoding, 15.0, rate=1000.0) is None  # forgotten once read
    assert seen.share(other, 15.0, rate=1000.0) is None  # never started


def test_share_is_at_most_one_and_none_without_decode_time() -> None:
    seen = PrefillSeen()
    a, b = ticket(prompt=10), ticket(prompt=10)
    seen.started(a, "http://b0", 10.0)
    seen.started(b, "http://b0", 10.0)
    seen.sent("http://b0", 50000)
    assert seen.share(a, 11.0, rate=1000.0) == 1.0  # more sent than the engine could run: all of it
    assert seen.share(b, 10.0, rate=1000.0) is None
