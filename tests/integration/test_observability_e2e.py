"""Observability end to end: the real gateway in front of simulated SGLang backends, alerts to real sinks.

Each test runs its own gateway with a pool, class, tenant and sink names of its own (the metric registry is
process-wide), drives requests through it and reads what ops would see: `/metrics` and webhook bodies.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from gateway.observability.metrics import REGISTRY
from loadtest.media import render_image
from loadtest.sim.config import SimConfig
from tests.estimate.helpers import data_uri, image_part
from tests.gateway.conftest import dead_url
from tests.integration.obs_fixtures import (
    ADMIN,
    MODEL,
    gateway_app,
    scrape_when,
    set_faults,
    start_sims,
    text_body,
    wait_scraped,
)
from tests.observability.conftest import Receiver
from tests.observability.conftest import _app as receiver_app
from tests.observability.exposition import (
    family_signatures,
    label_names,
    sample_sum,
    sample_value,
    unsampled_families,
)
from tests.support.servers import serve
from tests.support.sockets import silent_url

pytestmark = pytest.mark.e2e

SNAPSHOT = Path(__file__).with_name("metrics_snapshot.txt")
UPDATE_ENV = "OMNIGATE_UPDATE_SNAPSHOT"
REGENERATE = f"{UPDATE_ENV}=1 .venv/bin/python -m pytest tests/integration/test_observability_e2e.py"
SNAPSHOT_HEADER = (
    "# /metrics after the scripted run of test_observability_e2e.py: family, type, label names.\n"
    f"# Regenerate after an intended change (and update gateway/observability/README.md): {REGENERATE}\n"
)
# Families the scripted run cannot produce a sample for, and why.
UNREACHED = {
    "omnigate_tenant_store_errors": "needs the tenant store to be unreachable",
    "omnigate_tenant_store_deadline_misses": "needs a slow Redis (test_slow_store_e2e.py)",
    "omnigate_ledger_outbox": "needs a store that fails a reconcile (tests/tenants/test_outbox*.py)",
    "omnigate_usage_inferred": "every answer here carries usage (tests/tenants/test_charge_e2e.py leaves)",
    "omnigate_client_disconnects": "the script has no disconnect (tests/gateway/test_proxy.py cuts streams)",
    "omnigate_loans_revoked": "lending is off by default (test_admission_e2e.py revokes loans)",
    "omnigate_circuit_transitions": "no circuit opens here (tests/gateway/test_circuit_e2e.py opens one)",
    "omnigate_edge_refusals": "no connection is refused at the edge (tests/gateway/test_edge_e2e.py)",
    "omnigate_ttfa_seconds": "no answer speaks here (tests/gateway/test_speech_e2e.py measures speech)",
    "omnigate_backend_overloads": "no backend is full here (tests/omni_real/test_gateway.py fills one)",
    "omnigate_speech_rtf": "no answer speaks here (tests/gateway/test_speech_e2e.py measures speech)",
    "omnigate_audio_seconds": "no answer speaks here (tests/gateway/test_speech_e2e.py measures speech)",
    "omnigate_speech_stalls": "no answer speaks here (tests/speech/ counts stalls)",
}
FAST = 50.0  # sim time scale: virtual seconds per wall second


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """A real webhook receiver on loopback; tests use distinct paths, so one serves the module."""
    rx = Receiver()
    with serve(receiver_app(rx)) as server:
        rx.url = server.url
        yield rx


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def _tenant(name: str, **quotas: int) -> dict[str, Any]:
    return {"id": name, "keys": [f"sk-{name}"], "quotas": quotas}


def _auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer sk-{name}"}


def _usage(response: httpx.Response) -> tuple[int, int]:
    """(prompt, completion) tokens the backend reported, from a JSON body or the stream's usage chunk."""
    if response.headers["content-type"].startswith("application/json"):
        usage = response.json()["usage"]
    else:
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: {")]
        usage = orjson.loads(events[-1])["usage"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def _outcomes(metrics: str, sink: str) -> float:
    """Notifications a sink is done with: sent, failed after retries, or dropped from its full queue."""
    return sample_sum(metrics, "omnigate_alert_notifications_total", sink=sink)


def _compare_snapshot(lines: list[str]) -> None:
    body = SNAPSHOT_HEADER + "\n".join(lines) + "\n"
    if os.environ.get(UPDATE_ENV) == "1":
        SNAPSHOT.write_text(body, encoding="utf-8")
    expected = SNAPSHOT.read_text(encoding="utf-8") if SNAPSHOT.exists() else ""
    if body != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), body.splitlines(keepends=True), str(SNAPSHOT), "/metrics"
            )
        )
        pytest.fail(
            f"/metrics names or label sets changed:\n{diff}\nIf intended, regenerate with {REGENERATE} "
            "and document the change in gateway/observability/README.md.",
            pytrace=False,
        )


