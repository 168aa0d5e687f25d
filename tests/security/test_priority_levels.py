"""A client's `x-priority` stays inside the policy's levels, and metrics name its band, never its number."""

from __future__ import annotations

import pytest

from gateway.admission.settings import PriorityPolicy

LEVELS = PriorityPolicy(levels={"low": 0, "normal": 5, "high": 10})


@pytest.mark.parametrize(
    ("asked", "clamped", "band"),
    [
        (-7, 0, "low"),
        (-(10**40), 0, "low"),
        (0, 0, "low"),
        (4, 4, "low"),
        (5, 5, "normal"),
        (9, 9, "normal"),
        (10, 10, "high"),
        (10**40, 10, "high"),
    ],
)
def test_priority_is_clamped_to_the_levels_on_both_sides(asked: int, clamped: int, band: str) -> None:
    assert LEVELS.clamp(asked) == clamped
    assert LEVELS.band(LEVELS.clamp(asked)) == band


def test_a_thousand_distinct_priorities_fall_in_three_bands() -> None:
    bands = {LEVELS.band(LEVELS.clamp(p)) for p in range(-1000, 1000)}
    assert bands == {"low", "normal", "high"}


def test_levels_sharing_a_value_name_one_band_and_no_levels_is_one_band() -> None:
    shared = PriorityPolicy(levels={"b": 3, "a": 3, "top": 9})
    assert shared.band(shared.clamp(4)) == "a"  # ties by name: the same band on every replica
    none = PriorityPolicy(levels={}, default=5)
    assert (none.clamp(-3), none.clamp(99)) == (5, 5)
    assert none.band(none.clamp(99)) == "default"
