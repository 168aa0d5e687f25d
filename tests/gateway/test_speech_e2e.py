"""Speech out through the gateway, against the simulated sglang-omni server and with the real `openai` client:
/v1/audio/speech whole and streamed, chat with audio out whole and streamed — passed through unchanged, in the
`speech` bucket, the first audio counted as the first output, and the audio seconds the gateway counts equal
to what the server made (its own accounting)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.observability.metrics import REGISTRY
from tests.gateway.test_omni_backends import MODEL, backends, omni_gateway, sims  # noqa: F401
from tests.support.processes import Processes
from tests.support.servers import ServerThread
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

TEXT = "The quick brown fox jumps over the lazy dog, then rests in the warm afternoon sun."
SAMPLE_RATE = 24_000


def _wav_seconds(data: bytes) -> float:
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    return (len(data) - 44) / (2 * SAMPLE_RATE)


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _made(sim_url: str) -> dict[str, Any]:
    """The server's own record of the last request it finished."""
    record: dict[str, Any] = httpx.get(sim_url + "/sim/omni/accounting?limit=1").json()["requests"][-1]
    return record


@pytest.fixture
def speech_pool(sims, start_gateway: Callable[..., ServerThread]) -> tuple[str, str]:  # noqa: F811
    sim = sims()
    gw = omni_gateway(start_gateway, [sim.url], version="snapshot")
    assert wait_for(lambda: backends(gw)[0]["running"] is not None)
    return gw, sim.url


def test_the_openai_client_streams_speech_through_the_gateway(speech_pool) -> None:
    gw, sim = speech_pool
    labels = {"pool": "interactive", "traffic_class": "interactive"}
    ttfa_before = _sample("omnigate_ttfa_seconds_count", **labels)
    rtf_before = _sample("omnigate_speech_rtf_count", **labels)
    audio_before = _sample("omnigate_audio_seconds_total", pool="interactive", tenant="anonymous")
    client = openai.OpenAI(base_url=gw + "/v1", api_key="unused", max_retries=0)
    events = []
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice="default", input=TEXT, extra_body={"stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-omnigate-bucket"] == "speech"
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    chunks = [e for e in events if e["audio"] is not None]
    assert len(chunks) >= 2 and all(e["object"] == "audio.speech.chunk" for e in events)
    heard = sum(_wav_seconds(base64.b64decode(e["audio"]["data"])) for e in chunks)
    made = _made(sim)
    assert made["kind"] == "speech" and heard == pytest.approx(made["audio_seconds"], abs=1e-6)
    assert events[-1]["finish_reason"] == "stop" and events[-1]["usage"]["prompt_tokens"] > 0
    counted = _sample("omnigate_audio_seconds_total", pool="interactive", tenant="anonymous")
    assert counted - audio_before == pytest.approx(heard, abs=1e-6)
    assert _sample("omnigate_ttfa_seconds_count", **labels) == ttfa_before + 1
    assert _sample("omnigate_speech_rtf_count", **labels) == rtf_before + 1


def test_a_whole_speech_answer_is_the_servers_audio_with_its_headers(speech_pool) -> None:
    gw, sim = speech_pool
    client = openai.OpenAI(base_url=gw + "/v1", api_key="unused", max_retries=0)
    response = client.audio.speech.with_raw_response.create(model=MODEL, voice="default", input=TEXT)
    audio = response.content
    assert response.headers["content-type"] == "audio/wav"
    assert response.headers["x-omnigate-bucket"] == "speech"
    made = _made(sim)
    assert int(response.headers["x-prompt-tokens"]) == made["prompt_tokens"]
    assert int(response.headers["x-completion-tokens"]) == made["thinker_tokens"]
    assert _wav_seconds(audio) == pytest.approx(made["audio_seconds"], abs=1e-6)


def test_chat_with_audio_out_streams_audio_deltas_unchanged(speech_pool) -> None:
    gw, sim = speech_pool
    client = openai.OpenAI(base_url=gw + "/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about foxes."}],
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "wav"},
        max_tokens=40,
        stream=True,
    )
    assert raw.headers["x-omnigate-bucket"] == "speech"
    chunks = list(raw.parse())
    audio = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert audio and text
    heard = sum(_wav_seconds(base64.b64decode(a.data)) for a in audio)
    assert heard == pytest.approx(_made(sim)["audio_seconds"], abs=1e-6)


def test_a_whole_chat_answer_with_audio_counts_its_clip(speech_pool) -> None:
    gw, sim = speech_pool
    before = _sample("omnigate_audio_seconds_total", pool="interactive", tenant="anonymous")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hi."}],
        "modalities": ["text", "audio"],
        "max_tokens": 20,
    }
    answer = httpx.post(gw + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200 and answer.headers["x-omnigate-bucket"] == "speech"
    clip = _wav_seconds(base64.b64decode(answer.json()["choices"][0]["message"]["audio"]["data"]))
    assert clip == pytest.approx(_made(sim)["audio_seconds"], abs=1e-6) and clip > 0
    after = _sample("omnigate_audio_seconds_total", pool="interactive", tenant="anonymous")
    assert after - before == pytest.approx(clip, abs=1e-6)


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/audio/speech", {"model": MODEL, "voice": "default"}, "input"),
        ("/v1/audio/speech", {"model": MODEL, "input": ""}, "input"),
        ("/v1/audio/speech", {"model": MODEL, "input": "hi", "speed": 0}, "speed"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "modalities": ["video"]},
            "modalities",
        ),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "modalities": ["audio"],
                "audio": {"voice": 3},
            },
            "audio.voice",
        ),
    ],
)
def test_bad_speech_requests_are_refused_with_the_param_named(speech_pool, route, body, param) -> None:
    gw, _ = speech_pool
    answer = httpx.post(gw + route, json=body, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


def test_a_plain_sglang_pool_has_no_speech_route(start_gateway, tmp_path) -> None:
    group = Processes(tmp_path)
    try:
        sim = group.sim("--time-scale", "50", "--model", MODEL)
        gw = start_gateway([sim.url]).url
        answer = httpx.post(gw + "/v1/audio/speech", json={"model": MODEL, "input": "hi"}, timeout=30)
    finally:
        group.close()
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "route_not_served"


def test_speech_is_admitted_by_the_audio_rate_its_streams_were_measured_to_get(speech_pool) -> None:
    """The relay's meter reaches admission: code2wav has no budget until a stream shows its speed, then
    the measured rate × rtf_target (the last rate standing once the stream is done)."""
    gw, _ = speech_pool

    def code2wav() -> dict[str, Any]:
        return next(s for s in backends(gw)[0]["stages"] if s["stage"] == "code2wav")

    assert (code2wav()["budget"], code2wav()["measured"]) == (None, None)
    body = {"model": MODEL, "voice": "default", "input": TEXT, "stream": True}
    with httpx.stream("POST", gw + "/v1/audio/speech", json=body, timeout=30) as response:
        chunks = sum(1 for line in response.iter_lines() if '"audio": {' in line)
    assert chunks >= 3
    assert wait_for(lambda: code2wav()["use"] == 0)
    stage = code2wav()
    assert stage["measured"] > 0 and stage["budget"] == pytest.approx(stage["measured"] * 0.8, abs=1e-3)
