"""How the journal checks the rows it reads: each against its hash and the one before.

What is read is what was verified. Every event a read returns is checked against
its stored hash and the stored hash of the event before it (a scan checks the
chain through the rows it reads), and a kernel that opened from a snapshot checks
the chain before it, which opening skipped, in the background
(:meth:`~kernel.journal.store.Journal.check_history`, :class:`HistoryCheck`): a read
that would return an event of that part waits for the check, and gets
:class:`~kernel.journal.errors.JournalCorrupt` naming the seq if it failed. What is
wrong with a row is said in :func:`~kernel.journal.sealing.check_row`'s words.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence

import anyio
import msgspec

from kernel.core.events import GENESIS_HASH, Event, chain, decode_body
from kernel.journal._subscription import READ_BATCH
from kernel.journal.codec import unpack
from kernel.journal.errors import JournalCorrupt
from kernel.journal.head import Row
from kernel.journal.port import EventRow
from kernel.journal.sealing import check_row
from kernel.journal.tree import leaves_of

_decoder = msgspec.json.Decoder(Event)


def checked_event(
    seq: int, body: bytes, hash_: bytes, prev: bytes, key: bytes | None, checked: bool
) -> Event | None:
    """Return event ``seq`` with its hashes if its row chains on ``prev``; None if not."""
    try:
        plain = unpack(body)
        if checked and hash_ != (
            hashlib.sha256(prev + plain).digest() if key is None else chain(prev, plain, key)
        ):
            return None
        event = decode_body(plain, prev, hash_)
    except (ValueError, TypeError):
        return None
    return event if event.seq == seq else None


def row_problem(row: Row, seq: int, prev: bytes, key: bytes | None, checked: bool) -> str:
    """Say what is wrong with a row that did not check (check_row's words)."""
    found = check_row(row, seq, prev, key, checked, with_columns=False)[0]
    return found or f"event {seq} is stored under another dfid or type than its body's"


def folded(
    rows: Sequence[EventRow], expected: int, prev: bytes, key: bytes | None, checked: bool
) -> tuple[list[Event], str]:
    """Decode consecutive rows from event ``expected`` on, checking they chain on ``prev``.

    Returns the events (without their hashes, as a fold reads them) and what is wrong
    with the next row ("" when every row checked out). The loop every replay runs: the
    words for a row that is not plainly sound come from :func:`check_row`.
    """
    events: list[Event] = []
    append, decode, sha256 = events.append, _decoder.decode, hashlib.sha256
    fast = checked and key is None
    for seq, body, hash_, _ in rows:
        try:
            if seq != expected or type(hash_) is not bytes:
                raise _Unsound
            plain = unpack(body)
            if fast:
                if hash_ != sha256(prev + plain).digest():
                    raise _Unsound
            elif checked and hash_ != chain(prev, plain, key):
                raise _Unsound
            event = decode(plain)
            if event.seq != seq:
                raise _Unsound
        except (_Unsound, ValueError, TypeError):
            return events, row_problem((seq, "", None, body, hash_), expected, prev, key, checked)
        append(event)
        expected, prev = expected + 1, hash_
    return events, ""


class _Unsound(Exception):
    """A row :func:`folded` leaves to :func:`check_row` to describe."""


def chain_through(
    rows: Sequence[Row], expected: int, prev: bytes, key: bytes | None, hashes_checked: bool
) -> tuple[str, int, bytes]:
    """Check that ``rows`` are events ``expected``.. chained on ``prev``.

    Returns what is wrong ("" if nothing), the seq it is wrong at (else the next seq)
    and the last hash. Hashes only: nothing is decoded, so it is cheap enough to run
    over a whole history in the background.
    """
    for seq, _, _, body, hash_ in rows:
        if seq != expected:
            return f"event {expected} is missing (the next row is event {seq})", expected, prev
        if not isinstance(body, bytes) or not isinstance(hash_, bytes):
            return f"event {seq} is not stored as bytes", seq, prev
        if hashes_checked:
            try:
                canonical = unpack(body)
            except (ValueError, TypeError) as exc:
                return f"event {seq} does not decode ({exc})", seq, prev
            if hash_ != chain(prev, canonical, key):
                altered = f"event {seq} does not match its hash: its body or hash was altered"
                return altered, seq, prev
        expected, prev = expected + 1, hash_
    return "", expected, prev


def storable(text: str) -> bool:
    """Whether ``text`` could be a stored dfid or type (a store cannot even be asked otherwise)."""
    if text.isascii():
        return "\x00" not in text
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def asked_for(wanted: list[str] | None) -> list[str] | None:
    """Return the types to ask the store for, to read the events of types ``wanted``."""
    if wanted is None:
        return None
    # A FlowClosed may be derived from the success it travels with, a ContextCompiled from
    # the FlowCreated of its flow, a ProposalAccepted from its submission, an
    # ExecutionStarted from the acceptance it travels with, itself a row or its
    # submission's (no row of their own): their rows are asked for too.
    extra = [
        row
        for derived, rows in _ROWS_OF.items()
        if derived in wanted
        for row in rows
        if row not in wanted
    ]
    return [*wanted, *dict.fromkeys(extra)] if extra else wanted


_ROWS_OF = {
    "FlowClosed": ("ExecutionSucceeded",),
    "ContextCompiled": ("FlowCreated",),
    "ProposalAccepted": ("ProposalSubmitted",),
    "ExecutionStarted": ("ProposalAccepted", "ProposalSubmitted"),
}


def unaskable(wanted: list[str] | None, dfid: str | None) -> bool:
    """Whether no event can match a read: no type left to ask for, or an unstorable dfid."""
    return (wanted is not None and not wanted) or (dfid is not None and not storable(dfid))


def read_rows(
    rows: Sequence[EventRow],
    dfid: str | None,
    asked: list[str] | None,
    key: bytes | None,
    checked: bool,
) -> tuple[list[Event], str, int]:
    """Decode the rows a read asked for, each checked against its hash and the one before.

    Returns the events, what is wrong with the first row that did not check ("" when
    every row checked out) and its seq.
    """
    events: list[Event] = []
    for seq, body, hash_, prev in rows:
        # Each event against its own hash and the stored hash of the one before it: an
        # edited body, a hash that was not recomputed or a missing row is refused.
        prev = GENESIS_HASH if seq == 1 else prev or b""
        event = checked_event(seq, body, hash_, prev, key, checked)
        if (
            event is None
            or (dfid is not None and event.dfid != dfid)
            or (asked is not None and event.type not in asked)
        ):
            return events, row_problem((seq, "", None, body, hash_), seq, prev, key, checked), seq
        events.append(event)
    return events, "", 0


class HistoryCheck:
    """The chain before where opening began to check it: events 1..:attr:`end`, checked once.

    :func:`kernel.state.snapshots.restore` opens a kernel from its latest trusted
    snapshot and checks only the events after it; it hands the events before it here
    (:meth:`defer`). A kernel runs :meth:`check` in the background after it opened;
    a read of one of those events waits for it.
    """

    def __init__(self) -> None:
        self.end = 0
        """The last event left unchecked (0: none, or checked)."""
        self._lock: anyio.Lock | None = None
        self._problem: JournalCorrupt | None = None

    def defer(self, last: int) -> None:
        """Leave events 1..``last`` to :meth:`check`."""
        self.end = max(self.end, last)

    async def check(
        self,
        read: Callable[[int, int, int], Awaitable[list[Row]]],
        check_open: Callable[[], None],
        corrupt: Callable[[str, int], JournalCorrupt],
        key: bytes | None,
        checked: bool,
    ) -> None:
        """Check events 1..end through ``read`` (a store's rows), once; raise what it found.

        Later calls return at once, or raise again what the first found.
        """
        if self._problem is not None:
            raise self._problem
        if not self.end:
            return
        self._lock = self._lock or anyio.Lock()
        async with self._lock:
            if self._problem is not None:
                raise self._problem
            last = self.end
            if not last:
                return
            expected, prev = 1, GENESIS_HASH
            while expected <= last:
                check_open()
                rows = await read(expected, last, READ_BATCH)
                # The hashing runs off the event loop: the kernel goes on meanwhile.
                if not rows:
                    self._problem = corrupt(f"event {expected} is missing", expected)
                    raise self._problem
                problem, expected, prev = await anyio.to_thread.run_sync(
                    chain_through, rows, expected, prev, key, checked
                )
                if problem:
                    self._problem = corrupt(problem, expected)
                    raise self._problem
            self.end = 0


def checked_page(
    rows: Sequence[Row], expected: int, prev: bytes, key: bytes | None, checked: bool
) -> tuple[list[Event], str, int, bytes]:
    """Check that ``rows`` are events ``expected``.. chained on ``prev``, and decode them.

    Returns the events, what is wrong with the first row that did not check ("" if
    none), its seq (else the next seq) and the last hash.
    """
    batch: list[Event] = []
    for row in rows:
        problem, event = check_row(row, expected, prev, key, checked)
        if event is None:
            return batch, problem, expected, prev
        batch.append(event)
        expected, prev = expected + 1, row[4]
    return batch, "", expected, prev


async def leaves_read(
    read: Callable[[int, int, int], Awaitable[list[Row]]],
    start: int,
    stop: int,
    corrupt: Callable[[str, int], JournalCorrupt],
) -> list[bytes]:
    """Return the Merkle leaves of events ``start``..``stop - 1``, read through ``read``."""
    bodies: list[bytes] = []
    while start < stop:
        rows = await read(start, stop - 1, READ_BATCH)
        if not rows or rows[0][0] != start:
            raise corrupt(f"event {start} is missing", start)
        bodies += [row[3] for row in rows]
        start = rows[-1][0] + 1
    try:
        return leaves_of(bodies)
    except (ValueError, TypeError) as exc:
        raise corrupt(f"an event does not decode ({exc})", start) from None
