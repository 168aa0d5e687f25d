"""Adaptive batching window: exact window lengths and opening times from the prefill load."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.admission.settings import WindowPolicy
from gateway.admission.window import QueueLoad, hold, opens_at, under_load

POLICY = WindowPolicy(max_window_s=0.0625, light_load=0.5, full_load=1.0, slack_fraction=0.5)


def _load(
    queued: int, *, recent: int = 0, others: int = 0, slack: float = 10.0, oldest: float = 100.0
) -> QueueLoad:
    """`queued` prefill tokens waiting at the top band, `recent` released by the last round at that band
    and above, `others` waiting in lower bands; the round's budget is 4096 tokens."""
    return QueueLoad(
        band=5,
        band_prefill_tokens=queued,
        recent_prefill_tokens=recent,
        prefill_tokens=queued + others,
        oldest_enqueued_at=oldest,
        oldest_slack_s=slack,
        round_tokens=4096,
    )


def test_light_prefill_load_releases_at_once_whatever_the_request_count() -> None:
    assert _load(100, recent=1948).level == 0.5  # e.g. a hundred tiny requests last round: still light
    assert opens_at("interactive", _load(100, recent=1948), POLICY) == 100.0
    assert hold("interactive", _load(100, recent=1948), POLICY) == 0.0


def test_window_grows_with_prefill_load_up_to_max() -> None:
    assert opens_at("interactive", _load(1024, recent=2048), POLICY) == 100.03125  # level 0.75
    assert hold("interactive", _load(1024, recent=2048), POLICY) == 0.03125
    assert opens_at("interactive", _load(1024, recent=8192), POLICY) == 100.0625  # level 2.25: max


def test_lower_bands_do_not_make_the_top_band_look_loaded() -> None:
    assert opens_at("interactive", _load(100, others=3000), POLICY) == 100.0


def test_window_never_spends_slack_the_oldest_does_not_have() -> None:
    assert opens_at("interactive", _load(1024, recent=8192, slack=0.03125), POLICY) == 100.015625
    assert opens_at("interactive", _load(1024, recent=8192, slack=-1.0), POLICY) == 100.0


def test_full_round_group_already_queued_releases_at_once() -> None:
    assert opens_at("interactive", _load(2048, recent=8192, others=2048), POLICY) == 100.0


def test_offline_accumulates_to_token_threshold_or_max_wait() -> None:
    assert opens_at("offline", _load(1000), WindowPolicy()) == 102.0  # default max_wait_s 2
    assert hold("offline", _load(1000), WindowPolicy()) == 2.0
    assert opens_at("offline", _load(32768), WindowPolicy()) == 100.0


def test_default_holds_only_demand_beyond_one_round_budget() -> None:
    assert opens_at("interactive", _load(96, recent=4000), WindowPolicy()) == 100.0  # level 1: fits
    assert opens_at("interactive", _load(1024, recent=4096), WindowPolicy()) == 100.0125  # level 1.25
    assert (
        hold("interactive", _load(1024, recent=4096), WindowPolicy()) == 0.0125
    )  # 0.05 · (1.25 − 1) / (2 − 1)


def test_window_policy_needs_light_below_full_load() -> None:
    with pytest.raises(ValidationError):
        WindowPolicy(light_load=2.0, full_load=2.0)


def test_disabled_window_never_holds_nor_groups() -> None:
    assert opens_at("offline", _load(1024, recent=8192), WindowPolicy(enabled=False)) == 100.0
    assert not under_load(5.0, WindowPolicy(enabled=False))
    assert under_load(0.5078125, POLICY) and not under_load(0.5, POLICY)
