"""Embedded store: tenants, key hashes and the usage ledger in one SQLite file; rate counters in memory.

Durability: the database runs in WAL mode and every change is one short transaction committed before the
call returns. Admin changes (tenants, keys) commit with synchronous=FULL, which fsyncs the WAL: they
survive power loss. Ledger writes (two per request) commit with synchronous=NORMAL: in WAL mode a commit
is then written to the WAL file but fsynced only at checkpoints, so it survives the process being killed
(kill -9: the OS still holds the pages) and can lose only the last few ledger entries on an OS crash —
the usual trade for not paying an fsync per request. Per-minute buckets and concurrency counts live in
memory: they reset on restart, which only forgives at most one minute of rate.

All SQL runs on one connection in a worker thread so the event loop never waits on the disk. A ledger
write waits at most `LEDGER_BUSY_MS` for a lock another process holds; a locked or failing file raises
StoreUnavailable (the service's failure mode applies, failed reconciles go to the outbox). A first
reconcile either commits or leaves nothing; a replay from the outbox commits its reservation id in
`applied` (kept two days) with its ledger change, so a replay repeated after a crash charges nothing twice.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from gateway.tenants.memory_store import MemoryStore
from gateway.tenants.models import KeyRecord, Quotas, TenantSpec
from gateway.tenants.quota import Charge, Denial, LedgerRow, day_of, month_of
from gateway.tenants.store import StoreUnavailable

T = TypeVar("T")
LEDGER_BUSY_MS = 1000
ADMIN_BUSY_MS = 10000
APPLIED_KEPT_S = 2 * 86400

SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (id TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash TEXT PRIMARY KEY, id TEXT NOT NULL, tenant_id TEXT NOT NULL, record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS api_keys_tenant ON api_keys (tenant_id);
CREATE TABLE IF NOT EXISTS applied (reservation_id TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    tenant_id TEXT NOT NULL, day TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    requests INTEGER NOT NULL DEFAULT 0, audio_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
) WITHOUT ROWID;
"""
# a ledger written before audio was counted gains the column (its rows count no audio)
AUDIO_COLUMN = "ALTER TABLE ledger ADD COLUMN audio_ms INTEGER NOT NULL DEFAULT 0"
LEDGER_UPSERT = """
INSERT INTO ledger (tenant_id, day, input_tokens, output_tokens, requests, audio_ms) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant_id, day) DO UPDATE SET input_tokens = input_tokens + excluded.input_tokens,
    output_tokens = output_tokens + excluded.output_tokens, requests = requests + excluded.requests,
    audio_ms = audio_ms + excluded.audio_ms
"""
LEDGER_SUMS = (
    "COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), COALESCE(SUM(requests), 0),"
    " COALESCE(SUM(audio_ms), 0)"
)


