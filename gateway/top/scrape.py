"""What `omnigate top` reads of a gateway, and the rows it makes of two reads in a row.

One `Sample` is one moment: /metrics (the counters and gauges), /admin/state (the schedulers and backends)
and each tenant's quota standing (/admin/tenants/{id}/usage). `rows` turns the newest sample, with the one
before it for rates, into plain rows: pure, so the view is tested without a gateway.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
WANTED = frozenset(
    {
        "omnigate_requests_total",
        "omnigate_rejections_total",
        "omnigate_queue_depth",
        "omnigate_queue_oldest_wait_seconds",
        "omnigate_tenant_tokens_total",
    }
)


@dataclass(slots=True)
class Sample:
    """One read of the gateway; `errors` names what could not be read (the view says so)."""

    at: float
    metrics: dict[str, dict[Labels, float]] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)  # tenant id → its usage report
    errors: list[str] = field(default_factory=list)

    def series(self, name: str) -> dict[Labels, float]:
        return self.metrics.get(name, {})


def parse_metrics(text: str) -> dict[str, dict[Labels, float]]:
    """The series `top` shows, by sample name, each keyed by its sorted labels."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in WANTED:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


async def read(client: httpx.AsyncClient, url: str, token: str | None, max_tenants: int) -> Sample:
    """Read /metrics and /admin/state at once, then the quota standing of up to `max_tenants` tenants
    (the busiest first, by their requests so far)."""
    sample = Sample(at=time.monotonic())
    auth = {"authorization": f"Bearer {token}"} if token else {}

    async def get(path: str) -> Any:
        try:
            r = await client.get(url + path, headers=auth)
        except httpx.HTTPError as e:
            sample.errors.append(f"{path}: {type(e).__name__}")
            return None
        if r.status_code != 200:
            sample.errors.append(f"{path}: HTTP {r.status_code}")
            return None
        return r.text if path == "/metrics" else r.json()

    metrics, state, tenants = await asyncio.gather(
        get("/metrics"), get("/admin/state"), get("/admin/tenants")
    )
    sample.metrics = parse_metrics(metrics) if metrics is not None else {}
    sample.state = state if isinstance(state, dict) else {}
    ids = [str(t["id"]) for t in (tenants or {}).get("data", []) if isinstance(t, dict) and "id" in t]
    served = _by(sample.series("omnigate_requests_total"), "tenant")
    ids.sort(key=lambda t: -served.get(t, 0.0))
    reports = await asyncio.gather(*(get(f"/admin/tenants/{t}/usage?days=1") for t in ids[:max_tenants]))
    sample.usage = {t: r for t, r in zip(ids, reports, strict=False) if isinstance(r, dict)}
    return sample


def _by(series: dict[Labels, float], *keys: str) -> dict[Any, float]:
    """The series summed over every label but `keys` (one key: its value; several: a tuple)."""
    out: dict[Any, float] = {}
    for labels, value in series.items():
        d = dict(labels)
        key = tuple(d.get(k, "") for k in keys)
        k = key[0] if len(keys) == 1 else key
        out[k] = out.get(k, 0.0) + value
    return out


def _rate(now: dict[Any, float], before: dict[Any, float] | None, seconds: float) -> dict[Any, float]:
    if before is None or seconds <= 0:
        return {}
    return {k: max(0.0, v - before.get(k, 0.0)) / seconds for k, v in now.items()}


@dataclass(slots=True)
class PoolRow:
    name: str
    kind: str
    queued_by_band: dict[str, int]
    oldest_wait_s: float
    window_s: float
    in_flight: int
    borrowed: int
    lent: int
    ok_per_s: float | None
    rejected: dict[str, int]  # reason → the scheduler's refusals so far (queue full, deadline, …)
    rejected_per_s: float | None


@dataclass(slots=True)
class BackendRow:
    pool: str
    name: str
    url: str
    limit: int | None
    active: int | None
    running: float | None
    queued: float | None
    kv_usage: float | None
    healthy: bool | None
    circuit: str
    held: int
    stages: list[tuple[str, float | None, float | None]]  # (stage, use, budget) — budget None: unbounded
    missing: list[str]


@dataclass(slots=True)
class TenantRow:
    tenant: str
    requests: float
    req_per_s: float | None
    tokens_per_s: float | None
    per_minute: dict[str, tuple[float, float]]  # quota → (used, limit)
    concurrent: tuple[int, int | None] | None  # (active, limit)
    today: tuple[int, int | None] | None  # (tokens, limit)


@dataclass(slots=True)
class RejectionRow:
    traffic_class: str
    reason: str
    total: float
    per_s: float | None


