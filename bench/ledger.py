"""Ledger chaos benchmark: does every tenant pay for exactly the work the engines did, whatever happens?

    .venv/bin/python -m bench.ledger                          # both stores, 60 s each (~3 min)
    .venv/bin/python -m bench.ledger --stores redis --duration 20
    .venv/bin/python -m bench.ledger --workload images --max-running-requests 16
    .venv/bin/python -m bench.ledger --url http://127.0.0.1:30000 --stores sqlite   # a running SGLang

The reference is the engine's own count, `sglang:prompt_tokens_total + sglang:generation_tokens_total`
(what it ran: a request's whole prompt once its prefill started, every token it generated; counted when
the request ends, nothing for one that left while it waited).

One real `omnigate serve` at a time (store: Redis, then SQLite) in front of the engines, three tenants
sending chats, streamed and whole, from a few concurrent clients. Each request meets a fate drawn at random:
it completes, or its client leaves — while it is queued, waiting for its prefill, mid-stream, or at any
moment (`anytime`, the `departures` workload). Workloads (`--workload`): `mixed` (text and up to two
images), `images` (two to four images each), `departures` (four in five clients leave at a random moment).

On the simulator (default: two `python -m loadtest.sim` engines, `--time-scale` faster than a GPU; its
`--max-running-requests` with this flag) the tenants run at once, and the run injects faults: the engines
fail requests before their first byte and cut streams (`POST /admin/faults`) for a while; the store fails —
redis-server is stopped and started again (append-only file, so its ledger survives) or another process
holds the SQLite file locked — for a few seconds. Per tenant, the engines' count is their own account by
request id (`GET /sim/work`), whose sum the run checks against their counters.

Against a running SGLang (`--url`, repeatable; `--model` its served name), which cannot tell tenants
apart, the tenants run one after another (`--duration` each, text prompts) and each is held to the
counters' growth over its turn; the store's fault is injected, the engine's are not (it has none).

At the end, once the gateway's outbox is empty, it prints per tenant: the tokens its ledger charged, the
engines' count, their ratio, the requests the ledger counts against those sent, and whether every counter is
back to zero (the tenant's concurrency, the gateway's queues and slots, the outbox, the engines' running
requests). Targets: charged within 2 % of the engines' count per tenant, no request counted twice, every
counter zero.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import random
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import redis as redis_client
from PIL import Image

from bench.common.servers import Procs, free_port, wait_http

MODEL = "qwen2.5-omni-7b"
ADMIN = "bench-ledger-admin"
TENANTS = ("acme", "globex", "initech")
FATES = {"complete": 0.4, "queued": 0.2, "prefill": 0.2, "mid_stream": 0.2}
DEPARTURES = {"complete": 0.2, "anytime": 0.8}
COUNTERS = ("sglang:prompt_tokens_total", "sglang:generation_tokens_total")


@dataclass(frozen=True)
class Workload:
    fates: dict[str, float]
    images: tuple[int, ...]  # how many images a request carries, drawn from these
    max_tokens: tuple[int, int]


WORKLOADS = {
    "mixed": Workload(FATES, (0, 0, 1, 2), (32, 256)),
    "images": Workload(FATES, (2, 3, 4), (32, 256)),
    "departures": Workload(DEPARTURES, (0, 0, 1, 2), (32, 256)),
    "text": Workload(DEPARTURES, (0,), (16, 160)),  # a real engine's tiny text model: the probe
}


def _png(width: int, height: int, seed: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (seed * 40 % 255, 90, 160)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGES = [_png(w, h, i) for i, (w, h) in enumerate([(640, 480), (1280, 720), (1024, 1024), (1920, 1080)])]
PROMPTS = [
    "Describe what you see, then list three details a careful reader might miss.",
    "Summarise the text below in two sentences.\n" + "The harbor wakes slowly under a grey sky. " * 20,
    "Write a short story about a lighthouse keeper and a stray cat.",
]


@dataclass
class Tally:
    sent: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # 429/503 by error code
    ids: list[str] = field(default_factory=list)
    fate: dict[str, str] = field(default_factory=dict)  # request id → its fate


def _body(rng: random.Random, work: Workload, model: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": rng.choice(PROMPTS)}]
    for _ in range(rng.choice(work.images)):
        parts.append({"type": "image_url", "image_url": {"url": rng.choice(IMAGES)}})
    return {
        "model": model,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": rng.randint(*work.max_tokens),
        "stream": rng.random() < 0.7,
    }


async def _one(
    client: httpx.AsyncClient, key: str, rid: str, body: dict[str, Any], fate: str, rng: random.Random
) -> tuple[int, str]:
    """Send one request and play its fate; the status seen (0 when the client left before it) and, for a
    refusal, its error code."""
    headers = {"authorization": f"Bearer {key}", "x-request-id": rid}
    leave_after = {
        "complete": None,
        "queued": rng.uniform(0.0, 0.05),
        "prefill": rng.uniform(0.05, 1.0),
        "mid_stream": None,
        "anytime": rng.uniform(0.0, 3.0),
    }[fate]
    status = 0
    with anyio.move_on_after(leave_after if leave_after is not None else 120):
        if body["stream"]:
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
                status = resp.status_code
                if status >= 400:
                    return status, _code(await resp.aread())
                chunks = 0
                cut = rng.randint(1, 20) if fate == "mid_stream" else None
                async for _ in resp.aiter_raw():
                    chunks += 1
                    if cut is not None and chunks >= cut:
                        break
        else:
            resp = await client.post("/v1/chat/completions", json=body, headers=headers)
            status = resp.status_code
            if status >= 400:
                return status, _code(resp.content)
    return status, ""


def _code(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "?"


async def tenant_load(
    url: str,
    tenant: str,
    deadline: float,
    clients: int,
    seed: int,
    tally: Tally,
    work: Workload = WORKLOADS["mixed"],
    model: str = MODEL,
) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as client:

        async def worker(w: int) -> None:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                rid = f"{tenant}-{seed}-{w}-{n}"  # unique in a run: each store's engines are fresh
                fate = rng.choices(list(work.fates), weights=list(work.fates.values()))[0]
                body = _body(rng, work, model)
                if fate == "mid_stream":
                    body["stream"] = True
                tally.sent += 1
                tally.ids.append(rid)
                tally.fate[rid] = fate
                status, code = await _one(client, f"og-bench-{tenant}-key-0123456789", rid, body, fate, rng)
                if status in (429, 503):
                    tally.refused[f"{status} {code}"] += 1

        await asyncio.gather(*(worker(w) for w in range(clients)))


def _hold_sqlite(path: Path, seconds: float) -> None:
    """Another process's view: hold the store's file locked (BEGIN EXCLUSIVE) for `seconds`."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("BEGIN EXCLUSIVE")
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


