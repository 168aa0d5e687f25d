"""The rich rendering of `omnigate top`: one table per pool, backend and tenant, from `scrape.Rows`."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gateway.top.scrape import BackendRow, PoolRow, RejectionRow, Rows, TenantRow


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right", no_wrap=i == 0)
    return t


def _num(v: float | None, fmt: str = ".0f") -> str:
    return "-" if v is None else f"{v:{fmt}}"


def _pools(pools: list[PoolRow]) -> Table:
    t = _table(
        "pools: queue by priority band, batching window, rejections by reason",
        "pool",
        "kind",
        "queued by band",
        "oldest",
        "window",
        "in flight",
        "ok/s",
        "rej/s",
        "queue refusals so far",
    )
    for p in pools:
        bands = ", ".join(f"{band} {n}" for band, n in sorted(p.queued_by_band.items())) or "-"
        flight = str(p.in_flight) + (f" (+{p.borrowed} borrowed)" if p.borrowed else "")
        flight += f" ({p.lent} lent)" if p.lent else ""
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(p.rejected.items())) or "none"
        t.add_row(
            p.name,
            p.kind,
            bands,
            f"{p.oldest_wait_s * 1000:.0f} ms",
            f"{p.window_s * 1000:.0f} ms",
            flight,
            _num(p.ok_per_s, ".1f"),
            _num(p.rejected_per_s, ".1f"),
            reasons,
        )
    return t


def _rejections(rejections: list[RejectionRow]) -> Table:
    t = _table("rejections by traffic class and reason", "class", "reason", "so far", "per s")
    for r in rejections:
        t.add_row(r.traffic_class, r.reason, f"{r.total:.0f}", _num(r.per_s, ".1f"))
    if not rejections:
        t.add_row("none", "", "", "")
    return t


def _stages(b: BackendRow) -> str:
    if not b.stages:
        return "-"
    return ", ".join(
        f"{s} {_num(use, 'g')}/{'∞' if budget is None else f'{budget:g}'}" for s, use, budget in b.stages
    )


def _backends(backends: list[BackendRow]) -> Table:
    t = _table(
        "backends: the gateway's limit and active requests, the engine's running, queued and KV use",
        "backend",
        "active/limit",
        "running",
        "queued",
        "KV used",
        "stages (use/budget)",
        "health",
    )
    for b in backends:
        health = "-" if b.healthy is None else ("up" if b.healthy else "DOWN") + f", {b.circuit}"
        if b.held:
            health += f", {b.held} held"
        if b.missing:
            health += f" (no {', '.join(b.missing)})"
        t.add_row(
            f"{b.name} {b.url}",
            f"{_num(b.active)}/{_num(b.limit)}",
            _num(b.running),
            _num(b.queued),
            "-" if b.kv_usage is None else f"{b.kv_usage * 100:.1f} %",
            _stages(b),
            health,
        )
    return t


def _standing(used: float, limit: float | None) -> str:
    """`used/limit (share)`; a refilling bucket's use is fractional: one decimal then, under 100."""
    if limit is None:
        return f"{used:.0f}/∞"
    share = used / limit * 100 if limit else 0.0
    digits = 1 if limit < 100 and used != int(used) else 0
    return f"{used:.{digits}f}/{limit:,.0f} ({share:.0f} %)"


def _tenants(tenants: list[TenantRow]) -> Table:
    t = _table(
        "tenants: rate, and quota standing (this minute, in flight, today)",
        "tenant",
        "requests",
        "req/s",
        "tok/s",
        "this minute",
        "concurrent",
        "today's tokens",
    )
    for r in tenants:
        minute = ", ".join(f"{q} {_standing(u, lim)}" for q, (u, lim) in sorted(r.per_minute.items())) or "-"
        t.add_row(
            r.tenant,
            f"{r.requests:.0f}",
            _num(r.req_per_s, ".1f"),
            _num(r.tokens_per_s, ".0f"),
            minute,
            "-" if r.concurrent is None else _standing(*r.concurrent),
            "-" if r.today is None else _standing(*r.today),
        )
    return t


def render(url: str, r: Rows) -> RenderableType:
    rates = f"rates over {r.interval_s:.1f} s" if r.interval_s else "no rates yet (one read)"
    head = Text.assemble(("omnigate top ", "bold"), f"{url}  ·  {rates}")
    parts: list[RenderableType] = [head]
    if r.errors:
        parts.append(Text("could not read: " + "; ".join(r.errors), style="bold red"))
    parts += [_pools(r.pools), _rejections(r.rejections), _backends(r.backends), _tenants(r.tenants)]
    return Group(*parts)
