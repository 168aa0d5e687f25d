"""The simulated sglang-omni server on a real uvicorn server, with the openai client and raw HTTP.

Answers are made deterministic with a profile whose natural answer is longer than any max_tokens used here
(sigma 0), so every answer is exactly max_tokens thinker tokens and ceil(max_tokens × 3.85) codec frames.
"""

from __future__ import annotations

import base64
import io
import json
import math
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from PIL import Image

from loadtest.sim.faults import FaultConfig
from loadtest.sim.omni.config import OmniConfig
from loadtest.sim.omni.profile import PROFILE_DIR
from loadtest.sim.omni.server import create_app
from loadtest.sim.responses import output_text
from tests.support.servers import ServerThread, serve

pytestmark = pytest.mark.e2e

FAST = 100.0
FRAMES_PER_TOKEN = 3.85
SPEECH_STAGES = [
    "preprocessing",
    "image_encoder",
    "audio_encoder",
    "mm_aggregate",
    "thinker",
    "decode",
    "talker_ar",
    "code_predictor",
    "code2wav",
]


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = yaml.safe_load((PROFILE_DIR / "qwen3-omni.yaml").read_text())
    data["output"] = {"median_tokens": 5000, "sigma": 0.0, "min_tokens": 1}
    path = tmp_path_factory.mktemp("omni") / "fixed.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def server(profile: Path, time_scale: float = FAST, **kw: Any) -> Iterator[ServerThread]:
    with serve(create_app(OmniConfig(profile=str(profile), time_scale=time_scale, seed=7, **kw))) as s:
        yield s


@pytest.fixture(scope="module")
def snap(profile_path: Path) -> Iterator[ServerThread]:
    yield from server(profile_path)


@pytest.fixture(scope="module")
def later(profile_path: Path) -> Iterator[ServerThread]:
    """Room for two requests (thinker cap 2, no queue), slow enough that two held streams stay in flight."""
    yield from server(
        profile_path, 10.0, release="later", max_queued_requests=0, thinker_max_running_requests=2
    )


def events(body: str) -> list[str]:
    return [block.removeprefix("data: ") for block in body.split("\n\n") if block]


def wav_info(data: bytes) -> tuple[int, int, int, int]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()


def frames(tokens: int) -> int:
    return math.ceil(tokens * FRAMES_PER_TOKEN)


