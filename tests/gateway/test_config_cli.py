"""Config fails fast naming the field; env overrides; `omnigate policy check|schema`; serve errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gateway.settings.config import ConfigError, load_config, parse_config
from omnigate.cli import main
from tests.gateway.conftest import ADMIN

POOLS = [{"name": "p", "models": ["m"], "backends": ["http://127.0.0.1:1"]}]


def test_env_overrides_nested_fields():
    cfg = parse_config(
        {"pools": POOLS},
        environ={
            "OMNIGATE_LISTEN__PORT": "9123",
            "OMNIGATE_ADMIN__TOKEN": "t",
            "OMNIGATE_STORE__KIND": "redis",
            "OTHER": "x",
        },
    )
    assert cfg.listen.port == 9123
    assert cfg.admin.resolve_token() == "t"
    assert cfg.store.kind == "redis"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "pools: Field required"),
        (
            {"pools": [{"name": "p", "models": ["m"], "backends": ["ftp://x"]}]},
            "pools.0.backends: Value error, backend URL must start with http:// or https://: 'ftp://x'",
        ),
        (
            {"pools": POOLS, "listen": {"port": 70000}},
            "listen.port: Input should be less than or equal to 65535",
        ),
        ({"pools": POOLS + POOLS}, "duplicate pool names: ['p']"),
        ({"pools": POOLS, "colour": "blue"}, "colour: Extra inputs are not permitted"),
    ],
)
def test_bad_config_fails_fast_naming_the_field(data, message):
    with pytest.raises(ConfigError) as info:
        parse_config(data, "gw.yaml", environ={})
    assert str(info.value).startswith("gw.yaml: ")
    assert message in str(info.value)


def test_shipped_configs_are_valid():
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "config" / "gateway.yaml", environ={})
    assert [p.name for p in cfg.pools] == ["interactive", "offline"]
    assert Path(cfg.policy_path).exists()
    for policy in sorted((root / "policies").rglob("*.yaml")):
        assert main(["policy", "check", str(policy)]) == 0


@pytest.mark.e2e
def test_serve_with_bad_config_exits_2_with_one_message(tmp_path):
    bad = tmp_path / "gw.yaml"
    bad.write_text("pools: [{name: p, models: [m], backends: [nope]}]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"omnigate: {bad}: pools.0.backends: Value error, "
        "backend URL must start with http:// or https://: 'nope'"
    ]


def test_policy_check_reports_errors_and_diffs(tmp_path, capsys):
    good = tmp_path / "p.yaml"
    good.write_text("version: 1\npool_defaults: {retries: 0}\nbudgets: {kv_watermark: 0.8}\n")
    assert main(["policy", "check", str(good)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"OK {good} is valid."
    assert "  ~ budgets.kv_watermark: 0.85 -> 0.8" in out
    assert "  ~ pool_defaults.retries: 1 -> 0" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nbudgets: {kv_watermark: 1.5}\n")
    assert main(["policy", "check", str(bad)]) == 1
    assert capsys.readouterr().out.startswith(
        f"INVALID {bad}: budgets.kv_watermark: Input should be less than"
    )


@pytest.mark.e2e
def test_policy_check_diffs_against_the_running_gateway(
    start_backend, start_gateway, policy_file, tmp_path, capsys
):
    gw = start_gateway([start_backend().url], watch_policy=False)
    candidate = tmp_path / "c.yaml"
    candidate.write_text(policy_file.read_text().replace("first_byte: 5.0", "first_byte: 9.0"))
    assert main(["policy", "check", str(candidate), "--url", gw.url, "--token", ADMIN]) == 0
    out = capsys.readouterr().out
    assert f"Changes against the running policy at {gw.url}:" in out
    assert out.strip().splitlines()[-1] == "  ~ pool_defaults.timeouts.first_byte: 5.0 -> 9.0"


def test_policy_schema_is_json_schema(tmp_path):
    out = tmp_path / "schema.json"
    assert main(["policy", "schema", "-o", str(out)]) == 0
    schema = orjson.loads(out.read_bytes())
    assert schema["title"] == "omnigate policy"
    assert {
        "pool_defaults",
        "queue",
        "budgets",
        "window",
        "controller",
        "estimation",
        "buckets",
        "tenant_defaults",
        "alerts",
        "fairness",
    } <= set(schema["properties"])