async def _faults(
    args: argparse.Namespace, sims: list[str], store: str, redis: Any, db: Path, procs: Procs
) -> list[str]:
    """The injected faults, spread over the run; returns what was done, for the report."""
    done: list[str] = []
    span = args.duration
    await asyncio.sleep(span * 0.2)
    engine_faults = not args.url  # a real engine has none to inject
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        for sim in sims if engine_faults else ():
            await client.post(sim + "/admin/faults", json={"error_rate": 0.1, "disconnect_rate": 0.1})
        if engine_faults:
            done.append("engine faults on (10 % errors before the first byte, 10 % cut streams)")
        await asyncio.sleep(span * 0.2)
        if store == "redis":
            redis.stop()
            done.append("redis-server stopped")
            await asyncio.sleep(min(5.0, span * 0.1))
            redis.start()
            done.append("redis-server started again")
        else:
            hold = min(4.0, span * 0.1)
            await asyncio.to_thread(_hold_sqlite, db, hold)
            done.append(f"SQLite file held locked for {hold:g} s")
        await asyncio.sleep(span * 0.2)
        for sim in sims if engine_faults else ():
            await client.post(sim + "/admin/faults", json={"error_rate": 0.0, "disconnect_rate": 0.0})
        if engine_faults:
            done.append("engine faults off")
    return done


