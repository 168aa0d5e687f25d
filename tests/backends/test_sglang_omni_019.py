"""The `sglang-omni` kind against what 0.1.9 (`version: later`) answers: overload told apart from a bad
request in every shape (a status, an error event before any output, one inside a started stream, speech's
message without a code), a drop the server's failure, stage replicas, the server's audio histograms, the PCM
format."""

from __future__ import annotations

import json

import pytest

from gateway.backends.kinds.errors import upstream_error
from gateway.backends.kinds.sglang_omni_scrape import read_omni_metrics
from gateway.relay.proxy import BrokenMidStream, CutAfterHeaders, UpstreamStatusError
from gateway.relay.sse import SSERelay, leading_error
from gateway.speech.pcm import PcmFormat
from tests.backends.test_sglang_omni_kind import _omni, _state

QUEUE_FULL = "The request queue is full."


def test_a_full_queue_before_the_answer_is_retried_and_signals_the_limit() -> None:
    body = json.dumps({"detail": QUEUE_FULL}).encode()
    verdict = _omni(version="later").judge(UpstreamStatusError(503, body), _state())
    assert (verdict.retry, verdict.overloaded, verdict.backend_fault, verdict.client_fault) == (
        True,
        True,
        False,
        False,
    )
    assert (verdict.error.status, verdict.error.message) == (503, QUEUE_FULL)


def test_an_error_event_before_any_output_reads_as_the_status_it_carries() -> None:
    event = {"error": {"message": QUEUE_FULL, "type": "server_error", "code": 503}}
    first = b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"
    status, body = leading_error(first) or (0, b"")
    assert status == 503 and json.loads(body) == event
    assert leading_error(b'data: {"error": {"message": "boom"}}\n\n') == (
        500,
        b'{"error": {"message": "boom"}}',
    )
    assert leading_error(b'data: {"id": "c", "choices": []}\n\n') is None
    assert leading_error(b"RIFF....") is None


@pytest.mark.parametrize(
    ("error", "overloaded", "backend_fault", "client_fault", "status"),
    [
        ({"message": QUEUE_FULL, "type": "server_error", "code": 503}, True, False, False, 503),
        (
            {"message": QUEUE_FULL, "type": "server_error", "param": None, "code": None},
            True,
            False,
            False,
            503,
        ),
        ({"message": "Stage thinker failed", "type": "server_error", "code": 500}, False, True, False, 500),
        (
            {"message": "Request has no prompt tokens", "type": "invalid_request_error", "code": 400},
            False,
            False,
            True,
            400,
        ),
    ],
)
def test_an_error_event_inside_a_started_stream(
    error: dict[str, object], overloaded: bool, backend_fault: bool, client_fault: bool, status: int
) -> None:
    verdict = _omni(version="later").judge_event(error, _state())
    assert (verdict.overloaded, verdict.backend_fault, verdict.client_fault) == (
        overloaded,
        backend_fault,
        client_fault,
    )
    assert verdict.error.status == status and not verdict.retry


@pytest.mark.parametrize("cut", [CutAfterHeaders("x"), BrokenMidStream("x")])
def test_a_dropped_stream_is_the_servers_failure_on_0_1_9_and_the_requests_on_the_snapshot(
    cut: Exception,
) -> None:
    assert isinstance(cut, CutAfterHeaders | BrokenMidStream)
    later = _omni(version="later").judge(cut, _state())
    snapshot = _omni(version="snapshot").judge(cut, _state())
    assert (later.backend_fault, later.client_fault) == (True, False)
    assert (snapshot.backend_fault, snapshot.client_fault) == (False, True)


