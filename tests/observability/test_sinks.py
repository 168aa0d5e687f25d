from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

from gateway.observability.metrics import REGISTRY
from gateway.observability.notification import Notification
from gateway.observability.sinks import Deliveries, SinkResult, SinkWorker, SlackSink, WeComSink, make_sink
from gateway.settings.config import AlertsConfig, SinkConfig
from tests.observability.conftest import Receiver, eventually

N = Notification(
    kind="firing",
    title="Queue depth high in pool interactive",
    severity="warning",
    fields=(("pool", "interactive"), ("queue depth", 150), ("KV usage", 0.912345), ("job", None)),
    rule="queue_depth",
    key="interactive",
    at=1_700_000_000,
)


def test_wecom_payload_is_the_robot_markdown_message() -> None:
    assert WeComSink("ops", "http://x").payload(N) == {
        "msgtype": "markdown",
        "markdown": {
            "content": '### <font color="warning">FIRING</font> Queue depth high in pool interactive\n'
            '> pool: <font color="comment">interactive</font>\n'
            '> queue depth: <font color="comment">150</font>\n'
            '> KV usage: <font color="comment">0.9123</font>\n'
            '> job: <font color="comment">-</font>\n'
            '<font color="comment">2023-11-14 22:13:20 UTC</font>'
        },
    }


def test_wecom_content_is_cut_to_the_robots_4096_byte_limit() -> None:
    big = Notification(kind="failure", title="x", lines=("错" * 3000,), at=0)
    content = WeComSink("ops", "http://x").payload(big)["markdown"]["content"]
    assert len(content.encode()) <= 4096 and content.endswith("\n…")


def test_slack_payload_is_text_plus_one_mrkdwn_section() -> None:
    assert SlackSink("chat", "http://x").payload(N) == {
        "text": "[FIRING] Queue depth high in pool interactive",
        "blocks": [
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": "*[FIRING] Queue depth high in pool interactive*\n"
                    "• *pool*: `interactive`\n"
                    "• *queue depth*: `150`\n"
                    "• *KV usage*: `0.9123`\n"
                    "• *job*: `-`\n"
                    "_2023-11-14 22:13:20 UTC_",
                },
            }
        ],
    }


def test_generic_webhook_payload_is_structured_json() -> None:
    body = make_sink(SinkConfig(kind="webhook", url="http://x")).payload(N)
    assert body == {
        "source": "omnigate",
        "kind": "firing",
        "status": "firing",
        "severity": "warning",
        "title": "Queue depth high in pool interactive",
        "rule": "queue_depth",
        "key": "interactive",
        "fields": {"pool": "interactive", "queue depth": 150, "KV usage": 0.912345, "job": None},
        "lines": [],
        "at": 1_700_000_000,
        "text": N.text(),
    }


def _config(sinks: list[SinkConfig], **kw: Any) -> AlertsConfig:
    return AlertsConfig(sinks=sinks, backoff_s=0.5, backoff_max_s=1.5, **kw)


@pytest.mark.e2e
async def test_every_kind_delivers_for_real_to_several_sinks_at_once(rx: Receiver) -> None:
    cfg = _config(
        [
            SinkConfig(kind="webhook", name="hook", url=f"{rx.url}/hook"),
            SinkConfig(kind="wecom", name="wecom", url=f"{rx.url}/wecom?key=secret"),
            SinkConfig(kind="slack", name="slack", url=f"{rx.url}/slack"),
        ]
    )
    async with httpx.AsyncClient() as client:
        results = await Deliveries(cfg, client).send_now(N)
    assert results == [SinkResult(n, True, 1, 200) for n in ("hook", "wecom", "slack")]
    assert rx.bodies("/hook")[0]["title"] == N.title
    assert rx.bodies("/wecom")[0]["msgtype"] == "markdown"
    assert rx.bodies("/slack")[0]["text"] == N.headline


@pytest.mark.e2e
async def test_retries_with_exponential_backoff_then_delivers(
    rx: Receiver, fast_sleep: tuple[list[float], Callable[[float], Any]]
) -> None:
    asked, sleep = fast_sleep
    rx.script["/hook"] = [(500, None), (503, None), (429, None)]
    cfg = _config([SinkConfig(kind="webhook", url=f"{rx.url}/hook")], retries=3)
    async with httpx.AsyncClient() as client:
        [r] = await Deliveries(cfg, client, sleep=sleep).send_now(N)
    assert r == SinkResult("webhook", True, 4, 200)
    assert asked == [0.5, 1.0, 1.5]  # doubling, capped at backoff_max_s
    assert len(rx.bodies("/hook")) == 4


