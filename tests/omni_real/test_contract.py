"""The sglang-omni contract: every route and answer shape omnigate's `sglang-omni` kind relies on, checked
against sglang-omni 0.1.9's own HTTP app (its real `create_app` and `Client`, a stand-in coordinator) and
against the simulator's later release. A difference between the two fails here before it reaches the
adapter."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import pytest

from tests.omni_real.conftest import Omni
from tests.omni_real.realapp import MODEL

pytestmark = pytest.mark.e2e

QUEUE_FULL = "The request queue is full."
PCM_HEADERS = {"content-type": "audio/pcm", "x-sample-rate": "24000", "x-channels": "1", "x-bit-depth": "16"}


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}


def speech(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": text, "voice": "default", **extra}


def events(raw: bytes) -> list[Any]:
    """The SSE data payloads in order (`[DONE]` as the string)."""
    out: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def post(omni: Omni, path: str, body: Any) -> httpx.Response:
    return httpx.post(omni.url + path, json=body, timeout=30.0, trust_env=False)


def test_health_lists_the_pipeline_and_its_counts(omni: Omni) -> None:
    reply = httpx.get(omni.url + "/health", trust_env=False)
    assert reply.status_code == 200
    body = reply.json()
    assert body["status"] == "healthy" and body["running"] is True
    assert {"thinker", "talker_ar", "code2wav"} <= set(body["stages"])
    assert body["entry_stage"] == "preprocessing"
    assert body["total_requests"] == 0 and body["pending_completions"] == 0


def test_an_unhealthy_coordinator_is_a_503_saying_so(omni: Omni) -> None:
    with omni.unhealthy():
        reply = httpx.get(omni.url + "/health", trust_env=False)
    assert reply.status_code == 503
    assert reply.json()["status"] == "unhealthy" and reply.json()["running"] is False


def test_models_lists_the_one_served_model(omni: Omni) -> None:
    body = httpx.get(omni.url + "/v1/models", trust_env=False).json()
    assert body["object"] == "list"
    assert [(m["id"], m["owned_by"], m["root"]) for m in body["data"]] == [(MODEL, "sglang-omni", MODEL)]


def test_whole_chat_answers_text_and_usage_and_checks_no_model(omni: Omni) -> None:
    body = post(omni, "/v1/chat/completions", chat("Hi", model="not-served")).json()
    assert body["object"] == "chat.completion" and body["model"] == "not-served"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert (
        isinstance(body["choices"][0]["message"]["content"], str) and body["choices"][0]["message"]["content"]
    )
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_whole_chat_with_audio_holds_one_wav(omni: Omni) -> None:
    body = post(omni, "/v1/chat/completions", chat("Hi", modalities=["text", "audio"])).json()
    audio = body["choices"][0]["message"]["audio"]
    assert audio["id"].startswith("audio-")
    wav = base64.b64decode(audio["data"])
    assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE" and int.from_bytes(wav[24:28], "little") == 24000


@pytest.mark.parametrize("fmt", ["wav", "pcm"])
def test_streamed_chat_sends_text_then_audio_deltas_then_usage_then_done(omni: Omni, fmt: str) -> None:
    body = chat("Hi", stream=True, modalities=["text", "audio"], audio={"voice": "default", "format": fmt})
    reply = post(omni, "/v1/chat/completions", body)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    got = events(reply.content)
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    audio = [c["choices"][0]["delta"]["audio"] for c in chunks if "audio" in c["choices"][0]["delta"]]
    assert audio and all(a["id"].startswith("audio-") for a in audio)
    for a in audio:
        data = base64.b64decode(a["data"])
        assert (data[:4] == b"RIFF") is (fmt == "wav")
        assert len(data) % 2 == 0 and data
    assert any(c["choices"][0]["delta"].get("content") for c in chunks)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["delta"] == {}
    assert last["usage"]["prompt_tokens"] > 0


def test_whole_speech_is_audio_with_its_token_headers(omni: Omni) -> None:
    reply = post(omni, "/v1/audio/speech", speech("Hello there.", voice="anyone"))
    assert reply.status_code == 200 and reply.headers["content-type"] == "audio/wav"
    assert reply.content[:4] == b"RIFF"
    h = reply.headers
    assert h["x-finish-reason"] == "stop" and h["x-request-id"].startswith("speech-")
    prompt, completion = int(h["x-prompt-tokens"]), int(h["x-completion-tokens"])
    assert int(h["x-sglang-omni-total-tokens"]) == prompt + completion and prompt > 0
    assert float(h["x-engine-time"]) > 0


def test_a_pcm_stream_is_raw_samples_and_its_usage_comes_from_the_outcome_route(omni: Omni) -> None:
    with httpx.stream(
        "POST",
        omni.url + "/v1/audio/speech",
        json=speech("Hello there.", stream=True, response_format="pcm"),
        trust_env=False,
        timeout=30.0,
    ) as reply:
        assert reply.status_code == 200
        assert {k: reply.headers[k] for k in PCM_HEADERS} == PCM_HEADERS
        assert "content-length" not in reply.headers
        speech_id = reply.headers["x-sglang-omni-speech-id"]
        pcm = b"".join(reply.iter_raw())
    assert pcm and len(pcm) % 2 == 0 and pcm[:4] != b"RIFF"
    outcome = httpx.get(f"{omni.url}/v1/audio/speech/{speech_id}", trust_env=False)
    assert outcome.status_code == 200
    body = outcome.json()
    assert body["request_id"] == speech_id and body["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["engine_time_s"] > 0
    unknown = httpx.get(f"{omni.url}/v1/audio/speech/speech-unknown", trust_env=False)
    assert unknown.status_code == 404
    assert unknown.json() == {"detail": "No finished speech stream with request id speech-unknown"}


def test_an_sse_speech_stream_sends_audio_delta_events_then_done_with_usage(omni: Omni) -> None:
    reply = post(
        omni, "/v1/audio/speech", speech("Hello.", stream=True, response_format="pcm", stream_format="sse")
    )
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["x-sample-rate"] == "24000"
    got = events(reply.content)
    assert "[DONE]" not in got
    assert [e["type"] for e in got[:-1]] == ["speech.audio.delta"] * (len(got) - 1) and len(got) > 1
    assert all(len(base64.b64decode(e["audio"])) % 2 == 0 for e in got[:-1])
    assert got[-1]["type"] == "speech.audio.done" and got[-1]["finish_reason"] == "stop"
    assert set(got[-1]["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (speech("Hi", stream=True), "stream=true requires response_format='pcm'", "response_format"),
        (speech("   "), "input must be a non-empty string", "input"),
        (speech("Hi", speed=5), "speed must be between 0.25 and 4.0", "speed"),
        (
            speech("Hi", response_format="ogg"),
            "response_format must be one of: aac, flac, mp3, opus, pcm, wav",
            "response_format",
        ),
        ({"model": MODEL}, "input: Field required", None),
    ],
)
def test_a_bad_speech_request_is_a_400_in_openais_envelope(
    omni: Omni, body: dict[str, Any], message: str, param: str | None
) -> None:
    reply = post(omni, "/v1/audio/speech", body)
    assert reply.status_code == 400
    assert reply.json() == {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    }


def test_speech_that_is_not_json_is_a_400(omni: Omni) -> None:
    reply = httpx.post(omni.url + "/v1/audio/speech", content=b"{nope", trust_env=False)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "speech request body must be valid JSON"


def test_a_bad_chat_request_is_fastapis_422_naming_the_field(omni: Omni) -> None:
    reply = post(omni, "/v1/chat/completions", {"model": MODEL})
    assert reply.status_code == 422
    (error,) = reply.json()["detail"]
    assert error["loc"] == ["body", "messages"] and error["type"] == "missing"


@pytest.mark.parametrize(("shape", "status"), [("overload", 503), ("fail", 500)])
def test_a_whole_chat_refused_before_output_is_the_status_in_detail(
    omni: Omni, shape: str, status: int
) -> None:
    with omni.shape(shape) as mark:
        reply = post(omni, "/v1/chat/completions", chat("Hi" + mark))
    assert reply.status_code == status
    assert set(reply.json()) == {"detail"}
    if status == 503:
        assert reply.json() == {"detail": QUEUE_FULL}


@pytest.mark.parametrize(
    ("shape", "status", "tokens"),
    [("overload", 503, False), ("overload-mid", 503, True), ("fail", 500, False), ("fail-mid", 500, True)],
)
def test_a_streamed_chat_failure_is_an_error_event_with_its_status_inside_a_200(
    omni: Omni, shape: str, status: int, tokens: bool
) -> None:
    with omni.shape(shape) as mark:
        reply = post(omni, "/v1/chat/completions", chat("Hi" + mark, stream=True))
    assert reply.status_code == 200
    got = events(reply.content)
    assert got[-1] == "[DONE]"
    error = got[-2]["error"]
    assert error["code"] == status and error["type"] == "server_error"
    if status == 503:
        assert error["message"] == QUEUE_FULL
    assert bool(got[:-2]) is tokens  # content chunks came first only mid-stream


@pytest.mark.parametrize(("shape", "status"), [("overload", 503), ("fail", 500)])
@pytest.mark.parametrize("stream", [False, True])
def test_speech_refused_before_its_first_audio_is_a_json_error(
    omni: Omni, shape: str, status: int, stream: bool
) -> None:
    extra: dict[str, Any] = {"stream": True, "response_format": "pcm"} if stream else {}
    with omni.shape(shape) as mark:
        reply = post(omni, "/v1/audio/speech", speech("Hello there." + mark, **extra))
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["type"] == "server_error" and error["code"] is None
    if status == 503:
        assert error["message"] == QUEUE_FULL


@pytest.mark.parametrize("shape", ["overload-mid", "fail-mid"])
def test_a_started_pcm_stream_that_fails_drops_the_connection(omni: Omni, shape: str) -> None:
    received = b""
    with (
        omni.shape(shape) as mark,
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST",
            omni.url + "/v1/audio/speech",
            json=speech("Hello there, a longer answer." + mark, stream=True, response_format="pcm"),
            trust_env=False,
            timeout=30.0,
        ) as reply,
    ):
        assert reply.status_code == 200
        for piece in reply.iter_raw():
            received += piece
    assert received  # some audio came before the drop


def test_an_sse_speech_stream_that_fails_ends_with_an_error_event_and_no_done(omni: Omni) -> None:
    with omni.shape("overload-mid") as mark:
        body = speech(
            "Hello there, a longer answer." + mark, stream=True, response_format="pcm", stream_format="sse"
        )
        reply = post(omni, "/v1/audio/speech", body)
    got = events(reply.content)
    assert reply.status_code == 200 and got[0]["type"] == "speech.audio.delta"
    assert got[-1]["type"] == "error" and got[-1]["error"]["message"] == QUEUE_FULL
    assert all(e["type"] != "speech.audio.done" for e in got)


@pytest.mark.parametrize("route", ["chat", "pcm"])
def test_a_client_that_leaves_a_stream_has_it_aborted(omni: Omni, route: str) -> None:
    before = omni.aborts()
    with omni.shape("slow") as mark:
        if route == "chat":
            path, body = "/v1/chat/completions", chat("Hi" + mark, stream=True, max_tokens=2000)
        else:
            path, body = "/v1/audio/speech", speech("Hello there." + mark, stream=True, response_format="pcm")
        with httpx.stream("POST", omni.url + path, json=body, trust_env=False, timeout=30.0) as reply:
            assert reply.status_code == 200
            next(reply.iter_raw())  # the first chunk, then leave
    deadline = time.monotonic() + 10
    while omni.aborts() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert omni.aborts() == before + 1
