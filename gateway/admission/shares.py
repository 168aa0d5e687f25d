"""The one hook replicas need in admission: how much of each backend this replica may use.

With a shared store, a backend's budgets belong to every replica together (gateway/coordination/); the
scheduler then dispatches within `granted(url, limit)` instead of the whole limit, scales the round's
prefill budget by `fraction`, follows the limit's owner (`follows`), and `nudge`s when requests wait, so
a lease is asked for sooner. Without one (the embedded default) the scheduler holds `None` and none of
this runs.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.admission.settings import PoolBudgets


class ReplicaShares(Protocol):
    def granted(self, url: str, local_limit: int) -> int:
        """The concurrency this replica may use on `url` now."""
        ...

    def fraction(self, urls: list[str], limits: dict[str, int]) -> float:
        """This replica's part (0..1) of the pool's budgets (`limits`: the local limits by URL)."""
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


class SharedBudgets:
    """The pool's budgets with the round's prefill budget scaled to this replica's part of the engines,
    copied once per change (as `rounds.Metering` does: a pydantic copy per decision is too dear)."""

    def __init__(self) -> None:
        self._copy: tuple[PoolBudgets, int, PoolBudgets] | None = None  # (budgets, tokens, their copy)

    def scaled(self, budgets: PoolBudgets, fraction: float, *, keep: bool = True) -> PoolBudgets:
        tokens = max(1, int(budgets.prefill_tokens_per_round * fraction))
        if tokens == budgets.prefill_tokens_per_round:
            return budgets
        held = self._copy
        if held is not None and held[0] is budgets and held[1] == tokens:
            return held[2]
        copy = budgets.model_copy(update={"prefill_tokens_per_round": tokens})
        if keep:
            self._copy = (budgets, tokens, copy)
        return copy