@pytest.mark.e2e
async def test_gives_up_after_retries_and_does_not_retry_client_errors(
    rx: Receiver, fast_sleep: tuple[list[float], Callable[[float], Any]]
) -> None:
    _, sleep = fast_sleep
    rx.script["/a"] = [(502, None)] * 3
    rx.script["/b"] = [(404, None)]
    cfg = _config(
        [
            SinkConfig(kind="webhook", name="a", url=f"{rx.url}/a"),
            SinkConfig(kind="slack", name="b", url=f"{rx.url}/b"),
        ],
        retries=2,
    )
    async with httpx.AsyncClient() as client:
        results = await Deliveries(cfg, client, sleep=sleep).send_now(N)
    assert results == [SinkResult("a", False, 3, 502, "HTTP 502"), SinkResult("b", False, 1, 404, "HTTP 404")]


@pytest.mark.e2e
async def test_wecom_errcode_in_a_200_is_a_failure_and_rate_limit_is_retried(
    rx: Receiver, fast_sleep: tuple[list[float], Callable[[float], Any]]
) -> None:
    _, sleep = fast_sleep
    rx.script["/busy"] = [(200, {"errcode": 45009, "errmsg": "api freq out of limit"})]
    rx.script["/bad"] = [(200, {"errcode": 93000, "errmsg": "invalid webhook url"})]
    cfg = _config(
        [
            SinkConfig(kind="wecom", name="busy", url=f"{rx.url}/busy"),
            SinkConfig(kind="wecom", name="bad", url=f"{rx.url}/bad"),
        ]
    )
    async with httpx.AsyncClient() as client:
        results = await Deliveries(cfg, client, sleep=sleep).send_now(N)
    assert results == [
        SinkResult("busy", True, 2, 200),
        SinkResult("bad", False, 1, 200, "errcode 93000: invalid webhook url"),
    ]


@pytest.mark.e2e
async def test_refused_connection_is_retried_then_reported(
    refused_url: str, fast_sleep: tuple[list[float], Callable[[float], Any]]
) -> None:
    _, sleep = fast_sleep
    cfg = _config([SinkConfig(kind="slack", url=refused_url)], retries=1)
    async with httpx.AsyncClient() as client:
        [r] = await Deliveries(cfg, client, sleep=sleep).send_now(N)
    assert (r.ok, r.attempts, r.status) == (False, 2, None)
    assert r.error is not None and r.error.startswith("ConnectError")


async def test_unset_url_env_is_reported_not_sent() -> None:
    cfg = _config([SinkConfig(kind="wecom", name="ops", url_env="OMNIGATE_TEST_UNSET_WEBHOOK")])
    async with httpx.AsyncClient() as client:
        [r] = await Deliveries(cfg, client, environ={}).send_now(N)
    assert r == SinkResult(
        "ops", False, 0, None, "environment variable OMNIGATE_TEST_UNSET_WEBHOOK is not set"
    )


def _dropped(sink: str) -> float:
    labels = {"sink": sink, "result": "dropped"}
    return REGISTRY.get_sample_value("omnigate_alert_notifications_total", labels) or 0


@pytest.mark.e2e
async def test_a_hung_sink_never_blocks_enqueue_nor_the_other_sinks(silent_url: str, rx: Receiver) -> None:
    """Mechanism: enqueue is a plain function (it cannot await), each sink has its own queue and task,
    and a full queue drops its oldest message and counts it instead of waiting."""
    assert not inspect.iscoroutinefunction(Deliveries.enqueue)
    assert not inspect.iscoroutinefunction(SinkWorker.enqueue)
    cfg = AlertsConfig(
        sinks=[
            SinkConfig(kind="webhook", name="hung-sink", url=silent_url),
            SinkConfig(kind="webhook", name="live-sink", url=f"{rx.url}/live"),
        ],
        queue_size=10,
        timeout_s=30,
    )
    before = _dropped("hung-sink")
    async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:
        d = Deliveries(cfg, client)
        hung = d.workers[0]
        tg.start_soon(d.run)
        d.enqueue(N)
        await rx.wait_for("/live", 1)
        await eventually(lambda: hung.busy)  # the hung sink's task is now stuck waiting for an answer
        for i in range(25):
            d.enqueue(Notification(kind="failure", title=f"f{i}", at=0))
        assert hung.pending == 10  # bounded: the 15 oldest dropped, nothing waited
        assert _dropped("hung-sink") - before == 15
        bodies = await rx.wait_for("/live", 11)  # the live sink delivers meanwhile, at its own pace
        assert [b["title"] for b in bodies] == [N.title] + [f"f{i}" for i in range(15, 25)]
        assert hung.busy and hung.pending == 10
        tg.cancel_scope.cancel()


def test_sink_config_needs_exactly_one_url_source() -> None:
    with pytest.raises(ValueError, match="exactly one of url or url_env"):
        SinkConfig(kind="slack")
    with pytest.raises(ValueError, match="must start with http"):
        SinkConfig(kind="slack", url="hooks.slack.com/x")
    with pytest.raises(ValueError, match="duplicate sink names"):
        AlertsConfig(
            sinks=[SinkConfig(kind="slack", url="http://a"), SinkConfig(kind="slack", url="http://b")]
        )
    assert SinkConfig(kind="wecom", url_env="HOOK").resolve_url({"HOOK": "http://w"}) == "http://w"