@dataclass(slots=True)
class Rows:
    pools: list[PoolRow]
    rejections: list[RejectionRow]  # every refusal (quota, budget, queue, …), by class and reason
    backends: list[BackendRow]
    tenants: list[TenantRow]
    errors: list[str]
    interval_s: float | None  # between the two reads the rates come from; None: one read, no rates


def rows(now: Sample, before: Sample | None) -> Rows:
    seconds = now.at - before.at if before is not None else 0.0

    def rate(name: str, *keys: str) -> dict[Any, float] | None:
        if before is None:
            return None
        return _rate(_by(now.series(name), *keys), _by(before.series(name), *keys), seconds)

    outcomes = rate("omnigate_requests_total", "pool", "outcome")
    depth = _by(now.series("omnigate_queue_depth"), "pool", "priority")
    pools, backends = [], []
    for name, p in (now.state.get("pools") or {}).items():
        rejected: Counter[str] = Counter()
        for key, n in (p.get("rejections") or {}).items():
            rejected[str(key).split("/", 1)[0]] += int(n)
        ok = None if outcomes is None else outcomes.get((name, "ok"), 0.0)
        shed = None if outcomes is None else outcomes.get((name, "rejected"), 0.0)
        pools.append(
            PoolRow(
                name=name,
                kind=str(p.get("kind", "")),
                queued_by_band={band: int(n) for (pool, band), n in depth.items() if pool == name},
                oldest_wait_s=float(p.get("oldest_wait_s") or 0.0),
                window_s=float(p.get("window_s") or 0.0),
                in_flight=int(p.get("in_flight") or 0),
                borrowed=int(p.get("borrowed_in_flight") or 0),
                lent=int(p.get("lent_in_flight") or 0),
                ok_per_s=ok,
                rejected=dict(rejected),
                rejected_per_s=shed,
            )
        )
        backends += [_backend(name, b) for b in p.get("backends") or []]
    refused = _by(now.series("omnigate_rejections_total"), "traffic_class", "reason")
    refused_rate = rate("omnigate_rejections_total", "traffic_class", "reason")
    rejections = [
        RejectionRow(cls, reason, n, None if refused_rate is None else refused_rate.get((cls, reason), 0.0))
        for (cls, reason), n in sorted(refused.items())
        if n
    ]
    tenants = _tenants(now, before, seconds)
    return Rows(pools, rejections, backends, tenants, list(now.errors), seconds or None)


def _backend(pool: str, b: dict[str, Any]) -> BackendRow:
    stages = [
        (
            str(s.get("stage")),
            s.get("use"),
            s.get("budget") if s.get("budget") is not None else s.get("limit"),
        )
        for s in b.get("stages") or []
    ]
    return BackendRow(
        pool=pool,
        name=str(b.get("backend", "")),
        url=str(b.get("url", "")),
        limit=b.get("limit"),
        active=b.get("active"),
        running=b.get("running"),
        queued=b.get("queued"),
        kv_usage=b.get("token_usage"),
        healthy=b.get("healthy"),
        circuit=str(b.get("circuit", "")),
        held=int(b.get("held") or 0),
        stages=stages,
        missing=[str(m) for m in b.get("missing_signals") or []],
    )


def _tenants(now: Sample, before: Sample | None, seconds: float) -> list[TenantRow]:
    served = _by(now.series("omnigate_requests_total"), "tenant")
    tokens = _by(now.series("omnigate_tenant_tokens_total"), "tenant")
    req_rate = tok_rate = None
    if before is not None:
        req_rate = _rate(served, _by(before.series("omnigate_requests_total"), "tenant"), seconds)
        tok_rate = _rate(tokens, _by(before.series("omnigate_tenant_tokens_total"), "tenant"), seconds)
    out = []
    for tenant in sorted(set(served) | set(now.usage), key=lambda t: (-served.get(t, 0.0), t)):
        usage = now.usage.get(tenant) or {}
        per_minute = {
            quota: (float(v.get("used") or 0), float(v["limit"]))
            for quota, v in (usage.get("per_minute") or {}).items()
            if isinstance(v, dict) and v.get("limit") is not None
        }
        conc, today = usage.get("concurrent"), usage.get("today")
        out.append(
            TenantRow(
                tenant=tenant,
                requests=served.get(tenant, 0.0),
                req_per_s=None if req_rate is None else req_rate.get(tenant, 0.0),
                tokens_per_s=None if tok_rate is None else tok_rate.get(tenant, 0.0),
                per_minute=per_minute,
                concurrent=(int(conc.get("active") or 0), conc.get("limit"))
                if isinstance(conc, dict)
                else None,
                today=(int(today.get("total_tokens") or 0), today.get("limit"))
                if isinstance(today, dict)
                else None,
            )
        )
    return out
