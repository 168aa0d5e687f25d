"""The ledger's outbox: charges the store could not take yet, kept until they are applied.

A reconcile that fails (a SQLite lock or full disk, Redis down or answering an error) and the usage a
replica admitted under its local limits while the shared store was down (fail-open) are written here and
retried by `TenantService.run_outbox` until the store takes them. Every entry is keyed by its reservation
id and the store applies each id once (it keeps a mark per applied id), so a retry of an entry that was in
fact applied, or a replay by a restarted process or by another replica sharing the file, charges nothing
twice.

Entries live in memory and, when a path is given, in a small SQLite file of their own — not the store's
file, whose lock must not block them — committed with synchronous=FULL before `put` returns. If that file
cannot be written either (a full disk), the entry stays in memory and is retried all the same.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import anyio.to_thread
import orjson

from gateway.tenants import metrics
from gateway.tenants.models import Quotas
from gateway.tenants.quota import Charge

log = logging.getLogger("omnigate.tenants.outbox")

SCHEMA = "CREATE TABLE IF NOT EXISTS outbox (reservation_id TEXT PRIMARY KEY, entry TEXT NOT NULL)"


@dataclass(frozen=True, slots=True)
class Entry:
    """One charge owed to the store. `settle`: a reconcile of a reservation the store holds; `usage`: what
    a fail-open admission used, for the store's day/month ledger; `release`: a request refused after its
    reserve was sent and not answered, which takes that reserve back should it have landed."""

    kind: Literal["settle", "usage", "release"]
    reservation_id: str
    tenant_id: str
    quotas: Quotas
    reserved: Charge
    actual: Charge
    reserved_at: float
    now: float

    def dumps(self) -> str:
        data = asdict(self)
        data["quotas"] = self.quotas.model_dump()
        return orjson.dumps(data).decode()

    @classmethod
    def loads(cls, raw: str) -> Entry:
        data = orjson.loads(raw)
        return cls(
            kind=data["kind"],
            reservation_id=data["reservation_id"],
            tenant_id=data["tenant_id"],
            quotas=Quotas.model_validate(data["quotas"]),
            reserved=Charge(**data["reserved"]),
            actual=Charge(**data["actual"]),
            reserved_at=data["reserved_at"],
            now=data["now"],
        )


class Outbox:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.pending: dict[str, Entry] = {}
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def open(self) -> None:
        """Open the file and load what an earlier process left in it."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(SCHEMA)
        self._conn = conn
        for (raw,) in conn.execute("SELECT entry FROM outbox"):
            entry = Entry.loads(raw)
            self.pending[entry.reservation_id] = entry
        if self.pending:
            log.warning("ledger outbox: %d charges left by an earlier run; replaying", len(self.pending))
        metrics.OUTBOX_PENDING.set(len(self.pending))

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with self._lock:
                conn.close()

    async def _run(self, sql: str, args: tuple[str, ...]) -> None:
        conn = self._conn
        if conn is None:
            return

        def call() -> None:
            with self._lock:
                conn.execute(sql, args)

        try:
            await anyio.to_thread.run_sync(call)
        except sqlite3.Error as e:
            metrics.OUTBOX_EVENTS.labels("file_error").inc()
            log.error("ledger outbox file %s: %s (entries kept in memory)", self.path, e)

    async def put(self, entry: Entry) -> None:
        self.pending[entry.reservation_id] = entry
        metrics.OUTBOX_EVENTS.labels("queued").inc()
        metrics.OUTBOX_PENDING.set(len(self.pending))
        sql = "INSERT OR REPLACE INTO outbox (reservation_id, entry) VALUES (?, ?)"
        await self._run(sql, (entry.reservation_id, entry.dumps()))

    async def done(self, entry: Entry) -> None:
        self.pending.pop(entry.reservation_id, None)
        metrics.OUTBOX_EVENTS.labels("applied").inc()
        metrics.OUTBOX_PENDING.set(len(self.pending))
        await self._run("DELETE FROM outbox WHERE reservation_id = ?", (entry.reservation_id,))
