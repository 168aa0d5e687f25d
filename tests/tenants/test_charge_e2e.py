"""Charging what the engine did, end to end: a real gateway in front of the simulated engine (whose own
account, GET /sim/work, is the reference) or the fake SGLang server, clients that leave, streams that are
cut, answers without usage."""

from __future__ import annotations

import base64
import io
import re
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from PIL import Image

from gateway.estimate.text import estimate_text_tokens
from gateway.http.app import create_app
from loadtest.sim.config import SimConfig
from loadtest.sim.server import create_app as create_sim
from tests.gateway.conftest import ADMIN, gateway_config
from tests.support.fake_sglang import Behaviour, make_app
from tests.support.processes import Processes
from tests.support.servers import ServerThread, serve
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

MODEL = "qwen2.5-omni-7b"
KEY = "og-alice-charge-test-0123456789"


def _png(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (40, 90, 160)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _gateway(
    stack: ExitStack, tmp_path: Path, backend: str, model: str, policy_text: str = "version: 1\n"
) -> ServerThread:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    pool = {"name": "interactive", "models": [model], "backends": [backend], "health_interval_s": 0.2}
    config = gateway_config(
        [backend],
        policy,
        pools=[pool],
        auth={"required": True},
        tenants=[{"id": "alice", "name": "Alice", "keys": [KEY]}],
    )
    return stack.enter_context(serve(create_app(config)))


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def _today(gw: str) -> dict[str, Any]:
    resp = httpx.get(
        gw + "/admin/tenants/alice/usage",
        params={"days": 1},
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    report: dict[str, Any] = resp.json()
    return report


def _settled(gw: str, requests: int) -> dict[str, Any] | None:
    report = _today(gw)
    done = report["today"]["requests"] == requests and report["concurrent"]["active"] == 0
    return report["today"] if done else None


def _inferred(gw: str, reason: str) -> float:
    text = httpx.get(gw + "/metrics", timeout=10).text
    found = re.search(rf'^omnigate_usage_inferred_total{{reason="{reason}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def _leave_in_prefill(client: httpx.AsyncClient, sim: str, body: bytes, request_id: str) -> bool:
    """Send a streaming request and disconnect once the engine has it (at least 0.35 s after sending, as
    the issue's probe; at most 5 s, when the gateway still queues it); True if no byte came back."""
    headers = {
        "authorization": f"Bearer {KEY}",
        "x-request-id": request_id,
        "content-type": "application/json",
    }
    got_byte = False

    async def engine_has_it() -> None:
        await anyio.sleep(0.35)
        async with httpx.AsyncClient(timeout=10) as probe:
            while True:
                if request_id in (await probe.get(sim + "/sim/work")).json():
                    return
                await anyio.sleep(0.02)

    async with anyio.create_task_group() as tg:

        async def send() -> None:
            nonlocal got_byte
            async with client.stream("POST", "/v1/chat/completions", content=body, headers=headers) as resp:
                async for _ in resp.aiter_raw():
                    got_byte = True

        tg.start_soon(send)
        with anyio.move_on_after(5):  # else the gateway's queue holds it: it leaves from there, unserved
            await engine_has_it()
        tg.cancel_scope.cancel()
    return not got_byte


def _engine_counted(sim: str) -> int:
    """The engine's own count: `sglang:prompt_tokens_total + generation_tokens_total`."""
    total = 0.0
    for line in httpx.get(sim + "/metrics", timeout=10).text.splitlines():
        if line.startswith(("sglang:prompt_tokens_total", "sglang:generation_tokens_total")):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _work_count(work: dict[str, Any]) -> int:
    return int(work["prompt_tokens"]) * bool(work["prefilled"]) + int(work["generated"])


REASONS = ("client_left", "left_queued", "stream_cut", "no_usage")  # omnigate_usage_inferred_total's
STORY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
    "max_tokens": 2000,
    "ignore_eos": True,
}


def _charged_exactly(
    gw: str, sim: str, ids: list[str], before: list[float]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Once the ledger settled: the engine's counters grew by its account of the requests `ids`, the tenant
    was charged exactly that, and nothing was inferred. Today's usage and the engine's account of each."""
    today = wait_for(lambda: _settled(gw, len(ids)), timeout=10)
    assert today is not None, _today(gw)["today"]
    work = httpx.get(sim + "/sim/work", timeout=10).json()
    served = [work[i] for i in ids]
    counted = _engine_counted(sim)
    assert counted == sum(_work_count(w) for w in served)
    assert today["input_tokens"] + today["output_tokens"] == counted
    assert [_inferred(gw, r) for r in REASONS] == before
    return today, served


def test_clients_leaving_during_prefill_pay_what_the_engine_counted(stack: ExitStack, tmp_path: Path) -> None:
    """The issue's probe: five streams of four 1920x1080 images each, every client gone 0.35 s after
    sending, once the engine has it (during its prefill, before the first token but for the first
    perhaps). The gateway ends each on the engine (`/abort_request`) and charges the usage it closes with:
    the tenant pays exactly the engine's own count — the prefills it ran, nothing for those it dropped
    from its waiting queue — and nothing is inferred."""
    # a process of its own, at half a real GPU's speed: the prefills outlast a loaded test machine's lag
    procs = stack.enter_context(closing(Processes(tmp_path)))
    sim = procs.sim("--time-scale", "0.5", "--model", MODEL, "--seed", "1")
    gw = _gateway(stack, tmp_path, sim.url, MODEL).url
    image = _png(1920, 1080)
    parts = [{"type": "text", "text": "Compare these four screenshots."}]
    parts += [{"type": "image_url", "image_url": {"url": image}}] * 4
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": parts}], "stream": True})
    ids = [f"probe-{uuid.uuid4().hex}" for _ in range(5)]
    before = [_inferred(gw, r) for r in REASONS]

    async def run() -> list[bool]:
        results: list[bool] = [False] * 5
        async with httpx.AsyncClient(base_url=gw, timeout=30) as client:

            async def one(i: int) -> None:
                results[i] = await _leave_in_prefill(client, sim.url, body, ids[i])

            async with anyio.create_task_group() as tg:
                for i in range(5):
                    tg.start_soon(one, i)
        return results

    # the first may see its first token by then; the others are still in (or waiting for) their prefill
    assert sum(anyio.run(run)) >= 3, "clients got bytes before leaving: the probe left too late"
    today = wait_for(lambda: _settled(gw, 5), timeout=20)
    assert today is not None, _today(gw)["today"]
    work = httpx.get(sim.url + "/sim/work", timeout=10).json()
    served = [work[i] for i in ids if i in work]  # the rest left the gateway's queue: no tokens for them
    assert len(served) >= 2 and all(w["finish_reason"] == "abort" for w in served)
    assert served[0]["prompt_tokens"] > 4 * 1000  # four 1080p images are ~4,900 prompt tokens
    assert any(w["prefilled"] for w in served) and not all(w["prefilled"] for w in served)
    counted = _engine_counted(sim.url)
    assert counted == sum(_work_count(w) for w in served)
    assert today["input_tokens"] + today["output_tokens"] == counted
    assert today["input_tokens"] == sum(w["prompt_tokens"] for w in served if w["prefilled"])
    assert [_inferred(gw, r) for r in REASONS] == before


def test_a_client_leaving_mid_stream_pays_exactly_what_the_engine_counted(
    stack: ExitStack, tmp_path: Path
) -> None:
    """Three clients each leave a long stream after ten tokens: the gateway ends each on the engine and
    charges the usage it closes with — to the token the engine's counters grew by, nothing inferred —
    though the engine went on generating after the last token the client read."""
    sim = stack.enter_context(serve(create_sim(SimConfig(model=MODEL, time_scale=5, seed=1))))
    gw = _gateway(stack, tmp_path, sim.url, MODEL).url
    before = [_inferred(gw, r) for r in REASONS]
    ids = [f"mid-{uuid.uuid4().hex}" for _ in range(3)]
    read = 0
    for request_id in ids:
        headers = {"authorization": f"Bearer {KEY}", "x-request-id": request_id}
        body = {**STORY, "stream": True}
        with httpx.stream("POST", gw + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
            tokens = 0
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                    tokens += 1
                if tokens == 10:
                    break
            read += tokens
    today, served = _charged_exactly(gw, sim.url, ids, before)
    assert all(w["finish_reason"] == "abort" and w["prefilled"] for w in served)
    assert today["output_tokens"] == sum(w["generated"] for w in served) >= read


def test_a_client_leaving_a_whole_answer_pays_exactly_what_the_engine_counted(
    stack: ExitStack, tmp_path: Path
) -> None:
    """Clients leave whole answers the engine is generating: the gateway ends each on the engine, which
    answers it with the answer so far and its usage, and charges that — the engine's count, nothing
    inferred."""
    sim = stack.enter_context(serve(create_sim(SimConfig(model=MODEL, time_scale=5, seed=1))))
    gw = _gateway(stack, tmp_path, sim.url, MODEL).url
    before = [_inferred(gw, r) for r in REASONS]
    ids = [f"whole-{uuid.uuid4().hex}" for _ in range(2)]
    for request_id in ids:
        headers = {"authorization": f"Bearer {KEY}", "x-request-id": request_id}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up on the answer
            httpx.post(gw + "/v1/chat/completions", json=STORY, headers=headers, timeout=1.0)
    _, served = _charged_exactly(gw, sim.url, ids, before)
    assert all(w["finish_reason"] == "abort" and w["generated"] > 10 for w in served)


def test_the_issues_probe_against_the_demos_engines_pays_what_they_prefilled(
    stack: ExitStack, tmp_path: Path
) -> None:
    """The issue's probe as it was run against `omnigate demo --no-load` (two engines at a GPU's speed):
    five streams of four 1920x1080 images each, every client gone 0.35 s after sending. Each engine
    started the first it got at once; the others waited behind that prefill and were dropped unprefilled
    when their clients left (so the engines prefilled two of the five prompts, not the five the issue
    assumed). The ledger charges the prompts the engines prefilled (as it priced them) — before, it
    charged none."""
    procs = stack.enter_context(closing(Processes(tmp_path)))
    sims = [procs.sim("--model", MODEL, "--seed", str(i), name=f"sim-{i}") for i in (1, 2)]
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    urls = [sim.url for sim in sims]
    pool = {"name": "interactive", "models": [MODEL], "backends": urls, "health_interval_s": 0.2}
    config = gateway_config(
        urls,
        policy,
        pools=[pool],
        auth={"required": True},
        tenants=[{"id": "alice", "name": "Alice", "keys": [KEY]}],
    )
    gw = stack.enter_context(serve(create_app(config))).url
    image = _png(1920, 1080)
    parts = [{"type": "text", "text": "Compare these four screenshots."}]
    parts += [{"type": "image_url", "image_url": {"url": image}}] * 4
    body = {"model": MODEL, "messages": [{"role": "user", "content": parts}], "stream": True}
    ids = [f"demo-{uuid.uuid4().hex}" for _ in range(5)]

    async def leave(client: httpx.AsyncClient, request_id: str) -> None:
        headers = {"authorization": f"Bearer {KEY}", "x-request-id": request_id}
        with anyio.move_on_after(0.35):
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
                async for _ in resp.aiter_raw():
                    pass

    async def run() -> None:
        async with httpx.AsyncClient(base_url=gw, timeout=30) as client, anyio.create_task_group() as tg:
            for request_id in ids:
                tg.start_soon(leave, client, request_id)

    anyio.run(run)
    today = wait_for(lambda: _settled(gw, 5), timeout=20)
    assert today is not None, _today(gw)["today"]
    work: dict[str, Any] = {}
    for sim in sims:
        work.update(httpx.get(sim.url + "/sim/work", timeout=10).json())
    served = [work[i] for i in ids if i in work]
    assert len(served) == 5
    engine_prompt = sum(w["prompt_tokens"] for w in served if w["prefilled"])
    assert engine_prompt >= 2 * 4 * 1000  # at least the first on each engine: ~4,900 prompt tokens each
    assert abs(today["input_tokens"] - engine_prompt) <= 0.01 * engine_prompt  # the gateway's price of them


def test_a_cut_stream_is_charged_by_its_tokens(stack: ExitStack, tmp_path: Path) -> None:
    """The engine drops the connection after 40 tokens, sent several to a chunk: the charge counts the
    answer's tokens (the engine's own count, within the text counter's error), not its chunks."""
    config = SimConfig(model=MODEL, time_scale=20, seed=1)
    sim = stack.enter_context(serve(create_sim(config)))
    gw = _gateway(stack, tmp_path, sim.url, MODEL).url
    httpx.post(
        sim.url + "/admin/faults", json={"disconnect_rate": 1.0, "disconnect_after_tokens": 40}, timeout=10
    )
    before = _inferred(gw, "stream_cut")
    ids = [f"cut-{uuid.uuid4().hex}" for _ in range(3)]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    chunks = words = 0
    for request_id in ids:
        headers = {"authorization": f"Bearer {KEY}", "x-request-id": request_id}
        with httpx.stream("POST", gw + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.read().decode().split("\n") if line.startswith("data: {")]
        assert '"error"' in events[-1]  # the client was told the stream failed
        contents = [orjson.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
        chunks += sum(1 for c in contents if c)
        words += sum(len(c.split()) for c in contents if c)  # the simulator sends one word per token
    today = wait_for(lambda: _settled(gw, 3), timeout=10)
    assert today is not None, _today(gw)["today"]
    work = httpx.get(sim.url + "/sim/work", timeout=10).json()
    engine_prompt = sum(work[i]["prompt_tokens"] for i in ids)
    assert words >= 3 * 40
    assert chunks < words  # tokens were batched into chunks: a per-chunk charge would be short
    assert abs(today["input_tokens"] - engine_prompt) <= 0.15 * engine_prompt  # text-only prompt
    assert words <= today["output_tokens"] <= 1.25 * words  # the text counter, on the sim's words
    assert _inferred(gw, "stream_cut") - before == 3


def test_a_whole_answer_the_gateway_gave_up_on_pays_what_the_engine_generated(
    stack: ExitStack, tmp_path: Path
) -> None:
    """The total timeout ends a whole answer the engine is still generating: 504 to the client, and
    the ledger charges the prompt plus the tokens predicted generated until the engine stopped, as for a
    client that left — not the prompt alone."""
    sim = stack.enter_context(serve(create_sim(SimConfig(model=MODEL, time_scale=1, seed=1))))
    policy = "version: 1\npool_defaults:\n  timeouts: {total: 1.0}\n"
    gw = _gateway(stack, tmp_path, sim.url, MODEL, policy).url
    headers = {"authorization": f"Bearer {KEY}"}
    messages = [{"role": "user", "content": "Tell me a long story about the sea."}]
    for _ in range(3):  # finished answers: the backend's pace per token
        body = {"model": MODEL, "messages": messages, "max_tokens": 20, "ignore_eos": True}
        assert (
            httpx.post(gw + "/v1/chat/completions", json=body, headers=headers, timeout=10).status_code == 200
        )
    warm = wait_for(lambda: _settled(gw, 3), timeout=10)
    assert warm is not None and warm["output_tokens"] == 60
    request_id = f"slow-{uuid.uuid4().hex}"
    body = {"model": MODEL, "messages": messages, "max_tokens": 2000, "ignore_eos": True}
    slow = httpx.post(
        gw + "/v1/chat/completions", json=body, headers={**headers, "x-request-id": request_id}, timeout=10
    )
    assert slow.status_code == 504, slow.text
    today = wait_for(lambda: _settled(gw, 4), timeout=10)
    assert today is not None, _today(gw)["today"]
    generated = wait_for(
        lambda: httpx.get(sim.url + "/sim/work", timeout=10).json()[request_id]["generated"] or None
    )
    charged = today["output_tokens"] - 60
    assert 0.6 * generated <= charged <= 1.4 * generated, (charged, generated)


def test_a_stream_ended_without_usage_in_time_pays_what_was_relayed_and_the_lesser_prompt(
    stack: ExitStack, tmp_path: Path
) -> None:
    """The client leaves after the first token; the gateway asks the engine to end the stream (its rid in
    `/abort_request`) and reads on for `end_wait_s`, but this engine sends nothing more in time: the charge
    is the guess that errs toward the customer — the priced prompt and the one token relayed, none the
    engine may have made after — flagged client_left."""
    app, _, record = make_app(Behaviour(token_delay=3.0, ends_on_abort=False))
    backend = stack.enter_context(serve(app))
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    pool = {"name": "interactive", "models": ["test-model"], "backends": [backend.url], "end_wait_s": 0.3}
    config = gateway_config(
        [backend.url],
        policy,
        pools=[pool],
        auth={"required": True},
        tenants=[{"id": "alice", "name": "Alice", "keys": [KEY]}],
    )
    gw = stack.enter_context(serve(create_app(config))).url
    before = _inferred(gw, "client_left")
    body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
    headers = {"authorization": f"Bearer {KEY}"}
    seen: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", gw + "/v1/chat/completions", json={**body, "stream": True}, headers=headers, timeout=30
    ) as resp:
        prompt = int(resp.headers["x-omnigate-estimated-tokens"]) - 30  # expected output = the cap here
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                seen.append(orjson.loads(line[6:]))
            if len(seen) == 2:  # the role chunk and the first token: leave
                break
    today = wait_for(lambda: _settled(gw, 1), timeout=10)
    assert today is not None, _today(gw)["today"]
    rid = record.received[0]["rid"]
    assert rid.startswith("chatcmpl-") and set(record.ended) == {rid}  # asked until the wait ended
    assert record.received[0]["stream_options"] == {"include_usage": True}  # asked for, for the ledger
    assert today["input_tokens"] == prompt
    assert today["output_tokens"] == estimate_text_tokens(seen[1]["choices"][0]["delta"]["content"])
    assert _inferred(gw, "client_left") - before == 1


def test_an_answer_without_usage_is_charged_by_its_text(stack: ExitStack, tmp_path: Path) -> None:
    """A server that sends no `usage`, streamed or whole: charged prompt (as priced) plus the counted
    answer, flagged no_usage."""
    app, _, _ = make_app(Behaviour(send_usage=False))
    backend = stack.enter_context(serve(app))
    gw = _gateway(stack, tmp_path, backend.url, "test-model").url
    before = _inferred(gw, "no_usage")
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
    whole = httpx.post(gw + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert whole.status_code == 200 and "usage" not in whole.json()
    prompt = int(whole.headers["x-omnigate-estimated-tokens"]) - 30  # expected output = the cap here
    streamed = httpx.post(
        gw + "/v1/chat/completions", json={**body, "stream": True}, headers=headers, timeout=10
    )
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    today = wait_for(lambda: _settled(gw, 2), timeout=10)
    assert today is not None, _today(gw)["today"]
    assert today["input_tokens"] == 2 * prompt
    # "t " * 30 whole (one word each) and "t0 " … "t29 " streamed: ≥ 30 each by the text counter
    assert 60 <= today["output_tokens"] <= 2 * 30 * 2
    assert _inferred(gw, "no_usage") - before == 2
