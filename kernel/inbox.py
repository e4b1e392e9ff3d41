"""The operator inbox: human decisions reach a running kernel through its journal's file.

``dirk decide`` (another process, maybe on a day the kernel is down) inserts a
row into ``operator_inbox`` with plain sqlite3; the kernel polls the table on
its clock and turns each new row into a Decide message. The operator needs no
server, and nothing is lost if either side restarts: a row stays until the
kernel has recorded what it made of it, and that record (HumanDecided,
DecisionRefused, LimitAmended, AmendmentRefused, AgentStatusChanged or
RuleDecided naming the row's id) is what makes the row count exactly once,
however often it is read.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import msgspec

from kernel.actors import Mailbox, Reply
from kernel.amendments import AmendLimit
from kernel.escalation import Decide, Decision, Tick
from kernel.journal import INBOX_SCHEMA
from kernel.ports import Clock
from kernel.projection import Projections

log = logging.getLogger("kernel.inbox")

BUSY_TIMEOUT_S = 10.0
"""How long either side waits for the other's write lock on the shared file."""


class InboxRow(msgspec.Struct, frozen=True, kw_only=True):
    """One human decision as the operator wrote it."""

    id: int
    dfid: str
    decision: dict[str, Any]
    created_ts: int
    taken_seq: int | None = None


def connect(path: str) -> sqlite3.Connection:
    """Open the journal file for inbox use, creating the inbox table if an old journal lacks it."""
    # Used from anyio worker threads, one call at a time (the poller holds a limiter of 1).
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.executescript(INBOX_SCHEMA)
    return conn


def queued_dfids(path: str) -> set[str]:
    """Return the DFIDs with a decision the kernel has not taken yet (reads only)."""
    uri = Path(path).absolute().as_uri() + "?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)) as conn:
        try:
            rows = conn.execute("SELECT dfid FROM operator_inbox WHERE taken_seq IS NULL")
        except sqlite3.OperationalError:
            return set()  # a journal no kernel of this version opened yet: no inbox
        return {dfid for (dfid,) in rows}


def post(path: str, dfid: str, decision: Mapping[str, Any], now_ns: int) -> int:
    """Write one decision into the inbox of the journal at ``path``; return its row id."""
    with closing(connect(path)) as conn:
        cursor = conn.execute(
            "INSERT INTO operator_inbox (dfid, decision, created_ts) VALUES (?, ?, ?)",
            (dfid, json.dumps(dict(decision), sort_keys=True), now_ns),
        )
        return int(cursor.lastrowid or 0)


def read_rows(conn: sqlite3.Connection, *, pending: bool = True) -> list[InboxRow]:
    """Return the inbox rows (only those not yet taken, when ``pending``), oldest first."""
    sql = "SELECT id, dfid, decision, created_ts, taken_seq FROM operator_inbox"
    if pending:
        sql += " WHERE taken_seq IS NULL"
    rows = []
    for id_, dfid, decision, created_ts, taken_seq in conn.execute(sql + " ORDER BY id"):
        try:
            body = json.loads(decision)
        except ValueError:
            body = {}
        rows.append(
            InboxRow(
                id=id_,
                dfid=dfid,
                decision=body if isinstance(body, dict) else {},
                created_ts=created_ts,
                taken_seq=taken_seq,
            )
        )
    return rows


def mark_taken(conn: sqlite3.Connection, row_id: int, seq: int) -> None:
    """Record on the row that the event at ``seq`` took it (-1: unreadable, never applied)."""
    conn.execute("UPDATE operator_inbox SET taken_seq = ? WHERE id = ?", (seq, row_id))


AMEND = "amend"
"""The ``type`` of an inbox row that amends a limit (``dirk amend``) rather than decides a flow."""
AGENT_STATUS = "agent_status"
"""The ``type`` of a row that changes an agent's status (``dirk agent``)."""
RULE = "rule"
"""The ``type`` of a row that overrides or skips a deferred rule proposal (``dirk rules``)."""
DECIDE = "decide"
"""The ``type`` of a decision on an escalated flow (rows without a type are decisions too)."""


def row_type(row: InboxRow) -> str:
    """What a row asks for: DECIDE, AMEND, AGENT_STATUS or RULE (or something unknown)."""
    return str(row.decision.get("type") or DECIDE)


def to_amend(row: InboxRow, reply: Reply[Any]) -> AmendLimit:
    """Turn an amendment row into the message the DIM handles (it checks every field)."""
    body = row.decision
    return AmendLimit(
        agent_id=str(body.get("agent_id", "")),
        limit=str(body.get("limit", "")),
        value=body.get("value"),
        ttl_s=body.get("ttl_s"),
        operator=str(body.get("operator", "")),
        reason=str(body.get("reason", "")),
        inbox_id=row.id,
        reply=reply,
    )


def to_decide(row: InboxRow, reply: Reply[Any]) -> Decide:
    """Turn an inbox row into the message the escalation manager handles.

    Raises:
        ValueError: when the row is not a decision (written by something else than dirk).
    """
    body = row.decision
    params = body.get("params")
    action_hash = body.get("action_hash")
    return Decide(
        dfid=row.dfid,
        decision=Decision(str(body.get("decision", ""))),
        operator=str(body.get("operator", "")),
        reason=str(body.get("reason", "")),
        params=params if isinstance(params, dict) else None,
        action_hash=str(action_hash) if action_hash else None,
        inbox_id=row.id,
        reply=reply,
    )


Handler = Callable[[InboxRow], Awaitable[None]]
"""Applies one row of its type; the event it records names the row's id."""


async def poll(
    path: str,
    clock: Clock,
    interval_s: float,
    escalation: Mailbox[Any],
    projections: Projections,
    handlers: Mapping[str, Handler],
) -> None:
    """Tick the escalation manager and apply new inbox rows, every ``interval_s`` on ``clock``.

    ``handlers`` apply the rows of each type (see :func:`row_type`).

    A failed round (the file busy beyond the timeout, say) is logged and tried
    again on the next one: the rows wait in the table meanwhile.
    """
    limiter = anyio.CapacityLimiter(1)
    conn = await anyio.to_thread.run_sync(connect, path, limiter=limiter)
    try:
        while True:
            await escalation.send(Tick())
            try:
                rows = await anyio.to_thread.run_sync(read_rows, conn, limiter=limiter)
                for row in rows:
                    seq = await _apply(row, projections, handlers)
                    await anyio.to_thread.run_sync(mark_taken, conn, row.id, seq, limiter=limiter)
            except sqlite3.Error as exc:
                log.warning("operator inbox of %s: %r; trying again", path, exc)
            await clock.sleep(interval_s)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(conn.close, limiter=limiter)


async def _apply(row: InboxRow, projections: Projections, handlers: Mapping[str, Handler]) -> int:
    """Apply one row through the handler of its type; return the seq of the event that took it.

    -1 marks a row that nothing took (an unknown type, or a refusal with no record).
    """
    taken = projections.inbox_taken.get(row.id)
    if taken is not None:
        return taken  # taken before a restart, and not marked yet: never applied twice
    handler = handlers.get(row_type(row))
    if handler is None:
        log.warning("operator inbox row %d asks for %r; left unapplied", row.id, row_type(row))
        return -1
    try:
        await handler(row)
    except ValueError as exc:
        log.warning("operator inbox row %d is malformed (%s); left unapplied", row.id, exc)
    return projections.inbox_taken.get(row.id, -1)