def chunk_sizes(tokens: int) -> list[int]:
    n = frames(tokens)
    return [10 * 1920] * (n // 10) + ([n % 10 * 1920] if n % 10 else [])


def record(s: ServerThread, rid: str) -> dict[str, Any]:
    """The sim's own accounting of one finished request (waits for it to be recorded)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for r in httpx.get(s.url + "/sim/omni/accounting").json()["requests"]:
            if r["rid"] == rid:
                return r
        time.sleep(0.02)
    raise AssertionError(f"{rid} never recorded")


def chat(**body: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], **body}


def test_streamed_chat_audio_deltas_are_whole_24k_wav_files(snap: ServerThread) -> None:
    client = openai.OpenAI(base_url=snap.url + "/v1", api_key="x")
    stream = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "say something"}],
        max_tokens=6,
        stream=True,
        modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "wav"},
        extra_body={"request_id": "stream-audio"},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == output_text(0, 6)
    audio = [c.choices[0].delta.audio for c in chunks if c.choices[0].delta.audio is not None]
    assert {a.id for a in audio} == {"audio-stream-audio"}
    infos = [wav_info(base64.b64decode(a.data)) for a in audio]
    assert [i[:3] for i in infos] == [(24000, 1, 2)] * len(infos)
    assert [i[3] for i in infos] == chunk_sizes(6)
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop" and last.choices[0].delta.content is None
    assert last.usage is not None and (last.usage.completion_tokens, last.usage.total_tokens) == (6, 6 + 12)
    assert {c.id for c in chunks} == {"chatcmpl-stream-audio"} and {c.model for c in chunks} == {"qwen"}
    rec = record(snap, "stream-audio")
    assert (rec["thinker_tokens"], rec["talker_tokens"]) == (6, frames(6) + 1)
    assert rec["audio_seconds"] == pytest.approx(frames(6) * 0.08) and rec["audio_delivered"]


def test_raw_sse_is_serialised_as_sglang_omni_does(snap: ServerThread) -> None:
    body = chat(
        max_tokens=2, stream=True, stream_options={"include_usage": True}, priority=5, request_id="raw"
    )
    r = httpx.post(snap.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = events(r.text)
    head = '{"id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": '
    assert all(e.startswith(head) for e in ev[:-1]) and ev[-1] == "[DONE]"
    assert ev[0].endswith(
        '"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": " the"}, '
        '"finish_reason": null}]}'
    )
    second = json.dumps(output_text(1, 2))
    assert ev[1].endswith(
        f'"choices": [{{"index": 0, "delta": {{"content": {second}}}, "finish_reason": null}}]}}'
    )
    assert ev[-2].endswith(
        '"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], '
        '"usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}'
    )
    assert (
        len(ev) == 4
    )  # no audio without "audio" in modalities, no separate usage chunk: stream_options ignored


def test_non_streamed_chat_carries_one_whole_clip_and_thinker_only_usage(snap: ServerThread) -> None:
    client = openai.OpenAI(base_url=snap.url + "/v1", api_key="x")
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=9,
        modalities=["text", "audio"],
        extra_body={"request_id": "whole"},
    )
    message = r.choices[0].message
    assert message.content == output_text(0, 9) and r.choices[0].finish_reason == "stop"
    assert message.audio is not None and message.audio.id == "audio-whole"
    assert message.audio.transcript == output_text(0, 9)
    assert wav_info(base64.b64decode(message.audio.data)) == (24000, 1, 2, frames(9) * 1920)
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (9, 9)
    assert record(snap, "whole")["talker_tokens"] == frames(9) + 1  # the talker's work is never in usage


def test_snapshot_makes_audio_for_text_only_requests_and_drops_it(snap: ServerThread) -> None:
    r = httpx.post(
        snap.url + "/v1/chat/completions", json=chat(max_tokens=3, stream=True, request_id="tonly")
    )
    assert not any('"audio"' in e for e in events(r.text))
    rec = record(snap, "tonly")
    assert rec["audio_stages"] and not rec["audio_delivered"]
    assert rec["audio_seconds"] == pytest.approx(frames(3) * 0.08)
    whole = httpx.post(snap.url + "/v1/chat/completions", json=chat(max_tokens=3)).json()
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": output_text(0, 3)}


def test_audio_only_modality_streams_role_then_audio(snap: ServerThread) -> None:
    body = chat(max_tokens=3, stream=True, modalities=["audio"], request_id="aonly")
    chunks = [
        json.loads(e) for e in events(httpx.post(snap.url + "/v1/chat/completions", json=body).text)[:-1]
    ]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"}
    assert [list(d) for d in deltas[1:-1]] == [["audio"]] * len(chunk_sizes(3)) and deltas[-1] == {}


def test_speech_whole_returns_raw_wav_with_usage_headers(snap: ServerThread) -> None:
    client = openai.OpenAI(base_url=snap.url + "/v1", api_key="x")
    raw = client.audio.speech.with_raw_response.create(model="tts", voice="alloy", input="one two three four")
    data = raw.parse().content
    assert raw.headers["content-type"] == "audio/wav"
    assert raw.headers["content-disposition"] == 'attachment; filename="speech.wav"'
    # the thinker reads the input back: 18 bytes → 5 text tokens + <|im_end|>; prompt 3 + 4 + 1 + 5
    assert (raw.headers["x-prompt-tokens"], raw.headers["x-completion-tokens"]) == ("13", "6")
    assert float(raw.headers["x-engine-time"]) > 0
    assert wav_info(data) == (24000, 1, 2, frames(5) * 1920)


def test_speech_stream_is_speech_chunk_events_then_done(snap: ServerThread) -> None:
    r = httpx.post(snap.url + "/v1/audio/speech", json={"input": "one two three four", "stream": True})
    ev = events(r.text)
    assert ev[-1] == "[DONE]"
    payloads = [json.loads(e) for e in ev[:-1]]
    audio, final = payloads[:-1], payloads[-1]
    assert [p["index"] for p in payloads] == list(range(len(payloads)))
    assert {p["object"] for p in payloads} == {"audio.speech.chunk"}
    assert len({p["id"] for p in payloads}) == 1 and payloads[0]["id"].startswith("speech-speech-")
    sizes = [wav_info(base64.b64decode(p["audio"]["data"]))[3] for p in audio]
    assert sizes == chunk_sizes(5)
    assert {(p["audio"]["format"], p["audio"]["mime_type"], p["audio"]["sample_rate"]) for p in audio} == {
        ("wav", "audio/wav", 24000)
    }
    assert all(p["finish_reason"] is None for p in audio)
    assert final["audio"] is None and final["finish_reason"] == "stop"
    use = final["usage"]
    assert (use["prompt_tokens"], use["completion_tokens"], use["total_tokens"]) == (13, 6, 19)
    assert use["engine_time_s"] > 0


def test_speech_pcm_is_raw_samples_and_unknown_codecs_fall_back_to_wav(snap: ServerThread) -> None:
    pcm = httpx.post(
        snap.url + "/v1/audio/speech", json={"input": "one two three four", "response_format": "pcm"}
    )
    assert pcm.headers["content-type"] == "audio/pcm" and len(pcm.content) == frames(5) * 1920 * 2
    mp3 = httpx.post(
        snap.url + "/v1/audio/speech", json={"input": "one two three four", "response_format": "mp3"}
    )
    assert mp3.headers["content-type"] == "audio/wav"
    assert mp3.headers["content-disposition"] == 'attachment; filename="speech.wav"'
    fast = httpx.post(snap.url + "/v1/audio/speech", json={"input": "one two three four", "speed": 2.0})
    assert wav_info(fast.content)[3] == frames(5) * 1920 // 2


def test_health_json_and_a_disconnected_stream_keeps_running(profile_path: Path) -> None:
    with serve(create_app(OmniConfig(profile=str(profile_path), time_scale=10.0, seed=1))) as s:
        idle = httpx.get(s.url + "/health")
        assert idle.status_code == 200
        assert idle.json() == {
            "status": "healthy",
            "running": True,
            "stages": SPEECH_STAGES,
            "entry_stage": "preprocessing",
            "total_requests": 0,
            "pending_completions": 0,
            "request_states": {},
        }
        # 60 tokens → 231 frames at 85 ms: ~20 s of virtual work, ~2 s of wall time at 10×
        body = chat(max_tokens=60, stream=True, modalities=["text", "audio"], request_id="gone")
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
            next(r.iter_lines())  # the first token arrived; then the client hangs up
        health = wait_for(s, lambda h: h["pending_completions"] == 0)
        assert (health["total_requests"], health["request_states"]) == (1, {"running": 1})
        done = wait_for(s, lambda h: h["total_requests"] == 0)
        assert done["request_states"] == {}
        rec = record(s, "gone")
        assert rec["status"] == "finished" and rec["audio_seconds"] == pytest.approx(frames(60) * 0.08)


def wait_for(s: ServerThread, ok: Any, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = httpx.get(s.url + "/health").json()
        if ok(health):
            return health
        time.sleep(0.01)
    raise AssertionError(f"health never satisfied the condition: {health}")


def test_later_aborts_a_stream_whose_client_left(profile_path: Path) -> None:
    with serve(create_app(OmniConfig(profile=str(profile_path), release="later", time_scale=5.0))) as s:
        body = chat(max_tokens=400, stream=True, modalities=["text", "audio"], request_id="left")
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
            next(r.iter_lines())
        health = wait_for(s, lambda h: h["total_requests"] == 0, timeout=10)
        assert health["pending_completions"] == 0
        rec = record(s, "left")
        assert rec["status"] == "aborted" and rec["audio_seconds"] < frames(400) * 0.08


def png(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def wav_url(seconds: float) -> str:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x00" * int(16000 * seconds))
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def test_top_level_media_lists_are_priced_by_the_qwen3_omni_formulas(snap: ServerThread) -> None:
    body = chat(max_tokens=1, images=[png(640, 480)], audios=[wav_url(2.5)])
    use = httpx.post(snap.url + "/v1/chat/completions", json=body).json()["usage"]
    # text 3 + 4 + 1 + 2 ("hello"); image 640×480 → 20 × 15 patches of 32 px = 300, audio 2.5 s → 26 + 7 = 33;
    # two markers each
    assert use["prompt_tokens"] == 10 + 300 + 33 + 4


def test_snapshot_dumps_content_parts_into_the_prompt_text_and_later_parses_them(
    snap: ServerThread, later: ServerThread
) -> None:
    content = [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": png(64, 64)}}]
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    dumped = len(json.dumps(content, ensure_ascii=True).encode())
    snap_use = httpx.post(snap.url + "/v1/chat/completions", json=body).json()["usage"]
    assert snap_use["prompt_tokens"] == 3 + 4 + 1 + math.ceil(dumped / 4)
    later_use = httpx.post(later.url + "/v1/chat/completions", json=body).json()["usage"]
    assert later_use["prompt_tokens"] == 3 + 4 + 1 + 2 + (2 * 2) + 2  # 64×64 px → 2 × 2 tokens of 32 px


def test_snapshot_generation_failures_are_500_and_cut_streams(snap: ServerThread) -> None:
    bad = chat(max_tokens=2, images=["data:image/png;base64,AAAA"])
    r = httpx.post(snap.url + "/v1/chat/completions", json=bad)
    assert r.status_code == 500 and r.json()["detail"].startswith("Failed to load image: cannot identify")
    with httpx.stream("POST", snap.url + "/v1/chat/completions", json={**bad, "stream": True}) as s:
        assert s.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            s.read()
    too_long = chat(max_tokens=2, messages=[{"role": "user", "content": "word " * 7000}])
    r = httpx.post(snap.url + "/v1/chat/completions", json=too_long)
    assert (
        r.status_code == 500 and "longer than the model's context length (8192 tokens)" in r.json()["detail"]
    )
    unknown = httpx.post(
        snap.url + "/v1/chat/completions", json=chat(stage_sampling={"thinker": {"nope": 1}})
    )
    assert (unknown.status_code, unknown.text) == (500, "Internal Server Error")


def test_snapshot_duplicate_request_id_is_a_500(snap: ServerThread) -> None:
    body = chat(max_tokens=300, request_id="twice")  # ~100 s of virtual work: still running when repeated
    with httpx.stream("POST", snap.url + "/v1/chat/completions", json={**body, "stream": True}) as open_one:
        lines = open_one.iter_lines()
        next(lines)
        again = httpx.post(snap.url + "/v1/chat/completions", json=body)
        assert (again.status_code, again.json()) == (500, {"detail": "Request twice already exists"})


def test_speech_route_reject_reproduces_qwen3_omnis_preprocessing_failure(profile_path: Path) -> None:
    with serve(
        create_app(OmniConfig(profile=str(profile_path), time_scale=FAST, speech_route="reject"))
    ) as s:
        r = httpx.post(s.url + "/v1/audio/speech", json={"input": "hello"})
        assert (r.status_code, r.json()) == (500, {"detail": "Preprocessing expects a list of chat messages"})


def test_bad_bodies_are_fastapi_422s(snap: ServerThread) -> None:
    url = snap.url + "/v1/chat/completions"
    missing = httpx.post(url, json={"model": "m"})
    assert (missing.status_code, missing.json()) == (
        422,
        {
            "detail": [
                {
                    "type": "missing",
                    "loc": ["body", "messages"],
                    "msg": "Field required",
                    "input": {"model": "m"},
                }
            ]
        },
    )
    broken = httpx.post(url, content=b'{"model": ', headers={"content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["detail"][0]["type"] == "json_invalid"
    assert broken.json()["detail"][0]["loc"] == ["body", 10]
    typed = httpx.post(url, json=chat(max_tokens="many"))
    assert typed.status_code == 422 and typed.json()["detail"][0]["loc"] == ["body", "max_tokens"]
    speech = httpx.post(snap.url + "/v1/audio/speech", json={"voice": "x"})
    assert speech.status_code == 422 and speech.json()["detail"][0]["loc"] == ["body", "input"]


def test_later_maps_bad_requests_to_400_full_queue_to_503_and_duplicates_to_409(later: ServerThread) -> None:
    url = later.url + "/v1/chat/completions"
    long_answer = httpx.post(url, json=chat(messages=[{"role": "user", "content": "word " * 5000}]))
    assert long_answer.status_code == 400
    assert long_answer.json()["detail"].startswith(
        "Requested token count exceeds the model's maximum context"
    )
    bad = httpx.post(url, json=chat(max_tokens=2, images=["data:image/png;base64,AAAA"]))
    assert bad.status_code == 400
    with (
        httpx.stream("POST", url, json=chat(max_tokens=2000, stream=True, request_id="hold-1")) as one,
        httpx.stream("POST", url, json=chat(max_tokens=2000, stream=True, request_id="hold-2")) as two,
    ):
        held = one.iter_lines(), two.iter_lines()  # keep the generators: dropping one closes its connection
        next(held[0]), next(held[1])
        full = httpx.post(url, json=chat(max_tokens=2))
        assert (full.status_code, full.json()) == (503, {"detail": "The request queue is full."})
        dup = httpx.post(url, json=chat(max_tokens=2, request_id="hold-1"))
        assert (dup.status_code, dup.json()) == (409, {"detail": "Request hold-1 already exists"})


def test_routes_the_real_server_lacks_answer_fastapi_404(snap: ServerThread, later: ServerThread) -> None:
    for path in ("/generate", "/v1/completions", "/abort_request"):
        r = httpx.post(snap.url + path, json={})
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
    for path in ("/get_server_info", "/server_info", "/v1/loads", "/get_model_info"):
        assert httpx.get(snap.url + path).status_code == 404
    assert httpx.get(later.url + "/metrics").status_code == 404  # only with --enable-metrics
    wrong = httpx.get(snap.url + "/v1/chat/completions")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
    models = httpx.get(snap.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["Qwen/Qwen3-Omni-30B-A3B-Instruct"]
    assert models["data"][0]["owned_by"] == "sglang-omni" and models["data"][0]["created"] == 0


def test_metrics_expose_the_sglang_omni_families(profile_path: Path) -> None:
    with serve(create_app(OmniConfig(profile=str(profile_path), time_scale=FAST, enable_metrics=True))) as s:
        httpx.post(s.url + "/v1/chat/completions", json=chat(max_tokens=1))
        httpx.get(s.url + "/nowhere")
        httpx.get(s.url + "/sim/omni/accounting")
        text = httpx.get(s.url + "/metrics").text
    model = 'model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct"'
    assert f"sglang_omni_pipeline_running{{{model}}} 1.0" in text.splitlines()
    assert f'sglang_omni_stage_present{{{model},stage="code2wav"}} 1.0' in text.splitlines()
    assert "# TYPE sglang_omni_http_request_duration_seconds histogram" in text
    counts = [ln for ln in text.splitlines() if ln.startswith("sglang_omni_http_requests_total{")]
    assert (
        f'sglang_omni_http_requests_total{{method="GET",{model},route="__unmatched__",status="404"}} 1.0'
        in counts
    )
    chat_200 = f'method="POST",{model},route="/v1/chat/completions",status="200"'
    assert f"sglang_omni_http_requests_total{{{chat_200}}} 1.0" in counts
    assert not any("/sim/omni" in ln or "/metrics" in ln for ln in counts)


def test_faults_switch_health_and_errors(profile_path: Path) -> None:
    config = OmniConfig(profile=str(profile_path), time_scale=FAST, faults=FaultConfig(health_failing=True))
    with serve(create_app(config)) as s:
        sick = httpx.get(s.url + "/health")
        assert sick.status_code == 503 and sick.json()["status"] == "unhealthy" and not sick.json()["running"]
        httpx.post(
            s.url + "/admin/faults", json={"health_failing": False, "error_rate": 1.0, "error_status": 503}
        )
        assert httpx.get(s.url + "/health").status_code == 200
        r = httpx.post(s.url + "/v1/chat/completions", json=chat())
        assert (r.status_code, r.json()) == (503, {"detail": "Injected fault: simulated error 503."})


def test_fault_disconnect_cuts_a_stream_after_n_chunks(profile_path: Path) -> None:
    faults = FaultConfig(disconnect_rate=1.0, disconnect_after_tokens=3)
    with serve(create_app(OmniConfig(profile=str(profile_path), time_scale=FAST, faults=faults))) as s:
        received: list[str] = []
        with (
            httpx.stream("POST", s.url + "/v1/chat/completions", json=chat(max_tokens=8, stream=True)) as r,
            pytest.raises(httpx.RemoteProtocolError),
        ):
            received.extend(line for line in r.iter_lines() if line)
        assert len(received) == 3 and all(line.startswith("data: {") for line in received)
