"""`Shares`: what a replica may use of a backend, leased or in its fallback, on a fake clock."""

from __future__ import annotations

import pytest

from gateway.coordination.shares import Lease, Shares

pytestmark = pytest.mark.unit

URL = "http://engine"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def lease(grant: int, until: float, limit: int = 12, replicas: int = 3, owner: bool = False) -> Lease:
    return Lease(grant, limit, until, replicas, 0, 0, owner, {"me": grant})


def test_before_any_answer_the_hint_divides_the_local_limit() -> None:
    shares = Shares("me", ttl_s=3.0, replicas_hint=2, clock=Clock())
    assert shares.granted(URL, 8) == 4
    assert shares.limit(URL, 8) == 8
    assert shares.describe(URL, 8)["mode"] == "fallback"


def test_a_live_lease_is_the_share_and_its_limit_the_engines() -> None:
    clock = Clock()
    shares = Shares("me", 3.0, 1, clock)
    shares.leased(URL, lease(7, until=103.0))
    assert shares.granted(URL, 64) == 7
    assert shares.limit(URL, 64) == 12
    assert shares.follows(URL) == 12  # another replica owns the limit
    shares.leased(URL, lease(7, until=103.0, owner=True))
    assert shares.follows(URL) is None


def test_redis_down_shrinks_to_one_nth_at_once_and_takes_it_whole_after_a_ttl() -> None:
    clock = Clock()
    shares = Shares("me", 3.0, 1, clock)
    shares.leased(URL, lease(2, until=103.0))  # a small share: 1/N = 12 / 3 = 4
    shares.failed(100.5)
    assert shares.returning
    assert shares.granted(URL, 12) == 2  # min(grant, 1/N) while the others' leases may still run
    clock.t = 103.49
    assert shares.granted(URL, 12) == 2
    clock.t = 103.5  # a TTL after the failure: every other lease has ended, each holds 1/N
    assert shares.granted(URL, 12) == 4
    shares.leased(URL, lease(9, until=106.0))
    shares.refreshed()
    assert not shares.returning
    assert shares.granted(URL, 12) == 9


def test_a_big_share_drops_to_one_nth_when_redis_goes() -> None:
    clock = Clock()
    shares = Shares("me", 3.0, 1, clock)
    shares.leased(URL, lease(10, until=103.0))
    shares.failed(100.2)
    assert shares.granted(URL, 12) == 4


def test_an_expired_lease_without_a_failure_is_a_fallback_too() -> None:
    clock = Clock()
    shares = Shares("me", 3.0, 1, clock)
    shares.leased(URL, lease(10, until=103.0))
    clock.t = 103.0  # the refresh loop stalled
    assert shares.granted(URL, 12) == 4
    assert shares.describe(URL, 12)["mode"] == "fallback"


def test_the_prefill_fraction_is_the_share_of_the_pools_engines() -> None:
    clock = Clock()
    shares = Shares("me", 3.0, 1, clock)
    shares.leased("a", lease(6, until=103.0))
    shares.leased("b", lease(0, until=103.0))
    assert shares.fraction(["a", "b"], {"a": 12, "b": 12}) == pytest.approx(6 / 24)


def test_nudge_asks_the_coordinator_for_an_early_refresh() -> None:
    shares = Shares("me", 3.0, 1, Clock())
    asked: list[bool] = []
    shares.on_want = lambda: asked.append(True)
    shares.nudge()
    assert asked == [True]


def test_the_queue_predicts_at_its_share_and_at_least_an_even_split() -> None:
    clock = Clock()
    shares = Shares("me", 3.0, 1, clock)
    shares.leased("a", lease(9, until=103.0, replicas=3))
    assert shares.pace(["a"], {"a": 12}) == pytest.approx(9 / 12)
    shares.leased("a", lease(1, until=103.0, replicas=3))
    assert shares.pace(["a"], {"a": 12}) == pytest.approx(1 / 3)


def test_the_peers_releases_are_inbound_only_while_the_target_exceeds_the_grant() -> None:
    clock = Clock()
    shares = Shares("me", 3.0, 1, clock)
    assert shares.inbound(URL) == 0  # no lease yet
    shares.leased(URL, Lease(2, 8, 103.0, 2, 0, 6, False, {"me": 2, "peer": 6}, target=5))
    assert shares.inbound(URL) == 6
    shares.leased(URL, Lease(5, 8, 103.0, 2, 0, 3, False, {"me": 5, "peer": 3}, target=5))
    assert shares.inbound(URL) == 0  # at its target: its own releases are its turnover
    shares.leased(URL, Lease(2, 8, 103.0, 2, 0, 6, False, {"me": 2, "peer": 6}, target=5))
    shares.failed(101.0)
    assert shares.inbound(URL) == 0  # in the fallback nothing comes from the peers
