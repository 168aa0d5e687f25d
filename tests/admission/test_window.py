"""When a round may open: at once, unless the pool accumulates (window.py); the load window's keys gone."""

from __future__ import annotations

import pytest

from gateway.admission.settings import AccumulatePolicy, WindowPolicy
from gateway.admission.window import hold
from gateway.livepolicy.policy import load_policy_text


def test_a_pool_that_does_not_accumulate_never_holds_whatever_its_load() -> None:
    assert hold("interactive", 10**6, WindowPolicy()) == 0.0


def test_offline_accumulates_to_token_threshold_or_max_wait() -> None:
    assert hold("offline", 1000, WindowPolicy()) == 2.0  # default max_wait_s 2
    assert hold("offline", 32768, WindowPolicy()) == 0.0
    assert hold("offline", 1000, WindowPolicy(accumulate={})) == 0.0
    assert hold("batch", 99, WindowPolicy(accumulate={"batch": AccumulatePolicy(tokens=100)})) == 2.0


def test_a_policy_naming_the_load_windows_keys_loads_and_warns_to_delete_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """policies/default.yaml named `enabled` and `max_window_s` until the window was removed."""
    text = "version: 1\nwindow:\n  enabled: true\n  max_window_s: 0.05\n  accumulate: {}\n"
    policy = load_policy_text(text, "old.yaml")
    assert policy.window == WindowPolicy(accumulate={})
    why = "rounds open as soon as requests wait, none grouped (decision 0108); delete it"
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("omnigate.policy", "WARNING", f"policy: window.{key} is ignored, it was removed: {why}")
        for key in ("enabled", "max_window_s")
    ]
