"""The sim's HTTP surface on a real uvicorn server, with the openai client and raw SSE parsing."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from PIL import Image

from loadtest.sim import cli
from loadtest.sim.config import SimConfig
from loadtest.sim.faults import FaultConfig
from loadtest.sim.profile import PrefillChunk, load_profile
from loadtest.sim.responses import output_text
from loadtest.sim.server import create_app
from tests.support.servers import ServerThread, serve

pytestmark = pytest.mark.e2e

FAST = 200.0


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerThread]:
    with serve(create_app(SimConfig(time_scale=FAST, seed=3))) as server:
        yield server


def _events(text: str) -> list[str]:
    return [block[len("data: ") :] for block in text.split("\n\n") if block]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_openai_sync_non_streaming_has_usage_and_exact_length(sim: ServerThread) -> None:
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="sk-x")
    r = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "abcdefgh"}],
        max_tokens=7,
        extra_body={"ignore_eos": True},
    )
    assert r.object == "chat.completion" and r.model == "any" and len(r.id) == 32  # 0.5.23: a bare uuid
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content == output_text(0, 7)
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (3 + 4 + 1 + 2, 7)


async def test_openai_async_streaming_with_usage(sim: ServerThread) -> None:
    client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="sk-x")
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == output_text(0, 5)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert (
        chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    )
    await client.close()


def test_raw_sse_chunk_sequence_is_sglangs(sim: ServerThread) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(sim.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert all("usage" not in c for c in chunks[:-1])  # 0.5.23: no key at all before the usage chunk
    assert chunks[0]["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    content, finish, use = chunks[1:-2], chunks[-2], chunks[-1]
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == output_text(0, 4)
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert (
        use["choices"] == []
        and use["usage"]["completion_tokens"] == 4
        and use["usage"]["total_tokens"] == 4 + 9
    )


def test_sglang_0_5_9s_chunks_carry_every_key_and_prefixed_ids() -> None:
    with serve(create_app(SimConfig(time_scale=FAST, seed=3, sglang_version="0.5.9"))) as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(server.url + "/v1/chat/completions", json=body | {"stream": True, "ignore_eos": True})
        chunks = [orjson.loads(e) for e in _events(r.text)[:-1]]
        info = httpx.get(server.url + "/server_info").json()
    assert chunks[0]["id"].startswith("chatcmpl-") and info["version"] == "0.5.9"
    assert all(c["usage"] is None for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": None,
        "tool_calls": None,
    }
    assert chunks[-1]["choices"][0]["delta"]["content"] is None


def test_completions_stream_and_non_stream(sim: ServerThread) -> None:
    r = httpx.post(
        sim.url + "/v1/completions",
        json={"model": "m", "prompt": "abcd", "max_tokens": 3, "ignore_eos": True},
    )
    data = r.json()
    assert data["object"] == "text_completion" and data["choices"][0]["text"] == output_text(0, 3)
    assert data["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 3,
        "total_tokens": 4,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    s = httpx.post(
        sim.url + "/v1/completions", json={"model": "m", "prompt": "abcd", "max_tokens": 3, "stream": True}
    )
    events = _events(s.text)
    assert events[-1] == "[DONE]" and orjson.loads(events[-2])["choices"][0]["finish_reason"] in (
        "stop",
        "length",
    )


def test_errors_use_sglang_format(sim: ServerThread) -> None:
    r = httpx.post(sim.url + "/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert (
        r.status_code == 400 and r.json()["object"] == "error" and "application/json" in r.json()["message"]
    )
    long_prompt = "a" * 4 * 40_000
    r = httpx.post(
        sim.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": long_prompt}]},
    )
    body = r.json()
    assert r.status_code == 400 and body["code"] == 400 and body["param"] is None
    assert (
        body["message"]
        == "The input (40008 tokens) is longer than the model's context length (32768 tokens)."
    )
    url_part = {"type": "image_url", "image_url": {"url": "http://example.com/x.png"}}
    r = httpx.post(
        sim.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": [url_part]}]},
    )
    assert r.status_code == 400 and "no network" in r.json()["message"]


def test_image_prompt_tokens_follow_real_dimensions(sim: ServerThread) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (1920, 1080)).save(buf, format="JPEG")
    raw_b64 = base64.b64encode(buf.getvalue()).decode()
    parts: list[Any] = [{"type": "image_url", "image_url": {"url": raw_b64}}] * 2
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="sk-x")
    messages: Any = [{"role": "user", "content": parts}]
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=1)
    # 1080×1920 → 1222 tokens each (vision_tokens_reference.csv) + 2 markers; template 3 + 4 + "user" 1
    assert r.usage is not None and r.usage.prompt_tokens == 2 * (1222 + 2) + 8


def test_server_info_is_sglang_0_5_9s_and_the_old_route_warns_per_call(
    sim: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    profile = load_profile("default")
    with caplog.at_level(logging.WARNING, logger="loadtest.sim"):
        info = httpx.get(sim.url + "/server_info").json()
        assert not caplog.records  # the current route is silent
        old = [httpx.get(sim.url + "/get_server_info").json() for _ in range(2)]
    deprecated = "Endpoint '/get_server_info' is deprecated and will be removed in a future version."
    assert [r.getMessage().startswith(deprecated) for r in caplog.records] == [True, True]
    assert {k: v for k, v in old[0].items() if k != "internal_states"} == {
        k: v for k, v in info.items() if k != "internal_states"
    }
    # server args, then the scheduler's init info, then per-DP internal states, then the version
    assert info["max_total_num_tokens"] == 917_980  # derived from the profile's memory (test_memory)
    assert info["max_total_tokens"] is None and info["mem_fraction_static"] == 0.834
    assert info["max_running_requests"] == profile.engine.max_running_requests
    assert info["status"] == "ready" and info["version"] == "0.5.23"
    assert info["max_req_input_len"] == profile.context_length - 1
    assert info["enable_priority_scheduling"] is False and info["schedule_policy"] == "fcfs"
    [state] = info["internal_states"]
    assert state["memory_usage"] == {
        "weight": 16.65,
        "kvcache": 49.03,
        "token_capacity": 917_980,
        "graph": 0.09,
    }
    assert state["effective_max_running_requests_per_dp"] == 48 and state["chunked_prefill_size"] == 8192
    assert set(state) >= {"last_gen_throughput", "max_running_requests", "schedule_policy"}


def test_info_routes(sim: ServerThread) -> None:
    info = httpx.get(sim.url + "/server_info").json()
    profile = load_profile("default")
    models = httpx.get(sim.url + "/v1/models").json()
    assert models["data"][0]["id"] == profile.served_model_name
    assert httpx.get(sim.url + "/v1/models/" + profile.served_model_name).status_code == 200
    assert httpx.get(sim.url + "/v1/models/nope").status_code == 404
    assert httpx.get(sim.url + "/get_model_info").json()["model_type"] == "qwen2_5_omni"
    assert set(httpx.get(sim.url + "/get_load").json()[0]) == {
        "num_reqs",
        "num_waiting_reqs",
        "num_tokens",
        "dp_rank",
    }
    assert (
        httpx.get(sim.url + "/v1/loads").json()["loads"][0]["max_total_num_tokens"]
        == info["max_total_num_tokens"]
    )
    assert httpx.get(sim.url + "/health").status_code == 200
    assert httpx.get(sim.url + "/health_generate").status_code == 200


def test_metrics_have_sglang_names(sim: ServerThread) -> None:
    text = httpx.get(sim.url + "/metrics").text
    for name in [
        "num_running_reqs",
        "num_queue_reqs",
        "token_usage",
        "num_used_tokens",
        "max_total_num_tokens",
        "gen_throughput",
        "num_retracted_reqs",
        "cache_hit_rate",
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_requests_total",
        "num_aborted_requests_total",
        "time_to_first_token_seconds_bucket",
        "inter_token_latency_seconds_bucket",
        "e2e_request_latency_seconds_sum",
        "queue_time_seconds_count",
    ]:
        assert f"sglang:{name}" in text, name
    assert 'model_name="Qwen/Qwen2.5-Omni-7B"' in text and 'engine_type="unified"' in text


def test_time_scale_reports_virtual_seconds() -> None:
    """One request alone: its e2e is the schedule's prefill + decode steps, whatever the wall time was."""
    profile = load_profile("default")
    with serve(create_app(SimConfig(time_scale=FAST))) as server:
        t0 = time.monotonic()
        r = httpx.post(
            server.url + "/generate",
            json={
                "input_ids": list(range(1000)),
                "sampling_params": {"max_new_tokens": 20, "ignore_eos": True},
            },
        )
        wall = time.monotonic() - t0
        meta = r.json()["meta_info"]
        c = profile.costs
        expected = c.prefill_time([PrefillChunk(0, 1000)]) + sum(
            c.decode_time(1, 1000 + k) for k in range(19)
        )
        assert meta["completion_tokens"] == 20
        assert meta["e2e_latency"] == pytest.approx(expected, abs=1e-6)
        assert wall >= expected / FAST  # the loop really slept the scaled time
        assert _metric(server.url, "sglang:e2e_request_latency_seconds_sum") == pytest.approx(
            expected, rel=1e-6
        )


