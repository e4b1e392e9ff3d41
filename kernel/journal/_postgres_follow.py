"""The PostgreSQL store's connections outside its writer: following appends, checkpoints."""

from __future__ import annotations

from typing import Any

import psycopg

from kernel.journal._postgres_connect import connect, pg_error

CHANNEL = "dirk_journal"
"""The channel each append notifies, with the new head seq as payload."""
# The Merkle tree's stored subtrees and the signed checkpoints (kernel.journal.tree).
TREE_SCHEMA = """
CREATE TABLE IF NOT EXISTS tree_nodes (
    level SMALLINT NOT NULL, idx BIGINT NOT NULL, hash BYTEA NOT NULL, PRIMARY KEY (level, idx)
);
CREATE TABLE IF NOT EXISTS tree_heads (size BIGINT PRIMARY KEY, note TEXT NOT NULL);
"""


def listen(location: str) -> psycopg.Connection[Any]:
    """Open a connection that LISTENs on the journal's channel (for a follower)."""
    conn = connect(location)
    try:
        conn.execute(f"LISTEN {CHANNEL}")
    except psycopg.Error as exc:
        conn.close()
        raise pg_error(location, exc) from None
    return conn


def notified(conn: psycopg.Connection[Any], location: str, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for an append's notification on ``conn``; True if one came."""
    try:
        for _ in conn.notifies(timeout=timeout_s, stop_after=1):
            return True
    except psycopg.Error as exc:
        raise pg_error(location, exc) from None
    return False


def add_tree_head(location: str, size: int, note: str) -> None:
    """Keep a signed checkpoint beside the journal's events, from outside its writer.

    Only ``tree_heads`` is written (never an event, never the head row), so a running
    writer and its lease are not disturbed; a size already kept gets the new signature
    lines added.

    Raises:
        JournalError: the database cannot be written.
        NoteError: ``note`` signs another checkpoint than the one kept for ``size``.
    """
    from kernel.core.notes import merge

    conn = connect(location)
    try:
        conn.execute(TREE_SCHEMA)
        with conn.transaction():
            row = conn.execute(
                "SELECT note FROM tree_heads WHERE size = %s FOR UPDATE", (size,)
            ).fetchone()
            merged = note if row is None else merge(str(row[0]), note)
            conn.execute(
                "INSERT INTO tree_heads (size, note) VALUES (%s, %s)"
                " ON CONFLICT (size) DO UPDATE SET note = excluded.note",
                (size, merged),
            )
    except psycopg.Error as exc:
        raise pg_error(location, exc) from None
    finally:
        conn.close()
