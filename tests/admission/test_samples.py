"""RecentSamples: the last N values, none older than the maximum age, and their nearest-rank quantile."""

from __future__ import annotations

from gateway.admission.samples import RecentSamples


def test_the_window_keeps_the_last_values_and_the_quantile_follows_every_change() -> None:
    s = RecentSamples(window=3, max_age_s=10.0)
    for at, value in ((0.0, 5.0), (1.0, 1.0), (2.0, 3.0)):
        s.add(value, at)
    assert (len(s), s.quantile(0.5), s.quantile(1.0)) == (3, 3.0, 5.0)
    s.add(4.0, 3.0)  # the window is full: 5.0, the oldest, goes
    assert (len(s), s.quantile(1.0), s.quantile(0.01)) == (3, 4.0, 1.0)


def test_samples_age_out_and_a_resize_keeps_the_most_recent() -> None:
    s = RecentSamples(window=4, max_age_s=10.0)
    for at in (0.0, 1.0, 2.0, 3.0):
        s.add(at * 10, at)
    assert s.quantile(0.25) == 0.0
    assert s.expire(10.0) and len(s) == 3  # seen at 0.0: forgotten at 10.0
    assert not s.expire(10.5)
    assert s.quantile(0.25) == 10.0
    s.resize(window=2, max_age_s=10.0)
    assert (len(s), s.quantile(0.0)) == (2, 20.0)
    s.resize(window=2, max_age_s=1.0)  # a shorter age applies at the next expiry
    assert s.expire(12.5) and len(s) == 0