async def test_metric_names_and_label_sets_are_stable_after_a_scripted_run(
    stack: ExitStack, tmp_path: Path, receiver: Receiver
) -> None:
    pool, cls, tenant = "e2e-snap", "e2e_snap", "e2e-snap"
    sims = start_sims(stack, SimConfig(time_scale=FAST, seed=1), SimConfig(time_scale=FAST, seed=2))
    app = gateway_app(
        tmp_path,
        pool=pool,
        traffic_class=cls,
        backends=[s.url for s in sims],
        tenant=_tenant(tenant, rpm=8),  # exactly the eight admitted requests below; the ninth is refused
        policy_alerts={},
        alerts={"sinks": [{"kind": "webhook", "name": "e2e-snap-hook", "url": receiver.url + "/snap"}]},
    )
    gw = stack.enter_context(serve(app))
    image = data_uri(render_image(320, 240, 0, 7, "png"))
    ok: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=gw.url, headers=_auth(tenant), timeout=20) as c:
        await wait_scraped(c, gw)
        text = text_body(max_tokens=6, ignore_eos=True)
        streamed = {"stream": True, "stream_options": {"include_usage": True}}
        pictured = {
            **text,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What?"}, image_part(image)]}],
        }
        for body in (text, text, text, {**text, **streamed}, pictured, {**pictured, **streamed}):
            ok.append(await c.post("/v1/chat/completions", json=body))
        remote = {
            **pictured,
            "messages": [{"role": "user", "content": [image_part("http://example.invalid/a.png")]}],
        }
        remote_media = await c.post("/v1/chat/completions", json=remote)  # the sim cannot fetch: 400
        bad = await c.post("/v1/chat/completions", json=text, headers={"x-priority": "urgent"})
        for sim in sims:
            await set_faults(c, sim, error_rate=1.0)
        broken = await c.post("/v1/chat/completions", json=text)  # fails on one sim, retried, fails again
        for sim in sims:
            await set_faults(c, sim, error_rate=0.0)
        over_quota = await c.post("/v1/chat/completions", json=text)
        reload = await c.post("/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN}"})
        bad_key = await c.post("/v1/chat/completions", json=text, headers=_auth("nobody"))
        assert [r.status_code for r in ok] == [200] * 6
        assert (remote_media.status_code, bad.status_code, broken.status_code) == (400, 400, 502)
        assert (over_quota.status_code, over_quota.json()["error"]["code"]) == (
            429,
            "requests_per_minute_exceeded",
        )
        assert (reload.json()["result"], bad_key.status_code) == ("unchanged", 401)
        await receiver.wait_for("/snap", 1)  # one failure alert: the broken backend (a 400 is the client's)

        metrics = await scrape_when(c, gw, lambda text: _outcomes(text, "e2e-snap-hook") == 1)

    def requests(bucket: str, priority: str, outcome: str) -> float | None:
        labels = {
            "pool": pool,
            "traffic_class": cls,
            "tenant": tenant,
            "bucket": bucket,
            "priority": priority,
        }
        return sample_value(metrics, "omnigate_requests_total", **labels, outcome=outcome)

    assert requests("text", "normal", "ok") == 4
    assert requests("single_image", "normal", "ok") == 2
    assert requests("single_image", "normal", "rejected") == 1  # the backend's 400 for the remote image
    assert requests("text", "normal", "upstream_error") == 1
    assert requests("text", "normal", "rejected") == 1  # quota, after pricing
    assert requests("text", "", "rejected") == 1  # bad header, before a priority was assigned
    assert sample_value(metrics, "omnigate_rejections_total", reason="quota", traffic_class=cls) == 1
    assert sample_value(metrics, "omnigate_rejections_total", reason="bad_input", traffic_class=cls) == 2
    assert sample_value(metrics, "omnigate_upstream_retries_total", pool=pool) == 1
    assert sample_sum(metrics, "omnigate_upstream_errors_total", pool=pool, phase="status") == 3
    assert sample_value(metrics, "omnigate_remote_media_unfetched_total", bucket="single_image") is not None
    assert sample_value(metrics, "omnigate_e2e_seconds_count", pool=pool, traffic_class=cls) == 6
    sent = sample_value(metrics, "omnigate_alert_notifications_total", sink="e2e-snap-hook", result="sent")
    assert sent == 1
    prompt, completion = (sum(n) for n in zip(*(_usage(r) for r in ok), strict=True))
    assert sample_value(metrics, "omnigate_tenant_tokens_total", tenant=tenant, kind="prompt") == prompt
    assert (
        sample_value(metrics, "omnigate_tenant_tokens_total", tenant=tenant, kind="completion") == completion
    )

    unreached = unsampled_families(metrics) - set(UNREACHED)
    assert not unreached, f"the scripted run left these families without a sample: {sorted(unreached)}"
    signatures = family_signatures(metrics, label_names(REGISTRY))
    _compare_snapshot([f"{name} {sig}" for name, sig in sorted(signatures.items())])


