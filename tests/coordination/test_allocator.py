"""The allocator script against the suite's real redis-server: the split by band, the top band's reserve,
the hold of a shrinking share, expiry of a dead replica's lease, the limit's owner, the recovery cap."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
import redis

from gateway.coordination.scripts import ALLOCATE, LEAVE

pytestmark = pytest.mark.e2e


class Allocator:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.script = client.register_script(ALLOCATE)
        self.leave_script = client.register_script(LEAVE)
        self.keys = [prefix + "b:engine", prefix + "replicas"]

    def __call__(
        self,
        replica: str,
        demand: dict[int, int] | None = None,
        *,
        active: int = 0,
        limit: int = 8,
        ttl_ms: int = 3000,
        seen: int = 1,
        returning: bool = False,
        kv: int = 0,
        reserve: tuple[int, int] = (0, 0),
        rank: float | None = None,
    ) -> dict[str, Any]:
        wanted = [[band, n] for band, n in (demand or {}).items()]
        args = [replica, ttl_ms, limit, active, kv, seen, int(returning), orjson.dumps(wanted), *reserve]
        args.append("" if rank is None else repr(rank))
        grant, engine_limit, live, peer_kv, peer_active, owner, target, peer_rank, *pairs = self.script(
            keys=self.keys, args=args
        )
        return {
            "grant": grant,
            "limit": engine_limit,
            "live": live,
            "peer_kv": peer_kv,
            "peer_active": peer_active,
            "owner": owner == 1,
            "target": target,
            "peer_rank": float(peer_rank) if peer_rank else None,
            "grants": {pairs[i].decode(): pairs[i + 1] for i in range(0, len(pairs), 2)},
        }

    def leave(self, replica: str) -> None:
        self.leave_script(keys=[self.keys[0], self.keys[1]], args=[replica])


@pytest.fixture
def allocate(redis_client: redis.Redis, redis_prefix: str) -> Allocator:
    return Allocator(redis_client, redis_prefix)


def test_alone_a_replica_gets_the_whole_limit(allocate: Allocator) -> None:
    first = allocate("a", {5: 3})
    assert (first["grant"], first["limit"], first["live"], first["owner"]) == (8, 8, 1, True)


def test_each_replica_hears_the_top_rank_its_peers_dispatched(allocate: Allocator) -> None:
    assert allocate("a", {10: 1}, rank=10.5)["peer_rank"] is None  # alone: no peer
    assert allocate("b", {0: 9}, rank=0.0)["peer_rank"] == 10.5
    assert allocate("c", {0: 9})["peer_rank"] == 10.5  # c dispatched nothing lately
    assert allocate("a", {10: 1}, rank=10.5)["peer_rank"] == 0.0  # the highest of b's and c's
    allocate("b", {0: 9}, rank=None)
    assert allocate("a", {10: 1}, rank=10.5)["peer_rank"] is None


def test_a_higher_band_on_one_replica_wins_slots_from_a_lower_band_on_another(allocate: Allocator) -> None:
    assert allocate("a", {0: 20})["grant"] == 8
    # b's high band wants 5; a's low flood still holds its 8, so b waits for a to shrink
    assert allocate("b", {10: 5})["grant"] == 0
    assert allocate("a", {0: 20}, active=8)["grant"] == 3  # the high band's 5 come first
    assert allocate("b", {10: 5})["grant"] == 0  # a may still be running its previous 8
    assert allocate("a", {0: 20}, active=3)["grant"] == 3  # drained to its share
    reply = allocate("b", {10: 5})
    assert reply["grant"] == 5
    assert reply["grants"] == {"a": 3, "b": 5}
    assert reply["peer_active"] == 3


def test_the_top_bands_reserve_is_kept_engine_wide_for_the_replica_that_serves_it(
    allocate: Allocator,
) -> None:
    # a saw top-band (10) work lately and keeps 2 of 8 for it; b's low flood claims all it may
    first = allocate("a", {10: 1}, reserve=(2, 10))
    assert (first["grant"], first["target"]) == (8, 8)
    flood = allocate("b", {0: 20})
    assert flood["target"] == 5  # 8 - a's running top request - the reserve of 2, wherever it arrives
    assert allocate("a", {10: 1}, active=1, reserve=(2, 10))["target"] == 3  # its request + the reserve
    allocate("a", {10: 1}, active=1, reserve=(2, 10))  # its grant before (8) no longer counts
    assert allocate("b", {0: 20})["grant"] == 5
    # a new top-band request on a starts at once: the reserve is a's, not stranded on b
    reply = allocate("a", {10: 2}, active=1, reserve=(2, 10))
    assert (reply["grant"], reply["grants"]) == (3, {"a": 3, "b": 5})


def test_without_a_reserve_the_lower_band_takes_everything_unclaimed(allocate: Allocator) -> None:
    allocate("a", {10: 1})
    assert allocate("b", {0: 20})["target"] == 7


def test_a_replica_owed_more_than_its_grant_learns_its_target(allocate: Allocator) -> None:
    allocate("a", {0: 20})
    allocate("a", {0: 20}, active=8)
    reply = allocate("b", {10: 5})
    assert (reply["grant"], reply["target"]) == (0, 5)  # a's 8 running are what b's slots wait for


def test_one_band_splits_max_min_fairly_by_demand(allocate: Allocator) -> None:
    allocate("a", {5: 10})
    allocate("b", {5: 2})
    allocate("a", {5: 10}, active=8)
    allocate("a", {5: 10}, active=6)
    assert allocate("b", {5: 2})["grant"] == 2
    assert allocate("a", {5: 10}, active=6)["grant"] == 6
    allocate("c", {5: 10})
    allocate("a", {5: 10}, active=6)
    allocate("a", {5: 10}, active=3)
    assert allocate("c", {5: 10})["grant"] == 3  # 2 for b, 3 each for the two heavy replicas
    assert sum(allocate("b", {5: 2})["grants"].values()) <= 8


def test_unclaimed_capacity_is_split_evenly_as_headroom(allocate: Allocator) -> None:
    allocate("a")
    allocate("b")
    assert allocate("a")["grant"] == 4
    assert allocate("b")["grant"] == 0  # a may still use its previous 8 until its next call
    allocate("a")
    assert allocate("b")["grant"] == 4


def test_a_dead_replicas_share_returns_when_its_lease_expires(allocate: Allocator) -> None:
    allocate("dead", {5: 8}, ttl_ms=300)
    assert allocate("live", {5: 8})["grant"] == 0
    time.sleep(0.35)  # the lease's own TTL, on Redis's clock: nothing to await
    reply = allocate("live", {5: 8})
    assert (reply["grant"], reply["live"], reply["owner"]) == (8, 1, True)  # share and limit taken over


def test_a_clean_leave_returns_the_share_at_once(allocate: Allocator) -> None:
    allocate("a", {5: 8})
    allocate("a", {5: 8})
    allocate("a", {5: 8}, active=8)
    assert allocate("b", {5: 8})["grant"] == 0
    allocate.leave("a")
    assert allocate("b", {5: 8})["grant"] == 8


def test_the_owner_sets_the_limit_and_the_others_follow(allocate: Allocator) -> None:
    assert allocate("a", limit=12)["owner"]
    reply = allocate("b", limit=30)
    assert (reply["limit"], reply["owner"]) == (12, False)
    assert allocate("a", limit=10)["limit"] == 10
    assert allocate("b", limit=30)["limit"] == 10


def test_a_replica_back_from_its_fallback_caps_everyone_at_one_nth_for_a_ttl(allocate: Allocator) -> None:
    allocate("a", {5: 8})
    assert allocate("a", {5: 8})["grant"] == 8
    reply = allocate("a", {5: 8}, returning=True, seen=2, ttl_ms=300)
    assert reply["grant"] == 4  # b may still hold 8 / 2 from its own fallback
    time.sleep(0.35)
    assert allocate("a", {5: 8}, ttl_ms=300)["grant"] == 8


def test_a_fresh_store_caps_at_the_replicas_last_seen(allocate: Allocator) -> None:
    assert allocate("a", {5: 8}, seen=2)["grant"] == 4  # Redis lost its data: others may hold 1/N


def test_peers_reserved_kv_is_reported(allocate: Allocator) -> None:
    allocate("a", kv=1000)
    assert allocate("b", kv=50)["peer_kv"] == 1000
