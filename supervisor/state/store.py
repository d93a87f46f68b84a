"""SQLite (WAL) state store: sessions, tasks and each session's event log.

One connection, used from one dedicated thread, so no call ever blocks the event loop and
SQLite never sees two threads. Event appends are batched by the caller (group commit).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from supervisor.core.errors import StateStorageError

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    ended_at REAL,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    state TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_by_session ON tasks (session_id);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    task_id TEXT,
    data TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cursors (
    session_id TEXT NOT NULL,
    consumer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (session_id, consumer)
);
"""


class StateStore:
    """Async facade over one SQLite database file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandvisor-state")
        self._conn: sqlite3.Connection | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except sqlite3.Error as exc:
            # OperationalError (full disk, locked) and DatabaseError (a corrupt file) alike:
            # callers handle StateStorageError; anything else would end a task as "lost".
            raise StateStorageError(f"state store {self.path}: {exc}") from exc

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StateStorageError("state store is closed")
        return self._conn

    async def open(self) -> None:
        def do_open() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            conn.executescript(_SCHEMA)
            self._conn = conn

        await self._run(do_open)

    async def close(self) -> None:
        def do_close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await self._run(do_close)
        self._pool.shutdown(wait=True)

    # -- meta -----------------------------------------------------------------------

    async def get_meta(self, key: str) -> str | None:
        def q() -> str | None:
            row = self._c().execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._run(q)

    async def set_meta(self, key: str, value: str) -> None:
        await self._run(
            lambda: self._c().execute(
                "INSERT INTO meta(key, value) VALUES(?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (key, value),
            )
        )

    async def metas(self, prefix: str) -> dict[str, str]:
        """Every meta entry whose key starts with ``prefix``."""

        def q() -> dict[str, str]:
            rows = (
                self._c()
                .execute(
                    "SELECT key, value FROM meta WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)
                )
                .fetchall()
            )
            return {str(k): str(v) for k, v in rows}

        return await self._run(q)

    async def delete_meta(self, key: str) -> None:
        await self._run(lambda: self._c().execute("DELETE FROM meta WHERE key=?", (key,)))

    # -- sessions -------------------------------------------------------------------

    async def put_session(
        self, session_id: str, created_at: float, ended_at: float | None, data: str | None = None
    ) -> None:
        """Create or update a session row; ``data=None`` keeps what is stored."""
        await self._run(
            lambda: self._c().execute(
                "INSERT INTO sessions(session_id, created_at, ended_at, data) "
                "VALUES(?,?,?,COALESCE(?, '{}')) "
                "ON CONFLICT(session_id) DO UPDATE SET ended_at=excluded.ended_at, "
                "data=COALESCE(?, sessions.data)",
                (session_id, created_at, ended_at, data, data),
            )
        )

    async def set_session_data(self, session_id: str, data: str) -> None:
        await self._run(
            lambda: self._c().execute(
                "UPDATE sessions SET data=? WHERE session_id=?", (data, session_id)
            )
        )

    async def get_session(self, session_id: str) -> tuple[float, float | None, str] | None:
        def q() -> tuple[float, float | None, str] | None:
            row = (
                self._c()
                .execute(
                    "SELECT created_at, ended_at, data FROM sessions WHERE session_id=?",
                    (session_id,),
                )
                .fetchone()
            )
            return None if row is None else (row[0], row[1], row[2])

        return await self._run(q)

    async def all_sessions(self) -> list[tuple[str, float, float | None, str]]:
        """(session_id, created_at, ended_at, data) for every stored session."""

        def q() -> list[tuple[str, float, float | None, str]]:
            rows = self._c().execute(
                "SELECT session_id, created_at, ended_at, data FROM sessions ORDER BY created_at"
            )
            return [(r[0], r[1], r[2], r[3]) for r in rows]

        return await self._run(q)

    async def open_sessions(self) -> list[str]:
        def q() -> list[str]:
            rows = self._c().execute("SELECT session_id FROM sessions WHERE ended_at IS NULL")
            return [r[0] for r in rows]

        return await self._run(q)

    # -- tasks ----------------------------------------------------------------------

    async def put_task(self, task_id: str, session_id: str, state: str, data: str) -> None:
        await self._run(
            lambda: self._c().execute(
                "INSERT INTO tasks(task_id, session_id, state, data) VALUES(?,?,?,?) "
                "ON CONFLICT(task_id) DO UPDATE SET state=excluded.state, data=excluded.data",
                (task_id, session_id, state, data),
            )
        )

    async def task_exists(self, task_id: str) -> bool:
        def q() -> bool:
            row = self._c().execute("SELECT 1 FROM tasks WHERE task_id=?", (task_id,)).fetchone()
            return row is not None

        return await self._run(q)

    async def tasks(self, session_id: str | None = None) -> list[tuple[str, str, str, str]]:
        """(task_id, session_id, state, data) rows."""

        def q() -> list[tuple[str, str, str, str]]:
            if session_id is None:
                rows = self._c().execute("SELECT task_id, session_id, state, data FROM tasks")
            else:
                rows = self._c().execute(
                    "SELECT task_id, session_id, state, data FROM tasks WHERE session_id=?",
                    (session_id,),
                )
            return [(r[0], r[1], r[2], r[3]) for r in rows]

        return await self._run(q)

    # -- events ---------------------------------------------------------------------

    async def append_events(self, rows: Sequence[tuple[str, int, str, str | None, str]]) -> None:
        """Insert (session_id, seq, type, task_id, json) rows in one transaction.

        The rows travel as one JSON parameter and one statement: ``executemany`` takes the
        GIL back for every row, and while the event loop is busy each take waits a switch
        interval (5 ms), so a large batch could hold the log back for minutes."""

        def q() -> None:
            conn = self._c()
            batch = json.dumps(list(rows))
            conn.execute("BEGIN")
            try:
                conn.execute(
                    "INSERT OR IGNORE INTO events(session_id, seq, type, task_id, data) "
                    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
                    "json_extract(value, '$[2]'), json_extract(value, '$[3]'), "
                    "json_extract(value, '$[4]') FROM json_each(?)",
                    (batch,),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        await self._run(q)

    async def read_events(self, session_id: str, after_seq: int, limit: int) -> list[str]:
        def q() -> list[str]:
            rows = self._c().execute(
                "SELECT data FROM events WHERE session_id=? AND seq>? ORDER BY seq LIMIT ?",
                (session_id, after_seq, limit),
            )
            return [r[0] for r in rows]

        return await self._run(q)

    async def seq_bounds(self, session_id: str) -> tuple[int, int]:
        """(lowest, highest) seq still stored; (0, 0) when none."""

        def q() -> tuple[int, int]:
            row = (
                self._c()
                .execute("SELECT MIN(seq), MAX(seq) FROM events WHERE session_id=?", (session_id,))
                .fetchone()
            )
            return (row[0] or 0, row[1] or 0)

        return await self._run(q)

    async def prune_events(self, session_id: str, keep_last: int) -> int:
        """Keep the newest ``keep_last`` seqs; record how far events were dropped, so readers
        asking for older ones get an explicit gap. Returns how many rows were deleted."""

        def q() -> int:
            conn = self._c()
            conn.execute("BEGIN")
            try:
                row = conn.execute(
                    "SELECT MAX(seq) FROM events WHERE session_id=?", (session_id,)
                ).fetchone()
                floor = (row[0] or 0) - keep_last
                cur = conn.execute(
                    "DELETE FROM events WHERE session_id=? AND seq <= ?", (session_id, floor)
                )
                if floor > 0:
                    conn.execute(
                        "INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE "
                        "SET value=MAX(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
                        (f"seq_pruned:{session_id}", str(floor)),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return cur.rowcount

        return await self._run(q)

    async def pruned_floor(self, session_id: str) -> int:
        """Events with seq <= this were dropped by retention (0: none)."""
        value = await self.get_meta(f"seq_pruned:{session_id}")
        return int(value or 0)

    async def task_events(self, session_id: str, task_id: str, types: tuple[str, ...]) -> list[str]:
        """Stored events of one task with one of ``types``, in seq order (JSON)."""

        def q() -> list[str]:
            marks = ",".join("?" for _ in types)
            rows = self._c().execute(
                f"SELECT data FROM events WHERE session_id=? AND task_id=? AND type IN ({marks}) "  # noqa: S608 - placeholders only
                "ORDER BY seq",
                (session_id, task_id, *types),
            )
            return [r[0] for r in rows]

        return await self._run(q)

    async def get_cursor(self, session_id: str, consumer: str) -> int:
        def q() -> int:
            row = (
                self._c()
                .execute(
                    "SELECT seq FROM cursors WHERE session_id=? AND consumer=?",
                    (session_id, consumer),
                )
                .fetchone()
            )
            return 0 if row is None else int(row[0])

        return await self._run(q)

    async def set_cursor(self, session_id: str, consumer: str, seq: int) -> None:
        await self._run(
            lambda: self._c().execute(
                "INSERT INTO cursors(session_id, consumer, seq) VALUES(?,?,?) "
                "ON CONFLICT(session_id, consumer) DO UPDATE SET seq=MAX(seq, excluded.seq)",
                (session_id, consumer, seq),
            )
        )
