from __future__ import annotations

from pathlib import Path

import anyio.to_thread
import pytest
import yaml

from gateway.observability.cli import main
from tests.observability.conftest import Receiver

pytestmark = pytest.mark.e2e

POOLS = [{"name": "interactive", "models": ["m"], "backends": ["http://127.0.0.1:1"]}]


def _config(tmp_path: Path, alerts: object) -> str:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"pools": POOLS, "alerts": alerts}))
    return str(path)


async def _run(argv: list[str]) -> int:
    """main() runs its own event loop (anyio.run), as the console script does; keep it off the test's loop."""
    return await anyio.to_thread.run_sync(main, argv)


async def test_alerts_test_reaches_each_sink_and_reports_each_result(
    tmp_path: Path, rx: Receiver, refused_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(
        tmp_path,
        {
            "sinks": [
                {"kind": "wecom", "name": "ops-wecom", "url": f"{rx.url}/wecom?key=k"},
                {"kind": "slack", "name": "ops-slack", "url": f"{rx.url}/slack"},
                {"kind": "webhook", "name": "relay", "url": refused_url},
            ]
        },
    )
    assert await _run(["test", "--config", cfg, "--message", "hello ops"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ok     ops-wecom (wecom): HTTP 200"
    assert lines[1] == "ok     ops-slack (slack): HTTP 200"
    assert lines[2].startswith("FAILED relay (webhook): no response - ConnectError")
    [wecom] = rx.bodies("/wecom")
    assert wecom["markdown"]["content"].startswith('### <font color="info">TEST</font> hello ops\n')
    assert rx.bodies("/slack")[0]["text"] == "[TEST] hello ops"


async def test_alerts_test_exit_zero_when_all_deliver(tmp_path: Path, rx: Receiver) -> None:
    cfg = _config(tmp_path, {"sinks": [{"kind": "webhook", "url": f"{rx.url}/hook"}]})
    assert await _run(["test", "--config", cfg]) == 0
    assert rx.bodies("/hook")[0]["kind"] == "test"


def test_alerts_test_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test", "--config", _config(tmp_path, {})]) == 2
    assert "no sinks under alerts.sinks" in capsys.readouterr().out
    assert (
        main(["test", "--config", _config(tmp_path, {"sinks": [{"kind": "teams", "url": "http://x"}]})]) == 2
    )
    assert capsys.readouterr().out.startswith(
        f"error: {tmp_path / 'gateway.yaml'}: alerts.sinks.0.kind: Input"
    )
    assert main(["test", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().out
