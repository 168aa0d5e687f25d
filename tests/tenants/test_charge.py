"""The charge rule (gateway/tenants/charge.py) and the relay's answer count it relies on, on pure values."""

from __future__ import annotations

import orjson
import pytest

from gateway.estimate.text import estimate_text_tokens
from gateway.sse import SSERelay, whole_answer_tokens
from gateway.tenants.charge import Inferred, billable, infer
from gateway.ticket import Cost, Outcome, Ticket, Usage


def _ticket(outcome: Outcome = Outcome.PENDING, reached: bool = True) -> Ticket:
    t = Ticket(id="r", model="m", stream=True, arrival=0.0, cost=Cost(text_tokens=100, vision_tokens=900))
    t.outcome, t.reached_engine = outcome, reached
    return t


def test_the_engines_usage_is_charged_as_reported() -> None:
    t = _ticket(Outcome.OK)
    t.usage = Usage(1003, 42)
    assert billable(t) == Usage(1003, 42) and t.usage_inferred is None


def test_nothing_is_charged_for_a_request_that_never_reached_an_engine() -> None:
    t = _ticket(Outcome.CANCELLED, reached=False)
    assert billable(t) == Usage(0, 0) and t.usage is None and t.usage_inferred is None


def test_leaving_before_the_first_byte_pays_the_priced_prompt() -> None:
    t = _ticket(Outcome.CANCELLED)
    assert billable(t) == Usage(1000, 0) and t.usage_inferred == Inferred.CLIENT_LEFT


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        (Outcome.PENDING, Inferred.CLIENT_LEFT),
        (Outcome.CANCELLED, Inferred.CLIENT_LEFT),
        (Outcome.UPSTREAM_ERROR, Inferred.STREAM_CUT),
        (Outcome.TIMEOUT, Inferred.STREAM_CUT),
        (Outcome.OK, Inferred.NO_USAGE),
    ],
)
def test_an_inferred_charge_says_why(outcome: Outcome, reason: Inferred) -> None:
    t = _ticket(outcome)
    assert infer(t, 17) == Usage(1000, 17) and t.usage_inferred == reason
    assert billable(t) == Usage(1000, 17)  # inferred once; billable keeps it


def _chunk(content: str) -> bytes:
    obj = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}], "usage": None}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_the_relay_counts_the_answer_text_not_its_chunks() -> None:
    relay = SSERelay(False, estimate_text_tokens)
    pieces = ["Hello", ' world, "quoted" \\ and', " 数据库 chunks", " more words here"]
    for i, piece in enumerate(pieces):
        relay.feed(_chunk(piece), float(i))
    assert relay.content_chunks == 4
    assert relay.answer_tokens() == estimate_text_tokens("".join(pieces))


def test_the_relay_charges_at_least_one_token_per_content_chunk() -> None:
    relay = SSERelay(False, lambda text: 0)
    for i in range(5):
        relay.feed(_chunk("x"), float(i))
    assert relay.answer_tokens() == 5


def test_a_long_answer_is_counted_without_keeping_it() -> None:
    relay = SSERelay(False, estimate_text_tokens)
    word = " harbor" * 100
    for i in range(200):  # ~140 KB of text: counted in 64 KiB slices as it passes
        relay.feed(_chunk(word), float(i))
    assert len(relay._text) < 1 << 16
    assert abs(relay.answer_tokens() - estimate_text_tokens(word * 200)) <= 3


def test_a_whole_answer_is_counted_from_its_message_text() -> None:
    answer = {"choices": [{"message": {"content": "one two three"}}, {"text": " four"}]}
    assert whole_answer_tokens(answer, estimate_text_tokens) == estimate_text_tokens("one two three four")
    assert whole_answer_tokens(None, estimate_text_tokens) == 0
    assert whole_answer_tokens({"choices": "junk"}, estimate_text_tokens) == 0