def test_a_streams_first_byte_comes_after_its_prefill() -> None:
    """As SGLang's serving_chat: the role chunk goes with the engine's first output, not at once — the
    gateway's first-byte timeout, its retry before the first byte and its prefill shield rely on it."""
    scale = 10.0
    with serve(create_app(SimConfig(time_scale=scale))) as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "x" * 20000}], "max_tokens": 2}
        prompt = httpx.post(server.url + "/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
        prefill = load_profile("default").costs.prefill_time([PrefillChunk(0, prompt)])
        assert prefill > 0.3  # simulated seconds: 30 ms of wall time at least
        t0 = time.monotonic()
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body | {"stream": True}) as resp:
            first = next(resp.iter_raw())
            wall = time.monotonic() - t0
    assert b'"role":"assistant"' in first
    assert wall >= prefill / scale  # the engine's prefill step (virtual seconds / time scale) came first


async def test_disconnect_aborts_and_frees_kv() -> None:
    with serve(create_app(SimConfig(time_scale=5.0))) as server:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "x" * 4000}],
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        }
        async with (
            httpx.AsyncClient() as client,
            client.stream("POST", server.url + "/v1/chat/completions", json=body) as resp,
        ):
            async for line in resp.aiter_lines():
                if "content" in line and '"content":""' not in line:
                    break
        await _until(lambda: _metric(server.url, "sglang:num_aborted_requests_total") == 1)
        assert _metric(server.url, "sglang:num_used_tokens") == 0


