"""Tenants, keys and quotas end to end: real `omnigate serve` processes, real SQLite files, real Redis.

What the unit tests in tests/tenants/ cannot show: the wiring. Auth, clamping and isolation through the
real `openai` client; 429s and live quota patches over HTTP; two gateway processes sharing one Redis
bucket and one pub/sub channel; a `kill -9` of the gateway; a Redis outage under a running gateway.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.conftest import (
    ADMIN_TOKEN,
    MODEL,
    Admin,
    chat,
    chat_body,
    ledger_total,
    write_config,
)
from tests.support.processes import ManagedProcess, Processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

KEY_DISPLAY_CHARS = 7  # the part of a key admin listings show (gateway/tenants/models.py)


@dataclass
class Shared:
    """One gateway (SQLite store) for the auth, quota and security tests, and every key it handed out."""

    gw: ManagedProcess
    admin: Admin
    keys: list[str] = field(default_factory=list)

    def new_tenant(self, tenant_id: str, **fields: object) -> str:
        """Create the tenant and one key; the key's plaintext."""
        self.admin.create_tenant(tenant_id, **fields)
        _, key = self.admin.create_key(tenant_id)
        self.keys.append(key)
        return key

    def settled(self, tenant_id: str) -> dict[str, int]:
        """The tenant's ledger once no request of it is open (reconcile runs after the response)."""
        usage = wait_for(lambda: (u := self.admin.usage(tenant_id))["concurrent"]["active"] == 0 and u)
        assert usage, f"{tenant_id} still has open requests"
        return ledger_total(usage)


@pytest.fixture(scope="module")
def shared(sim: ManagedProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    workdir = tmp_path_factory.mktemp("shared-gateway")
    group = Processes(workdir)
    store = {"kind": "sqlite", "path": str(workdir / "tenants.sqlite3")}
    try:
        gw = group.gateway(write_config(workdir / "gateway.yaml", sim.url, store))
        admin = Admin(gw.url)
        yield Shared(gw, admin)
        admin.close()
    finally:
        group.close()


def openai_client(gw: ManagedProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=30.0)


def assert_openai_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert (error["code"], set(error)) == (code, {"message", "type", "param", "code"})


# -- 1. authentication, priority cap, usage isolation ------------------------------------------------
def test_auth_priority_cap_and_usage_isolation(shared: Shared) -> None:
    gw, admin = shared.gw, shared.admin
    alpha = shared.new_tenant("alpha", name="Alpha", max_priority=5)
    beta = shared.new_tenant("beta")
    client = openai_client(gw, alpha)

    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        extra_headers={"x-priority": "99"},
        extra_body={"ignore_eos": True},
    )
    assert raw.http_response.status_code == 200
    assert raw.headers["x-omnigate-priority"] == "5"  # clamped to the tenant's max_priority
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.completion_tokens == 5

    assert_openai_error(chat(gw.url, None), 401, "missing_api_key")
    with pytest.raises(openai.AuthenticationError) as unknown:
        openai_client(gw, "og-not-a-key-" + "x" * 30).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert (unknown.value.status_code, unknown.value.code) == (401, "invalid_api_key")

    key_id, doomed = admin.create_key("beta", name="doomed")
    shared.keys.append(doomed)
    assert chat(gw.url, doomed, max_tokens=7).status_code == 200
    admin.revoke_key("beta", key_id)
    with pytest.raises(openai.AuthenticationError) as revoked:
        openai_client(gw, doomed).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert (revoked.value.status_code, revoked.value.code) == (401, "invalid_api_key")

    # tenant keys never open the admin API; the admin token does
    for method, path in [("GET", "/admin/tenants"), ("POST", "/admin/tenants/alpha/keys")]:
        resp = httpx.request(method, gw.url + path, headers={"authorization": f"Bearer {alpha}"}, json={})
        assert_openai_error(resp, 403, "invalid_admin_token")
    assert {"alpha", "beta"} <= {t["id"] for t in admin.call("GET", "/admin/tenants")["data"]}

    # /v1/usage answers for the caller's own tenant only, whatever the query says
    assert shared.settled("alpha")["output_tokens"] == 5
    assert shared.settled("beta")["output_tokens"] == 7
    for key, params, tenant, output in [
        (alpha, {}, "alpha", 5),
        (beta, {}, "beta", 7),
        (beta, {"tenant": "alpha", "tenant_id": "alpha"}, "beta", 7),
    ]:
        resp = httpx.get(gw.url + "/v1/usage", params=params, headers={"authorization": f"Bearer {key}"})
        assert resp.status_code == 200, resp.text
        own = resp.json()
        assert (own["tenant"], own["today"]["output_tokens"], own["today"]["requests"]) == (tenant, output, 1)
    assert_openai_error(httpx.get(gw.url + "/v1/usage"), 401, "missing_api_key")


