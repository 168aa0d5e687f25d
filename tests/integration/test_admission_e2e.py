"""Admission end to end: a real gateway in front of simulated SGLang backends (all real uvicorn servers).

What only the whole house can show: the gateway's budgets hold on the backends' own counters, every slot
comes back after a chaotic run (client disconnects, backend faults, a backend going unhealthy), and the
effective priority reaches the engine. No timing claims: the sims run fast (`time_scale`) and every wait
is a bounded poll.
"""

from __future__ import annotations

import asyncio
import base64
import io
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.app import create_app
from gateway.settings.config import parse_config
from loadtest.sim.config import SimConfig
from loadtest.sim.server import create_app as create_sim
from tests.support.servers import ServerThread, serve

pytestmark = pytest.mark.e2e

MODEL = "qwen2.5-omni-7b"
ADMIN = {"authorization": "Bearer e2e-admin"}
LIMIT = 4  # per-backend concurrency (fixed controller)
MULTI_CAP = 2  # per-backend multi_image bucket cap
POLICY = f"""\
version: 1
pool_defaults:
  timeouts: {{connect: 1.0, first_byte: 20.0, idle: 20.0, total: 60.0}}
  retries: 1
  # no circuit breaker: the chaos run's flaky backends must stay in rotation (tests/gateway/test_circuit*)
  circuit: {{consecutive_failures: null, failure_ratio: null}}
controller: {{algorithm: fixed, initial: {LIMIT}, min: {LIMIT}, max: {LIMIT}}}
budgets:
  bucket_caps: {{multi_image: {MULTI_CAP}, single_image: 64, long_doc: 8}}
  # these prompts are small: a low threshold so the shield holds in the chaos run
  shield: {{tokens: 32}}
fairness: {{reserve_fraction: 0}}  # headroom reserves off: these tests fill the cap itself
queue:
  priorities: {{reserve_fraction: 0}}
  classes:
    interactive: {{pool: interactive, ttft_p99_s: 30.0, tpot_p99_s: 1.0, max_wait_s: 30.0}}
    # no `pool:` (routed to the pool named offline): the one-pool stacks run this policy too
    offline: {{ttft_p99_s: null, tpot_p99_s: null, completion_deadline_s: 600,
              max_wait_s: 60.0, shed_by_deadline: false}}
"""


class BodyRecorder:
    """ASGI wrapper around a sim that keeps every generation request body it receives (then replays it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(orjson.loads(raw))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _png(size: int, shade: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (shade, 40, 90)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGES = [_png(56, 10), _png(84, 200)]


def chat(tokens: int, *, images: int = 0, stream: bool = True) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "Tell me about the queue. " * 4}]
    parts += [{"type": "image_url", "image_url": {"url": IMAGES[i % 2]}} for i in range(images)]
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def _asking(body: dict[str, Any], question: str) -> dict[str, Any]:
    """`body` with its text part replaced by `question` (four times, as long as `chat`'s own)."""
    body["messages"][0]["content"][0]["text"] = f"{question} " * 4
    return body


class Stack:
    """Sims and one gateway, started in-process on free loopback ports."""

    def __init__(self, stack: ExitStack, tmp_path: Path) -> None:
        self._stack = stack
        self.policy = tmp_path / "policy.yaml"
        self.policy.write_text(POLICY)

    def sim(self, seed: int, time_scale: float = 10.0, **kw: Any) -> ServerThread:
        app = create_sim(SimConfig(model=MODEL, time_scale=time_scale, seed=seed, **kw))
        return self._stack.enter_context(serve(app))

    def gateway(self, pools: list[dict[str, Any]], tenants: list[dict[str, Any]] | None = None) -> str:
        data = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "policy_path": str(self.policy),
            "watch_policy": False,
            "admin": {"token": "e2e-admin"},
            "auth": {"required": tenants is not None},
            "store": {"kind": "memory"},
            "access_log": False,
            "pools": [{"models": [MODEL], "health_interval_s": 0.1, **p} for p in pools],
            "tenants": tenants or [],
        }
        return self._stack.enter_context(serve(create_app(parse_config(data, environ={})))).url


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with ExitStack() as s:
        yield Stack(s, tmp_path)


