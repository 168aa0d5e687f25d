"""What `omnigate demo` shows: client-side stats from its own records, gateway and backend gauges.

`observe` scrapes; the rest are pure functions from one `Snapshot` to a rich renderable (a terminal) or
to one plain line (CI logs), so the view is tested without a terminal and the two outputs always agree.
Latencies are the demo client's own (send → first content chunk, vLLM's TPOT), in wall-clock ms. TPOT is
taken over answers in text only: an answer that speaks gets its text at the voice's pace and is judged by
its real-time factor, so mixing the two would report the voice as a missed text objective.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gateway.request.errors import CAPACITY_REJECTIONS, rejection_reason
from loadtest.metrics import percentile, tpot
from loadtest.records import RequestRecord
from loadtest.scrape import parse_prometheus

THROUGHPUT_WINDOW_S = 10.0
SPEECH_RTF_OBJECTIVE = 1.0  # above it a listener hears the stream stutter


@dataclass(frozen=True, slots=True)
class Objective:
    """A class's latency objectives from the policy the demo runs (queue.classes), in ms; None: not set."""

    ttft_ms: float | None
    tpot_ms: float | None


@dataclass(slots=True)
class BackendView:
    """One simulated backend: its own gauges (sglang:*) plus the gateway's opinion of it."""

    name: str
    pool: str
    url: str
    up: bool = False
    kv_usage: float | None = None
    running: float | None = None
    queued: float | None = None
    healthy: bool | None = None
    circuit: str | None = None
    active: int | None = None  # requests the gateway has in flight there
    limit: int | None = None  # the gateway's adaptive concurrency limit for it


@dataclass(slots=True)
class PoolView:
    """One pool's admission state from /admin/state: its queue, what is dispatched, its window."""

    queue_depth: int = 0
    in_flight: int = 0
    window_s: float = 0.0


@dataclass(slots=True)
class GatewayView:
    """The gateway's /metrics, reduced: finished requests by (pool, class, outcome), rejections, queue."""

    up: bool = False
    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    rejections: Counter[str] = field(default_factory=Counter)
    queue_depth: Counter[str] = field(default_factory=Counter)
    pools: dict[str, PoolView] = field(default_factory=dict)


@dataclass(slots=True)
class Snapshot:
    base_url: str
    elapsed: float
    phase: str
    time_scale: float
    records: list[RequestRecord]
    skipped: int = 0
    tenants: dict[str, str] = field(default_factory=dict)  # API key → tenant id
    objectives: dict[str, Objective] = field(default_factory=dict)  # traffic class → its objectives
    gateway: GatewayView = field(default_factory=GatewayView)
    backends: list[BackendView] = field(default_factory=list)


def objectives(policy: Any) -> dict[str, Objective]:
    """Each traffic class's TTFT and TPOT P99 objectives (ms) from a parsed policy."""
    return {
        name: Objective(
            None if c.ttft_p99_s is None else c.ttft_p99_s * 1000,
            None if c.tpot_p99_s is None else c.tpot_p99_s * 1000,
        )
        for name, c in policy.queue.classes.items()
    }


def parse_gateway_metrics(text: str) -> GatewayView:
    view = GatewayView(up=True)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "omnigate_requests_total":
                key = (
                    s.labels.get("pool", ""),
                    s.labels.get("traffic_class", ""),
                    s.labels.get("outcome", ""),
                )
                view.outcomes[key] += int(s.value)
            elif s.name == "omnigate_rejections_total":
                view.rejections[s.labels.get("reason", "")] += int(s.value)
            elif s.name == "omnigate_queue_depth":
                view.queue_depth[s.labels.get("pool", "")] += int(s.value)
    return view