class _Redis:
    """A private redis-server (append-only, so its ledger survives a restart on the same port)."""

    def __init__(self, procs: Procs) -> None:
        self.procs, self.port = procs, free_port()
        self.data = procs.workdir / "redis"
        self.data.mkdir(exist_ok=True)
        self.start()

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.data)]
        self.procs.start("redis", argv)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis_client.Redis(port=self.port).ping():
                    return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        proc = self.procs.procs.pop("redis")
        proc.terminate()
        proc.wait(10)


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def settled(url: str, sims: list[str]) -> dict[str, Any]:
    """Wait (≤ 60 s) for the outbox to drain and the engines to go idle; the counters seen last."""
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        deadline = time.monotonic() + 60
        while True:
            metrics = (await client.get(url + "/metrics")).text
            loads = [(await client.get(s + "/v1/loads")).json()["loads"][0] for s in sims]
            running = sum(ld["num_running_reqs"] + ld["num_waiting_reqs"] for ld in loads)
            state = (
                await client.get(url + "/admin/state", headers={"authorization": f"Bearer {ADMIN}"})
            ).json()
            pools = state["pools"].values()
            queued = sum(p["queue_depth"] for p in pools)
            in_flight = sum(p["in_flight"] + sum(b["active"] for b in p["backends"]) for p in pools)
            counters = {
                "outbox": _metric(metrics, "omnigate_ledger_outbox_pending"),
                "queued": queued,
                "in_flight": in_flight,
                "engines": running,
            }
            if not any(counters.values()) or time.monotonic() > deadline:
                return counters
            await asyncio.sleep(0.5)


async def _work(sims: list[str]) -> dict[str, dict[str, Any]]:
    """The engines' account by request id; for an id two engines took, the later attempt."""
    out: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        for sim in sims:
            for rid, w in (await client.get(sim + "/sim/work")).json().items():
                if rid not in out or w["at"] > out[rid]["at"]:
                    out[rid] = w
    return out


def _engine_count(work: dict[str, Any]) -> int:
    """The work an engine did for one request: its prompt once the prefill started, and what it generated
    (a request it aborted while it still waited for its prefill cost it nothing)."""
    return int(work["prompt_tokens"]) * bool(work["prefilled"]) + int(work["generated"])


def _by_fate(log: Path, tallies: dict[str, Tally], engines: dict[str, dict[str, Any]]) -> list[str]:
    """Charged (the access log's usage) against the engines' count, per fate, all tenants together; and
    where they part: prompts charged for requests an engine dropped before their prefill started
    (`unprefilled`), prefills an engine ran that were charged no prompt (`unpaid`: the gateway predicted
    the client left while the request still waited), and the gateway's price of the prompts an engine did
    prefill against the engine's own count (`prompt +/-`: the estimate's error on the charges the gateway
    had to infer)."""
    charged: dict[str, tuple[int, int]] = {}
    for line in log.read_text(errors="replace").splitlines():
        start = line.find('{"ts"')
        if start < 0:
            continue
        entry = orjson.loads(line[start:])
        if entry.get("request_id") and entry.get("prompt_tokens") is not None:
            charged[entry["request_id"]] = (entry["prompt_tokens"], entry["output_tokens"])
    sums: dict[str, list[int]] = {}
    for tally in tallies.values():
        for rid, fate in tally.fate.items():
            w = engines.get(rid)
            prompt, output = charged.get(rid, (0, 0))
            row = sums.setdefault(fate, [0, 0, 0, 0, 0, 0])
            row[0] += prompt + output
            row[1] += _engine_count(w) if w else 0
            row[2] += 1
            if w is not None and not w["prefilled"]:
                row[3] += prompt
            elif w is not None and not prompt:
                row[4] += int(w["prompt_tokens"])
            elif w is not None:
                row[5] += prompt - int(w["prompt_tokens"])
    head = ("fate", "sent", "charged", "engines", "unprefilled", "unpaid", "prompt +/-")
    out = ["{:<11} {:>5} {:>9} {:>9} {:>11} {:>7} {:>10}".format(*head)]
    out += [
        f"{f:<11} {n:>5} {c:>9} {e:>9} {u:>11} {m:>7} {d:>+10}"
        for f, (c, e, n, u, m, d) in sorted(sums.items())
    ]
    return out


