"""Which backend a request goes to among those it fits on now (`budgets.placement`).

- `first_token` (default): the backend where its first token is predicted soonest. What delays it there is
  the prefill queued ahead of it — the prompt tokens sent there whose prefill has not started (shield.py's
  `unstarted`) — and its own prefill: its prompt less the prefix that backend is expected to hold cached
  (gateway/backends/prefix_index.py). Both run at the same per-backend prefill rate, so the tokens compare
  as the times would: a warm backend wins until the prefill queued there outweighs what its cache saves.
  Ties (nothing cached anywhere, nothing queued) go to the least outstanding tokens.
- `least_tokens`: the least outstanding estimated tokens (then fewest active, then URL).
- `cache_aware`: sgl-model-gateway's rule: the least loaded backend (fewest requests) when the loads are
  imbalanced (max − min over `balance_abs_threshold` and max over `balance_rel_threshold` × min), else the
  backend holding the longest cached prefix if it covers more than `cache_threshold` of the prompt, else
  the least loaded.
- `sticky`: a conversation goes back to the backend it last went to while it fits there, whatever the
  policy would choose; the policy chooses its first backend and any after its own stops fitting.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from gateway.admission.settings import PlacementPolicy
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket

MAX_SESSIONS = 1 << 16  # conversations whose backend a sticky pool remembers, least recently placed forgotten


def least_tokens(backend: BackendState) -> tuple[int, int, str]:
    return backend.outstanding_tokens, backend.active, backend.url


class Placement:
    """One pool's placement rule and its sticky sessions."""

    def __init__(self) -> None:
        self.sessions: OrderedDict[bytes, str] = OrderedDict()  # session → the backend it last went to

    def choose(
        self,
        ticket: Ticket,
        fitting: Sequence[BackendState],
        policy: PlacementPolicy,
        unstarted: Callable[[str], int],
    ) -> BackendState:
        """The backend of `fitting` (not empty) `ticket` goes to; `unstarted(url)`: the prompt tokens sent to
        a backend whose prefill has not started."""
        session = ticket.prefix.session if ticket.prefix is not None else None
        if policy.sticky and session is not None:
            url = self.sessions.get(session)
            for b in fitting:
                if b.url == url:
                    return b
        if policy.policy == "least_tokens" or ticket.prefix is None:
            return min(fitting, key=least_tokens)
        key = ticket.prefix
        if policy.policy == "cache_aware":
            return _cache_aware(fitting, [b.prefix.match(key) for b in fitting], key.tokens, policy)
        prompt = ticket.cost.prompt_tokens
        return min(fitting, key=lambda b: (unstarted(b.url) + prompt - b.prefix.match(key), *least_tokens(b)))

    def placed(self, ticket: Ticket, backend: BackendState) -> None:
        """`ticket` went to `backend`: its conversation goes back there next (when sticky)."""
        session = ticket.prefix.session if ticket.prefix is not None else None
        if session is None:
            return
        self.sessions[session] = backend.url
        self.sessions.move_to_end(session)
        if len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)


def _cache_aware(
    fitting: Sequence[BackendState], matched: Sequence[int], prompt: int, policy: PlacementPolicy
) -> BackendState:
    loads = [b.active for b in fitting]
    least = min(fitting, key=lambda b: (b.active, b.url))
    high, low = max(loads), min(loads)
    if high - low > policy.balance_abs_threshold and high > policy.balance_rel_threshold * low:
        return least
    best = max(range(len(fitting)), key=lambda i: (matched[i], -fitting[i].active))
    if prompt and matched[best] / prompt > policy.cache_threshold:
        return fitting[best]
    return least
