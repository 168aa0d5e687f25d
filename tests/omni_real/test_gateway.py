"""`omnigate serve` in front of sglang-omni 0.1.9's own app (a `kind: sglang-omni`, `version: later` pool),
with the real `openai` client: PCM speech relayed unchanged and measured, chat with audio, usage read from the
outcome route and charged, overload told apart from a bad request in every shape, a dropped PCM stream the
server's failure, the server's 400 / 422 relayed naming the field, and a client that leaves aborted there."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Admin, write_config
from tests.omni_real import realapp
from tests.omni_real.conftest import Omni
from tests.omni_real.realapp import MODEL
from tests.support.processes import ManagedProcess, Processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

KEY = "og-omni-real-key-0001"
PCM_BYTES = 3 * 6000 * 2  # the stand-in's three 0.25 s chunks of 24 kHz 16-bit mono
TEXT = "The quick brown fox jumps over the lazy dog."


def _gateway(procs: Processes, workdir: Path, backends: list[str], name: str) -> ManagedProcess:
    pool = {
        "kind": "sglang-omni",
        "models": [MODEL],
        "backends": backends,
        "health_interval_s": 0.2,
        "sglang_omni": {"version": "later"},
    }
    config = write_config(
        workdir / f"{name}.yaml", backends[0], {"kind": "memory"}, [{"id": "acme", "keys": [KEY]}], pool
    )
    return procs.gateway(config, name=name)


@pytest.fixture(scope="module")
def gateway(real_omni: Omni, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("omni-gw")
    procs = Processes(workdir)
    try:
        yield _gateway(procs, workdir, [real_omni.url], "gateway").url
    finally:
        procs.close()


def metric(gw: str, name: str, **labels: str) -> float:
    """The sum of a gateway metric's samples whose labels include `labels`."""
    text = httpx.get(gw + "/metrics", trust_env=False).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def client(gw: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw + "/v1", api_key=KEY, max_retries=0, timeout=30)


def backend_state(gw: str) -> dict[str, Any]:
    entry: dict[str, Any] = Admin(gw).call("GET", "/admin/state")["pools"]["interactive"]["backends"][0]
    return entry


def sse_events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            out.append(block[6:] if block[6:] == "[DONE]" else json.loads(block[6:]))
    return out


def test_the_openai_client_streams_pcm_speech_unchanged_and_it_is_measured_and_charged(
    gateway: str, real_omni: Omni
) -> None:
    direct = httpx.post(
        real_omni.url + "/v1/audio/speech",
        json={"model": MODEL, "input": TEXT, "voice": "default", "stream": True, "response_format": "pcm"},
        trust_env=False,
    )
    outcome = httpx.get(
        f"{real_omni.url}/v1/audio/speech/{direct.headers['x-sglang-omni-speech-id']}", trust_env=False
    ).json()
    labels = {"pool": "interactive"}
    before = {
        n: metric(gateway, n, **labels)
        for n in ("omnigate_ttfa_seconds_count", "omnigate_speech_rtf_count", "omnigate_audio_seconds_total")
    }
    prompt_before = metric(gateway, "omnigate_tenant_tokens_total", tenant="acme", kind="prompt")
    with client(gateway).audio.speech.with_streaming_response.create(
        model=MODEL, voice="default", input=TEXT, response_format="pcm", extra_body={"stream": True}
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        assert (
            response.headers["x-sample-rate"],
            response.headers["x-channels"],
            response.headers["x-bit-depth"],
        ) == ("24000", "1", "16")
        pcm = b"".join(response.iter_bytes())
    assert pcm == direct.content and len(pcm) == PCM_BYTES  # nothing appended, nothing lost
    assert (
        metric(gateway, "omnigate_ttfa_seconds_count", **labels) == before["omnigate_ttfa_seconds_count"] + 1
    )
    assert metric(gateway, "omnigate_speech_rtf_count", **labels) == before["omnigate_speech_rtf_count"] + 1
    seconds = (
        metric(gateway, "omnigate_audio_seconds_total", **labels) - before["omnigate_audio_seconds_total"]
    )
    assert seconds == pytest.approx(0.75)
    charged = metric(gateway, "omnigate_tenant_tokens_total", tenant="acme", kind="prompt") - prompt_before
    assert charged == outcome["usage"]["prompt_tokens"]  # read from the outcome route, not estimated


def test_the_openai_client_streams_chat_with_audio_through_the_gateway(gateway: str) -> None:
    before = metric(gateway, "omnigate_audio_seconds_total", pool="interactive")
    stream = client(gateway).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "wav"},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    audio = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio is not None]
    assert text == "Hello from the stand-in" and len(audio) == 3
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert metric(gateway, "omnigate_audio_seconds_total", pool="interactive") - before == pytest.approx(0.75)