# -- 2. quotas over HTTP, patched live ----------------------------------------------------------------
def assert_quota_429(resp: httpx.Response, code: str, max_retry_after: int) -> None:
    assert_openai_error(resp, 429, code)
    assert resp.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(resp.headers["retry-after"]) <= max_retry_after, resp.headers


def test_quota_limits_answer_429_and_live_patches_apply_on_the_next_request(shared: Shared) -> None:
    gw, admin = shared.gw, shared.admin
    rpm = shared.new_tenant("rpm2", quotas={"rpm": 2})
    assert [chat(gw.url, rpm).status_code for _ in range(2)] == [200, 200]
    assert_quota_429(chat(gw.url, rpm), "requests_per_minute_exceeded", 30)  # one request per 30 s
    admin.patch_quotas("rpm2", rpm=None)  # raise: next request passes, no restart
    assert chat(gw.url, rpm).status_code == 200
    admin.patch_quotas("rpm2", daily_tokens=1)  # lower: next request refused
    assert_quota_429(chat(gw.url, rpm), "daily_token_budget_exceeded", 86400)
    admin.patch_quotas("rpm2", daily_tokens=None)
    assert chat(gw.url, rpm).status_code == 200

    # ~71 tokens per request against 100 per minute: the second must wait for the refill
    tpm = shared.new_tenant("tpm100", quotas={"total_tpm": 100})
    assert chat(gw.url, tpm, max_tokens=60).status_code == 200
    assert_quota_429(chat(gw.url, tpm, max_tokens=60), "tokens_per_minute_exceeded", 60)
    admin.patch_quotas("tpm100", total_tpm=None)
    assert chat(gw.url, tpm, max_tokens=60).status_code == 200


# -- 3. two gateway processes sharing one Redis -------------------------------------------------------
TPM = 60_000  # the limit; real time: the burst (one minute's worth), then 1000 tokens/s
WINDOW_S = 20.0
COST_TOKENS = 300  # the simulator's usage for one request: 11 prompt + 289 output tokens


@pytest.fixture
def replicas(
    sim: ManagedProcess, procs: Processes, tmp_path: Path, redis_url: str, redis_prefix: str
) -> tuple[ManagedProcess, ManagedProcess]:
    store = {"kind": "redis", "redis_url": redis_url, "redis_prefix": redis_prefix}
    config = write_config(tmp_path / "gateway.yaml", sim.url, store)
    return procs.gateway(config, name="replica-a"), procs.gateway(config, name="replica-b")


@dataclass
class Admitted:
    replica: str
    sent: float
    received: float
    tokens: int


async def hammer(
    url: str, key: str, name: str, out: list[Admitted], drained: asyncio.Event, stop: float
) -> None:
    """Four clients that each retry 0.1 s after a 429: far more demand than a 1000 tokens/s refill."""
    body = chat_body(max_tokens=COST_TOKENS - 11)
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0, trust_env=False) as client:

        async def worker() -> None:
            while time.monotonic() < stop:
                sent = time.monotonic()
                resp = await client.post("/v1/chat/completions", json=body)
                if resp.status_code == 200:
                    usage = resp.json()["usage"]
                    out.append(Admitted(name, sent, time.monotonic(), int(usage["total_tokens"])))
                else:
                    assert_openai_error(resp, 429, "tokens_per_minute_exceeded")
                    drained.set()
                    await asyncio.sleep(0.1)

        async with asyncio.TaskGroup() as workers:  # one failing worker stops the others
            for _ in range(4):
                workers.create_task(worker())