async def _until(cond: Callable[[], bool], limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


# a request that stays in the engine until aborted
LONG = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000, "ignore_eos": True}


async def _fill_one_slot_and_the_queue(
    client: httpx.AsyncClient, url: str, first: dict[str, Any], second: dict[str, Any]
) -> tuple[asyncio.Task[httpx.Response], asyncio.Task[httpx.Response]]:
    """One request running (`first`) and one waiting (`second`) on a one-slot, one-queue-place engine."""
    running = asyncio.create_task(client.post(url + "/v1/chat/completions", json=LONG | first))
    await _until(lambda: httpx.get(url + "/get_load").json()[0]["num_reqs"] == 1)
    waiting = asyncio.create_task(client.post(url + "/v1/chat/completions", json=LONG | second))
    await _until(lambda: httpx.get(url + "/get_load").json()[0]["num_waiting_reqs"] == 1)
    return running, waiting


async def test_queue_full_returns_503() -> None:
    cfg = SimConfig(time_scale=2.0, max_running_requests=1, max_queued_requests=1)
    with serve(create_app(cfg)) as server:
        async with httpx.AsyncClient(timeout=30) as client:
            running, queued = await _fill_one_slot_and_the_queue(client, server.url, {}, {})
            r = await client.post(server.url + "/v1/chat/completions", json=LONG)
            assert r.status_code == 503
            assert r.json() == {
                "object": "error",
                "message": "The request queue is full.",
                "type": "503",
                "param": None,
                "code": 503,
            }
            await client.post(server.url + "/abort_request", json={"abort_all": True})
            for ended in (await running, await queued):  # SGLang 0.5.23: the answer so far, 200
                assert ended.status_code == 200 and ended.json()["choices"][0]["finish_reason"] == "abort"