def test_a_full_queue_inside_a_started_chat_stream_is_the_servers_overload(gateway: str) -> None:
    before = metric(gateway, "omnigate_backend_overloads_total", phase="mid_stream")
    failing = metric(gateway, "omnigate_requests_total", outcome="upstream_error")
    reply = httpx.post(
        gateway + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi [overload-mid]"}], "stream": True},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=30,
        trust_env=False,
    )
    got = sse_events(reply.content)
    assert reply.status_code == 200 and got[-1] == "[DONE]"
    assert got[-2] == {
        "error": {"message": "The request queue is full.", "type": "server_error", "code": 503}
    }
    assert metric(gateway, "omnigate_backend_overloads_total", phase="mid_stream") == before + 1
    assert metric(gateway, "omnigate_requests_total", outcome="upstream_error") == failing + 1
    assert metric(gateway, "omnigate_requests_total", outcome="client_error", pool="interactive") == metric(
        gateway, "omnigate_requests_total", outcome="client_error", pool="interactive"
    )
    assert backend_state(gateway)["circuit"] == "closed"


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_queue_before_output_with_no_other_backend_is_a_503(gateway: str, stream: bool) -> None:
    before = metric(gateway, "omnigate_backend_overloads_total", phase="before_output")
    with pytest.raises(openai.APIStatusError) as refused:
        reply = client(gateway).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi [overload]"}], stream=stream
        )
        if stream:
            list(reply)  # type: ignore[arg-type]
    assert refused.value.status_code == 503
    assert "The request queue is full." in refused.value.message
    assert metric(gateway, "omnigate_backend_overloads_total", phase="before_output") == before + 1


def test_a_started_pcm_stream_the_server_drops_is_dropped_and_is_the_servers_failure(gateway: str) -> None:
    before = metric(gateway, "omnigate_upstream_errors_total", phase="mid_stream")
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST",
            gateway + "/v1/audio/speech",
            json={"model": MODEL, "input": TEXT + " [fail-mid]", "stream": True, "response_format": "pcm"},
            headers={"authorization": f"Bearer {KEY}"},
            timeout=30,
            trust_env=False,
        ) as reply,
    ):
        assert reply.status_code == 200 and reply.headers["content-type"] == "audio/pcm"
        for piece in reply.iter_raw():
            received += piece
    assert len(received) == 2 * 6000 * 2  # the two chunks before the failure, unchanged
    assert wait_for(
        lambda: metric(gateway, "omnigate_upstream_errors_total", phase="mid_stream") == before + 1
    )
    assert metric(gateway, "omnigate_requests_total", outcome="upstream_error", bucket="speech") >= 1


def test_the_servers_speech_400_names_the_field(gateway: str) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client(gateway).audio.speech.create(
            model=MODEL, voice="default", input="Hi", extra_body={"stream": True}
        )
    assert bad.value.status_code == 400
    assert bad.value.body == {  # type: ignore[comparison-overlap]
        "message": "stream=true requires response_format='pcm'",
        "type": "BadRequestError",
        "param": "response_format",
        "code": "400",
    }


def test_the_servers_chat_422_names_the_field(gateway: str) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as bad:
        client(gateway).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], extra_body={"stage_params": "loud"}
        )
    body = bad.value.body
    assert isinstance(body, dict) and body["param"] == "stage_params"
    assert body["message"].startswith("stage_params: ")


def test_a_client_that_leaves_a_pcm_stream_has_it_aborted_and_its_slot_freed(
    gateway: str, real_omni: Omni
) -> None:
    before = len(set(realapp.aborted(real_omni.url)))
    with httpx.stream(
        "POST",
        gateway + "/v1/audio/speech",
        json={"model": MODEL, "input": TEXT + " [slow]", "stream": True, "response_format": "pcm"},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=30,
        trust_env=False,
    ) as reply:
        assert reply.status_code == 200
        next(reply.iter_raw())
    assert wait_for(lambda: len(set(realapp.aborted(real_omni.url))) == before + 1)
    assert wait_for(lambda: backend_state(gateway)["active"] == 0)


def test_a_backend_refusing_with_a_full_queue_is_retried_elsewhere(
    real_omni: Omni, omni_processes: Processes, tmp_path: Path
) -> None:
    full = realapp.start(omni_processes, name="sglang-omni-full")
    realapp.set_overloaded(full.url, True)
    procs = Processes(tmp_path)
    try:
        gw = _gateway(procs, tmp_path, [full.url, real_omni.url], "gateway-retry").url

        def ask(i: int) -> None:  # at once: the busy backend makes the dispatcher try the other one too
            stream = i % 2 == 1
            reply = httpx.post(
                gw + "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"Hi {i} [slow]"}],
                    "stream": stream,
                },
                headers={"authorization": f"Bearer {KEY}"},
                timeout=30,
                trust_env=False,
            )
            assert reply.status_code == 200
            if stream:
                assert sse_events(reply.content)[-1] == "[DONE]" and "error" not in reply.text

        with ThreadPoolExecutor(6) as pool:
            list(pool.map(ask, range(6)))
        refusals = realapp.refused(full.url)
        assert refusals >= 1
        assert metric(gw, "omnigate_backend_overloads_total", phase="before_output") == refusals
        assert metric(gw, "omnigate_upstream_retries_total", pool="interactive") == refusals
    finally:
        procs.close()
        full.stop()