async def test_a_failing_job_alerts_webhook_and_wecom_with_every_field(
    stack: ExitStack, tmp_path: Path, receiver: Receiver
) -> None:
    pool, cls, tenant = "e2e-fail", "e2e_fail", "e2e-fail"
    (sim,) = start_sims(stack, SimConfig(time_scale=FAST, seed=3))
    app = gateway_app(
        tmp_path,
        pool=pool,
        traffic_class=cls,
        backends=[sim.url],
        tenant=_tenant(tenant),
        # a short failure window so the storm summary arrives within the test; no rule may fire meanwhile
        policy_alerts={"failure_window_s": 1.0, "for_s": 600, "for_overrides": {"backend_down": 600}},
        alerts={
            "sinks": [
                {"kind": "webhook", "name": "e2e-fail-hook", "url": receiver.url + "/fail-hook"},
                {"kind": "wecom", "name": "e2e-fail-wecom", "url": receiver.url + "/fail-wecom?key=robot"},
            ]
        },
    )
    gw = stack.enter_context(serve(app))
    async with httpx.AsyncClient(base_url=gw.url, headers=_auth(tenant), timeout=20) as c:
        await wait_scraped(c, gw)  # the alert reports the scraped KV watermark, not "unknown"
        await set_faults(c, sim, error_rate=1.0)
        job = {"x-omnigate-job": "job-42"}
        failed = [await c.post("/v1/chat/completions", json=text_body(), headers=job) for _ in range(3)]
    assert [r.status_code for r in failed] == [502] * 3
    # the job's one alert, the circuit opening at the third failure in a row, then the window's summary
    hook = await receiver.wait_for("/fail-hook", 3)
    wecom = await receiver.wait_for("/fail-wecom", 3)

    first, opened, summary = hook
    assert (opened["kind"], opened["rule"]) == ("firing", "circuit")
    assert opened["title"] == f"Circuit open: {pool}-0"
    assert opened["fields"] == {
        "pool": pool,
        "backend": f"{pool}-0",
        "from": "closed",
        "reason": "3 failures in a row",
    }
    assert (first["kind"], first["status"], first["title"]) == (
        "failure",
        "firing",
        "Batch job job-42 failed (502)",
    )
    expected = {
        "job": "job-42",
        "request": failed[0].headers["x-request-id"],
        "tenant": tenant,
        "class": cls,
        "model": MODEL,
        "pool": pool,
        "backend": f"{pool}-0",
        "status": 502,
        "error": "Injected fault: simulated error 500.",
        "backend KV usage": 0.0,  # the idle sim's sglang:token_usage at the moment of failure
    }
    assert first["fields"] == expected
    assert summary["kind"] == "failure_summary"
    assert summary["fields"] == {"failures": 2, "sent individually": 1}
    assert summary["lines"] == [f"2 × pool={pool} backend={pool}-0 status=502", "jobs: job-42 (2)"]

    assert wecom[0]["msgtype"] == "markdown"
    content = wecom[0]["markdown"]["content"].splitlines()
    shown = {k: "0" if k == "backend KV usage" else str(v) for k, v in expected.items()}
    assert content[0] == '### <font color="warning">FAILED</font> Batch job job-42 failed (502)'
    assert content[1:-1] == [f'> {k}: <font color="comment">{v}</font>' for k, v in shown.items()]
    assert wecom[2]["markdown"]["content"].startswith(
        '### <font color="warning">FAILED</font> 2 more failures'
    )


