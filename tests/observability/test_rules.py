from __future__ import annotations

import pytest

from gateway.backends.state import BackendState
from gateway.observability.rolling import ClassStats
from gateway.observability.rules import AlertInputs, BackendSnapshot, ClassLatency, RuleEngine
from gateway.observability.settings import AlertThresholds

B1 = "http://10.0.0.1:30000"
T = AlertThresholds(for_s=60, repeat_s=300, for_overrides={}, rejection_window_s=10, slo_min_samples=20)


def _inputs(rule: str, active: bool, step: int) -> AlertInputs:
    """Inputs where only `rule`'s condition holds (when active); counters grow 100 answered per step."""
    rejected = 10 * step if (rule == "rejection_rate" and active) else 0
    lat = ClassLatency("interactive", 50, ttft_p99=1.0, tpot_p99=0.05, ttft_slo=2.0, tpot_slo=0.06)
    if active and rule == "ttft_slo":
        lat = ClassLatency("interactive", 50, ttft_p99=2.5, tpot_p99=0.05, ttft_slo=2.0, tpot_slo=0.06)
    if active and rule == "tpot_slo":
        lat = ClassLatency("interactive", 50, ttft_p99=1.0, tpot_p99=0.08, ttft_slo=2.0, tpot_slo=0.06)
    backend = BackendSnapshot("interactive", B1, kv_usage=0.5)
    if active and rule == "kv_usage":
        backend = BackendSnapshot("interactive", B1, kv_usage=0.91)
    if active and rule == "backend_down":
        backend = BackendSnapshot("interactive", B1, circuit="open", kv_usage=0.5)
    depth = 150 if (active and rule == "queue_depth") else 3
    return AlertInputs(
        queue_depth={"interactive": depth},
        latency=(lat,),
        backends=(backend,),
        answered_total=100 * step,
        rejected_total=rejected,
    )


RULES = ["queue_depth", "ttft_slo", "tpot_slo", "kv_usage", "backend_down", "rejection_rate"]
KEYS = {"queue_depth": "interactive", "ttft_slo": "interactive", "tpot_slo": "interactive"}
KEYS |= {"kv_usage": B1, "backend_down": B1, "rejection_rate": "all"}


