"""The prefill shield family: the shield and duty spacing (`budgets.shield`).

An engine forms each prefill batch from the top of its waiting queue down, as far as its token budget
goes, so a light tenant's 100-token prompt that overtakes the heavy tenant's queued prompts still waits
for them: they run in its batch. Ranks are standing.py's (band, plus a half under the tenant's share).

- Shield: while a higher-ranked request was dispatched in the pool within `hold_s`, a lower-ranked one
  goes to a backend only if the lower-ranked prompts there whose prefill has not started (`pending`: a
  stream until its first byte, a whole request for its predicted prefill time) stay within `tokens` with
  it, or none wait.
- Duty spacing: what remains is the step already in flight, which no engine preempts; so a lower-ranked
  prompt too big for the shield (it goes alone) is spaced — after one goes to a backend, the next waits
  there for the first one's predicted prefill divided by `duty`. That bounds how often a higher-ranked
  arrival meets such a step in flight, and how long the higher-ranked streams decoding there stall.
The traffic the shield protects (the top rank seen within `hold_s`, with a lower rank seen too) goes to
the backend where the fewest prompt tokens wait for their prefill (dispatch.py). Loans are neither spaced
nor space the lender's own prompts: they run only below the lender's `max_load` and are given back as
soon as its own requests wait (decision 0105).

Replicas sharing the engines (gateway/coordination/) tell each other the top rank they dispatched within
`hold_s` (`own_top`); the peers' highest counts here as a rank seen until their lease ends (`peers`), so a
replica that only ever sees a flood still shields and spaces it for the higher-ranked stream a peer
serves on the same engine.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from gateway.admission.blocks import Block
from gateway.admission.decision import Decision
from gateway.admission.families import Ask
from gateway.admission.settings import ShieldPolicy
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket

"""The placement refusals a first byte or a predicted prefill end may lift."""


class Pending(NamedTuple):
    """A prompt sent to a backend whose prefill has not started (as far as the gateway can tell)."""

    ticket: Ticket
    rank: float
    tokens: int
    due: float  # a whole request's predicted prefill end; inf for a stream (until its first byte)


class Shield:
    """The prompts not yet started per backend, the ranks recently dispatched, and the spaced turns: a
    `Budget` and a `FirstByte` listener (families.py) that frees itself as prefills start and time passes."""

    lasting = False

    def __init__(self) -> None:
        # url → id(ticket) (client request ids may repeat) → its prompt not started there
        self.pending: dict[str, dict[int, Pending]] = {}
        self.rank_seen: dict[float, float] = {}  # rank → when our own request of that rank last went
        # url → id(ticket) → when the next big lower-ranked prompt may go there after it (`spaced`)
        self.spacing: dict[str, dict[int, float]] = {}
        self.held = False  # a placement was refused by the shield since `rearm` (a first byte may free it)
        self.peer_top: tuple[float, float] = (-math.inf, -math.inf)  # (the peers' top rank, good until)

    def miss(self, ask: Ask, backend: BackendState, ctx: Decision) -> Block | None:
        """The shield, then the spacing (a loan is never spaced)."""
        tokens, url, shield = ask.prefill(backend), backend.url, ctx.budgets.shield
        if self.shielded(tokens, ask.rank, url, shield, ctx.now):
            return Block.PREFILL_SHIELD
        if not ask.loan and self.spaced(tokens, ask.rank, url, shield, ctx.now):
            return Block.SHIELD_DUTY
        return None

    def commit(self, ask: Ask, backend: BackendState, ctx: Decision) -> None:
        self.sent(
            ask.ticket,
            ask.rank,
            backend.url,
            shield=ctx.budgets.shield,
            prefill_rate=ctx.prefill_rate,
            now=ctx.now,
            loan=ask.loan,
        )

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """An ended request's prompt waits for no prefill any more."""
        self.started(ticket, backend.url, now)

    def rearm(self) -> None:
        """A new dispatch pass begins: forget that the last one was held by the shield."""
        self.held = False

    def shielded(self, tokens: int, rank: float, url: str, shield: ShieldPolicy, now: float) -> bool:
        """Would a prompt of `tokens` at `rank` load the prefill batch of a higher-ranked request: the
        shield is up (a higher rank went within `hold_s`), the lower-ranked prompts not yet started on
        `url` plus its own exceed `shield.tokens`, and it would not be alone there (higher-ranked prompts
        waiting for their batch count too: it would join theirs)?"""
        if shield.tokens is None:
            return False
        top = self._top_rank(shield, now)
        if rank >= top:
            return False
        riders = self.unstarted(url, now, below=top) + tokens
        return riders > shield.tokens and self.unstarted(url, now) > 0

    def spaced(self, tokens: int, rank: float, url: str, shield: ShieldPolicy, now: float) -> bool:
        """Is this a lower-ranked prompt too big for the shield whose spaced turn on `url` has not come
        (`shield.duty`: the last such prompt sent there, predicted prefill / duty ago)?"""
        spacing = self.spacing.get(url, {}).values()  # mostly empty: no scan of the ranks then
        return any(until > now for until in spacing) and self._lone(tokens, rank, shield, now)

    def _lone(self, tokens: int, rank: float, shield: ShieldPolicy, now: float) -> bool:
        """Is a prompt of `tokens` at `rank` spaced by `shield.duty`: below the top rank seen within
        `hold_s`, above `shield.tokens` (one that goes alone)?"""
        if shield.duty is None or shield.tokens is None or tokens <= shield.tokens:
            return False
        return rank < self._top_rank(shield, now)

    def _recent_ranks(self, shield: ShieldPolicy, now: float) -> list[float]:
        """The ranks our own requests were dispatched at within `shield.hold_s`, and the peers' top rank
        while their last report holds."""
        ranks = [r for r, at in self.rank_seen.items() if now - at <= shield.hold_s]
        rank, until = self.peer_top
        return [*ranks, rank] if now < until else ranks

    def own_top(self, shield: ShieldPolicy, now: float) -> float | None:
        """The highest rank our own requests were dispatched at within `shield.hold_s` (None: none): what
        this replica tells its peers."""
        return max((r for r, at in self.rank_seen.items() if now - at <= shield.hold_s), default=None)

    def above_peers(self, shield: ShieldPolicy, now: float) -> bool:
        """Is our top rank within `shield.hold_s` above the peers' last reported one? Then the engines run
        our prompts before any of theirs (engine priority), as if we were the only replica."""
        own = self.own_top(shield, now)
        rank, until = self.peer_top
        return own is not None and now < until and own > rank

    def peers(self, rank: float | None, until: float) -> None:
        """The peers' top rank within their `hold_s` (None: none), counted as seen until `until`."""
        self.peer_top = (-math.inf, -math.inf) if rank is None else (rank, until)

    def _top_rank(self, shield: ShieldPolicy, now: float) -> float:
        """The highest rank dispatched within `shield.hold_s` (-inf: none)."""
        return max(self._recent_ranks(shield, now), default=-math.inf)

    def on_top(self, rank: float, shield: ShieldPolicy, now: float) -> bool:
        """Is `rank` the traffic the shield protects: at or above the top rank seen within hold_s, with a
        lower rank seen too?"""
        recent = self._recent_ranks(shield, now)
        return any(r < rank for r in recent) and rank >= max(recent)

    def unstarted(self, url: str, now: float, below: float = math.inf) -> int:
        """Prompt tokens sent to `url` at a rank below `below` whose prefill has not started by `now`."""
        return sum(p.tokens for p in self.pending.get(url, {}).values() if p.rank < below and p.due > now)

    def started(self, ticket: Ticket, url: str, now: float) -> None:
        """`ticket`'s prefill on `url` is done (its first byte came): it no longer rides in a new batch."""
        self.pending.get(url, {}).pop(id(ticket), None)

    def next_due(self, now: float) -> float:
        """When the next whole request's predicted prefill ends or a big lower-ranked prompt's spaced
        turn comes (a shield may fall then); inf: none."""
        dues = [p.due for waiting in self.pending.values() for p in waiting.values()]
        dues += [until for spaced in self.spacing.values() for until in spaced.values()]
        return min((t for t in dues if t > now), default=math.inf)

    def sent(
        self,
        ticket: Ticket,
        rank: float,
        url: str,
        *,
        shield: ShieldPolicy | None,
        prefill_rate: float,
        now: float,
        loan: bool,
    ) -> None:
        """A dispatch to `url`. `shield`: a big lower-ranked prompt of our own starts the backend's
        spacing. A loan neither is spaced nor counts as our rank. What it adds there is its prompt less
        the prefix expected cached on `url`."""
        tokens = ticket.cost.prefill_tokens
        if shield is not None and not loan and self._lone(tokens, rank, shield, now):
            assert shield.duty is not None  # _lone
            spaced = self.spacing.setdefault(url, {})
            for key in [key for key, until in spaced.items() if until <= now]:
                del spaced[key]
            spaced[id(ticket)] = now + tokens / prefill_rate / shield.duty
        # a stream's prefill ends with its first byte (`started`); a whole request's only by prediction
        due = math.inf if ticket.stream else now + tokens / prefill_rate
        self.pending.setdefault(url, {})[id(ticket)] = Pending(ticket, rank, tokens, due)
        if not loan:
            self.rank_seen[rank] = now
