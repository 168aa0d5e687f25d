"""A reconcile is never lost: what the store cannot take goes to the outbox and is replayed until applied,
once per reservation, across restarts; measuring never waits on it. SQLite on real files (a unit test:
no sockets); Redis on a redis-server of our own (e2e module: tests/tenants/test_outbox_redis.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.observability.metrics import REGISTRY
from gateway.request.ticket import Ending, Outcome, Ticket, Usage
from gateway.stages.finish import Finish
from gateway.tenants.models import Quotas, TenantCreate
from gateway.tenants.outbox import Entry, Outbox
from gateway.tenants.quota import Charge
from gateway.tenants.service import Reservation, TenantService
from gateway.tenants.sqlite_store import SQLiteStore
from tests.tenants.conftest import FakeClock


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _service(tmp_path: Path, clock: FakeClock) -> TenantService:
    db = tmp_path / "tenants.sqlite3"
    service = TenantService(SQLiteStore(db), clock=clock, outbox=Outbox(str(db) + ".outbox"))
    await service.start()
    return service


async def _today(service: TenantService) -> tuple[int, int, int, float]:
    report = (await service.usage("acme", days=1))["today"]
    return report["input_tokens"], report["output_tokens"], report["requests"], report["audio_seconds"]


async def test_a_locked_sqlite_file_loses_no_charge(tmp_path: Path, clock: FakeClock) -> None:
    service = await _service(tmp_path, clock)
    await service.create_tenant(TenantCreate.model_validate({"id": "acme", "quotas": {"total_tpm": 10_000}}))
    tenant = service.resolve(await service.get_tenant("acme"))
    res = await service.reserve(tenant, 100, 50, audio_seconds=4.0)
    other = sqlite3.connect(tmp_path / "tenants.sqlite3", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the file
    await service.reconcile(res, 120, 10, audio_seconds=6.5)  # waits out the busy timeout, keeps the charge
    assert list(service.outbox.pending) == [res.id]
    assert await _today(service) == (100, 50, 1, 4.0)  # the ledger still holds the estimate
    assert await service.replay_outbox() == 0  # still locked: nothing applied, nothing dropped
    other.execute("COMMIT")
    assert await service.replay_outbox() == 1
    assert not service.outbox.pending
    assert await _today(service) == (120, 10, 1, 6.5)
    assert (await service.usage("acme"))["concurrent"]["active"] == 0  # the slot was freed at once
    other.close()
    await service.close()


async def test_a_replay_is_applied_once_across_restarts(tmp_path: Path, clock: FakeClock) -> None:
    """A process that replayed a charge and died before crossing it off replays it again on restart: the
    store's mark makes the second replay a no-op."""
    service = await _service(tmp_path, clock)
    await service.create_tenant(TenantCreate.model_validate({"id": "acme"}))
    tenant = service.resolve(await service.get_tenant("acme"))
    res = await service.reserve(tenant, 100, 50)
    entry = Entry("settle", res.id, "acme", Quotas(), res.charge, Charge(90, 20, 1250), clock(), clock())
    await service.outbox.put(entry)  # as a failed reconcile leaves it
    res.settled = True
    await service.close()

    service = await _service(tmp_path, clock)  # a new process: the entry is read back from the file
    assert list(service.outbox.pending) == [res.id]
    assert await service.replay_outbox() == 1
    assert await _today(service) == (90, 20, 1, 1.25)
    await service.outbox.put(entry)  # applied, but the process died before the outbox row went
    await service.close()

    service = await _service(tmp_path, clock)
    assert await service.replay_outbox() == 1  # crossed off ...
    assert await _today(service) == (90, 20, 1, 1.25)  # ... without charging it twice
    await service.close()


class _Failing:
    """A tenant service whose reconcile fails, to show that measuring does not depend on it."""

    async def reconcile(self, *args: object) -> None:
        raise RuntimeError("disk full")


async def test_measuring_never_depends_on_the_reconcile() -> None:
    measured: list[str] = []

    def measure(ticket: Ticket, status: int, error: str | None) -> None:
        measured.append(ticket.id)

    finish = Finish(_Failing(), measure, clock=lambda: 5.0)  # type: ignore[arg-type]
    ticket = Ticket(id="r1", model="m", stream=False, arrival=0.0)
    ticket.usage = Usage(3, 4)
    reservation = Reservation("x", None, None, 0.0)  # type: ignore[arg-type]
    await finish(ticket, Ending(), reservation, 200, None)
    assert measured == ["r1"] and ticket.outcome == Outcome.OK


async def test_an_outbox_file_that_cannot_be_written_keeps_entries_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    outbox = Outbox(path)
    await outbox.open()
    assert outbox._conn is not None
    outbox._conn.execute("PRAGMA query_only=ON")  # every write now fails, as on a full disk
    entry = Entry("usage", "r1", "acme", Quotas(), Charge(1, 1), Charge(1, 1), 0.0, 0.0)
    await outbox.put(entry)
    assert list(outbox.pending) == ["r1"]
    assert counter("omnigate_ledger_outbox_total", event="file_error") >= 1
    await outbox.close()
