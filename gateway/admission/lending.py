"""Lending: another pool's whole requests running on this pool's idle backends (`budgets.lend`, off by
default), given back as soon as this pool's own requests wait for what they hold.

The offline pool borrows from the interactive one: a loan starts only while lending is enabled, none of
the lender's own requests wait, and a backend is below `lend.max_load` (the larger of active / limit and
KV occupancy / watermark) and fits the lender's budgets — the loan spends the lender's round prefill
budget (`PoolScheduler.lend`). Only whole requests are lent: a loan must be revocable, and a stream
cannot be taken back once it has started. When the lender's head request fits on no backend and a loan
holds what it lacks (`Block.reclaimable`), the newest loan there is revoked (`Loans.reclaim`): its pipeline
abandons the upstream call and queues it again in its own pool. The engine that did the work learns from
it: a loan's prefill and latency samples go to the lender's rate and limit (`PoolScheduler.settle`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from gateway.admission.blocks import Block
from gateway.admission.lease import Lease


class Loans:
    """The lender's side: the leases of another pool's requests on this pool's backends, oldest first."""

    def __init__(self) -> None:
        self._leases: list[Lease] = []

    def __len__(self) -> int:
        return len(self._leases)

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._leases)

    def add(self, lease: Lease) -> None:
        self._leases.append(lease)

    def remove(self, lease: Lease) -> None:
        self._leases.remove(lease)

    def reclaim(self, blocked: Mapping[str, Block]) -> None:
        """Our head request is `blocked` on every backend (url → reason): where a loan may hold what it
        lacks, revoke the newest loan — one at a time per backend, so each revocation is seen freed
        before the next."""
        for url, reason in blocked.items():
            if not reason.reclaimable:
                continue
            loans = [lease for lease in self._leases if lease.backend.url == url]
            if loans and not any(lease.revoked for lease in loans):
                loans[-1].revoke()
