"""Dispatch rounds and prefill metering: how many prompt tokens a pool may send a backend, and when.

A round is the period (`budgets.round_s`) over which a backend's prefill budget
(`prefill_tokens_per_round`) is metered: prompt tokens released to it in the current round + the request's
prompt ≤ the budget, except that a request larger than the whole budget may go alone into an empty round.
The budget is metered per engine priority: a request counts only the prefill released at its engine
priority and above (standing.py), the part the engine runs before it.

Adaptive metering (`prefill_rate_fraction`): a round's budget per backend is
min(prefill_tokens_per_round, fraction × the measured prefill rate × round_s) — the engine's own pace, so
the gateway's order rather than the engine's FIFO decides whose prefill runs next; what a round released
beyond its budget is carried into the next rounds (less one budget per round elapsed), so the budget
meters the engine's rate even for prompts larger than one round's budget.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.admission.blocks import Block
from gateway.admission.decision import Decision
from gateway.admission.families import Ask
from gateway.admission.settings import PoolBudgets
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket


def metered_tokens(budgets: PoolBudgets, rate: float) -> int | None:
    """The round's prefill budget at the measured per-backend `rate` (tokens/s) under adaptive metering,
    at least one token; None when the configured budget holds (metering off, or the rate allows it)."""
    fraction = budgets.prefill_rate_fraction
    if fraction is None:
        return None
    metered = int(fraction * rate * budgets.round_s)
    return None if metered >= budgets.prefill_tokens_per_round else max(1, metered)


class BudgetCopy:
    """The pool's budgets with another round budget, copied once per change: a pydantic copy per
    decision was a tenth of the admission path's CPU."""

    def __init__(self) -> None:
        self._copy: tuple[PoolBudgets, int, PoolBudgets] | None = None  # (budgets, tokens, their copy)

    def with_tokens(self, budgets: PoolBudgets, tokens: int, *, keep: bool = True) -> PoolBudgets:
        """`budgets` with `tokens` as the round's prefill budget; `keep=False` for reads (/admin/state)
        leaves the held copy as it is."""
        if tokens == budgets.prefill_tokens_per_round:
            return budgets
        held = self._copy
        if held is not None and held[0] is budgets and held[1] == tokens:
            return held[2]
        copy = budgets.model_copy(update={"prefill_tokens_per_round": tokens})
        if keep:
            self._copy = (budgets, tokens, copy)
        return copy


class Metering(BudgetCopy):
    """The pool's budgets with the metered round budget."""

    def budgets(self, budgets: PoolBudgets, rate: float, *, keep: bool = True) -> PoolBudgets:
        """`budgets` with the round's budget metered at `rate` (see `BudgetCopy.with_tokens`)."""
        tokens = metered_tokens(budgets, rate)
        return budgets if tokens is None else self.with_tokens(budgets, tokens, keep=keep)


class Rounds:
    """The current round of one pool: when it opened, and the prefill it released per backend and engine
    priority. The round's prefill family, a `Budget` (families.py) that frees itself: the next round has
    its budget unspent."""

    lasting = False

    def __init__(self) -> None:
        self.started: float | None = None
        self.prefill: dict[str, dict[int, int]] = {}  # backend → engine priority → tokens
        self.dispatched: dict[int, int] = {}  # band → dispatches this round

    def is_open(self, now: float, budgets: PoolBudgets) -> bool:
        return self.started is not None and now < self.started + budgets.round_s

    def ends(self, budgets: PoolBudgets) -> float | None:
        return None if self.started is None else self.started + budgets.round_s

    def open(self, now: float, budgets: PoolBudgets | None = None) -> None:
        """Start a round. With `budgets`, a backend's prefill released beyond what the rounds since the
        last one opened allowed is carried in as already released."""
        self.prefill = self._carry(now, budgets) if budgets is not None else {}
        self.started = now
        self.dispatched = {}

    def _carry(self, now: float, budgets: PoolBudgets) -> dict[str, dict[int, int]]:
        """Per backend and engine priority, the prefill the last round released that the time since it
        opened (one budget per `round_s`) has not paid off: a 4000-token prompt under a 1000-token budget
        spends 4 rounds. The engine works from its highest priority down, so that is what is paid first.
        Only under adaptive metering, where a budget is the engine's measured pace and the carry is the
        time the engine needs for what it was sent; a fixed budget is a burst size (big prompts go alone)."""
        if self.started is None or budgets.prefill_rate_fraction is None:
            return {}
        paid = budgets.prefill_tokens_per_round * (now - self.started) / budgets.round_s
        paid = round(paid, 6)  # clock arithmetic (1000.1 - 1000.0) must not shift a whole token
        carried: dict[str, dict[int, int]] = {}
        for url, levels in self.prefill.items():
            left = paid
            for prio in sorted(levels, reverse=True):
                if levels[prio] > left:
                    carried.setdefault(url, {})[prio] = math.ceil(levels[prio] - left)
                left = max(0.0, left - levels[prio])
        return carried

    def view(self, now: float, budgets: PoolBudgets) -> dict[str, Any]:
        """The round as `/admin/state` shows it."""
        return {
            "open": self.is_open(now, budgets),
            "age_s": None if self.started is None else now - self.started,
            "dispatched_by_priority": {str(band): n for band, n in sorted(self.dispatched.items())},
        }

    def released(self, url: str, min_priority: float = -math.inf) -> int:
        """Prefill tokens the round released (or carried) to `url` at engine priority ≥ `min_priority`."""
        return sum(n for prio, n in self.prefill.get(url, {}).items() if prio >= min_priority)

    def over_budget(self, url: str, engine_priority: int, prompt_tokens: int, budgets: PoolBudgets) -> bool:
        """Would `prompt_tokens` at `engine_priority` exceed the round's budget on `url` (never alone)?"""
        released = self.released(url, engine_priority)
        return bool(released) and released + prompt_tokens > budgets.prefill_tokens_per_round

    def miss(self, ask: Ask, backend: BackendState, ctx: Decision) -> Block | None:
        """The round's prefill budget on `backend` at the request's engine priority (a round opened now,
        `ask.new_round`, has it unspent)."""
        tokens = ask.prefill(backend)
        if not ask.new_round and self.over_budget(backend.url, ask.engine_priority, tokens, ctx.budgets):
            return Block.ROUND_PREFILL
        return None

    def commit(self, ask: Ask, backend: BackendState, ctx: Decision) -> None:
        """A dispatch spends the round's budget; only the pool's own (not a loan) counts as its band's."""
        self.spend(backend.url, ask.engine_priority, ask.ticket.cost.prefill_tokens)
        if not ask.loan:
            self.dispatched[ask.ticket.priority] = self.dispatched.get(ask.ticket.priority, 0) + 1

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """Nothing to give back: what a round released is spent, and the next round starts afresh."""

    def spend(self, url: str, engine_priority: int, prompt_tokens: int) -> None:
        """A dispatch to `url` (also a loan: it spends the lender's budget)."""
        levels = self.prefill.setdefault(url, {})
        levels[engine_priority] = levels.get(engine_priority, 0) + prompt_tokens