class SQLiteStore(MemoryStore):
    """Writes go to the file first, then to the in-memory copy the request path reads."""

    kind = "sqlite"

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._loaded: set[tuple[str, str]] = set()
        self._owed: set[str] = set()  # reservations settled in memory whose ledger write failed

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SCHEMA)
        if "audio_ms" not in {row[1] for row in conn.execute("PRAGMA table_info(ledger)")}:
            conn.execute(AUDIO_COLUMN)
        conn.execute("DELETE FROM applied WHERE at < ?", (time.time() - APPLIED_KEPT_S,))
        self._conn = conn
        for (spec,) in conn.execute("SELECT spec FROM tenants"):
            tenant = TenantSpec.model_validate_json(spec)
            self.tenants[tenant.id] = tenant
        for (record,) in conn.execute("SELECT record FROM api_keys"):
            key = KeyRecord.model_validate_json(record)
            self.keys[key.key_hash] = key

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with self._lock:
                conn.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise RuntimeError("SQLiteStore used before start()")

        def call() -> T:
            with self._lock:
                return fn(conn)

        return await anyio.to_thread.run_sync(call)

    async def _write(self, statements: list[tuple[str, tuple[Any, ...]]], durable: bool) -> None:
        await self._transaction(statements, durable)

    async def _transaction(
        self,
        statements: list[tuple[str, tuple[Any, ...]]],
        durable: bool,
        once: tuple[str, float] | None = None,
    ) -> bool:
        """Run the statements in one transaction. With `once` (reservation id, wall time: marks are pruned
        by it), only if that id was never applied: False when it was (nothing written)."""

        def tx(conn: sqlite3.Connection) -> bool:
            conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            conn.execute(f"PRAGMA busy_timeout={ADMIN_BUSY_MS if durable else LEDGER_BUSY_MS}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                if once is not None:
                    conn.execute("INSERT OR IGNORE INTO applied (reservation_id, at) VALUES (?, ?)", once)
                    if conn.execute("SELECT changes()").fetchone()[0] == 0:
                        conn.execute("ROLLBACK")
                        return False
                for sql, args in statements:
                    conn.execute(sql, args)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return True

        try:
            return await self._run(tx)
        except sqlite3.OperationalError as e:  # locked, disk full, I/O error: the file cannot take it now
            raise StoreUnavailable(f"sqlite: {e}") from None

    async def create_tenant(self, spec: TenantSpec) -> bool:
        if spec.id in self.tenants:
            return False
        try:
            await self._write(
                [("INSERT INTO tenants (id, spec) VALUES (?, ?)", (spec.id, spec.model_dump_json()))], True
            )
        except sqlite3.IntegrityError:  # a concurrent create of the same id won
            return False
        return await super().create_tenant(spec)

    async def update_tenant(self, spec: TenantSpec) -> bool:
        if spec.id not in self.tenants:
            return False
        await self._write(
            [("UPDATE tenants SET spec = ? WHERE id = ?", (spec.model_dump_json(), spec.id))], True
        )
        return await super().update_tenant(spec)

    async def delete_tenant(self, tenant_id: str) -> bool:
        if tenant_id not in self.tenants:
            return False
        await self._write(
            [
                ("DELETE FROM tenants WHERE id = ?", (tenant_id,)),
                ("DELETE FROM api_keys WHERE tenant_id = ?", (tenant_id,)),
            ],
            True,
        )
        return await super().delete_tenant(tenant_id)

    async def _put_key(self, record: KeyRecord) -> None:
        sql = "INSERT OR REPLACE INTO api_keys (key_hash, id, tenant_id, record) VALUES (?, ?, ?, ?)"
        await self._write(
            [(sql, (record.key_hash, record.id, record.tenant_id, record.model_dump_json()))], True
        )

    async def add_key(self, record: KeyRecord) -> None:
        await self._put_key(record)
        await super().add_key(record)

    async def revoke_key(self, tenant_id: str, key_id: str, now: float) -> KeyRecord | None:
        record = self._find_key(tenant_id, key_id)
        if record is None or record.revoked:
            return record
        revoked = record.model_copy(update={"revoked_at": now})
        await self._put_key(revoked)
        self.keys[revoked.key_hash] = revoked
        return revoked

    async def _load_periods(self, tenant_id: str, now: float) -> None:
        """Bring today's and this month's ledger totals into memory once, for budget checks."""
        day, month = day_of(now), month_of(now)
        if (tenant_id, day) in self._loaded and (tenant_id, month) in self._loaded:
            return

        def read(conn: sqlite3.Connection) -> tuple[tuple[int, ...], tuple[int, ...]]:
            row = conn.execute(
                "SELECT input_tokens, output_tokens, requests, audio_ms FROM ledger"
                " WHERE tenant_id = ? AND day = ?",
                (tenant_id, day),
            ).fetchone()
            total = conn.execute(
                f"SELECT {LEDGER_SUMS} FROM ledger WHERE tenant_id = ? AND day LIKE ?",
                (tenant_id, month + "-%"),
            ).fetchone()
            return row or (0, 0, 0, 0), total

        day_row, month_row = await self._run(read)
        # Another task may have loaded (and already changed) the rows while we read: its copy wins.
        for period, book, values in ((day, self.book.days, day_row), (month, self.book.months, month_row)):
            if (tenant_id, period) not in self._loaded:
                self._loaded.add((tenant_id, period))
                book[(tenant_id, period)] = LedgerRow(*values)

    async def reserve(
        self, tenant_id: str, quotas: Quotas, charge: Charge, now: float, reservation_id: str
    ) -> Denial | None:
        await self._load_periods(tenant_id, now)
        denial = self.book.try_reserve(tenant_id, quotas, charge, now)
        if denial is None:
            row = (tenant_id, day_of(now), charge.input_tokens, charge.output_tokens, 1, charge.audio_ms)
            try:
                await self._write([(LEDGER_UPSERT, row)], False)
            except BaseException:
                self.book.settle(tenant_id, quotas, charge, Charge(), now, now)
                self.book.record(tenant_id, now, 0, 0, -1)
                raise
        return denial

    async def settle(
        self,
        tenant_id: str,
        quotas: Quotas,
        reserved: Charge,
        actual: Charge,
        reserved_at: float,
        now: float,
        reservation_id: str,
        replay: bool = False,
    ) -> None:
        if reservation_id not in self._owed:  # a retry: the memory part was done the first time
            await self._load_periods(tenant_id, reserved_at)
            self.book.settle(tenant_id, quotas, reserved, actual, reserved_at, now)
        delta_in = actual.input_tokens - reserved.input_tokens
        delta_out = actual.output_tokens - reserved.output_tokens
        delta_audio = actual.audio_ms - reserved.audio_ms
        if not (delta_in or delta_out or delta_audio):
            self._owed.discard(reservation_id)
            return
        self._owed.add(reservation_id)
        row = (tenant_id, day_of(reserved_at), delta_in, delta_out, 0, delta_audio)
        await self._transaction(
            [(LEDGER_UPSERT, row)], False, (reservation_id, time.time()) if replay else None
        )
        self._owed.discard(reservation_id)

    async def record_usage(
        self,
        tenant_id: str,
        quotas: Quotas,
        reserved: Charge,
        usage: Charge,
        ts: float,
        now: float,
        reservation_id: str,
        requests: int = 1,
    ) -> None:
        await self._load_periods(tenant_id, ts)
        row = (tenant_id, day_of(ts), usage.input_tokens, usage.output_tokens, requests, usage.audio_ms)
        if await self._transaction([(LEDGER_UPSERT, row)], False, (reservation_id, time.time())):
            self.book.record(tenant_id, ts, usage.input_tokens, usage.output_tokens, requests, usage.audio_ms)

    async def ledger(
        self, tenant_id: str, days: list[str], month: str
    ) -> tuple[dict[str, LedgerRow], LedgerRow]:
        def read(conn: sqlite3.Connection) -> tuple[dict[str, LedgerRow], LedgerRow]:
            marks = ",".join("?" * len(days))
            rows = conn.execute(
                "SELECT day, input_tokens, output_tokens, requests, audio_ms FROM ledger"
                f" WHERE tenant_id = ? AND day IN ({marks})",
                (tenant_id, *days),
            ).fetchall()
            total = conn.execute(
                f"SELECT {LEDGER_SUMS} FROM ledger WHERE tenant_id = ? AND day LIKE ?",
                (tenant_id, month + "-%"),
            ).fetchone()
            return {d: LedgerRow(*values) for d, *values in rows}, LedgerRow(*total)

        return await self._run(read)
