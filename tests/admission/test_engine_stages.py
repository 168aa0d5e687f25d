"""Staged capacity: per-stage budgets on a sglang-omni backend, what a request holds, the RTF-adaptive
speaking budgets, and the dispatcher skipping speech (not text) when the talker is full."""

from __future__ import annotations

import pytest

from gateway.admission.dispatch import Dispatcher
from gateway.admission.engine_stages import StageBook
from gateway.admission.families import Ask
from gateway.admission.settings import StagePolicy
from gateway.backends.kinds import adapter_for
from gateway.backends.state import BackendState
from gateway.request.ticket import Cost, Relayed, Ticket
from gateway.settings.config import PoolConfig
from gateway.speech.meter import SpeechMeter
from tests.admission.helpers import decision, entry, miss

CTX = decision()

pytestmark = pytest.mark.unit


class _Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _book(policy: StagePolicy | None = None, clock: _Clock | None = None, **server: object) -> StageBook:
    pool = {
        "name": "s",
        "kind": "sglang-omni",
        "models": ["m"],
        "backends": ["http://b:1"],
        "sglang_omni": {"version": "later", **server},
    }
    kind = adapter_for(PoolConfig.model_validate(pool))
    p = policy or StagePolicy()
    return StageBook(kind, lambda: p, clock or _Clock())


def _backend(limit: int = 100) -> BackendState:
    b = BackendState(url="http://b:1", pool="s")
    b.concurrency_limit = limit
    return b


_n = iter(range(1_000_000))


def _ticket(voice: str | None = None, rtf: float | None = None, **cost: int) -> Ticket:
    t = Ticket(id=f"r{next(_n)}", model="m", stream=True, arrival=0.0, voice=voice, cost=Cost(**cost))
    t.relayed = Relayed(rtf=rtf)
    return t


def _budgets(book: StageBook, b: BackendState) -> dict[str, float | None]:
    return {s["stage"]: s["budget"] for s in book.snapshot(b, None)}


def test_budgets_are_the_servers_caps_and_the_policys_overrides() -> None:
    b = _backend(limit=40)
    assert _budgets(_book(), b) == {"encoder": 32, "thinker": 64, "talker": 32, "code2wav": None}
    assert _budgets(_book(StagePolicy(talker=4, code2wav_audio_seconds_per_s=6)), b)["talker"] == 4
    assert _budgets(_book(StagePolicy(code2wav_audio_seconds_per_s=6)), b)["code2wav"] == 6
    assert _budgets(_book(code2wav_audio_seconds_per_s=3.0), b)["code2wav"] == 3


def test_a_speaking_request_holds_the_talker_and_a_real_time_stream_text_only_the_thinker() -> None:
    book, b = _book(StagePolicy(talker=2, code2wav_audio_seconds_per_s=8)), _backend()
    speaking = [_ticket("default"), _ticket("default")]
    for t in speaking:
        assert book.full(t, b) is None
        book.commit(Ask(t, 0.0, 0), b, CTX)
    assert book.full(_ticket("default"), b) == "stage_talker"
    assert book.full(_ticket(), b) is None  # text only: the thinker has room
    use = {s["stage"]: s["use"] for s in book.snapshot(b, None)}
    assert use == {"encoder": 0, "thinker": 2, "talker": 2, "code2wav": 2}
    blocks = {s["stage"]: s["blocks_head"] for s in book.snapshot(b, _ticket("default"))}
    assert blocks == {"encoder": False, "thinker": False, "talker": True, "code2wav": False}
    book.release(speaking[0], b, 0.0)
    assert book.full(_ticket("default"), b) is None


def test_media_items_wait_for_one_encoder_batch_until_the_first_byte() -> None:
    book, b = _book(StagePolicy(encoder_batch=4)), _backend()
    first = _ticket(images=3)
    book.commit(Ask(first, 0.0, 0), b, CTX)
    assert book.full(_ticket(images=2), b) == "stage_encoder"
    assert book.full(_ticket(images=1), b) is None
    book.started(first, b.url, 0.0)
    assert book.full(_ticket(images=2), b) is None
    assert _book(StagePolicy(encoder_batch=4)).full(_ticket(images=9), _backend()) is None  # alone: goes


def test_the_talker_budget_follows_the_streams_real_time_factor() -> None:
    book, b = _book(StagePolicy(talker=10, rtf_target=0.8, decrease=0.5)), _backend()
    crowd = [_ticket("default", rtf=1.6) for _ in range(8)]
    for t in crowd:
        book.commit(Ask(t, 0.0, 0), b, CTX)
    book.release(crowd[0], b, 0.0)  # 8 × 0.8 / 1.6 = 4 streams would have met 0.8; one step goes to 10 × 0.5
    assert _budgets(book, b)["talker"] == 5
    book.release(crowd[1], b, 0.0)  # 7 × 0.8 / 1.6 = 3.5, within one step
    assert _budgets(book, b)["talker"] == 3.5
    crowd[2].relayed = Relayed(rtf=0.3)
    book.release(crowd[2], b, 0.0)  # fast while the budget had no room (6 speaking): one more
    assert _budgets(book, b)["talker"] == 4.5
    for t in crowd[3:]:
        t.relayed = Relayed(rtf=0.7)
        book.release(t, b, 0.0)  # within the target, not below 0.8 × 0.75: unchanged
    assert _budgets(book, b)["talker"] == 4.5
    for _ in range(20):
        t = _ticket("default", rtf=5.0)
        book.commit(Ask(t, 0.0, 0), b, CTX)
        book.release(t, b, 0.0)
    assert _budgets(book, b)["talker"] == 1  # min_speaking
    fast = _ticket("default", rtf=0.3)
    book.commit(Ask(fast, 0.0, 0), b, CTX)
    book.release(fast, b, 0.0)  # alone at a budget of one: full, and fast
    assert _budgets(book, b)["talker"] == 2