async def _counted(engines: list[str]) -> int:
    """The engines' own count: Σ `sglang:prompt_tokens_total + sglang:generation_tokens_total`."""
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        texts = [(await client.get(e + "/metrics")).text for e in engines]
    return int(sum(_metric(text, name) for text in texts for name in COUNTERS))


async def _charged(client: httpx.AsyncClient, url: str, tenant: str) -> tuple[int, int, int]:
    """The tenant's ledger: tokens charged, requests counted, requests still active."""
    usage = (
        await client.get(
            f"{url}/admin/tenants/{tenant}/usage",
            params={"days": 2},
            headers={"authorization": f"Bearer {ADMIN}"},
        )
    ).json()
    charged = sum(d["input_tokens"] + d["output_tokens"] for d in usage["history"])
    requests = sum(d["requests"] for d in usage["history"])
    return charged, requests, int(usage["concurrent"]["active"])


def _gateway_config(args: argparse.Namespace, store: str, work: Path, port: int, engines: list[str]) -> bytes:
    store_cfg: dict[str, Any] = {"kind": "sqlite", "path": str(work / f"{store}-tenants.sqlite3")}
    if store == "redis":
        store_cfg = {
            "kind": "redis",
            "redis_url": f"redis://127.0.0.1:{args.redis_port}/0",
            "redis_failure": "open",
            "outbox_path": str(work / "redis-outbox.sqlite3"),
        }
    (work / "policy.yaml").write_text("version: 1\n")
    pool = {"name": "interactive", "models": [args.model], "backends": engines, "health_interval_s": 0.25}
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "policy_path": str(work / "policy.yaml"),
        "watch_policy": False,
        "admin": {"token": ADMIN},
        "auth": {"required": True},
        "store": store_cfg,
        "access_log": True,  # per request what was charged: the breakdown by fate
        "tenants": [{"id": t, "keys": [f"og-bench-{t}-key-0123456789"]} for t in TENANTS],
        "pools": [pool],
    }
    return orjson.dumps(config)


async def run_store(
    args: argparse.Namespace, store: str, procs: Procs, engines: list[str]
) -> tuple[list[str], bool]:
    work = procs.workdir
    db = work / f"{store}-tenants.sqlite3"
    redis = _Redis(procs) if store == "redis" else None
    args.redis_port = redis.port if redis is not None else 0
    port = free_port()
    (work / f"gw-{store}.yaml").write_bytes(_gateway_config(args, store, work, port, engines))
    name = f"gateway-{store}"
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(work / f"gw-{store}.yaml")]
    procs.start(name, [*argv, "--log-level", "info"])
    wait_http(port, "/readyz", 60, procs, name)
    url = f"http://127.0.0.1:{port}"
    tallies = {t: Tally() for t in TENANTS}
    simulated = not args.url
    # the simulator tells tenants apart (its account by request id): they run at once; a real engine's
    # counters cannot, so each tenant has the engine to itself for its turn
    turns = [list(TENANTS)] if simulated else [[t] for t in TENANTS]
    counted: dict[str, int] = {}  # a turn's growth of the engines' counters, by its only tenant
    done: list[str] = []
    counters: dict[str, float] = {}
    total_counted = 0
    for turn in turns:
        before = await _counted(engines)
        deadline = time.monotonic() + args.duration
        work, seed = WORKLOADS[args.workload], args.seed * 100
        load = [
            tenant_load(url, t, deadline, args.clients, seed + TENANTS.index(t), tallies[t], work, args.model)
            for t in turn
        ]
        results = await asyncio.gather(_faults(args, engines, store, redis, db, procs), *load)
        assert isinstance(results[0], list)
        done += results[0]
        counters = await settled(url, engines)
        grown = await _counted(engines) - before
        total_counted += grown
        if len(turn) == 1:
            counted[turn[0]] = grown
    requests_by_id = await _work(engines) if simulated else {}
    lines = [f"store {store}: " + "; ".join(dict.fromkeys(done))]
    all_ok = not any(counters.values())
    head = ("tenant", "sent", "ledger req", "charged", "engines", "ratio", "in target")
    lines.append("{:<8} {:>5} {:>10} {:>9} {:>9} {:>6} {:>7}".format(*head))
    totals = [0, 0]  # charged, engines: all tenants together
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        for tenant, tally in tallies.items():
            charged, requests, active = await _charged(client, url, tenant)
            if simulated:
                engine = sum(_engine_count(requests_by_id[i]) for i in tally.ids if i in requests_by_id)
            else:
                engine = counted[tenant]
            ratio = charged / engine if engine else float("nan")
            within, counted_once = abs(ratio - 1) <= args.tolerance, requests <= tally.sent
            ok = within and counted_once
            totals[0] += charged
            totals[1] += engine
            all_ok = all_ok and counted_once and (within or args.overall) and active == 0
            cells = (tenant, tally.sent, requests, charged, engine, f"{ratio:.3f}", "yes" if ok else "NO")
            lines.append(
                "{:<8} {:>5} {:>10} {:>9} {:>9} {:>6} {:>7}".format(*cells)
                + f"   active {active}, refused {sum(tally.refused.values())}"
            )
    overall = totals[0] / totals[1] if totals[1] else float("nan")
    overall_ok = abs(overall - 1) <= args.tolerance
    agree = totals[1] == total_counted  # the simulator's account by request id against its counters
    all_ok = all_ok and overall_ok and agree
    lines.append(
        f"all tenants: charged {totals[0]}, engines {totals[1]} (their counters grew {total_counted}), "
        f"ratio {overall:.3f}"
    )
    refused = sum((t.refused for t in tallies.values()), Counter[str]())
    lines.append("refused: " + (", ".join(f"{k} ×{n}" for k, n in refused.most_common()) or "none"))
    lines.append("counters at the end: " + ", ".join(f"{k} {v:g}" for k, v in counters.items()))
    if simulated:
        lines += _by_fate(procs.workdir / f"{name}.log", tallies, requests_by_id)
    proc = procs.procs.pop(name)
    proc.terminate()
    proc.wait(10)
    if redis is not None:
        redis.stop()
    return lines, all_ok


