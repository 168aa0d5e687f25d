from __future__ import annotations

import pytest

from gateway.livepolicy.policy import PolicyError, load_policy_text
from gateway.observability.cli import alerts_config
from gateway.settings.config import AlertsConfig


def test_thresholds_live_in_the_policy_under_alerts() -> None:
    policy = load_policy_text(
        "version: 1\nalerts:\n  queue_depth: 40\n  for_overrides: {kv_usage: 30}\n"
        "  queue_depth_per_pool: {offline: 9000}\n"
    )
    t = policy.alerts
    assert (t.queue_limit("interactive"), t.queue_limit("offline")) == (40, 9000)
    assert (t.for_rule("kv_usage"), t.for_rule("queue_depth")) == (30.0, 60.0)


def test_bad_thresholds_are_refused_with_the_field_named() -> None:
    with pytest.raises(PolicyError, match=r"alerts\.kv_usage: Input should be less than or equal to 1"):
        load_policy_text("version: 1\nalerts: {kv_usage: 85}\n")
    with pytest.raises(PolicyError, match=r"alerts\.for_overrides\.queue_lenght"):
        load_policy_text("version: 1\nalerts: {for_overrides: {queue_lenght: 5}}\n")


def test_alerts_config_from_the_gateway_config_mapping() -> None:
    cfg = alerts_config({"sinks": [{"kind": "wecom", "url_env": "WECOM_HOOK"}], "evaluation_interval_s": 2})
    assert cfg.sinks[0].name == "wecom" and cfg.evaluation_interval_s == 2
    assert alerts_config(cfg) is cfg
    assert AlertsConfig().sinks == () and AlertsConfig().enabled
