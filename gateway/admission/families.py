"""The contracts of admission's families: what placement asks of each, and what each must guarantee.

A pool's dispatcher (dispatch.py) holds its families in one declared order and calls none of them by
name to place, account or release a request: it asks every `Budget` whether the request misses it, tells
every `Tally` (budgets included) of a dispatch and of its end, and every `FirstByte` listener of a first
byte. A new mechanism is a new member of the list that keeps these promises; the dispatcher's head-of-line
rule, lending's reclaim and the shield's memory read the `Block` it answers with (blocks.py), never its
name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.admission.blocks import Block
from gateway.admission.decision import Decision
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket


@dataclass(frozen=True, slots=True)
class Ask:
    """One request as placement weighs it in one decision: its rank and engine priority as they stand
    now (standing.py), and how it is asked about."""

    ticket: Ticket
    rank: float
    engine_priority: int
    loan: bool = False  # another pool's request on this pool's backends (lending.py)
    new_round: bool = False  # judged as a round opened now would judge it: the round's budget unspent

    def prefill(self, backend: BackendState) -> int:
        """The prompt tokens `backend` would prefill for it: the prompt less the prefix it is expected to
        hold cached (gateway/backends/prefix_index.py). A commit settles it as `cost.prefill_tokens`."""
        return self.ticket.cost.prompt_tokens - backend.prefix.match(self.ticket.prefix)


class Tally(Protocol):
    """Keeps what a pool's dispatches hold, or learns from them. An implementation guarantees:
    - `commit` and `release` of one ticket on one backend come in pairs (the dispatcher calls `release`
      exactly once per `commit`, on the pool that owns the backend, a loan's included), and `release` ends
      what that `commit` began: what the family holds for the request goes back, what it learned stays;
    - neither raises, and neither reads another family's state: the dispatcher may call them in any
      order, so its declared order is one of placement only."""

    def commit(self, ask: Ask, backend: BackendState, ctx: Decision) -> None:
        """`ask.ticket` was dispatched to `backend` under `ctx`."""
        ...

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """The dispatch of `ticket` to `backend` ended at `now`, however it ended."""
        ...


class Budget(Tally, Protocol):
    """A budget a request must fit to be placed on a backend. On top of a `Tally`'s, it guarantees:
    - `miss` is a read: it changes nothing, and gives the same answer for the same state and decision
      (`/admin/state` and the queue's predictions ask it as often as placement does);
    - it answers with its own `Block` members only; their properties, not the budget, say whether the
      requests behind may pass and whether a loan may be holding what it lacks;
    - `lasting` True: only releases free what commits took, and once every dispatch is released it
      refuses exactly what it refused before they came (slots, a stage, the backend's KV). False: it
      frees itself in time instead (the round's prefill at the next round, the shield as prefills start
      and spaced turns come), and reclaiming loans and predicting a slot's wait leave it out."""

    lasting: bool

    def miss(self, ask: Ask, backend: BackendState, ctx: Decision) -> Block | None:
        """Why `ask.ticket` may not go to `backend` now by this budget; None when it fits."""
        ...


class FirstByte(Protocol):
    """Learns that a dispatched request's prefill is done (its first byte came). Guarantees: a call for
    a ticket it does not hold, or a second call, changes nothing."""

    def started(self, ticket: Ticket, url: str, now: float) -> None: ...