async def sim_load(client: httpx.AsyncClient, sim: str) -> int:
    """Requests the engine holds (running + waiting), from its own `/v1/loads`."""
    load = (await client.get(sim + "/v1/loads")).json()["loads"][0]
    return int(load["num_running_reqs"]) + int(load["num_waiting_reqs"])


async def sample_peaks(sims: list[str], stop: asyncio.Event) -> dict[str, int]:
    """Highest engine load seen per sim while the workload runs."""
    peaks = dict.fromkeys(sims, 0)
    async with httpx.AsyncClient(timeout=5) as client:
        while not stop.is_set():
            for sim in sims:
                peaks[sim] = max(peaks[sim], await sim_load(client, sim))
            await asyncio.sleep(0.003)
    return peaks


async def stream_all(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> int:
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        data = await resp.aread()
    assert resp.status_code == 200, data
    assert data.endswith(b"data: [DONE]\n\n")
    return resp.status_code


async def run_peaks(
    gw: str, sims: list[str], bodies: list[dict[str, Any]], concurrency: int
) -> dict[str, int]:
    """Send `bodies` with `concurrency` clients, all through the gateway; the sims' peak loads."""
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_peaks(sims, stop))
    todo = list(bodies)
    async with httpx.AsyncClient(timeout=60) as client:

        async def worker() -> None:
            while todo:
                await stream_all(client, gw, todo.pop())

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), 60)
    stop.set()
    return await sampler


async def wait_ready(gw: str, pools: int = 1) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        for _ in range(200):
            resp = await client.get(gw + "/readyz")
            if resp.status_code == 200:
                state = (await client.get(gw + "/admin/state", headers=ADMIN)).json()
                if all(b["max_total_tokens"] for p in state["pools"].values() for b in p["backends"]):
                    return
            await asyncio.sleep(0.05)
    raise AssertionError("gateway never became ready with scraped backends")


async def test_budgets_hold_on_the_engines_own_counters(stack: Stack) -> None:
    sims = [stack.sim(seed=1).url, stack.sim(seed=2).url]
    gw = stack.gateway([{"name": "interactive", "backends": sims}])
    await wait_ready(gw)
    # Text: 24 clients against 2 × LIMIT slots. Every slot fills, none overflows.
    peaks = await run_peaks(gw, sims, [chat(120) for _ in range(32)], concurrency=24)
    assert peaks == dict.fromkeys(sims, LIMIT)
    # Multi-image alone: the bucket cap, not the concurrency limit, is what binds.
    peaks = await run_peaks(gw, sims, [chat(120, images=2) for _ in range(16)], concurrency=12)
    assert peaks == dict.fromkeys(sims, MULTI_CAP)


async def gateway_idle(client: httpx.AsyncClient, gw: str) -> list[str]:
    """Every counter the gateway holds that is not back at zero (empty list: all released)."""
    state = (await client.get(gw + "/admin/state", headers=ADMIN)).json()
    left = []
    for name, pool in state["pools"].items():
        for key in (
            "in_flight",
            "queue_depth",
            "borrowed_in_flight",
            "lent_in_flight",
            "queued_prefill_tokens",
        ):
            if pool[key]:
                left.append(f"{name}.{key}={pool[key]}")
        for b in pool["backends"]:
            for key in ("active", "outstanding_tokens", "reserved_kv_tokens", "pending_prefill_tokens"):
                if b[key]:
                    left.append(f"{b['url']}.{key}={b[key]}")
            if b["buckets"]:
                left.append(f"{b['url']}.buckets={b['buckets']}")
    return left


async def gateway_settled(client: httpx.AsyncClient, gw: str) -> list[str]:
    """`gateway_idle` once the counters had ~2 s to settle: the last release may follow the last byte
    by a moment."""
    for _ in range(100):
        if not (left := await gateway_idle(client, gw)):
            break
        await asyncio.sleep(0.02)
    return left