async def observe(
    client: httpx.AsyncClient, base_url: str, admin_token: str | None, backends: list[BackendView]
) -> tuple[GatewayView, list[BackendView]]:
    """Scrape the gateway (/metrics, /admin/state) and each backend's /metrics at once; fills `backends`."""

    async def get(url: str, headers: dict[str, str] | None = None) -> httpx.Response | None:
        try:
            r = await client.get(url, headers=headers, timeout=2.0)
        except httpx.HTTPError:
            return None
        return r if r.status_code == 200 else None

    auth = {"authorization": f"Bearer {admin_token}"} if admin_token else None
    gw_metrics, state, *scraped = await asyncio.gather(
        get(base_url + "/metrics"),
        get(base_url + "/admin/state", auth),
        *(get(b.url + "/metrics") for b in backends),
    )
    gateway = parse_gateway_metrics(gw_metrics.text) if gw_metrics is not None else GatewayView()
    for view, resp in zip(backends, scraped, strict=True):
        view.up = resp is not None
        if resp is not None:
            m = parse_prometheus(resp.text)
            view.kv_usage, view.running, view.queued = m.get("kv_usage"), m.get("running"), m.get("queued")
    if state is not None:
        apply_admin_state(state.json(), gateway, backends)
    return gateway, backends


def apply_admin_state(state: dict[str, Any], gateway: GatewayView, backends: list[BackendView]) -> None:
    """Fold /admin/state into the views; backends are matched by the gateway's id `<pool>-<index>`."""
    by_id = {b.name: b for b in backends}
    for name, pool in (state.get("pools") or {}).items():
        if not isinstance(pool, dict):
            continue
        gateway.pools[name] = PoolView(
            int(pool.get("queue_depth") or 0),
            int(pool.get("in_flight") or 0),
            float(pool.get("window_s") or 0),
        )
        for entry in pool.get("backends") or []:
            view = by_id.get(str(entry.get("backend")))
            if view is not None:
                view.healthy, view.circuit = bool(entry.get("healthy")), str(entry.get("circuit"))
                view.active, view.limit = entry.get("active"), entry.get("limit")


@dataclass(slots=True)
class GroupStats:
    """One row of the client table: a traffic class, a tenant, or everything."""

    sent: int = 0
    ok: int = 0
    rejected: int = 0
    failed: int = 0
    in_flight: int = 0
    req_per_s: float = 0.0
    tok_per_s: float = 0.0
    ttft_ms: tuple[float, float] | None = None  # (p50, p99)
    tpot_ms: tuple[float, float] | None = None
    ttfa_ms: tuple[float, float] | None = None  # time to first audio, of answers that speak
    rtf: tuple[float, float] | None = None  # real-time factor of speech streams (gateway/speech/meter.py)


def _p50_p99(values: list[float]) -> tuple[float, float] | None:
    return (percentile(values, 50), percentile(values, 99)) if values else None


def group_stats(records: Iterable[RequestRecord], elapsed: float) -> GroupStats:
    st = GroupStats()
    ttfts: list[float] = []
    tpots: list[float] = []
    ttfas: list[float] = []
    rtfs: list[float] = []
    window = min(THROUGHPUT_WINDOW_S, elapsed) or 1.0
    recent_reqs = recent_tokens = 0
    for r in records:
        st.sent += 1
        outcome = _outcome(r)
        if outcome == "unfinished":  # live, or cut when the demo stopped: shown as live, summed as unfinished
            st.in_flight += 1
        elif outcome == "ok" and r.e2e is not None:
            st.ok += 1
            if r.ttft is not None:
                ttfts.append(r.ttft * 1000)
            if not r.audio and (t := tpot(r)) is not None:
                tpots.append(t * 1000)
            if r.ttfa is not None:
                ttfas.append(r.ttfa * 1000)
            if (speech := r.speech) is not None and (rtf := speech.rtf) is not None:
                rtfs.append(rtf)
            if r.sent + r.e2e >= elapsed - window:
                recent_reqs += 1
                recent_tokens += r.output_tokens
        elif outcome == "rejected":
            st.rejected += 1
        else:
            st.failed += 1
    st.req_per_s, st.tok_per_s = recent_reqs / window, recent_tokens / window
    st.ttft_ms, st.tpot_ms = _p50_p99(ttfts), _p50_p99(tpots)
    st.ttfa_ms, st.rtf = _p50_p99(ttfas), _p50_p99(rtfs)
    return st


