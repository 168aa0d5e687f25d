"""The one hook replicas need in admission: how much of each backend this replica may use.

With a shared store, a backend's budgets belong to every replica together (gateway/coordination/); the
scheduler then dispatches within `granted(url, limit)` instead of the whole limit, scales the round's
prefill budget by `fraction`, follows the limit's owner (`follows`), and `nudge`s when requests wait, so
a lease is asked for sooner. Without one (the embedded default) the scheduler holds `None` and none of
this runs.
"""

from __future__ import annotations

from typing import Any, Protocol


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