async def test_dead_and_hung_sinks_never_hold_up_requests(
    stack: ExitStack, tmp_path: Path, receiver: Receiver
) -> None:
    pool, cls, tenant = "e2e-dead", "e2e_dead", "e2e-dead"
    cut = {"disconnect_rate": 1.0, "disconnect_after_tokens": 1}  # every stream breaks: every request alerts
    sims = start_sims(stack, *(SimConfig(time_scale=FAST, seed=s, faults=cut) for s in (4, 5)))
    queue_size, total = 8, 200
    hung = stack.enter_context(silent_url())
    app = gateway_app(
        tmp_path,
        pool=pool,
        traffic_class=cls,
        backends=[s.url for s in sims],
        tenant=_tenant(tenant),
        # threshold rules off and no storm folding: exactly one notification per failed request; no
        # circuit breaker (every request fails: it would open and turn the rest into 503s, alerting nobody)
        policy_alerts={"enabled": False, "failure_burst": 1000, "failure_window_s": 3600},
        circuit={"consecutive_failures": None, "failure_ratio": None},
        alerts={
            "sinks": [
                {"kind": "webhook", "name": "e2e-dead-refused", "url": dead_url() + "/hook"},
                {"kind": "wecom", "name": "e2e-dead-hung", "url": hung},
                {"kind": "webhook", "name": "e2e-dead-live", "url": receiver.url + "/dead-live"},
            ],
            "timeout_s": 120.0,  # far longer than the test: the hung sink's first delivery never ends
            "retries": 1,
            "backoff_s": 0.01,
            "queue_size": queue_size,
        },
    )
    gw = stack.enter_context(serve(app))
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=gw.url, headers=_auth(tenant), timeout=20) as c:
        await wait_scraped(c, gw)
        limiter = anyio.CapacityLimiter(2)
        body = text_body(max_tokens=8, stream=True)

        async def one() -> None:
            async with limiter:
                answers.append(await c.post("/v1/chat/completions", json=body))

        with anyio.fail_after(45):
            async with anyio.create_task_group() as tg:
                for _ in range(total):
                    tg.start_soon(one)
        # every sink has accounted for every message except the hung one's in-flight message and full queue
        in_limbo = {"e2e-dead-refused": 0, "e2e-dead-live": 0, "e2e-dead-hung": 1 + queue_size}
        metrics = await scrape_when(
            c, gw, lambda text: all(_outcomes(text, s) + n == total for s, n in in_limbo.items())
        )

    def count(sink: str, result: str) -> float:
        return sample_value(metrics, "omnigate_alert_notifications_total", sink=sink, result=result) or 0

    assert len(answers) == total
    assert all(r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") for r in answers)
    assert all('"error"' in r.text for r in answers)  # each stream told its client it broke
    assert count("e2e-dead-refused", "failed") >= 1 and count("e2e-dead-refused", "sent") == 0
    assert count("e2e-dead-live", "sent") >= 1 and count("e2e-dead-live", "failed") == 0
    # All requests were answered while the hung sink still holds its first message (one in flight, a full
    # queue behind it): nothing it was given has been delivered or given up on, the rest was dropped.
    assert (count("e2e-dead-hung", "sent"), count("e2e-dead-hung", "failed")) == (0, 0)
    assert count("e2e-dead-hung", "dropped") == total - 1 - queue_size


async def test_kv_usage_rule_fires_then_resolves_through_the_live_gateway(
    stack: ExitStack, tmp_path: Path, receiver: Receiver
) -> None:
    pool, cls, tenant = "e2e-kv", "e2e_kv", "e2e-kv"
    # A slow sim with a small KV pool: a 1,000-token prompt fills ~12 % of it for as long as it generates.
    (sim,) = start_sims(stack, SimConfig(time_scale=5, max_total_tokens=8192, seed=6))
    app = gateway_app(
        tmp_path,
        pool=pool,
        traffic_class=cls,
        backends=[sim.url],
        tenant=_tenant(tenant),
        policy_alerts={"kv_usage": 0.05, "for_s": 0},
        alerts={"sinks": [{"kind": "webhook", "name": "e2e-kv-hook", "url": receiver.url + "/kv"}]},
    )
    gw = stack.enter_context(serve(app))
    body = text_body("harbour " * 500, max_tokens=4000, ignore_eos=True, stream=True)
    async with httpx.AsyncClient(base_url=gw.url, headers=_auth(tenant), timeout=20) as c:
        await wait_scraped(c, gw)
        async with c.stream("POST", "/v1/chat/completions", json=body) as stream:
            assert stream.status_code == 200
            (firing,) = await receiver.wait_for("/kv", 1)
        # leaving the stream early disconnects: the gateway aborts upstream and the sim frees the KV
        firing_then_resolved = await receiver.wait_for("/kv", 2)

    assert firing_then_resolved[0] == firing
    resolved = firing_then_resolved[1]
    assert (firing["kind"], firing["rule"], firing["key"]) == ("firing", "kv_usage", f"{pool}-0")
    assert (resolved["kind"], resolved["status"], resolved["rule"], resolved["key"]) == (
        "resolved",
        "resolved",
        "kv_usage",
        f"{pool}-0",
    )
    fields = firing["fields"]
    assert (fields["rule"], fields["pool"], fields["backend"], fields["threshold"]) == (
        "kv_usage",
        pool,
        f"{pool}-0",
        0.05,
    )
    assert fields["KV usage"] > 0.05
    assert len(receiver.bodies("/kv")) == 2  # deduplicated: one firing message, one resolved