@pytest.mark.parametrize("rule", RULES)
def test_rule_fires_after_for_dedups_repeats_and_resolves(rule: str) -> None:
    engine = RuleEngine()
    sent: list[tuple[float, str]] = []

    def run(t: float, active: bool) -> None:
        for n in engine.evaluate(_inputs(rule, active, int(t // 10)), T, now=t, wall=1.7e9 + t):
            assert (n.rule, n.key) == (rule, KEYS[rule])
            sent.append((t, n.kind))

    run(0, active=False)
    for t in range(10, 400, 10):  # holds from t=10: pending until 70, repeats every 300 s
        run(t, active=True)
    run(400, active=False)
    run(410, active=False)
    assert sent == [(70, "firing"), (370, "firing"), (400, "resolved")]
    assert engine.firing() == {}


def test_a_condition_that_clears_before_its_for_duration_sends_nothing_and_restarts() -> None:
    engine = RuleEngine()
    kinds: list[tuple[int, str]] = []
    schedule = [(0, True), (50, True), (55, False), (60, True), (110, True), (120, True)]
    for t, active in schedule:
        kinds += [(t, n.kind) for n in engine.evaluate(_inputs("queue_depth", active, 0), T, t, 0.0)]
    assert kinds == [(120, "firing")]  # pending again from 60, so 60 s later


def test_firing_message_fields_are_exact() -> None:
    engine = RuleEngine()
    engine.evaluate(_inputs("kv_usage", True, 0), T, now=0, wall=0)
    [n] = engine.evaluate(_inputs("kv_usage", True, 0), T, now=60, wall=1_700_000_000)
    assert n.title == f"KV cache usage high on {B1}"
    assert n.severity == "warning"
    assert n.fields == (
        ("rule", "kv_usage"),
        ("pool", "interactive"),
        ("backend", B1),
        ("KV usage", 0.91),
        ("threshold", 0.85),
        ("active for s", 60.0),
    )
    [r] = engine.evaluate(_inputs("kv_usage", False, 0), T, now=75, wall=1_700_000_015)
    assert (r.kind, r.severity, r.fields[-1]) == ("resolved", "info", ("lasted s", 75.0))


def test_backend_down_defaults_to_a_short_for_and_covers_failed_health_checks() -> None:
    t = AlertThresholds(for_s=60)
    assert t.for_rule("backend_down") == 10.0 and t.for_rule("kv_usage") == 60.0
    engine = RuleEngine()
    down = AlertInputs(backends=(BackendSnapshot("offline", B1, healthy=False),))
    assert engine.evaluate(down, t, now=0, wall=0) == []
    [n] = engine.evaluate(down, t, now=10, wall=0)
    assert dict(n.fields)["healthy"] == "false" and n.severity == "critical"


def test_slo_rules_wait_for_enough_samples_and_ignore_classes_without_objectives() -> None:
    engine = RuleEngine()
    few = ClassLatency("interactive", 19, ttft_p99=9.0, ttft_slo=2.0)
    no_slo = ClassLatency("offline", 500, ttft_p99=900.0, tpot_p99=1.0)
    t0 = AlertThresholds(for_s=0, slo_min_samples=20)
    assert engine.evaluate(AlertInputs(latency=(few, no_slo)), t0, now=0, wall=0) == []
    enough = ClassLatency("interactive", 20, ttft_p99=9.0, ttft_slo=2.0)
    [n] = engine.evaluate(AlertInputs(latency=(enough,)), t0, now=1, wall=0)
    assert n.title == "TTFT P99 over SLO for class interactive"


def test_per_pool_queue_limit_overrides_the_default() -> None:
    t = AlertThresholds(for_s=0, queue_depth=100, queue_depth_per_pool={"offline": 5000})
    engine = RuleEngine()
    notes = engine.evaluate(AlertInputs(queue_depth={"interactive": 101, "offline": 4000}), t, now=0, wall=0)
    assert [n.key for n in notes] == ["interactive"]


def test_rejection_rate_needs_enough_requests_and_survives_counter_resets() -> None:
    t = AlertThresholds(for_s=0, rejection_rate=0.05, rejection_window_s=60, rejection_min_requests=20)
    engine = RuleEngine()
    assert engine.evaluate(AlertInputs(answered_total=0, rejected_total=0), t, 0, 0) == []
    assert engine.evaluate(AlertInputs(answered_total=10, rejected_total=10), t, 10, 0) == []  # 10 < 20
    [n] = engine.evaluate(AlertInputs(answered_total=40, rejected_total=12), t, 20, 0)  # 12/40
    assert dict(n.fields)["rejection rate"] == 0.3
    # a restart of the counting side: counters drop; no negative rate, the window starts over
    assert [x.kind for x in engine.evaluate(AlertInputs(answered_total=5, rejected_total=0), t, 30, 0)] == [
        "resolved"
    ]


def test_disabling_alerts_in_the_policy_forgets_state_without_messages() -> None:
    engine = RuleEngine()
    t0 = AlertThresholds(for_s=0)
    assert len(engine.evaluate(_inputs("queue_depth", True, 0), t0, 0, 0)) == 1
    off = AlertThresholds(enabled=False)
    assert engine.evaluate(_inputs("queue_depth", True, 0), off, 1, 0) == []
    assert engine.firing() == {}


def test_build_reads_the_apps_own_objects() -> None:
    b = BackendState(url=B1, pool="interactive", healthy=True, circuit="half_open", token_usage=0.4)
    stats = [ClassStats("interactive", 30, 1.5, 0.05, 0.97), ClassStats("offline", 2, None, None, 1.0)]
    inputs = AlertInputs.build(
        queue_depth={"interactive": 4},
        backends=[b],
        slo_stats=stats,
        slo_targets={"interactive": (2.0, 0.06)},
        answered_total=7,
        rejected_total=1,
    )
    assert inputs.backends == (BackendSnapshot("interactive", B1, True, "half_open", 0.4),)
    assert inputs.latency == (
        ClassLatency("interactive", 30, 1.5, 0.05, 2.0, 0.06),
        ClassLatency("offline", 2, None, None, None, None),
    )
    assert (inputs.answered_total, inputs.rejected_total) == (7, 1)