def by_class(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(r.traffic_class or "default", []).append(r)
    return dict(sorted(out.items()))


def by_tenant(records: list[RequestRecord], tenants: dict[str, str]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(tenants.get(r.tenant, r.tenant or "-"), []).append(r)
    return dict(sorted(out.items()))


def _pair(v: tuple[float, float] | None, fmt: str) -> str:
    return "-" if v is None else f"{v[0]:{fmt}}/{v[1]:{fmt}}"


def _opt(v: float | None, fmt: str) -> str:
    return "-" if v is None else f"{v:{fmt}}"


def _speech_table(snap: Snapshot) -> Table | None:
    """Answers that spoke, per tenant: time to first audio, the streams' real-time factor, and the pace of
    their text (it follows the voice, so it is shown here and not in the text TPOT)."""
    spoken = [r for r in snap.records if r.audio]
    if not spoken:
        return None
    t = _table(
        "answers that speak: time to first audio (ms), real-time factor (over 1 stutters), "
        "their text's ms/token (the voice's pace); p50/p99",
        ("", "spoke", "TTFA", "RTF", "text", "audio s"),
    )
    for name, recs in by_tenant(spoken, snap.tenants).items():
        s = group_stats(recs, snap.elapsed)
        seconds = sum(m.seconds for r in recs if (m := r.speech) is not None)
        pace = _p50_p99([x * 1000 for r in recs if _outcome(r) == "ok" and (x := tpot(r)) is not None])
        t.add_row(
            name,
            str(len(recs)),
            _pair(s.ttfa_ms, ".0f"),
            _pair(s.rtf, ".2f"),
            _pair(pace, ".0f"),
            f"{seconds:.0f}",
        )
    return t


def _p99_ms(records: list[RequestRecord], metric: str) -> float | None:
    s = group_stats(records, 1.0)
    pair = s.ttft_ms if metric == "TTFT" else s.tpot_ms
    return None if pair is None else pair[1]


def _check(line: Text, name: str, value: float | None, limit: float | None, unit: str = " ms") -> bool:
    """Append `name P99 value` against its objective; True when the objective is missed."""
    if value is None:
        return False
    shown = f"{value:.2f}" if unit == "" else f"{value:.0f}" if value >= 100 else f"{value:.1f}"
    if limit is None:
        line.append(f"{name} P99 {shown}{unit} (no objective)")
        return False
    if value <= limit:
        line.append(f"{name} P99 {shown}{unit} ≤ {limit:g}{unit} ✓", style="green")
        return False
    line.append(f"{name} P99 {shown}{unit} > {limit:g}{unit} ✗ MISSED", style="bold red")
    return True


def _class_lines(cls: str, recs: list[RequestRecord], goal: Objective | None) -> list[Text]:
    done = [r for r in recs if _outcome(r) == "ok"]
    text, spoke = [r for r in done if not r.audio], [r for r in done if r.audio]
    lines: list[Text] = []
    if text:
        line = Text(f"{cls}: ", style="bold")
        missed = []
        for name, limit in (
            ("TTFT", goal.ttft_ms if goal else None),
            ("TPOT", goal.tpot_ms if goal else None),
        ):
            if _check(line, name, _p99_ms(text, name), limit):
                missed.append(name)
            line.append(" · ")
        line.append(f"{len(text)} answers in text")
        for name in missed:  # why: the bucket whose tail it is
            worst = max(
                ((b, v) for b, rs in _by_bucket(text).items() if (v := _p99_ms(rs, name)) is not None),
                key=lambda bv: bv[1],
            )
            line.append(f"; {name} tail: {worst[0]} answers, P99 {worst[1]:.0f} ms", style="red")
        lines.append(line)
    if spoke:
        s = group_stats(spoke, 1.0)
        line = Text(f"{cls}, answers that speak: ", style="bold")
        _check(line, "RTF", s.rtf[1] if s.rtf else None, SPEECH_RTF_OBJECTIVE, unit="")
        line.append(" · ")
        _check(line, "TTFA", s.ttfa_ms[1] if s.ttfa_ms else None, None)
        line.append(f" · {len(spoke)} answers; their text follows the voice, judged by RTF, not TPOT")
        lines.append(line)
    return lines


def _by_bucket(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(r.bucket, []).append(r)
    return out


def _refused_line(snap: Snapshot) -> Text:
    """Refusals split by why: to keep the objectives (capacity) or a tenant's own quota or budget."""
    refused = [r for r in snap.records if _outcome(r) == "rejected"]
    line = Text(f"refused {len(refused)}", style="bold")
    kinds = (("to keep the objectives (capacity)", True), ("by tenant quota or budget", False))
    for label, capacity in kinds:
        who = Counter(
            (snap.tenants.get(r.tenant, r.tenant or "-"), r.error or f"http_{r.status}")
            for r in refused
            if (rejection_reason(r.status, r.error) in CAPACITY_REJECTIONS) == capacity
        )
        detail = ", ".join(f"{t} {code} ×{n}" for (t, code), n in sorted(who.items()))
        line.append(f" · {label}: {sum(who.values())}" + (f" ({detail})" if detail else ""))
    return line


def verdict(snap: Snapshot) -> list[Text]:
    """At a glance: each class's P99s against the objectives of the policy it runs, and every refusal."""
    lines = [
        line
        for cls, recs in by_class(snap.records).items()
        for line in _class_lines(cls, recs, snap.objectives.get(cls))
    ]
    title = Text("what the gateway kept (P99 against the policy's objectives) and refused:", style="bold")
    return [title, *lines, _refused_line(snap)]


def _table(title: str, columns: tuple[str, ...]) -> Table:
    t = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
    )
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right", no_wrap=i == 0)
    return t


def _client_table(snap: Snapshot) -> Table:
    t = _table(
        "demo client: per class, then per tenant (TTFT, TPOT of answers in text: p50/p99 ms)",
        ("", "sent", "ok", "rej", "err", "live", "req/s", "tok/s", "TTFT", "TPOT"),
    )
    groups = list(by_class(snap.records).items())
    n_classes = len(groups)
    groups += list(by_tenant(snap.records, snap.tenants).items())
    for i, (name, recs) in enumerate(groups):
        s = group_stats(recs, snap.elapsed)
        t.add_row(
            name,
            str(s.sent),
            str(s.ok),
            str(s.rejected),
            str(s.failed),
            str(s.in_flight),
            f"{s.req_per_s:.1f}",
            f"{s.tok_per_s:.0f}",
            _pair(s.ttft_ms, ".0f"),
            _pair(s.tpot_ms, ".1f"),
            end_section=i == n_classes - 1,
        )
    return t


def _gateway_table(gw: GatewayView) -> Table:
    t = _table(
        "gateway (/metrics, /admin/state)", ("pool/class", "ok", "rej", "err", "queued", "live", "window")
    )
    pairs = sorted({(p, c) for p, c, _ in gw.outcomes} | {(p, "") for p in gw.pools})
    for pool, cls in pairs:
        if cls == "" and any(p == pool and c for p, c in pairs):
            continue  # the pool shows on its class rows
        counts = {o: n for (p, c, o), n in gw.outcomes.items() if (p, c) == (pool, cls)}
        ok, rejected = counts.get("ok", 0), counts.get("rejected", 0)
        state = gw.pools.get(pool)
        t.add_row(
            pool if cls in ("", pool) else f"{pool}/{cls}",
            str(ok),
            str(rejected),
            str(sum(counts.values()) - ok - rejected),
            str(state.queue_depth if state else gw.queue_depth.get(pool, 0)),
            str(state.in_flight) if state else "-",
            f"{state.window_s * 1000:.0f} ms" if state else "-",
        )
    if not pairs:
        t.add_row("(no requests yet)" if gw.up else "(unreachable)", *[""] * 6)
    return t


def _backend_table(backends: list[BackendView]) -> Table:
    t = _table(
        "backends: simulated SGLang /metrics; gateway's active/limit and health",
        ("backend", "KV used", "running", "queued", "active", "health"),
    )
    for b in backends:
        kv = "-" if b.kv_usage is None else f"{b.kv_usage * 100:.1f} %"
        health = "-" if b.healthy is None else ("up" if b.healthy else "DOWN") + f", {b.circuit}"
        t.add_row(
            f"{b.name} :{b.url.rsplit(':', 1)[-1]}" if b.up else f"{b.name} (down)",
            kv,
            _opt(b.running, ".0f"),
            _opt(b.queued, ".0f"),
            f"{_opt(b.active, '.0f')}/{_opt(b.limit, '.0f')}",
            health,
        )
    return t


def render(snap: Snapshot) -> RenderableType:
    head = Text.assemble(
        ("omnigate demo ", "bold"),
        f"{snap.base_url}  ·  {snap.phase}  ·  {snap.elapsed:.0f} s",
        f"  ·  sims at time-scale {snap.time_scale:g}",
        f"  ·  skipped arrivals {snap.skipped}" if snap.skipped else "",
    )
    parts: list[RenderableType] = [head, *verdict(snap), _client_table(snap)]
    speech = _speech_table(snap)
    if speech is not None:
        parts.append(speech)
    parts.append(_gateway_table(snap.gateway))
    if snap.gateway.rejections:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(snap.gateway.rejections.items()))
        parts.append(Text(f"gateway rejections by reason: {reasons}"))
    parts.append(_backend_table(snap.backends))
    return Group(*parts)


def plain_line(snap: Snapshot) -> str:
    """One log line: totals, then per class TTFT/TPOT P99, then gateway queue and backend KV."""
    total = group_stats(snap.records, snap.elapsed)
    bits = [
        f"[demo {snap.elapsed:5.0f} s {snap.phase}] sent={total.sent} ok={total.ok}",
        f"rejected={total.rejected} failed={total.failed} in_flight={total.in_flight}",
        f"req/s={total.req_per_s:.1f}",
    ]
    for cls, recs in by_class(snap.records).items():
        s = group_stats(recs, snap.elapsed)
        ttft = "-" if s.ttft_ms is None else f"{s.ttft_ms[1]:.0f}ms"
        tpot_ = "-" if s.tpot_ms is None else f"{s.tpot_ms[1]:.1f}ms"
        bits.append(f"| {cls}: ok={s.ok} ttft_p99={ttft} tpot_p99={tpot_}")
        if s.ttfa_ms is not None:
            rtf = "-" if s.rtf is None else f"{s.rtf[1]:.2f}"
            bits.append(f"ttfa_p99={s.ttfa_ms[1]:.0f}ms rtf_p99={rtf}")
    pools = snap.gateway.pools
    queued = sum(p.queue_depth for p in pools.values()) if pools else sum(snap.gateway.queue_depth.values())
    bits.append(f"| gateway queued={queued} rejected={sum(snap.gateway.rejections.values())}")
    kv = ",".join(
        f"{b.name}={_opt(None if b.kv_usage is None else b.kv_usage * 100, '.0f')}%" for b in snap.backends
    )
    bits.append(f"| kv {kv}")
    return " ".join(bits)


def _outcome(r: RequestRecord) -> str:
    if r.e2e is None or r.error == "unfinished":  # still streaming, or cut when the demo ended
        return "unfinished"
    return "ok" if r.ok else "rejected" if r.rejected else "failed"


def summary_line(records: list[RequestRecord], skipped: int) -> str:
    """The last line the demo prints; stable `key=value` pairs that scripts and tests parse."""
    counts = Counter(_outcome(r) for r in records)
    return (
        f"demo summary: sent={len(records)} ok={counts['ok']} rejected={counts['rejected']} "
        f"failed={counts['failed']} unfinished={counts['unfinished']} skipped={skipped}"
    )
