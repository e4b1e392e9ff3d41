"""Sealing and checking rows: what makes an event a journal row, the same in every store.

:func:`seal` numbers, stamps and chains a caller's drafts into rows (seq, type,
dfid, canonical body, hash); :func:`check_row` is its inverse, used when a
journal is opened, followed, verified or copied. Neither touches a database,
so a row sealed for SQLite and one sealed for PostgreSQL are the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec

from kernel.core.events import Draft, Event, canonical, chain, decode_body, event_type, stamp
from kernel.journal.codec import unpack
from kernel.journal.head import Row


class EventUnreadable(ValueError):
    """An event refused before it was written: it has no canonical bytes (text that is not
    UTF-8, an object JSON cannot hold), or they do not decode back to it."""


def seal(
    drafts: Sequence[Draft], seq: int, prev: bytes, ts: int, key: bytes | None = None
) -> tuple[list[Row], list[Event]]:
    """Number, stamp and chain one caller's drafts after event ``seq``, whose hash is ``prev``.

    A negative ``caused_by`` (-k: the event k places before, in this append) becomes a seq
    here. With a chain ``key`` each hash is an HMAC (see :func:`kernel.core.events.chain`).
    """
    rows: list[Row] = []
    events: list[Event] = []
    prev_hex = prev.hex()
    for position, draft in enumerate(drafts):
        seq += 1
        # A cause that is not an integer at all is the event's own fault: the round-trip
        # check refuses it below, rather than a comparison failing here with a TypeError.
        if isinstance(draft.caused_by, int) and draft.caused_by < 0:
            if -draft.caused_by > position:
                raise ValueError(f"caused_by={draft.caused_by} reaches outside its append")
            draft = msgspec.structs.replace(draft, caused_by=seq + draft.caused_by)
        event = stamp(draft, seq, ts)
        try:
            body = canonical(event)
        except (TypeError, ValueError, OverflowError) as exc:
            # A lone surrogate (UnicodeEncodeError), an object JSON has no form for, an
            # integer past 64 bits: refused as the event's own fault, never the journal's.
            name = event_type(draft.payload)
            raise EventUnreadable(f"{name} cannot be written: {exc}") from None
        _check_round_trip(event, body)
        hash_ = chain(prev, body, key)
        hash_hex = hash_.hex()
        rows.append((seq, event_type(draft.payload), draft.dfid, body, hash_))
        events.append(msgspec.structs.replace(event, prev_hash=prev_hex, hash=hash_hex))
        prev, prev_hex = hash_, hash_hex
    return rows, events


def _check_round_trip(event: Event, body: bytes) -> None:
    """Refuse an event whose stored bytes would not read back as the same event.

    JSON writes ``nan`` as ``null`` and a tuple as a list; msgpack, which hashes the
    projections and stores snapshots, cannot hold an integer outside 64 bits. Any of
    these would leave a journal the next open cannot read, so the append fails instead
    (only its own caller: see ``Journal._commit``).

    Raises:
        EventUnreadable: the event does not survive encode, decode, compare.
    """
    try:
        back = _round_trip_decoder.decode(body)
        _msgpack_probe.encode(event.payload)
    except (msgspec.DecodeError, OverflowError, TypeError, ValueError) as exc:
        raise EventUnreadable(f"{event_type(event.payload)} would not read back: {exc}") from None
    if back != event:
        raise EventUnreadable(
            f"{event_type(event.payload)} would read back as another event"
            " (a non-finite float, a tuple or another type JSON does not keep)"
        )


_round_trip_decoder = _decoder = msgspec.json.Decoder(Event)
_msgpack_probe = msgspec.msgpack.Encoder()


def check_row(
    row: Any,
    expected_seq: int,
    prev: bytes,
    key: bytes | None,
    hashes_checked: bool,
    with_hashes: bool = True,
    with_columns: bool = True,
) -> tuple[str, Event | None]:
    """Return ("", the event) if the row is event ``expected_seq`` chained to ``prev``,
    else (what is wrong, None).

    ``with_hashes`` False leaves the event's ``prev_hash`` and ``hash`` empty (a check
    that only needs to know the row is sound skips writing them out in hex);
    ``with_columns`` False skips comparing the type and dfid columns with the body (a
    read that did not fetch them compares what it asked for itself).
    """
    seq, type_, dfid, body, hash_ = row
    if seq != expected_seq:
        if seq > expected_seq:
            return f"event {expected_seq} is missing (the next row is event {seq})", None
        return f"unexpected row with seq {seq}", None
    if not isinstance(body, bytes) or not isinstance(hash_, bytes):
        return f"event {seq} is not stored as bytes", None
    try:
        # The stored body may be compressed; the hash is over the canonical bytes.
        body = unpack(body)
        event = decode_body(body, prev, hash_) if with_hashes else _decoder.decode(body)
    except (ValueError, TypeError) as exc:
        # msgspec.DecodeError, or UnicodeDecodeError for bytes that are not UTF-8.
        return f"event {seq} does not decode ({exc})", None
    if event.seq != seq:
        return f"event {seq} records seq {event.seq} in its body", None
    if hashes_checked and hash_ != chain(prev, body, key):
        return f"event {seq} does not match its hash: its body or hash was altered", None
    if with_columns and (type_ != event.type or dfid != event.dfid):
        return f"event {seq} has type or dfid columns that differ from its body", None
    return "", event


def check_rows(
    rows: Sequence[Any],
    expected_seq: int,
    prev: bytes,
    key: bytes | None,
    hashes_checked: bool,
    leaves: list[bytes] | None = None,
) -> tuple[list[Event], str]:
    """Check consecutive rows from event ``expected_seq`` on, chained to ``prev``.

    Returns:
        The events of the rows that checked out, in order, without their chain hashes
        (``prev_hash`` and ``hash`` empty), and what is wrong with the next row ("" when
        every row checked out).

    The same checks as :func:`check_row` row by row, in a loop that replay and verify
    run for every event: a row that is not plainly sound is handed to
    :func:`check_row`, which says what is wrong with it, so both give one verdict.
    ``leaves``, when given, gets each checked event's Merkle leaf hash (RFC 9162's
    ``SHA-256(0x00 || canonical bytes)``), hashed here from the body inflated once for both.
    """
    events: list[Event] = []
    append = events.append
    decode = _decoder.decode
    sha256 = hashlib.sha256
    fast_hash = hashes_checked and key is None
    for row in rows:
        seq, type_, dfid, body, hash_ = row
        try:
            if seq != expected_seq or type(body) is not bytes or type(hash_) is not bytes:
                raise _Unsound
            body = unpack(body)
            event = decode(body)
            if (
                event.seq != seq
                or (
                    hash_ != sha256(prev + body).digest()
                    if fast_hash
                    else hashes_checked and hash_ != chain(prev, body, key)
                )
                or type_ != type(event.payload).__name__
                or dfid != event.dfid
            ):
                raise _Unsound
        except (_Unsound, ValueError, TypeError):
            problem, event_ = check_row(row, expected_seq, prev, key, hashes_checked, False)
            if event_ is None:
                return events, problem
            event = event_
            body = unpack(row[3])
        append(event)
        if leaves is not None:
            leaves.append(sha256(b"\x00" + body).digest())
        expected_seq, prev = expected_seq + 1, hash_
    return events, ""


class _Unsound(Exception):
    """A row :func:`check_rows` leaves to :func:`check_row` to judge."""
