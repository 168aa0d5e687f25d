"""The one hook replicas need in admission, both ways: how much of each backend this replica may use
(`ReplicaShares`, which the scheduler asks), and what the replicas' coordinator may read from and tell a
pool (`SharedPool`, which the scheduler is).

With a shared store, a backend's budgets belong to every replica together (gateway/coordination/); the
scheduler then dispatches within `granted(url, limit)` instead of the whole limit, scales the round's
prefill budget by `fraction`, follows the limit's owner (`follows`), and `nudge`s when requests wait, so
a lease is asked for sooner. Without one (the embedded default) the scheduler holds `None` and none of
this runs. The coordinator touches a pool through `SharedPool` only, never its queue, dispatcher or
fairness state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.backends.state import BackendState


class ReplicaShares(Protocol):
    def granted(self, url: str, local_limit: int) -> int:
        """The concurrency this replica may use on `url` now."""
        ...

    def fraction(self, urls: list[str], limits: dict[str, int]) -> float:
        """This replica's part (0..1) of the pool's budgets (`limits`: the local limits by URL)."""
        ...

    def pace(self, urls: list[str], limits: dict[str, int]) -> float:
        """This replica's part (0..1) of the pool's engines for predicting its queue's waits: its share,
        at least an even split (a share lags a sudden rise of demand by a refresh or two)."""
        ...

    def inbound(self, url: str) -> int:
        """The other replicas' running requests on `url` whose releases will come to this one (its queue
        predicts its slot waits from them too)."""
        ...

    def follows(self, url: str) -> int | None:
        """The engine's limit to adopt when another replica owns it; None when this one does."""
        ...

    def nudge(self) -> None:
        """Requests wait here: refresh the leases soon."""
        ...

    def describe(self, url: str, local_limit: int) -> dict[str, Any]:
        """/admin/state: the engine's whole budget, this replica's share, every replica's share."""
        ...


@dataclass(frozen=True, slots=True)
class Fairness:
    """What one pool's fairness state changed since the last refresh, taken for the replicas' shared
    sums: the tenants' virtual token counters and their recent service (decayed to `now`)."""

    counters: dict[str, float]
    recent: dict[str, float]
    now: float
    window_s: float


class SharedPool(Protocol):
    """One pool's scheduler as the replicas' coordinator sees it. The scheduler guarantees that after
    `share`, every fairness change is kept until `take_fairness` hands it over (exactly once, unless
    `restore_fairness` gives it back), and that what it reads here changes nothing in the pool."""

    @property
    def backends(self) -> Sequence[BackendState]: ...

    def share(self, shares: ReplicaShares) -> None:
        """From now on dispatch within `shares`, and keep the fairness changes for the shared sums."""
        ...

    def local_limit(self, url: str) -> int:
        """This replica's own concurrency limit on `url` (what it proposes to the allocator)."""
        ...

    def demand(self, url: str) -> dict[int, int]:
        """Per band: the requests this pool queues plus those it runs on `url`."""
        ...

    def top_reserve(self, limit: int) -> tuple[int, int]:
        """(slots of `limit` the lower bands leave free for the top band, the top band); (0, 0): none."""
        ...

    def shield_top(self) -> float | None:
        """The top rank this pool dispatched within the shield's hold (None: none)."""
        ...

    def peers_shield(self, rank: float | None, until: float) -> None:
        """The peers' top rank within their hold (None: none), counted as seen until `until`."""
        ...

    def take_fairness(self) -> Fairness:
        """The fairness changes since the last call, for the shared sums."""
        ...

    def restore_fairness(self, taken: Fairness) -> None:
        """`taken` never reached the shared sums: keep it for the next refresh."""
        ...

    def merge_fairness(self, taken: Fairness, counters: dict[str, float], recent: dict[str, float]) -> None:
        """Adopt the shared sums (every replica's changes, `taken` included) plus this pool's since."""
        ...

    def pump(self) -> None:
        """Dispatch what the (perhaps grown) shares allow now."""
        ...
