"""`omnigate alerts test --config config/gateway.yaml`: prove each sink delivers before an incident does.

Each sink gets one real test message, sent once without retries, and one line saying exactly what its
server answered. Exit status: 0 all delivered, 1 some sink failed, 2 no usable configuration.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
from pydantic import ValidationError

from gateway.observability.notification import Notification
from gateway.observability.sinks import Deliveries, SinkResult
from gateway.settings.config import AlertsConfig, ConfigError, load_config
from gateway.settings.schema import describe


def alerts_config(value: AlertsConfig | dict[str, Any]) -> AlertsConfig:
    """GatewayConfig.alerts as the model, whether the config schema already types it or not."""
    return value if isinstance(value, AlertsConfig) else AlertsConfig.model_validate(value)


def sample_notification(message: str) -> Notification:
    return Notification(
        kind="test",
        title=message,
        severity="info",
        fields=(
            ("host", socket.gethostname()),
            ("what", "a test from `omnigate alerts test`; no action needed"),
        ),
    )


async def send_test(config: AlertsConfig, message: str) -> list[SinkResult]:
    once = config.model_copy(update={"retries": 0})
    async with httpx.AsyncClient() as client:
        return await Deliveries(once, client).send_now(sample_notification(message))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnigate alerts", description="Alert sink tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    test = sub.add_parser("test", help="send a test message to each configured sink")
    test.add_argument("--config", default="config/gateway.yaml", help="gateway config file")
    test.add_argument("--message", default="omnigate alert test", help="title of the test message")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = alerts_config(load_config(args.config).alerts)
    except ConfigError as e:
        print(f"error: {e}")
        return 2
    except ValidationError as e:
        print(f"error: {args.config}: {describe(e, 'alerts')}")
        return 2
    if not cfg.sinks:
        print(f"error: {args.config}: no sinks under alerts.sinks; nothing to test")
        return 2
    results = anyio.run(send_test, cfg, args.message)
    kinds = {s.name: s.kind for s in cfg.sinks}
    for r in results:
        state = "ok" if r.ok else "FAILED"
        status = f"HTTP {r.status}" if r.status is not None else "no response"
        detail = f" - {r.error}" if r.error else ""
        print(f"{state:<6} {r.sink} ({kinds[r.sink]}): {status}{detail}")
    return 0 if all(r.ok for r in results) else 1