def _speak(meter: SpeechMeter, start: float, gap: float, chunks: int, seconds: float = 0.8) -> None:
    for i in range(chunks):
        meter.add(start + i * gap, seconds)


def test_speech_is_admitted_within_the_audio_rate_its_streams_get_now() -> None:
    """Each stream needs one audio second per wall second; the backend's rate is the sum of what its
    streams get now, and a speaking request goes while the streams, itself included, fit rate × target."""
    clock = _Clock()
    book, b = _book(StagePolicy(rtf_target=0.8), clock), _backend()
    first = _ticket("default")
    assert book.full(first, b) is None
    book.commit(Ask(first, 0.0, 0), b, CTX)
    assert book.full(_ticket("default"), b) is None  # nothing measured: the talker's budget alone
    first.speech = SpeechMeter()
    _speak(first.speech, 95.0, 0.16, 6)  # 0.8 s of audio every 0.16 s: 5 audio s/s
    clock.now = 95.8
    assert book.measured_rate(b) == pytest.approx(5.0)
    others = [_ticket("default") for _ in range(3)]
    for t in others:  # 4 × 1 ≤ 5 × 0.8
        assert book.full(t, b) is None
        book.commit(Ask(t, 0.0, 0), b, CTX)
    assert book.full(_ticket("default"), b) == "stage_code2wav"
    assert book.full(_ticket(), b) is None  # text passes
    for t in (first, *others):  # shared four ways: 2.5 audio s/s each, 10 in all: room for 8 streams
        t.speech = SpeechMeter()
        _speak(t.speech, 96.0, 0.32, 6)
    clock.now = 97.6
    assert book.measured_rate(b) == pytest.approx(10.0)
    assert _budgets(book, b)["code2wav"] == 8
    clock.now = 97.6 + 0.32 * 3  # no chunk for three usual gaps: each stream's speed falls
    assert book.measured_rate(b) == pytest.approx(4 * 4.0 / (1.6 + 0.64))
    for t in (first, *others):
        book.release(t, b, 0.0)
    # what the streams left got, measured as each ended; it stands while no stream shows a speed
    assert book.measured_rate(b) == pytest.approx(4.0 / (1.6 + 0.64))
    fresh = _ticket("default")
    book.commit(Ask(fresh, 0.0, 0), b, CTX)
    fresh.speech = SpeechMeter()
    _speak(fresh.speech, clock.now - 0.8, 0.16, 6)
    assert _budgets(book, b)["code2wav"] == pytest.approx(4.0)  # what it gets now: 5 audio s/s × 0.8
    fresh.speech = None
    assert book.measured_rate(b) == pytest.approx(4.0 / (1.6 + 0.64))  # /admin/state read it, kept nothing
    assert _budgets(_book(StagePolicy(code2wav_audio_seconds_per_s=6), clock), b)["code2wav"] == 6


def test_the_dispatcher_lets_text_pass_a_speech_request_waiting_for_the_talker() -> None:
    d = Dispatcher(stages=_book(StagePolicy(talker=1)))
    b = _backend()
    ctx = decision(limit=100)
    first = _ticket("default")
    d.commit(first, b, ctx)
    waiting_speech, text = _ticket("default"), _ticket()
    order = [entry(waiting_speech, now=0.0), entry(text, now=0.1)]
    placed = d.place(order, [b], ctx)
    assert placed is not None and placed[0].ticket is text
    assert d.blocked_by(order[0], [b], ctx) == {b.url: "stage_talker"}
    d.release(first, b, 1.0)
    placed = d.place(order, [b], ctx)
    assert placed is not None and placed[0].ticket is waiting_speech


def test_a_speaking_request_does_not_take_a_thinker_slot_from_text() -> None:
    d = Dispatcher(stages=_book())
    b = _backend()
    ctx = decision(limit=2)
    for t in (_ticket("default"), _ticket("default")):
        d.commit(t, b, ctx)
    assert miss(d, _ticket(), b, ctx) is None  # two speaking: the limit of 2 is text's
    d.commit(_ticket(), b, ctx)
    d.commit(_ticket(), b, ctx)
    assert miss(d, _ticket(), b, ctx) == "concurrency"


def test_speech_leaves_the_queue_in_time_for_its_first_audio() -> None:
    """A speaking request waits for a stream to end (no slot turnover predicts it) and must leave the
    queue the measured dispatch-to-first-audio lag before its deadline."""
    book, b = _book(StagePolicy(talker=1)), _backend()
    d = Dispatcher(stages=book)
    ctx = decision(limit=100)
    spoken = _ticket("default")
    d.commit(spoken, b, ctx)
    assert d.slot_wait(entry(_ticket("default"), now=0.0), [b], ctx, 0.0, 60.0) is None
    assert d.slot_wait(entry(_ticket(), now=0.0), [b], ctx, 0.0, 60.0) == 0.0
    assert book.first_audio_lag(_ticket("default")) == 0.0  # nothing measured yet
    spoken.dispatched_at, spoken.relayed = 10.0, Relayed(first_audio_at=10.5)
    d.release(spoken, b, 12.0)
    later = _ticket("default")
    later.dispatched_at, later.relayed = 20.0, Relayed(first_audio_at=21.5)
    d.commit(later, b, ctx)
    d.release(later, b, 23.0)
    assert book.first_audio_lag(_ticket("default")) == pytest.approx(0.5 + 0.2 * (1.5 - 0.5))
    assert book.first_audio_lag(_ticket()) == 0.0  # text: its first token is its first output
