"""The charge rule (gateway/tenants/charge.py), the relay's answer count and the engine's predicted progress
(gateway/backends/progress.py) it relies on, on pure values."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.backends.progress import EngineProgress
from gateway.estimate.text import estimate_text_tokens
from gateway.http.stream_end import reported_usage
from gateway.relay.sse import SSERelay, whole_answer_tokens
from gateway.request.ticket import Cost, Ending, Outcome, Prefill, Ticket, Usage
from gateway.tenants.charge import Inferred, billable, charged_prompt, infer, left_waiting


def _ticket(outcome: Outcome = Outcome.PENDING, reached: bool = True) -> Ticket:
    t = Ticket(id="r", model="m", stream=True, arrival=0.0, cost=Cost(text_tokens=100, vision_tokens=900))
    t.ending, t.reached_engine = Ending(outcome), reached
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
    assert infer(t, 17, outcome) == Usage(1000, 17) and t.usage_inferred == reason
    assert billable(t) == Usage(1000, 17)  # inferred once; billable keeps it


def test_a_guessed_prompt_is_the_lesser_of_the_price_and_the_engines_predicted_count() -> None:
    over, under = _ticket(Outcome.CANCELLED), _ticket(Outcome.CANCELLED)
    over.prefill = Prefill(1, 0.0, 0.1, 1200)  # the engine counts prompts of its kind above our price
    under.prefill = Prefill(1, 0.0, 0.1, 800)
    cut = Outcome.CANCELLED
    assert infer(over, 3, cut) == Usage(1000, 3) and infer(under, 3, cut) == Usage(800, 3)


@pytest.mark.parametrize(
    ("usage", "charged"),
    [
        ({"prompt_tokens": 26, "completion_tokens": 108, "total_tokens": 134}, Usage(26, 108)),
        ({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, Usage(0, 0)),  # left the queue
        ({"prompt_tokens": 900, "completion_tokens": 0}, Usage(900, 0)),  # ended within its prefill
        ({"prompt_tokens": None, "completion_tokens": 5}, Usage(0, 5)),
        ({"prompt_tokens": "12", "completion_tokens": -3}, Usage(0, 0)),
        # --enable-cache-report: the cached prefix, never more than the prompt; null details: not told
        (
            {"prompt_tokens": 900, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 640}},
            Usage(900, 5, 640),
        ),
        (
            {"prompt_tokens": 9, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}},
            Usage(9, 5, 9),
        ),
        ({"prompt_tokens": 9, "completion_tokens": 5, "prompt_tokens_details": None}, Usage(9, 5, None)),
    ],
)
def test_an_ended_request_is_charged_the_usage_the_engine_reported(
    usage: dict[str, Any], charged: Usage
) -> None:
    assert reported_usage(usage) == charged


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


def _sent(progress: EngineProgress, at: float, prompt: int = 1000, stream: bool = True) -> Ticket:
    t = Ticket(
        id=f"r{at}", model="m", stream=stream, arrival=at, cost=Cost(text_tokens=prompt, max_output_tokens=50)
    )
    t.reached_engine = True
    progress.sent(t, at, prefill_rate=1000.0)  # 1 s per 1000 tokens
    return t


def test_a_prefill_starts_at_once_or_with_the_next_batch() -> None:
    progress = EngineProgress()
    first = _sent(progress, 10.0)
    second, third = _sent(progress, 10.5, prompt=500), _sent(progress, 10.7, prompt=300)
    assert first.prefill == Prefill(1, 10.0, 1.0, 1000)  # no prefill running: at once
    assert second.prefill == Prefill(2, 11.0, 0.5, 500)  # both wait for it and go together
    assert third.prefill == Prefill(2, 11.0, 0.3, 300)
    fourth = _sent(progress, 11.2)  # behind the batch of the two, which ends at 11.8
    assert fourth.prefill is not None and (fourth.prefill.batch, fourth.prefill.at) == (
        3,
        pytest.approx(11.8),
    )
    assert _sent(progress, 20.0).prefill == Prefill(4, 20.0, 1.0, 1000)  # an idle engine starts it at once


def test_a_first_byte_ends_its_batch_and_starts_the_next() -> None:
    progress = EngineProgress()
    first = _sent(progress, 10.0)
    waiting = _sent(progress, 10.1)
    progress.first_token(first, 10.6)  # prefilled 0.4 s sooner than predicted: the next batch runs now
    assert (progress.batch, progress.running_from, progress.running_until) == (2, 10.6, 11.6)
    assert progress.reached(waiting, 10.7)  # it was in that batch
    later = _sent(progress, 10.8)
    progress.first_token(later, 11.0)  # its batch ran already: engine faster than predicted
    assert (progress.batch, progress.running_until, progress.next_s) == (3, 11.0, 0.0)
    progress.first_token(first, 12.0)  # a batch long gone: nothing to move
    assert (progress.batch, progress.running_until) == (3, 11.0)


def test_output_after_a_batch_started_shows_it_over() -> None:
    progress = EngineProgress()
    progress.output(10.5)  # no decode pace yet: no evidence
    _sent(progress, 10.0)
    waiting = _sent(progress, 10.1)
    progress.output(10.5)
    assert progress.running_until == 11.0
    progress.answered(0.02)
    progress.output(10.01)  # within a decode step of the batch's start: may have been sent before it
    assert progress.running_until == 11.0
    progress.output(10.5)  # the engine decodes: the batch is over and the next one runs
    assert (progress.batch, progress.running_from, progress.running_until) == (2, 10.5, 11.5)
    assert progress.reached(waiting, 10.6)
    progress.output(10.51)  # the same step's other outputs: the batch that just started stays
    assert progress.running_until == 11.5


def test_a_request_is_let_off_only_if_its_batch_would_wait_even_as_early_as_recent_batches_ended() -> None:
    progress = EngineProgress()
    first = _sent(progress, 10.0)
    progress.first_token(first, 10.6)  # ended 0.4 s sooner than predicted
    assert progress.early_s == pytest.approx(0.2 * 0.4)
    _sent(progress, 20.0)  # a batch predicted to run to 21.0
    queued = _sent(progress, 20.1)
    assert not progress.reached(queued, 20.9)  # 20.9 + 0.08 is still before 21.0
    again = _sent(progress, 20.9)
    assert progress.reached(again, 20.95)  # the batch ahead may have ended by now


def test_an_inferred_prompt_is_counted_as_the_engine_counts_prompts_of_its_kind_at_most_our_price() -> None:
    progress = EngineProgress()
    progress.counted("text", 1000, 900)
    progress.counted("text", 1000, 800)  # the ratio follows recent answers
    progress.counted("single_image", 0, 500)  # nothing priced: no sample
    assert progress.prompt_ratio == {"text": pytest.approx(0.88)}
    left = _sent(progress, 10.0)
    left_waiting(left, progress, 10.5, runs_on=False)
    assert left.usage == Usage(880, 0)
    progress.prompt_ratio["text"] = 1.12  # the engine counts more than we priced: the guess is our price
    above = _sent(progress, 30.0)
    left_waiting(above, progress, 30.5, runs_on=False)
    assert above.usage == Usage(1000, 0)
    other = Ticket(
        id="i", model="m", stream=True, arrival=0.0, cost=Cost(vision_tokens=800), bucket="single_image"
    )
    progress.sent(other, 20.0, prefill_rate=1000.0)
    assert other.prefill is not None and other.prefill.tokens == 800  # no answer of its kind yet: our price


def test_an_engine_that_stops_a_request_late_is_charged_what_it_did_until_then() -> None:
    """SGLang's HTTP server aborts a stream ~2 s after its connection closed: a request still waiting when
    its client left is prefilled if its batch starts within that delay, and a whole answer decodes on."""
    progress = EngineProgress()
    progress.answered(0.1)
    _sent(progress, 10.0)  # runs to 11.0
    queued = _sent(progress, 10.1)
    left_waiting(queued, progress, 10.2, runs_on=False, abort_delay=2.0)
    assert queued.usage == Usage(1000, 0) and queued.usage_inferred == Inferred.CLIENT_LEFT
    whole = _sent(progress, 20.0, stream=False)  # prefilled by 21.0
    left_waiting(whole, progress, 21.0, runs_on=False, abort_delay=2.0)
    assert whole.usage == Usage(1000, 21)  # the first token, then 2 s of 0.1 s steps


def test_a_request_the_engine_refused_leaves_its_batch() -> None:
    progress = EngineProgress()
    alone, queued = _sent(progress, 10.0), _sent(progress, 10.2)
    progress.dropped(queued, 10.3)
    assert progress.next_s == 0.0
    progress.dropped(alone, 10.3)  # it ran alone: its batch is over
    assert progress.running_until == 10.3
    assert _sent(progress, 10.4).prefill == Prefill(2, 10.4, 1.0, 1000)


def test_leaving_before_the_predicted_prefill_charges_nothing_and_leaves_its_batch() -> None:
    progress = EngineProgress()
    _sent(progress, 10.0)
    queued = _sent(progress, 10.0)
    left_waiting(queued, progress, 10.5, runs_on=False)
    assert queued.usage == Usage(0, 0) and queued.usage_inferred == Inferred.LEFT_QUEUED
    assert billable(queued) == Usage(0, 0)
    assert progress.next_s == 0.0  # its second of prefill is out of the next batch


def test_a_server_that_runs_on_prefills_a_request_whose_client_left_while_queued() -> None:
    progress = EngineProgress()
    _sent(progress, 10.0)
    queued = _sent(progress, 10.0)
    left_waiting(queued, progress, 10.5, runs_on=True)
    assert queued.usage == Usage(1000, 0) and queued.usage_inferred == Inferred.CLIENT_LEFT
    assert progress.next_s == 1.0


def test_leaving_after_the_prefill_started_charges_the_prompt() -> None:
    progress = EngineProgress()
    t = _sent(progress, 10.0)
    left_waiting(t, progress, 10.2, runs_on=False)
    assert t.usage == Usage(1000, 0) and t.usage_inferred == Inferred.CLIENT_LEFT


def test_a_whole_answer_left_mid_generation_pays_the_tokens_decoded_at_the_measured_pace() -> None:
    progress = EngineProgress()
    progress.answered(0.05)
    progress.answered(0.10)  # the pace follows recent answers
    assert progress.token_s == pytest.approx(0.06)
    t = _sent(progress, 10.0, stream=False)  # prefill ends at 11.0 with the first token
    left_waiting(t, progress, 11.63, runs_on=False)  # 0.63 s of decoding: 10 steps
    assert t.usage == Usage(1000, 11) and t.usage_inferred == Inferred.CLIENT_LEFT
    late = _sent(progress, 20.0, stream=False)
    left_waiting(late, progress, 100.0, runs_on=False)
    assert late.usage == Usage(1000, 50)  # never more than its max_tokens


def test_decode_steps_since_a_moment_follow_the_pace() -> None:
    progress = EngineProgress()
    assert progress.decoded(10.0, 11.0) == 0  # no pace measured yet
    progress.answered(0.02)
    assert (progress.decoded(10.0, 10.07), progress.decoded(10.0, 9.0)) == (3, 0)


def test_a_whole_answer_is_charged_its_prompt_until_a_pace_was_measured() -> None:
    progress = EngineProgress()
    t = _sent(progress, 10.0, stream=False)
    left_waiting(t, progress, 15.0, runs_on=False)
    assert t.usage == Usage(1000, 0)


def test_a_request_that_never_reached_the_engine_is_left_uncharged() -> None:
    progress = EngineProgress()
    t = Ticket(id="r", model="m", stream=True, arrival=0.0, cost=Cost(text_tokens=1000))
    left_waiting(t, progress, 1.0, runs_on=False)
    assert t.usage is None and billable(t) == Usage(0, 0)


@pytest.mark.parametrize(
    ("usage", "share", "charged"),
    [
        (Usage(900, 5, 640), 1.0, 900),  # the default: full price, as if nothing were cached
        (Usage(900, 5, 640), 0.25, 260 + 160),
        (Usage(900, 5, 641), 0.25, 259 + 161),  # a cached share rounds up
        (Usage(900, 5, 640), 0.0, 260),
        (Usage(900, 5, None), 0.25, 900),  # not told: the whole prompt
    ],
)
def test_cached_prompt_tokens_are_charged_at_the_policys_share(
    usage: Usage, share: float, charged: int
) -> None:
    assert charged_prompt(usage, share) == charged
