"""One inbox row as every store gives it back, whatever a writer of the table stored."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec


class StoredRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row as stored: its id, its body's bytes, when it was posted, what took it."""

    id: int
    body: bytes
    created_ts: int = 0
    taken_seq: int | None = None


def stored_rows(found: Sequence[Sequence[object]]) -> list[StoredRow]:
    """Turn (id, body, created_ts, taken_seq) tuples into rows, whatever a writer stored.

    A body stored as text is taken as its UTF-8 bytes (what cannot be read stays the
    poller's to refuse); a timestamp or a marker that is no integer counts as absent.
    """
    rows = []
    for id_, body, created_ts, taken in found:
        if not isinstance(id_, int):
            continue
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogateescape")
        rows.append(
            StoredRow(
                id=id_,
                body=bytes(body) if isinstance(body, bytes | bytearray | memoryview) else b"",
                created_ts=created_ts if isinstance(created_ts, int) else 0,
                taken_seq=taken if isinstance(taken, int) else None,
            )
        )
    return rows
