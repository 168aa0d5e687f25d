"""Threshold alert rules over a plain snapshot of the gateway's live state.

Semantics follow Prometheus/Alertmanager so ops meet no surprises: a condition must hold for the rule's
`for` duration before it fires (pending until then, silently forgotten if it clears); one subject (pool,
backend, class) fires once and is then deduplicated, re-sent every `repeat_s` while it still holds, and
sends one `resolved` message when it clears. Pure: `evaluate(inputs, now)` takes monotonic seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from gateway.backends.state import BackendState
from gateway.observability.notification import FieldValue, Notification, Severity
from gateway.observability.rolling import ClassStats
from gateway.observability.settings import AlertThresholds, RuleName


@dataclass(frozen=True, slots=True)
class BackendSnapshot:
    pool: str
    backend: str
    healthy: bool = True
    circuit: str = "closed"
    kv_usage: float | None = None

    @classmethod
    def from_state(cls, b: BackendState) -> BackendSnapshot:
        return cls(b.pool, b.name, b.healthy, b.circuit, b.token_usage)


@dataclass(frozen=True, slots=True)
class ClassLatency:
    """A class's rolling P99s next to the SLO in force; None where the class has no such objective."""

    traffic_class: str
    samples: int
    ttft_p99: float | None = None
    tpot_p99: float | None = None
    ttft_slo: float | None = None
    tpot_slo: float | None = None


_NONE: tuple[None, None] = (None, None)


@dataclass(frozen=True, slots=True)
class AlertInputs:
    """Everything the rules read. Counters are cumulative; the engine differences them over its window."""

    queue_depth: Mapping[str, int] = field(default_factory=dict)  # pool -> waiting requests
    latency: tuple[ClassLatency, ...] = ()
    backends: tuple[BackendSnapshot, ...] = ()
    answered_total: int = 0  # every request the gateway answered, rejections included
    rejected_total: int = 0

    @classmethod
    def build(
        cls,
        *,
        queue_depth: Mapping[str, int],
        backends: Iterable[BackendState],
        slo_stats: Iterable[ClassStats],
        slo_targets: Mapping[str, tuple[float | None, float | None]],
        answered_total: int,
        rejected_total: int,
    ) -> AlertInputs:
        """From the app's own objects; `slo_targets` maps class -> (ttft_p99_s, tpot_p99_s) of the policy."""
        latency = tuple(
            ClassLatency(
                s.traffic_class,
                s.samples,
                s.ttft_p99,
                s.tpot_p99,
                *slo_targets.get(s.traffic_class, (None, None)),
            )
            for s in slo_stats
        )
        return cls(
            queue_depth=dict(queue_depth),
            latency=latency,
            backends=tuple(BackendSnapshot.from_state(b) for b in backends),
            answered_total=answered_total,
            rejected_total=rejected_total,
        )


Fields = tuple[tuple[str, FieldValue], ...]


@dataclass(frozen=True, slots=True)
class Condition:
    rule: RuleName
    key: str
    title: str
    severity: Severity
    fields: Fields


@dataclass(slots=True)
class _State:
    since: float
    firing: bool = False
    last_sent: float = 0.0
    condition: Condition | None = None


