"""Every pool a policy names must exist in the config and every model alias name a served model: at start,
at reload, in `omnigate policy check`; a class that routes to no pool serving the model is one clear 400."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.backends.pool import Pool
from gateway.livepolicy.policy import PolicyError, parse_policy
from gateway.livepolicy.refs import check_refs, unknown_refs
from gateway.livepolicy.reloader import PolicyHolder
from gateway.process.replica import Gateway
from gateway.request.errors import ApiError
from gateway.settings.config import PoolConfig, parse_config
from gateway.stages.route import Router
from omnigate.cli import main

POOLS = {"interactive": ("m",), "offline": ("m",)}
TYPOS = {
    "pools": {"interactve": {"retries": 0}},
    "budgets": {"pools": {"ofline": {"kv_watermark": 0.9}}},
    "window": {"accumulate": {"batch": {"tokens": 1000}}},
    "queue": {"classes": {"interactive": {"pool": "interactive"}, "bulk": {"pool": "bulk-pool"}}},
    "alerts": {"queue_depth_per_pool": {"interactiv": 5}},
}


def test_every_field_naming_a_missing_pool_is_reported() -> None:
    policy = parse_policy({"version": 1, **TYPOS})
    assert unknown_refs(policy, POOLS) == [
        "pools.interactve: no pool named 'interactve'",
        "budgets.pools.ofline: no pool named 'ofline'",
        "window.accumulate.batch: no pool named 'batch'",
        "queue.classes.bulk.pool: no pool named 'bulk-pool'",
        "alerts.queue_depth_per_pool.interactiv: no pool named 'interactiv'",
    ]
    with pytest.raises(PolicyError) as info:
        check_refs(policy, POOLS, "p.yaml")
    assert str(info.value).startswith("p.yaml: pools.interactve: no pool named 'interactve'; budgets.")
    assert str(info.value).endswith("(the config's pools: interactive, offline)")


def test_defaults_naming_pools_a_deployment_lacks_are_not_errors_but_written_ones_are() -> None:
    # the code defaults name `offline` (its class, its accumulate mode): inert without such a pool
    one = {"interactive": ("m",)}
    assert unknown_refs(parse_policy({"version": 1}), one) == []
    assert unknown_refs(parse_policy({"version": 1, "window": {}}), one) == []
    written = parse_policy({"version": 1, "window": {"accumulate": {"offline": {"tokens": 100}}}})
    assert unknown_refs(written, one) == ["window.accumulate.offline: no pool named 'offline'"]


def test_model_aliases_must_name_a_served_model_and_not_shadow_one() -> None:
    pools = {"interactive": ("qwen", "llava"), "offline": ("qwen-batch",)}
    good = parse_policy({"version": 1, "model_aliases": {"gpt-4o-mini": "qwen", "batch": "qwen-batch"}})
    assert unknown_refs(good, pools) == []
    bad = parse_policy({"version": 1, "model_aliases": {"gpt-4o": "qwne", "llava": "qwen"}})
    assert unknown_refs(bad, pools) == [
        "model_aliases.gpt-4o: no pool serves model 'qwne'",
        "model_aliases.llava: a served model's own name cannot be an alias",
    ]


def _config(tmp_path: Path, policy: dict) -> Path:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    cfg = {
        "policy_path": str(tmp_path / "policy.yaml"),
        "store": {"kind": "memory"},
        "auth": {"required": False},
        "pools": [
            {"name": name, "models": ["m"], "backends": [f"http://127.0.0.1:{9 + i}"]}
            for i, name in enumerate(POOLS)
        ],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_the_gateway_refuses_to_start_with_such_a_policy(tmp_path: Path) -> None:
    path = _config(tmp_path, {"version": 1, "budgets": {"pools": {"ofline": {"kv_watermark": 0.9}}}})
    config = parse_config(yaml.safe_load(path.read_text()), environ={})
    with pytest.raises(PolicyError) as info:
        Gateway(config)
    assert "budgets.pools.ofline: no pool named 'ofline'" in str(info.value)


async def test_a_reload_naming_a_missing_pool_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    path = _config(tmp_path, {"version": 1, "pools": {"offline": {"retries": 0}}})
    gw = Gateway(parse_config(yaml.safe_load(path.read_text()), environ={}))
    holder: PolicyHolder = gw.policy
    before = holder.current
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump({"version": 1, "pools": {"offlne": {"retries": 2}}}))
    result = await holder.reload()
    assert result.result == "invalid"
    assert result.error is not None and "pools.offlne: no pool named 'offlne'" in result.error
    assert holder.current is before and holder.last_error == result.error


def test_policy_check_with_the_config_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, {"version": 1})
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"version": 1, "window": {"accumulate": {"ofline": {"tokens": 10}}}}))
    assert main(["policy", "check", str(bad)]) == 0  # without the config nothing says which pools exist
    capsys.readouterr()
    assert main(["policy", "check", str(bad), "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"INVALID {bad}: window.accumulate.ofline: no pool named 'ofline'")
    assert main(["policy", "check", str(tmp_path / "policy.yaml"), "--config", str(config)]) == 0


def _pool(name: str, models: tuple[str, ...], traffic_class: str | None = None) -> Pool:
    return Pool(PoolConfig(name=name, models=models, backends=("http://b",), traffic_class=traffic_class))


def test_a_class_routing_to_no_pool_serving_the_model_is_a_400_never_another_pool() -> None:
    router = Router(
        [_pool("interactive", ("chat", "both")), _pool("batch", ("both",), traffic_class="offline")]
    )
    policy = parse_policy({"version": 1})
    assert router.route("both", "offline", policy).name == "batch"  # by the pool's traffic class
    assert router.route("chat", "interactive", policy).name == "interactive"
    with pytest.raises(ApiError) as info:
        router.route("chat", "offline", policy)  # was: silently the interactive pool
    e = info.value
    assert (e.status, e.code, e.param) == (400, "no_pool_for_class", "x-omnigate-class")
    assert e.message == (
        "Traffic class 'offline' routes to pool 'offline', which does not serve model `chat` "
        "(served by: interactive)."
    )


@pytest.mark.e2e
def test_serve_refuses_such_a_policy_with_one_message(tmp_path: Path) -> None:
    path = _config(tmp_path, {"version": 1, "queue": {"classes": {"interactive": {"pool": "interactve"}}}})
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"omnigate: {tmp_path / 'policy.yaml'}: queue.classes.interactive.pool: no pool named 'interactve' "
        "(the config's pools: interactive, offline)"
    ]
