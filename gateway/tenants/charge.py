"""What a finished request is charged: the work the engine did for it, whatever the client did.

The rule (documented in the tenants README, "What a request is charged"):
- The engine reported `usage` (a complete answer, or a stream that ended with its usage chunk): exactly that.
- The request never reached an engine (refused, cancelled while queued or before its body was sent, or
  every attempt was refused by the backend or could not connect): no tokens. It still counted as a
  request (rpm, `requests`). It reached the engine once its body was written to the engine's connection
  (gateway/proxy.py `sent`): an engine notices a closed connection only later, so it runs the prefill.
- It reached an engine and no usage came back (the client left after dispatch, the stream was cut, a 200
  without `usage`): the prompt as the gateway priced it — the prefill ran or was under way — plus the
  answer tokens relayed, counted from the answer's text by the estimator's text counter and never fewer
  than the content chunks (each carries at least one token). Each such charge is counted in
  `omnigate_usage_inferred_total{reason}`.
"""

from __future__ import annotations

from enum import StrEnum

from gateway.tenants import metrics
from gateway.ticket import Outcome, Ticket, Usage


class Inferred(StrEnum):
    """Why a charge was inferred rather than read from the engine's usage (the metric's label)."""

    CLIENT_LEFT = "client_left"  # the client disconnected after dispatch
    STREAM_CUT = "stream_cut"  # the backend's stream ended early (error event, cut, deadline)
    NO_USAGE = "no_usage"  # a complete answer without a `usage` object


_NOTHING = Usage(0, 0)


def infer(ticket: Ticket, answer_tokens: int) -> Usage:
    """The engine sent no usage for a request it ran: charge the priced prompt plus `answer_tokens`, and
    count why. Callers infer only while `ticket.usage` is None, so once per request."""
    if ticket.outcome == Outcome.OK:
        reason = Inferred.NO_USAGE
    elif ticket.outcome in (Outcome.CANCELLED, Outcome.PENDING):  # PENDING: a disconnect cut the relay
        reason = Inferred.CLIENT_LEFT
    else:
        reason = Inferred.STREAM_CUT
    usage = ticket.usage = Usage(ticket.cost.prompt_tokens, answer_tokens)
    ticket.usage_inferred = reason
    metrics.USAGE_INFERRED.labels(reason).inc()
    return usage


def billable(ticket: Ticket) -> Usage:
    """The usage a finished request is charged (the rule above); infers it for a request cancelled after
    dispatch before any byte came back."""
    if ticket.usage is not None:
        return ticket.usage
    return infer(ticket, 0) if ticket.reached_engine else _NOTHING
