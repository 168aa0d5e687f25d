"""Capacity the gateway keeps charged for requests it walked away from that the server keeps running.

A server that cannot abort a request when its connection closes (sglang-omni: the snapshot never does,
later versions not for whole answers) goes on spending its stages on a request whose client left, or whose
deadline passed. Releasing that request's slot at the disconnect would admit new work onto a server still
busy with the old: so its pool holds the release (docs/decisions/0203-cancellation-hold.md) until

- the server's counts show it finished: after a health probe, the held requests still running can be at
  most the requests the server tracks (`running_reqs`), and the held streams at most the requests no client
  waits for (`detached_reqs`, sglang-omni: a stream's handler stops waiting when its client leaves); or
- its predicted end passes.

The counts are anonymous, so which held requests finished is a guess: the ones predicted to end first. A
hold is judged by counts only on probes sent a whole tick after it began, so a probe that raced the
disconnect (the server had not yet seen the connection close) cannot end it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket


def predicted_end(ticket: Ticket, now: float, latest: float, paced: bool) -> float:
    """When the server will be done with a request the gateway left: the rest of its expected answer at its
    stream's pace so far, when the text's pace tells its end (`paced`: no stage runs on after the text, as
    a talker does); else, or when the pace is unknown (a whole answer, a stream cut before its second
    token), `latest`: its total deadline."""
    produced = ticket.usage.completion_tokens if ticket.usage is not None else 0
    first, last = ticket.first_token_at, ticket.last_token_at
    if not paced or produced < 2 or first is None or last is None or last <= first:
        return latest
    per_token = (last - first) / (produced - 1)
    remaining = max(ticket.cost.expected_output_tokens - produced, 1)
    return min(latest, now + remaining * per_token)


@dataclass(eq=False, slots=True)
class Hold:
    release: Callable[[], None]  # gives the request's budgets back (its lease's release)
    stream: bool
    since: float
    until: float  # the predicted end


@dataclass(slots=True)
class Holds:
    grace_s: float  # a probe judges a hold by counts once it was sent this long after the hold began
    _held: dict[str, list[Hold]] = field(default_factory=dict)  # backend url → its holds

    def add(self, url: str, hold: Hold) -> None:
        self._held.setdefault(url, []).append(hold)

    def count(self, url: str) -> int:
        return len(self._held.get(url, ()))

    def settle(self, state: BackendState, now: float, probed_at: float | None) -> int:
        """Release the holds on `state`'s backend that are over (see the module docstring); `probed_at`:
        when the probe that just read the counts was sent (None: it read none). Returns how many ended."""
        held = self._held.get(state.url)
        if not held:
            return 0
        held.sort(key=lambda h: h.until)
        done = {id(h) for h in held if h.until <= now}
        judged = [
            h
            for h in held
            if id(h) not in done and probed_at is not None and h.since + self.grace_s <= probed_at
        ]
        if state.running_reqs is not None:
            done.update(id(h) for h in judged[: max(0, len(judged) - state.running_reqs)])
        if state.detached_reqs is not None:
            streams = [h for h in judged if h.stream and id(h) not in done]
            done.update(id(h) for h in streams[: max(0, len(streams) - state.detached_reqs)])
        self._held[state.url] = [h for h in held if id(h) not in done]
        for h in held:
            if id(h) in done:
                h.release()
        return len(done)

    def release_all(self) -> None:
        held, self._held = self._held, {}
        for holds in held.values():
            for h in holds:
                h.release()