async def test_chaos_then_every_counter_returns_to_zero(stack: Stack) -> None:
    sims = [stack.sim(seed=3).url, stack.sim(seed=4).url, stack.sim(seed=5).url]
    gw = stack.gateway([{"name": "interactive", "backends": sims}])
    await wait_ready(gw)
    rng = random.Random(7)
    outcomes: dict[str, int] = {}

    def count(kind: str) -> None:
        outcomes[kind] = outcomes.get(kind, 0) + 1

    async with httpx.AsyncClient(timeout=60) as admin:
        await admin.post(sims[0] + "/admin/faults", json={"error_rate": 0.3, "error_status": 503})
        await admin.post(
            sims[1] + "/admin/faults", json={"disconnect_rate": 0.3, "disconnect_after_tokens": 3}
        )

    async def complete(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        async with client.stream("POST", gw + "/v1/chat/completions", json=body) as resp:
            await resp.aread()
        count(f"complete:{resp.status_code}")

    async def leave_mid_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        async with client.stream("POST", gw + "/v1/chat/completions", json=body) as resp:
            chunks = 0
            async for _ in resp.aiter_raw():
                chunks += 1
                if chunks >= 3:
                    break
        count(f"left_stream:{resp.status_code}")

    async def leave_while_queued(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        try:
            await asyncio.wait_for(client.post(gw + "/v1/chat/completions", json=body), 0.05)
            count("left_queue:answered")
        except TimeoutError:
            count("left_queue:cut")

    actions: list[Callable[[httpx.AsyncClient, dict[str, Any]], Awaitable[None]]] = [
        complete,
        leave_mid_stream,
        leave_while_queued,
    ]

    bands = random.Random(8)  # two bands, so the prefill shield holds band 0 while band 5 is about

    async def client_task(i: int) -> None:
        await asyncio.sleep(rng.uniform(0, 0.6))
        body = chat(rng.choice([20, 80, 200]), images=rng.choice([0, 0, 1, 3]), stream=rng.random() < 0.85)
        headers = {"x-priority": bands.choice(["0", "5"])}
        async with httpx.AsyncClient(timeout=30, headers=headers) as client:
            await rng.choice(actions)(client, body)

    async def backend_goes_unhealthy() -> None:
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient(timeout=5) as client:
            await client.post(sims[2] + "/admin/faults", json={"health_failing": True})

    await asyncio.wait_for(asyncio.gather(backend_goes_unhealthy(), *(client_task(i) for i in range(60))), 60)
    # The chaos really happened: every kind of exit was taken.
    assert {k.split(":")[0] for k in outcomes} == {"complete", "left_stream", "left_queue"}, outcomes

    async with httpx.AsyncClient(timeout=5) as client:
        left: list[str] = ["not checked"]
        for _ in range(150):  # bounded: up to ~15 s under CPU contention
            left = await gateway_idle(client, gw)
            left += [f"{s}: {n} in engine" for s in sims if (n := await sim_load(client, s))]
            if not left:
                break
            await asyncio.sleep(0.1)
        assert left == []
        state = (await client.get(gw + "/admin/state", headers=ADMIN)).json()["pools"]["interactive"]
        assert [b["available"] for b in state["backends"]] == [True, True, False]


async def test_effective_priority_reaches_the_engine_only_where_the_pool_asks(stack: Stack) -> None:
    recorders = [BodyRecorder(create_sim(SimConfig(model=MODEL, time_scale=20, seed=s))) for s in (6, 7)]
    urls = [stack._stack.enter_context(serve(r)).url for r in recorders]
    tenants = [
        {"id": "vip", "keys": ["sk-vip"], "max_priority": 10, "default_priority": 7},
        {"id": "plain", "keys": ["sk-plain"], "max_priority": 5, "default_priority": 1},
    ]
    gw = stack.gateway(
        [
            {"name": "interactive", "backends": urls[:1], "priority_scheduling": True},
            {"name": "offline", "backends": urls[1:], "priority_scheduling": False},
        ],
        tenants,
    )
    await wait_ready(gw)
    sends = [  # (key, x-priority header, engine priority): 2 × the effective priority, as each request
        # is alone when dispatched (no other tenant to be under the share of)
        ("sk-vip", None, 14),
        ("sk-vip", "10", 20),
        ("sk-vip", "3", 6),
        ("sk-plain", None, 2),
        ("sk-plain", "10", 10),  # capped at the tenant's max_priority 5
    ]
    async with httpx.AsyncClient(timeout=30) as client:
        for traffic_class in ("interactive", "offline"):
            for key, priority, _ in sends:
                headers = {"authorization": f"Bearer {key}", "x-omnigate-class": traffic_class}
                if priority is not None:
                    headers["x-priority"] = priority
                # a client's own `priority` field never reaches an engine: the gateway sets it or drops it
                body = chat(4, stream=False) | {"priority": 99}
                resp = await client.post(gw + "/v1/chat/completions", json=body, headers=headers)
                assert resp.status_code == 200, resp.text
    assert [b.get("priority") for b in recorders[0].bodies] == [want for *_, want in sends]
    assert [("priority" in b) for b in recorders[1].bodies] == [False] * len(sends)


def _counter(metrics_text: str, name: str, pool: str) -> float:
    """The counter `name`{pool=`pool`} (0 before its first increment)."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name and sample.labels == {"pool": pool}:
                return sample.value
    return 0.0


def _loans_revoked(metrics_text: str) -> float:
    return _counter(metrics_text, "omnigate_loans_revoked_total", "offline")


async def test_loans_give_the_backend_back_when_interactive_requests_wait(stack: Stack) -> None:
    """Offline whole requests fill their own backend and borrow every slot of the interactive one; two
    interactive streams then arrive. Each revokes one loan (newest first, one at a time), runs at once
    and finishes while every offline request is still generating; the revoked requests queue again and
    still answer 200 — nothing is lost, and every counter returns to zero."""
    lend = "budgets:\n  pools: {interactive: {lend: {enabled: true, max_load: 1.0}}}\n"
    stack.policy.write_text(POLICY.replace("budgets:\n", lend))
    inter, off = stack.sim(seed=8, time_scale=5).url, stack.sim(seed=9, time_scale=5).url
    gw = stack.gateway([{"name": "interactive", "backends": [inter]}, {"name": "offline", "backends": [off]}])
    await wait_ready(gw)
    done: list[str] = []
    offline_headers = {"x-omnigate-class": "offline"}
    async with httpx.AsyncClient(timeout=60) as client:
        before = _loans_revoked((await client.get(gw + "/metrics")).text)

        async def offline(i: int) -> None:
            body = chat(1500, stream=False)
            resp = await client.post(gw + "/v1/chat/completions", json=body, headers=offline_headers)
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == 1500
            done.append(f"offline-{i}")

        batch = [asyncio.create_task(offline(i)) for i in range(2 * LIMIT)]
        for _ in range(400):  # until the loans hold every interactive slot, on the engines' own count
            state = (await client.get(gw + "/admin/state", headers=ADMIN)).json()["pools"]
            loads = (await sim_load(client, inter), await sim_load(client, off))
            if state["interactive"]["lent_in_flight"] == LIMIT and loads == (LIMIT, LIMIT):
                break
            await asyncio.sleep(0.01)
        assert loads == (LIMIT, LIMIT) and state["interactive"]["lent_in_flight"] == LIMIT

        async def interactive(i: int) -> None:
            await stream_all(client, gw, chat(8))
            done.append(f"interactive-{i}")

        await asyncio.wait_for(asyncio.gather(interactive(0), interactive(1)), 30)
        assert done == ["interactive-0", "interactive-1"] or done == ["interactive-1", "interactive-0"]
        await asyncio.wait_for(asyncio.gather(*batch), 60)
        assert sorted(done[2:]) == [f"offline-{i}" for i in range(2 * LIMIT)]
        assert _loans_revoked((await client.get(gw + "/metrics")).text) == before + 2
        assert await gateway_idle(client, gw) == []


async def test_lending_with_clients_leaving_and_loans_revoked_leaves_nothing_held(stack: Stack) -> None:
    """Chaos on the lending path: two offline clients go away mid-generation (on whichever backend they
    run), then three interactive streams take the interactive backend back. Every interactive stream and
    every remaining offline request completes, and the gateway's and both engines' counters return to 0."""
    lend = "budgets:\n  pools: {interactive: {lend: {enabled: true, max_load: 1.0}}}\n"
    stack.policy.write_text(POLICY.replace("budgets:\n", lend))
    inter, off = stack.sim(seed=10, time_scale=5).url, stack.sim(seed=11, time_scale=5).url
    gw = stack.gateway([{"name": "interactive", "backends": [inter]}, {"name": "offline", "backends": [off]}])
    await wait_ready(gw)
    offline_headers = {"x-omnigate-class": "offline"}

    async def offline() -> int:
        async with httpx.AsyncClient(timeout=60) as own:  # its own connection: cancelling closes it
            resp = await own.post(
                gw + "/v1/chat/completions", json=chat(1500, stream=False), headers=offline_headers
            )
            return resp.status_code

    batch = [asyncio.create_task(offline()) for _ in range(2 * LIMIT)]
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(400):
            lent = (await client.get(gw + "/admin/state", headers=ADMIN)).json()["pools"]["interactive"]
            if lent["lent_in_flight"] == LIMIT:
                break
            await asyncio.sleep(0.01)
        assert lent["lent_in_flight"] == LIMIT
        for task in batch[-2:]:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*(stream_all(client, gw, chat(8)) for _ in range(3))), 30)
        assert not any(t.done() for t in batch[:-2])  # the interactive streams did not wait for them
        assert await asyncio.wait_for(asyncio.gather(*batch[:-2]), 60) == [200] * (2 * LIMIT - 2)
        for _ in range(400):
            if await gateway_idle(client, gw) == [] and await sim_load(client, inter) == 0:
                break
            await asyncio.sleep(0.01)
        assert await gateway_idle(client, gw) == []
        assert (await sim_load(client, inter), await sim_load(client, off)) == (0, 0)


async def test_a_streams_first_byte_ends_its_pending_prefill(stack: Stack) -> None:
    """The prefill shield counts a stream's prompt as waiting in the engine until its first byte: the
    pipeline must say when that came, or every lower-ranked request would wait for whole answers."""
    sim = stack.sim(seed=3, time_scale=2.0).url  # 300 tokens take seconds: the stream is still running
    gw = stack.gateway([{"name": "interactive", "backends": [sim]}])
    await wait_ready(gw)
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", gw + "/v1/chat/completions", json=chat(300)) as resp,
    ):
        assert resp.status_code == 200
        first = await anext(resp.aiter_bytes())
        assert first.startswith(b"data: ")
        state = (await client.get(gw + "/admin/state", headers=ADMIN)).json()["pools"]["interactive"]
        backend = state["backends"][0]
        assert (backend["active"], backend["pending_prefill_tokens"]) == (1, 0)
        assert backend["outstanding_tokens"] > 0


async def test_a_second_big_lower_band_prompt_waits_its_spaced_turn(stack: Stack) -> None:
    """`shield.duty`: while a band-10 request is about, a big band-0 prompt goes alone, and the next one
    waits at the gateway (`shield_duty` in /admin/state) for the first one's predicted prefill / duty —
    then goes, and both clients get their whole answers."""
    # ~30 prompt tokens at the prior 10 000 tokens/s over duty 0.0003: ~10 s of spacing, longer than the
    # first answer takes on a loaded machine (with ~3 s, it sometimes ended before the second was sent)
    stack.policy.write_text(POLICY.replace("{tokens: 32}", "{tokens: 8, duty: 0.0003}"))
    sim = stack.sim(seed=5, time_scale=2.0).url
    gw = stack.gateway([{"name": "interactive", "backends": [sim]}])
    await wait_ready(gw)
    url = gw + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=30) as client:

        async def send(body: dict[str, Any]) -> bytes:
            async with client.stream("POST", url, json=body, headers={"x-priority": "0"}) as resp:
                data = await resp.aread()
            assert resp.status_code == 200, data
            return data

        async def head_blocked_by() -> dict[str, str] | None:
            state = (await client.get(gw + "/admin/state", headers=ADMIN)).json()["pools"]["interactive"]
            return None if state["head"] is None else state["head"]["blocked_by"]

        async with client.stream("POST", url, json=chat(200), headers={"x-priority": "10"}) as high:
            rest = high.aiter_raw()
            await anext(rest)  # its first byte: nothing waits in the engine, a band-0 prompt may go alone
            # prompts of their own: a prompt the backend holds cached (the same text again) costs no
            # prefill there, and so is neither big nor spaced (the prefix index, decision 0110)
            first = await send(_asking(chat(4), "Which tenant waits longest?"))
            second = asyncio.create_task(send(_asking(chat(4), "How long is one round of the window?")))
            seen = []
            for _ in range(100):
                seen.append(await head_blocked_by())
                if seen[-1] is not None:
                    break
                await asyncio.sleep(0.01)
            assert seen[-1] == {sim: "shield_duty"} and not second.done()
            answers = [first, await asyncio.wait_for(second, 30)]
            assert await head_blocked_by() is None
        left = await gateway_settled(client, gw)
    for data in answers:
        assert data.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"length"' in data
    assert left == []