def test_stage_replicas_multiply_that_stages_cap() -> None:
    kind, state = _omni(version="later"), _state()
    health = {
        "running": True,
        "stages": ["preprocessing", "thinker@r0", "thinker@r1", "talker_ar@r0", "code2wav"],
        "total_requests": 0,
        "pending_completions": 0,
    }
    assert kind._read_health(state, json.dumps(health).encode())
    limits = {s.name: s.limit for s in kind.capacity(state).stages}
    assert (limits["thinker"], limits["talker"]) == (128, 32)
    assert kind.speaks(state)
    kind._read_health(state, json.dumps({**health, "stages": ["thinker@r0", "decode"]}).encode())
    assert not kind.speaks(state) and [s.name for s in kind.capacity(state).stages] == ["encoder", "thinker"]


@pytest.mark.parametrize(
    "names", [("audio_ttfp_s", "audio_duration_s"), ("audio_ttfp_seconds", "audio_output_duration_seconds")]
)
def test_the_servers_audio_histograms_in_either_spelling(names: tuple[str, str]) -> None:
    ttfp, duration = names
    text = "\n".join(
        [
            f"# TYPE sglang_omni:{ttfp} histogram",
            f'sglang_omni:{ttfp}_bucket{{le="+Inf"}} 2.0',
            f"sglang_omni:{ttfp}_count 2.0",
            f"sglang_omni:{ttfp}_sum 0.5",
            "# TYPE sglang_omni:audio_rtf histogram",
            'sglang_omni:audio_rtf_bucket{le="+Inf"} 2.0',
            "sglang_omni:audio_rtf_count 2.0",
            "sglang_omni:audio_rtf_sum 0.6",
            f"# TYPE sglang_omni:{duration} histogram",
            f'sglang_omni:{duration}_bucket{{le="+Inf"}} 2.0',
            f"sglang_omni:{duration}_count 2.0",
            f"sglang_omni:{duration}_sum 7.25",
        ]
    )
    audio = read_omni_metrics(text + "\n").audio
    assert audio == {"ttfp_s_mean": 0.25, "rtf_mean": 0.3, "audio_seconds": 7.25, "answers": 2.0}
    assert read_omni_metrics("").audio is None


def test_the_pcm_format_times_bytes_by_its_headers() -> None:
    pcm = PcmFormat.of({"x-sample-rate": "24000", "x-channels": "1", "x-bit-depth": "16"})
    assert pcm is not None and pcm.seconds(48_000) == 1.0
    assert PcmFormat.of({"x-sample-rate": "16000", "x-channels": "2"}).seconds(64_000) == 1.0  # type: ignore[union-attr]
    assert PcmFormat.of({"content-type": "audio/pcm"}) is None


def test_a_speech_sse_stream_ends_with_its_done_event_and_its_pcm_is_timed_by_the_rate() -> None:
    relay = SSERelay(False, pcm_rate=24000)
    delta = json.dumps({"type": "speech.audio.delta", "audio": "AAAA" * 8000}).encode()  # 24000 bytes
    done = json.dumps(
        {
            "type": "speech.audio.done",
            "usage": {"input_tokens": 7, "output_tokens": 0, "total_tokens": 7},
            "finish_reason": "stop",
        }
    ).encode()
    out = relay.feed(b"data: " + delta + b"\n\ndata: " + done + b"\n\n", 1.0)
    assert out.endswith(done + b"\n\n") and relay.done
    assert relay.audio.seconds == 0.5
    assert relay.usage == {"prompt_tokens": 7, "completion_tokens": 0}


def test_a_speech_400_names_its_field_from_the_envelope_or_the_message() -> None:
    named = {
        "error": {
            "message": "speed must be between 0.25 and 4.0",
            "type": "BadRequestError",
            "param": "speed",
            "code": 400,
        }
    }
    unnamed = {
        "error": {"message": "input: Field required", "type": "BadRequestError", "param": None, "code": 400}
    }
    assert upstream_error(400, json.dumps(named).encode()).param == "speed"
    assert upstream_error(400, json.dumps(unnamed).encode()).param == "input"
    assert upstream_error(400, json.dumps({"detail": "Error: nope"}).encode()).param is None