async def test_full_queue_under_priority_scheduling_aborts_the_lowest_waiting_request() -> None:
    cfg = SimConfig(
        time_scale=2.0, max_running_requests=1, max_queued_requests=1, enable_priority_scheduling=True
    )
    with serve(create_app(cfg)) as server:
        url = server.url + "/v1/chat/completions"
        async with httpx.AsyncClient(timeout=30) as client:
            running, low = await _fill_one_slot_and_the_queue(
                client, server.url, {"priority": 1}, {"priority": 0}
            )
            # the running one is only 2 below the newcomer: no preemption (threshold 10)
            high = asyncio.create_task(client.post(url, json=LONG | {"priority": 3}))
            evicted = await low
            assert evicted.status_code == 503
            assert evicted.json()["message"] == "The request is aborted by a higher priority request."
            assert _metric(server.url, "sglang:num_aborted_requests_total") == 1
            same = await client.post(url, json=LONG | {"priority": 3})  # not strictly better: refused
            assert same.status_code == 503 and same.json()["message"] == "The request queue is full."
            await client.post(server.url + "/abort_request", json={"abort_all": True})
            assert (await running).status_code == 200 and (await high).status_code == 200


def test_cli_takes_sglangs_scheduling_flags_and_refuses_what_sglang_refuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = cli.build_parser().parse_args(
        ["--enable-priority-scheduling", "--schedule-low-priority-values-first",
         "--priority-scheduling-preemption-threshold", "4", "--schedule-policy", "lof",
         "--mem-fraction-static", "0.8"]
    )  # fmt: skip
    config = cli.config_from_args(args)
    assert (config.enable_priority_scheduling, config.schedule_low_priority_values_first) == (True, True)
    assert (config.priority_scheduling_preemption_threshold, config.schedule_policy) == (4, "lof")
    assert config.build(config.load_profile())[1].mem_fraction_static == 0.8
    assert cli.main(["--schedule-policy", "priority", "--port", "0"]) == 2
    assert "Unknown schedule_policy: policy='priority'" in capsys.readouterr().out


def test_memory_peak_gauge_counts_static_memory_cached_tokens_and_activations() -> None:
    app = create_app(SimConfig(time_scale=FAST))
    with serve(app) as server:
        memory = app.state.sim.memory
        idle = _metric(server.url, "sim:memory_peak_bytes")
        assert idle == memory.static_bytes
        r = httpx.post(
            server.url + "/generate",
            json={"input_ids": list(range(1000)), "sampling_params": {"max_new_tokens": 1}},
        )
        assert r.status_code == 200
        # the one prefill step: 1000 cached tokens and 1000 tokens' activations plus one logits row
        expected = (
            memory.static_bytes
            + 1000 * memory.kv_bytes_per_token
            + memory.prefill_bytes([PrefillChunk(0, 1000)], sampled=1)
        )
        assert _metric(server.url, "sim:memory_peak_bytes") == expected


def test_faults_switch_at_runtime() -> None:
    with serve(create_app(SimConfig(time_scale=FAST, seed=1))) as server:
        chat = {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 50,
            "ignore_eos": True,
        }
        assert (
            httpx.post(
                server.url + "/admin/faults", json={"error_rate": 1.0, "error_status": 503}
            ).status_code
            == 200
        )
        r = httpx.post(server.url + "/v1/chat/completions", json=chat)
        assert r.status_code == 503 and r.json()["object"] == "error"
        httpx.post(
            server.url + "/admin/faults",
            json={"error_rate": 0.0, "disconnect_rate": 1.0, "disconnect_after_tokens": 2},
        )
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(server.url + "/v1/chat/completions", json={**chat, "stream": True})
        httpx.post(server.url + "/admin/faults", json={"disconnect_rate": 0.0, "health_failing": True})
        assert httpx.get(server.url + "/health").status_code == 503
        bad = httpx.post(server.url + "/admin/faults", json={"error_rate": 2})
        assert (
            bad.status_code == 400
            and httpx.get(server.url + "/admin/faults").json()["health_failing"] is True
        )
        assert httpx.post(server.url + "/v1/chat/completions", json=chat).status_code == 200


def test_slow_start_fails_health_then_recovers() -> None:
    cfg = SimConfig(time_scale=FAST, faults=FaultConfig(slow_start_s=0.3 * FAST))
    with serve(create_app(cfg)) as server:
        assert httpx.get(server.url + "/health").status_code == 503
        deadline = time.monotonic() + 10
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
