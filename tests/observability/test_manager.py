"""AlertManager end to end: pure engine on a fake clock, delivery for real to a loopback receiver."""

from __future__ import annotations

import pytest

from gateway.observability.failures import FailureEvent
from gateway.observability.manager import AlertManager
from gateway.observability.metrics import REGISTRY
from gateway.observability.rules import AlertInputs, BackendSnapshot
from gateway.observability.settings import AlertThresholds
from gateway.settings.config import AlertsConfig, SinkConfig
from tests.observability.conftest import FakeClock, Receiver, eventually

pytestmark = pytest.mark.e2e

DEEP = AlertInputs(queue_depth={"interactive": 500})
CALM = AlertInputs(queue_depth={"interactive": 0})


class Setup:
    def __init__(self, rx: Receiver) -> None:
        self.clock = FakeClock()
        self.thresholds = AlertThresholds(for_s=30, repeat_s=600, failure_burst=5, failure_window_s=60)
        cfg = AlertsConfig(
            sinks=[
                SinkConfig(kind="webhook", name="hook", url=f"{rx.url}/hook"),
                SinkConfig(kind="wecom", name="wecom", url=f"{rx.url}/wecom"),
                SinkConfig(kind="slack", name="slack", url=f"{rx.url}/slack"),
            ]
        )
        self.manager = AlertManager(
            cfg, lambda: self.thresholds, clock=self.clock, wall=lambda: 1_700_000_000.0
        )


@pytest.fixture
def setup(rx: Receiver) -> Setup:
    return Setup(rx)


async def test_threshold_alert_lifecycle_reaches_every_sink(setup: Setup, rx: Receiver) -> None:
    async with setup.manager:
        m, clock = setup.manager, setup.clock
        assert m.evaluate(DEEP) == []  # pending
        clock.advance(29.9)
        assert m.evaluate(DEEP) == []
        clock.advance(0.1)
        assert [n.kind for n in m.evaluate(DEEP)] == ["firing"]
        assert REGISTRY.get_sample_value("omnigate_alerts_firing", {"rule": "queue_depth"}) == 1
        for _ in range(5):  # deduplicated while it holds
            clock.advance(100)
            assert m.evaluate(DEEP) == []
        clock.advance(100)  # 600 s after the first message
        assert [n.kind for n in m.evaluate(DEEP)] == ["firing"]
        clock.advance(5)
        assert [n.kind for n in m.evaluate(CALM)] == ["resolved"]
        assert REGISTRY.get_sample_value("omnigate_alerts_firing", {"rule": "queue_depth"}) == 0

        hooks = await rx.wait_for("/hook", 3)
        assert [(b["kind"], b["status"], b["rule"], b["key"]) for b in hooks] == [
            ("firing", "firing", "queue_depth", "interactive"),
            ("firing", "firing", "queue_depth", "interactive"),
            ("resolved", "resolved", "queue_depth", "interactive"),
        ]
        assert hooks[0]["fields"] == {
            "rule": "queue_depth",
            "pool": "interactive",
            "queue depth": 500,
            "threshold": 100,
            "active for s": 30.0,
        }
        wecom = await rx.wait_for("/wecom", 3)
        assert wecom[2]["markdown"]["content"].startswith(
            '### <font color="info">RESOLVED</font> Queue depth high'
        )
        slack = await rx.wait_for("/slack", 3)
        assert [b["text"] for b in slack] == ["[FIRING] Queue depth high in pool interactive"] * 2 + [
            "[RESOLVED] Queue depth high in pool interactive"
        ]


async def test_threshold_changes_apply_at_the_next_evaluation(setup: Setup) -> None:
    async with setup.manager:
        m = setup.manager
        kv = AlertInputs(backends=(BackendSnapshot("interactive", "http://b:1", kv_usage=0.8),))
        setup.thresholds = AlertThresholds(for_s=0, kv_usage=0.85)
        assert m.evaluate(kv) == []
        setup.thresholds = AlertThresholds(for_s=0, kv_usage=0.75)  # a policy reload
        assert [n.rule for n in m.evaluate(kv)] == ["kv_usage"]


def _failure(i: int) -> FailureEvent:
    return FailureEvent(
        f"req-{i}", "acme", "offline", "http://b:2", 500, "engine OOM", 0.97, job_id=f"job-{i}"
    )


async def test_failure_alert_carries_every_field_and_a_storm_becomes_one_summary(
    setup: Setup, rx: Receiver
) -> None:
    async with setup.manager:
        m, clock = setup.manager, setup.clock
        for i in range(42):
            m.notify_failure(_failure(i))
            clock.advance(1.0)
        clock.advance(18.0)  # the window opened at the first failure, 60 s ago
        assert [n.title for n in m.tick()] == ["37 more failures in the last 60 s"]
        hooks = await rx.wait_for("/hook", 6)
        assert [b["kind"] for b in hooks] == ["failure"] * 5 + ["failure_summary"]
        assert hooks[0]["fields"] == {
            "job": "job-0",
            "request": "req-0",
            "tenant": "acme",
            "class": None,
            "model": None,
            "pool": "offline",
            "backend": "http://b:2",
            "status": 500,
            "error": "engine OOM",
            "backend KV usage": 0.97,
        }
        assert hooks[5]["lines"][0] == "37 × pool=offline backend=http://b:2 status=500"
        wecom = await rx.wait_for("/wecom", 6)
        assert '> backend KV usage: <font color="comment">0.97</font>' in wecom[0]["markdown"]["content"]


async def test_provider_mode_pulls_a_snapshot_every_interval(rx: Receiver) -> None:
    pulls: list[int] = []

    def provider() -> AlertInputs:
        pulls.append(1)
        return DEEP

    cfg = AlertsConfig(sinks=[SinkConfig(kind="webhook", url=f"{rx.url}/pulled")], evaluation_interval_s=0.01)
    m = AlertManager(cfg, lambda: AlertThresholds(for_s=0), provider=provider)
    await m.start()
    try:
        [body] = await rx.wait_for("/pulled", 1)
        await eventually(lambda: len(pulls) >= 3)
    finally:
        await m.stop()
    assert body["title"] == "Queue depth high in pool interactive"
    assert len(rx.bodies("/pulled")) == 1  # many pulls, one message: deduplicated


async def test_messages_before_start_are_kept_and_stop_drains_the_queue(rx: Receiver) -> None:
    cfg = AlertsConfig(sinks=[SinkConfig(kind="slack", url=f"{rx.url}/slack-drain")])
    m = AlertManager(cfg, lambda: AlertThresholds(for_s=0))
    m.notify_failure(_failure(1))  # before start: the app may report before its lifespan finished
    await m.start()
    m.notify_failure(_failure(2))
    await m.stop()
    assert [b["text"] for b in rx.bodies("/slack-drain")] == [
        "[FAILED] Batch job job-1 failed (500)",
        "[FAILED] Batch job job-2 failed (500)",
    ]


async def test_disabled_config_sends_nothing(rx: Receiver) -> None:
    cfg = AlertsConfig(enabled=False, sinks=[SinkConfig(kind="webhook", url=f"{rx.url}/off")])
    m = AlertManager(cfg, lambda: AlertThresholds(for_s=0))
    await m.start()
    assert len(m.evaluate(DEEP)) == 1  # still evaluated (the gauge stays true) ...
    m.notify_failure(_failure(3))
    await m.stop()
    assert rx.bodies("/off") == []  # ... but nothing is delivered