def _conditions(inputs: AlertInputs, t: AlertThresholds, rejection_rate: float | None) -> Iterator[Condition]:
    """Every condition that holds right now, one per rule and subject."""
    for pool, depth in sorted(inputs.queue_depth.items()):
        limit = t.queue_limit(pool)
        if depth > limit:
            fields: Fields = (("pool", pool), ("queue depth", depth), ("threshold", limit))
            yield Condition("queue_depth", pool, f"Queue depth high in pool {pool}", "warning", fields)
    for c in inputs.latency:
        if c.samples < t.slo_min_samples:
            continue
        objectives: tuple[tuple[RuleName, str, float | None, float | None], ...] = (
            ("ttft_slo", "TTFT", c.ttft_p99, c.ttft_slo),
            ("tpot_slo", "TPOT", c.tpot_p99, c.tpot_slo),
        )
        for rule, name, p99, slo in objectives:
            if p99 is not None and slo is not None and p99 > slo:
                fields = (
                    ("class", c.traffic_class),
                    (f"{name} P99 s", p99),
                    ("SLO s", slo),
                    ("samples", c.samples),
                )
                title = f"{name} P99 over SLO for class {c.traffic_class}"
                yield Condition(rule, c.traffic_class, title, "critical", fields)
    for b in inputs.backends:
        where: Fields = (("pool", b.pool), ("backend", b.backend))
        if not b.healthy or b.circuit == "open":
            fields = (*where, ("healthy", str(b.healthy).lower()), ("circuit", b.circuit))
            yield Condition("backend_down", b.backend, f"Backend down: {b.backend}", "critical", fields)
        if b.kv_usage is not None and b.kv_usage > t.kv_usage:
            fields = (*where, ("KV usage", b.kv_usage), ("threshold", t.kv_usage))
            yield Condition("kv_usage", b.backend, f"KV cache usage high on {b.backend}", "warning", fields)
    if rejection_rate is not None and rejection_rate > t.rejection_rate:
        fields = (
            ("rejection rate", round(rejection_rate, 4)),
            ("threshold", t.rejection_rate),
            ("window s", t.rejection_window_s),
        )
        yield Condition("rejection_rate", "all", "Rejection rate high", "warning", fields)


class RuleEngine:
    def __init__(self) -> None:
        self._states: dict[tuple[RuleName, str], _State] = {}
        self._counts: deque[tuple[float, int, int]] = deque()  # (now, answered, rejected)

    def _rejection_rate(self, inputs: AlertInputs, t: AlertThresholds, now: float) -> float | None:
        if self._counts and (
            inputs.answered_total < self._counts[-1][1] or inputs.rejected_total < self._counts[-1][2]
        ):
            self._counts.clear()  # counters went backwards: a restart of whoever counts
        self._counts.append((now, inputs.answered_total, inputs.rejected_total))
        while len(self._counts) > 1 and self._counts[1][0] <= now - t.rejection_window_s:
            self._counts.popleft()
        _, answered0, rejected0 = self._counts[0]
        answered = inputs.answered_total - answered0
        if answered < t.rejection_min_requests:
            return None
        return (inputs.rejected_total - rejected0) / answered

    def firing(self) -> dict[str, int]:
        """Rule -> number of subjects firing now (for the omnigate_alerts_firing gauge)."""
        out: dict[str, int] = {}
        for (rule, _), st in self._states.items():
            if st.firing:
                out[rule] = out.get(rule, 0) + 1
        return out

    def evaluate(
        self, inputs: AlertInputs, thresholds: AlertThresholds, now: float, wall: float
    ) -> list[Notification]:
        rate = self._rejection_rate(inputs, thresholds, now)
        if not thresholds.enabled:
            self._states.clear()
            return []
        out: list[Notification] = []
        active = {(c.rule, c.key): c for c in _conditions(inputs, thresholds, rate)}
        for k, cond in active.items():
            st = self._states.setdefault(k, _State(since=now))
            st.condition = cond
            due = (not st.firing and now - st.since >= thresholds.for_rule(cond.rule)) or (
                st.firing and now - st.last_sent >= thresholds.repeat_s
            )
            if due:
                st.firing, st.last_sent = True, now
                out.append(self._message("firing", cond, now - st.since, wall))
        for k in [k for k in self._states if k not in active]:
            st = self._states.pop(k)
            if st.firing and st.condition is not None:
                out.append(self._message("resolved", st.condition, now - st.since, wall))
        return out

    @staticmethod
    def _message(kind: str, cond: Condition, held_s: float, wall: float) -> Notification:
        label = "active for s" if kind == "firing" else "lasted s"
        return Notification(
            kind="firing" if kind == "firing" else "resolved",
            title=cond.title,
            severity=cond.severity if kind == "firing" else "info",
            fields=(("rule", cond.rule), *cond.fields, (label, round(held_s, 1))),
            rule=cond.rule,
            key=cond.key,
            at=wall,
        )