def start_sims(
    args: argparse.Namespace, procs: Procs, store: str, model: str = MODEL, cap: int | None = None
) -> list[str]:
    """Two fresh engines per store (serving `model`, capped at `cap` running requests if given): each
    run's account starts empty."""
    sims = []
    for i in range(2):
        port, name = free_port(), f"{store}-sim{i}"
        argv = [sys.executable, "-m", "loadtest.sim", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--time-scale", repr(args.time_scale), "--model", model, "--seed", str(i + 1)]
        if cap:
            argv += ["--max-running-requests", str(cap)]
        procs.start(name, argv)
        wait_http(port, "/health", 60, procs, name)
        sims.append(f"http://127.0.0.1:{port}")
    return sims


async def main_async(args: argparse.Namespace) -> bool:
    ok = True
    print(f"workload {args.workload}, {args.clients} clients per tenant, {args.duration:g} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="omnigate-ledger-") as tmp:
        procs = Procs(Path(tmp))
        try:
            for store in args.stores:
                engines = [u.rstrip("/") for u in args.url] or start_sims(
                    args, procs, store, args.model, args.max_running_requests
                )
                lines, store_ok = await run_store(args, store, procs, engines)
                ok = ok and store_ok
                for line in lines:
                    print(line, flush=True)
        finally:
            procs.close()
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stores", nargs="+", default=["redis", "sqlite"], choices=["redis", "sqlite"])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load per store")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients per tenant")
    p.add_argument("--time-scale", type=float, default=5.0, help="engines run this much faster than a GPU")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--workload", choices=sorted(WORKLOADS), default=None, help="default: mixed; text with --url"
    )
    p.add_argument("--max-running-requests", type=int, default=None, help="the simulated engines' cap")
    p.add_argument("--url", action="append", default=[], help="a running SGLang instead of the simulator")
    p.add_argument(
        "--model", default=None, help=f"the engines' model name (default {MODEL}; with --url: tiny-llama)"
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="charged vs the engines' count, per tenant (see --overall)",
    )
    p.add_argument(
        "--overall",
        action="store_true",
        help="hold only all tenants' tokens together to the tolerance (a short run has too few per tenant)",
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args()
    args.workload = args.workload or ("text" if args.url else "mixed")
    args.model = args.model or ("tiny-llama" if args.url else MODEL)
    ok = asyncio.run(main_async(args))
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