async def ledger_tokens(admin: httpx.AsyncClient, tenant_id: str) -> tuple[float, int]:
    """(when, tokens charged so far) from the shared ledger; `when` is the middle of the call."""
    before = time.monotonic()
    resp = await admin.get(f"/admin/tenants/{tenant_id}/usage", params={"days": 2})
    assert resp.status_code == 200, resp.text
    totals = ledger_total(resp.json())
    return (before + time.monotonic()) / 2, totals["input_tokens"] + totals["output_tokens"]


async def test_two_replicas_hold_one_tenant_to_its_token_limit(
    replicas: tuple[ManagedProcess, ManagedProcess],
) -> None:
    a, b = replicas
    admin = Admin(a.url)
    admin.create_tenant("acme", quotas={"total_tpm": TPM})
    _, key = admin.create_key("acme")
    admin.close()
    admitted: list[Admitted] = []
    drained = asyncio.Event()
    stop = time.monotonic() + 38.0  # hard bound; normally cancelled right after the window
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=a.url, headers=headers, timeout=10.0, trust_env=False) as http:
        hammers = [
            asyncio.create_task(hammer(gw.url, key, name, admitted, drained, stop))
            for gw, name in ((a, "a"), (b, "b"))
        ]
        try:
            spent = asyncio.create_task(drained.wait())  # the first minute's burst is spent
            await asyncio.wait([spent, *hammers], timeout=15.0, return_when=asyncio.FIRST_COMPLETED)
            spent.cancel()
            if drained.is_set():
                await asyncio.sleep(1.0)
                t1, tokens1 = await ledger_tokens(http, "acme")
                await asyncio.sleep(WINDOW_S)
                t2, tokens2 = await ledger_tokens(http, "acme")
        finally:
            ended = [h for h in hammers if h.done()]  # a hammer only ends early by failing
            for h in hammers:
                h.cancel()
            await asyncio.gather(*hammers, return_exceptions=True)
    for h in ended:
        h.result()
    assert drained.is_set(), "no 429 within 15 s: the burst was never spent"
    assert {x.tokens for x in admitted} == {COST_TOKENS}
    expected = TPM / 60 * (t2 - t1)
    charged = tokens2 - tokens1
    in_window = [x for x in admitted if t1 <= x.sent and x.received <= t2]
    per_replica = {r: sum(1 for x in in_window if x.replica == r) for r in ("a", "b")}
    first, last = min(x.sent for x in admitted), max(x.received for x in admitted)
    ceiling = TPM + TPM / 60 * (last - first) + COST_TOKENS
    total = sum(x.tokens for x in admitted)
    print(
        f"\nwindow {t2 - t1:.1f} s: charged {charged} tokens, refill allows {expected:.0f} "
        f"({charged / expected - 1:+.1%}); admitted per replica {per_replica}; "
        f"whole run {total} tokens in {last - first:.1f} s (ceiling {ceiling:.0f})"
    )
    assert abs(charged - expected) <= 0.05 * expected
    assert total <= ceiling  # never more than the bucket plus its refill plus one request's reservation
    assert min(per_replica.values()) >= 5  # both processes really drew on the one bucket


def seconds_until(url: str, key: str, old: int, new: int) -> float:
    """Poll `url` every 50 ms with `key` until the answer turns from status `old` to `new`; seconds taken
    from the call (made right after the admin response) to the response that shows the change."""
    since = time.monotonic()
    while (status := chat(url, key, max_tokens=1).status_code) != new:
        assert status == old, status
        assert time.monotonic() - since < 10.0, "replica b never saw the change"
        time.sleep(0.05)
    return time.monotonic() - since


