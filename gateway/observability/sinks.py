"""Where notifications go: generic JSON webhook, WeCom group robot, Slack incoming webhook.

Each sink has its own bounded queue and delivery task, so a dead or slow sink delays only itself and
never the request path: `enqueue` is synchronous and O(1), drops the oldest pending message when the
queue is full (counted in omnigate_alert_notifications_total{result="dropped"}). Delivery retries on
transport errors, 5xx, 429 and WeCom's rate-limit errcode, with exponential backoff. URLs are never
logged: robot keys live in them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from gateway.observability import metrics as m
from gateway.observability.notification import Notification
from gateway.settings.config import AlertsConfig, SinkConfig

log = logging.getLogger("omnigate.alerts")

WECOM_MAX_BYTES = 4096
WECOM_RETRY_ERRCODES = frozenset({-1, 45009})  # system busy, API frequency limit


class Sink:
    """A generic JSON webhook: POSTs Notification.to_dict()."""

    kind = "webhook"

    def __init__(self, name: str, url: str | None, missing: str = "") -> None:
        self.name = name
        self.url = url
        self.missing = missing  # why url is None (an unset environment variable)

    def payload(self, n: Notification) -> dict[str, Any]:
        return n.to_dict()

    def verdict(self, response: httpx.Response) -> str | None:
        """None when delivered, else an error; retryable errors start with 'retry:'."""
        if response.status_code == 429 or response.status_code >= 500:
            return f"retry: HTTP {response.status_code}"
        if response.status_code >= 400:
            return f"HTTP {response.status_code}"
        return None


class WeComSink(Sink):
    """WeCom (企业微信) group robot: markdown message; HTTP 200 with a nonzero errcode is a failure."""

    kind = "wecom"

    def payload(self, n: Notification) -> dict[str, Any]:
        content = n.wecom_markdown()
        raw = content.encode()
        if len(raw) > WECOM_MAX_BYTES:
            content = raw[: WECOM_MAX_BYTES - 4].decode(errors="ignore") + "\n…"
        return {"msgtype": "markdown", "markdown": {"content": content}}

    def verdict(self, response: httpx.Response) -> str | None:
        error = super().verdict(response)
        if error is not None:
            return error
        try:
            body = response.json()
        except ValueError:
            return "response is not JSON"
        code = body.get("errcode", 0) if isinstance(body, dict) else 0
        if code == 0:
            return None
        message = f"errcode {code}: {body.get('errmsg', '')}"
        return f"retry: {message}" if code in WECOM_RETRY_ERRCODES else message


class SlackSink(Sink):
    """Slack incoming webhook: `text` as the notification fallback, one mrkdwn section block."""

    kind = "slack"

    def payload(self, n: Notification) -> dict[str, Any]:
        return {
            "text": n.headline,
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": n.slack_mrkdwn()}}],
        }


_KINDS: dict[str, type[Sink]] = {"webhook": Sink, "wecom": WeComSink, "slack": SlackSink}


def make_sink(cfg: SinkConfig, environ: dict[str, str] | None = None) -> Sink:
    url = cfg.resolve_url(environ)
    missing = "" if url else f"environment variable {cfg.url_env} is not set"
    return _KINDS[cfg.kind](cfg.name, url, missing)


@dataclass(frozen=True, slots=True)
class SinkResult:
    sink: str
    ok: bool
    attempts: int
    status: int | None = None
    error: str | None = None

    def describe(self) -> tuple[str, int, str]:
        return self.sink, self.attempts, self.error or "ok"


class SinkWorker:
    """One sink's queue and delivery loop."""

    def __init__(
        self,
        sink: Sink,
        client: httpx.AsyncClient,
        config: AlertsConfig,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.sink = sink
        self._client = client
        self._config = config
        self._sleep = sleep
        self._pending: deque[Notification] = deque()
        self._wake: anyio.Event | None = None  # made inside the loop: anyio events need a running backend
        self._drained: anyio.Event | None = None
        self.busy = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    def enqueue(self, n: Notification) -> None:
        """Non-blocking; call from the event loop's thread."""
        if len(self._pending) >= self._config.queue_size:
            self._pending.popleft()
            m.ALERT_NOTIFICATIONS.labels(self.sink.name, "dropped").inc()
        self._pending.append(n)
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        while True:
            if not self._pending:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            n = self._pending.popleft()
            self.busy = True
            try:
                result = await self.deliver(n)
            finally:
                self.busy = False
            if not self._pending and self._drained is not None:
                self._drained.set()
            m.ALERT_NOTIFICATIONS.labels(self.sink.name, "sent" if result.ok else "failed").inc()
            if not result.ok:
                log.warning(
                    "alert to sink %s failed after %d attempt(s): %s",
                    result.sink,
                    result.attempts,
                    result.error,
                )

    async def drain(self) -> None:
        """Wait until everything queued has been delivered or given up on."""
        while self._pending or self.busy:
            self._drained = anyio.Event()
            await self._drained.wait()

    async def deliver(self, n: Notification) -> SinkResult:
        """POST with retries; returns how it went. Never raises on delivery errors."""
        if self.sink.url is None:
            return SinkResult(self.sink.name, False, 0, error=self.sink.missing)
        cfg = self._config
        payload = self.sink.payload(n)
        status: int | None = None
        error = ""
        for attempt in range(1, cfg.retries + 2):
            try:
                response = await self._client.post(self.sink.url, json=payload, timeout=cfg.timeout_s)
                status = response.status_code
                verdict = self.sink.verdict(response)
            except httpx.HTTPError as e:
                verdict = f"retry: {type(e).__name__}: {e}" if str(e) else f"retry: {type(e).__name__}"
            if verdict is None:
                return SinkResult(self.sink.name, True, attempt, status)
            error = verdict.removeprefix("retry: ")
            if not verdict.startswith("retry: ") or attempt > cfg.retries:
                return SinkResult(self.sink.name, False, attempt, status, error)
            await self._sleep(min(cfg.backoff_s * 2 ** (attempt - 1), cfg.backoff_max_s))
        raise AssertionError("unreachable: the last attempt returns")


class Deliveries:
    """All configured sinks: fan a notification out to every one, each at its own pace."""

    def __init__(
        self,
        config: AlertsConfig,
        client: httpx.AsyncClient,
        environ: dict[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.workers = [SinkWorker(make_sink(s, environ), client, config, sleep) for s in config.sinks]

    def enqueue(self, n: Notification) -> None:
        for w in self.workers:
            w.enqueue(n)

    async def drain(self) -> None:
        for w in self.workers:
            await w.drain()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for w in self.workers:
                tg.start_soon(w.run)

    async def send_now(self, n: Notification) -> list[SinkResult]:
        """Deliver to every sink concurrently and report each result (for `omnigate alerts test`)."""
        results: list[SinkResult | None] = [None] * len(self.workers)

        async def one(i: int, w: SinkWorker) -> None:
            results[i] = await w.deliver(n)

        async with anyio.create_task_group() as tg:
            for i, w in enumerate(self.workers):
                tg.start_soon(one, i, w)
        return [r for r in results if r is not None]
