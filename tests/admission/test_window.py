"""Adaptive batching window: exact window lengths and opening times."""

from __future__ import annotations

from gateway.admission.settings import WindowPolicy
from gateway.admission.window import BatchWindow, QueueLoad

POLICY = WindowPolicy(max_window_s=0.0625, light_load_queue_depth=1, full_window_depth=16, slack_fraction=0.5)


def _load(depth: int, *, tokens: int = 100, slack: float = 10.0, oldest: float = 100.0) -> QueueLoad:
    return QueueLoad(
        band=5,
        depth=depth,
        prefill_tokens=tokens,
        oldest_enqueued_at=oldest,
        oldest_slack_s=slack,
        round_tokens=4096,
    )


def test_light_load_releases_at_once() -> None:
    w = BatchWindow()
    assert w.opens_at("interactive", _load(1), POLICY) == 100.0
    assert w.length_s == 0.0


def test_window_grows_with_depth_up_to_max() -> None:
    w = BatchWindow()
    assert w.opens_at("interactive", _load(9), POLICY) == 100.03125  # 0.0625 · 8/16
    assert w.length_s == 0.03125
    assert w.opens_at("interactive", _load(40), POLICY) == 100.0625


def test_window_never_spends_slack_the_oldest_does_not_have() -> None:
    w = BatchWindow()
    assert w.opens_at("interactive", _load(40, slack=0.03125), POLICY) == 100.015625
    assert w.opens_at("interactive", _load(40, slack=-1.0), POLICY) == 100.0


def test_full_round_group_already_queued_releases_at_once() -> None:
    w = BatchWindow()
    assert w.opens_at("interactive", _load(40, tokens=4096), POLICY) == 100.0


def test_offline_accumulates_to_token_threshold_or_max_wait() -> None:
    w = BatchWindow()
    assert w.opens_at("offline", _load(3, tokens=1000), WindowPolicy()) == 102.0  # default max_wait_s 2
    assert w.length_s == 2.0
    assert w.opens_at("offline", _load(3, tokens=32768), WindowPolicy()) == 100.0


def test_disabled_window_never_holds() -> None:
    w = BatchWindow()
    assert w.opens_at("offline", _load(40), WindowPolicy(enabled=False)) == 100.0