def test_admin_change_on_replica_a_is_enforced_by_replica_b_within_a_second(
    replicas: tuple[ManagedProcess, ManagedProcess],
) -> None:
    a, b = replicas
    admin = Admin(a.url)
    admin.create_tenant("prop")
    delays: list[float] = []
    for _ in range(3):
        key_id, key = admin.create_key("prop")
        assert chat(b.url, key).status_code == 200  # b has now cached the key and the tenant
        admin.patch_quotas("prop", daily_tokens=1)
        delays.append(seconds_until(b.url, key, 200, 429))
        assert_quota_429(chat(b.url, key), "daily_token_budget_exceeded", 86400)
        admin.patch_quotas("prop", daily_tokens=None)
        delays.append(seconds_until(b.url, key, 429, 200))
        admin.revoke_key("prop", key_id)
        delays.append(seconds_until(b.url, key, 200, 401))
        assert_openai_error(chat(b.url, key), 401, "invalid_api_key")
    admin.close()
    print(f"\nadmin change on a → enforced by b after (ms): {[round(d * 1000) for d in delays]}")
    assert max(delays) <= 1.0


# -- 4. restart durability ------------------------------------------------------------------------------
def test_sqlite_store_keeps_tenants_keys_and_ledger_across_kill_9(
    sim: ManagedProcess, procs: Processes, tmp_path: Path
) -> None:
    store = {"kind": "sqlite", "path": str(tmp_path / "tenants.sqlite3")}
    gw = procs.gateway(write_config(tmp_path / "gateway.yaml", sim.url, store))
    admin = Admin(gw.url)
    quotas = {"total_tpm": 100_000, "rpm": 600, "daily_tokens": 10_000_000}
    admin.create_tenant("durable", name="Durable Inc", weight=2.0, max_priority=3, quotas=quotas)
    _, kept = admin.create_key("durable", name="prod")
    gone_id, gone = admin.create_key("durable", name="old")
    admin.revoke_key("durable", gone_id)
    admin.patch_quotas("durable", rpm=500)
    assert [chat(gw.url, kept, max_tokens=n).status_code for n in (10, 20, 30, 40, 50)] == [200] * 5
    spent = {"input_tokens": 5 * 11, "output_tokens": 150, "requests": 5}
    assert wait_for(lambda: ledger_total(admin.usage("durable")) == spent)  # every reconcile acknowledged
    tenant, keys = (
        admin.call("GET", "/admin/tenants/durable"),
        admin.call("GET", "/admin/tenants/durable/keys"),
    )
    admin.close()

    gw.kill()
    gw.start()
    admin = Admin(gw.url)
    assert admin.call("GET", "/admin/tenants/durable") == tenant
    assert tenant["quotas"]["rpm"] == 500 and tenant["effective"]["max_priority"] == 3
    assert admin.call("GET", "/admin/tenants/durable/keys") == keys
    assert ledger_total(admin.usage("durable")) == spent
    assert chat(gw.url, kept, max_tokens=5).status_code == 200  # the old key still works
    assert_openai_error(chat(gw.url, gone), 401, "invalid_api_key")  # and the revoked one stays revoked
    admin.close()
    log = gw.output()  # both runs
    assert not [k for k in (kept, gone) if k[KEY_DISPLAY_CHARS:] in log]


# -- 5. no plaintext key in logs or metrics ---------------------------------------------------------------
def test_plaintext_keys_never_reach_logs_or_metrics(shared: Shared) -> None:
    gw, admin = shared.gw, shared.admin
    key = shared.new_tenant("secretive", quotas={"rpm": 2})
    unknown = "og-unknown-" + "k" * 32
    shared.keys.append(unknown)
    auth = {"authorization": f"Bearer {key}"}
    assert chat(gw.url, key, headers={"x-priority": "99"}).status_code == 200
    assert httpx.get(gw.url + "/v1/usage", headers=auth).status_code == 200
    assert httpx.get(gw.url + "/admin/tenants", headers=auth).status_code == 403
    assert chat(gw.url, key).status_code == 200
    assert chat(gw.url, key).status_code == 429
    assert chat(gw.url, unknown).status_code == 401
    admin.revoke_key("secretive", admin.call("GET", "/admin/tenants/secretive/keys")["data"][0]["id"])
    last = chat(gw.url, key)
    assert last.status_code == 401
    assert wait_for(lambda: last.headers["x-request-id"] in gw.output())  # the log has caught up
    log, metrics = gw.output(), httpx.get(gw.url + "/metrics").text
    assert key[:KEY_DISPLAY_CHARS] in log  # the display prefix is logged on purpose: this is the right log
    leaked = [k[:KEY_DISPLAY_CHARS] for k in shared.keys if k[KEY_DISPLAY_CHARS:] in log + metrics]
    assert leaked == [], f"plaintext keys found in logs or /metrics: {leaked}"


# -- 6. Redis outage under running gateways ---------------------------------------------------------------
def metric(gw: ManagedProcess, name: str, labels: str = "") -> float:
    """One sample of the gateway's /metrics; `labels` as the exposition writes them: 'operation="reserve"'."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == wanted:
            return float(value)
    raise AssertionError(f"{wanted} not in /metrics")


def served(url: str, key: str) -> bool:
    return chat(url, key).status_code == 200


def test_redis_outage_fails_open_or_closed_per_config_and_recovers_by_itself(
    sim: ManagedProcess, procs: Processes, tmp_path: Path
) -> None:
    # append-only so that the restarted server has the tenants again, as a real Redis with persistence would
    server = procs.redis(tmp_path / "redis", "--appendonly", "yes")
    keys = {mode: f"og-outage-{mode}-" + "s" * 30 for mode in ("open", "closed")}
    gws: dict[str, ManagedProcess] = {}
    for mode, key in keys.items():
        store = {
            "kind": "redis",
            "redis_url": f"redis://127.0.0.1:{server.port}/0",
            "redis_prefix": f"outage-{mode}:",
            "redis_failure": mode,
        }
        tenants = [{"id": f"t-{mode}", "keys": [key], "quotas": {"rpm": 3}}]
        config = write_config(tmp_path / f"{mode}.yaml", sim.url, store, tenants)
        gws[mode] = procs.gateway(config, name=f"fail-{mode}")
        assert chat(gws[mode].url, key).status_code == 200  # the replica now caches the key and tenant
        with Admin(gws[mode].url) as admin:  # reconciled before the outage, so no reconcile is lost to it
            assert wait_for(lambda: admin.usage(f"t-{mode}")["concurrent"]["active"] == 0)  # noqa: B023

    server.kill()
    # fail-open: admitted under the replica's own in-memory limits, which start where Redis was (2 of
    # 3 rpm left, one replica, plus what refilled since: the third comes back after 20 s), then refused
    statuses = [chat(gws["open"].url, keys["open"]) for _ in range(4)]
    admitted = next(i for i, r in enumerate(statuses) if r.status_code != 200)
    assert admitted in (2, 3), [r.status_code for r in statuses]
    assert_quota_429(statuses[admitted], "requests_per_minute_exceeded", 60)
    assert metric(gws["open"], "omnigate_quota_fail_open_admissions_total") == admitted  # not the refused
    assert_openai_error(chat(gws["closed"].url, keys["closed"]), 503, "quota_store_unavailable")
    assert metric(gws["closed"], "omnigate_tenant_store_errors_total", 'operation="reserve"') >= 1
    # what a replica has not cached cannot be checked, in either mode: unknown keys and admin calls get 503
    unseen = "og-never-seen-" + "u" * 30
    assert_openai_error(chat(gws["open"].url, unseen), 503, "quota_store_unavailable")
    admin_call = httpx.get(
        gws["open"].url + "/admin/tenants", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert_openai_error(admin_call, 503, "quota_store_unavailable")
    for mode, gw in gws.items():
        assert metric(gw, "omnigate_tenant_store_up") == 0
        assert gw.output().count(f"tenant store redis unreachable; failure mode: fail-{mode}") == 1

    server.start()  # same port, same data directory
    for mode, gw in gws.items():  # back to the shared bucket (2 of 3 left) without any restart
        assert wait_for(partial(served, gw.url, keys[mode]), timeout=15.0, interval=0.2)
        assert metric(gw, "omnigate_tenant_store_up") == 1
        assert "tenant store redis usable again" in gw.output()
