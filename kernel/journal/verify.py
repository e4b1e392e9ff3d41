"""Verify a journal's hash chain from genesis on, without trusting anything in the file.

``dirk verify`` runs this first, then replays the projections
(:func:`kernel.state.snapshots.verify_projections`). It opens its own read-only
connection (to a SQLite file or a ``postgresql://`` URL: the same chain gives the
same head hash in either) and never raises for a bad file: whatever is wrong is reported
with the seq of the first bad event. Beyond the chain it checks the head
record (a removed tail) and, when given one, an anchor: a line naming an
event the journal must still hold, kept somewhere the journal's writer
cannot reach (see docs/integrity.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, cast

import msgspec

from kernel.core.events import (
    GENESIS_HASH,
    Event,
    KernelStarted,
    KernelStopped,
    with_derived,
)
from kernel.core.notes import NoteError, parse_checkpoint, split_note
from kernel.journal._helper import decoded, helped, helps, request
from kernel.journal._subscription import READ_BATCH
from kernel.journal.errors import JournalError, chain_key_from_env
from kernel.journal.head import KEYED_CHAIN, Row, head_problem, key_problem, parse_head
from kernel.journal.port import Snapshot, backend_for
from kernel.journal.sealing import check_rows
from kernel.journal.tree import TREE_MARK, Node, TiledTree

_HEAD_EVENTS = frozenset({KernelStarted, KernelStopped})
_Head = KernelStarted | KernelStopped
_ANCHOR = re.compile(
    r"dirk-anchor v1 journal=(?P<journal>\S+) seq=(?P<seq>[0-9]{1,19})"
    r" hash=(?P<hash>[0-9a-f]{64}) ts=(?P<ts>\S+)"
)


class Anchor(msgspec.Struct, frozen=True, kw_only=True):
    """An event a journal must still hold: its journal, seq, hash and time.

    Its :meth:`line` is what ``dirk anchor`` prints, for a user to keep where
    whoever can write the journal cannot reach.
    """

    journal_id: str
    seq: int
    hash: str
    ts: str

    def line(self) -> str:
        """Return the one-line form ``dirk verify --anchor`` takes."""
        return (
            f"dirk-anchor v1 journal={self.journal_id} seq={self.seq} hash={self.hash} ts={self.ts}"
        )


def parse_anchor(text: str) -> Anchor:
    """Return the anchor in ``text``: its line, or the contents of a file holding it.

    Raises:
        ValueError: No line of ``text`` is an anchor.
    """
    for line in text.splitlines():
        match = _ANCHOR.fullmatch(line.strip())
        if match:
            return Anchor(
                journal_id=match["journal"],
                seq=int(match["seq"]),
                hash=match["hash"],
                ts=match["ts"],
            )
    raise ValueError("not an anchor: expected 'dirk-anchor v1 journal=ID seq=N hash=HEX ts=TIME'")


def anchor_time(ts_ns: int) -> str:
    """Return an event's time as the anchor writes it (UTC, to the nanosecond)."""
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    try:
        moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return f"{ts_ns}ns"
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ns:09d}Z"


class VerifyReport(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of :func:`verify_journal`.

    Attributes:
        ok: True if every event checked out (and the head record and anchor, if any).
        events: Events that checked out (all of them when ``ok``).
        head: Hex hash of the last event that checked out.
        first_bad_seq: Seq of the first bad or missing event; None when ok or
            when the problem is with the file rather than a row.
        problem: What is wrong, empty when ok.
        journal_id: The journal's id (empty if the file is not a journal).
        head_ts: Time of the last event that checked out, in ns (0: none).
        head_record: False for a journal written before head records existed
            (it verifies, but a removed tail cannot be told from it alone).
        keyed: True if the chain is keyed and was checked with its key.
        tree_root: Hex Merkle root of the events that checked out (kernel.core.merkle).
        tree_stored: False for a journal whose store keeps no tree yet (from before trees).
        tree_heads: The signed checkpoints stored beside the events, as (size, note); each
            one's root was checked against the events (its signatures need public keys:
            kernel.proofs).
    """

    ok: bool
    events: int
    head: str
    first_bad_seq: int | None = None
    problem: str = ""
    journal_id: str = ""
    head_ts: int = 0
    head_record: bool = True
    keyed: bool = False
    tree_root: str = ""
    tree_stored: bool = True
    tree_heads: list[tuple[int, str]] = []
    chain_checked: bool = True
    """False for a keyed journal verified without its key (``public_only``)."""

    def anchor(self) -> Anchor:
        """Return the anchor of the head this report verified."""
        return Anchor(
            journal_id=self.journal_id,
            seq=self.events,
            hash=self.head,
            ts=anchor_time(self.head_ts),
        )


async def verify_journal(
    path: str | os.PathLike[str],
    *,
    chain_key: bytes | None = None,
    anchor: Anchor | None = None,
    fold: Callable[[list[Event]], Awaitable[object]] | None = None,
    public_only: bool = False,
) -> VerifyReport:
    """Check every event of the journal at ``path`` from genesis on; never raise for a bad file.

    Recomputes each hash (an HMAC under ``chain_key`` for a keyed journal),
    checks seqs run 1..N without gaps, that each body decodes to its own seq,
    type and DecisionFlow, that the last event is the one the head record
    names, and that the journal still holds the event ``anchor`` names.

    ``chain_key`` defaults to ``DIRK_CHAIN_KEY``, as for ``open_kernel`` and ``dirk``:
    a journal a kernel keyed from the environment verifies with the same environment.

    ``public_only`` verifies a keyed journal without its chain key: its HMACs go
    unchecked, and what vouches for the events is the Merkle tree recomputed from them,
    which the caller checks against checkpoints signed with the kernel's key
    (kernel.proofs.check): a public key, which cannot forge, instead of the chain key.

    ``fold`` is handed each batch of events that checked out, in order, before the
    next is read (``dirk verify`` folds the projections from them: each event is read
    and decoded once). Their ``prev_hash`` and ``hash`` are left empty: the hashes were
    checked here, and a fold needs neither. A bad event ends the batches before it; the
    report says where.
    """
    path = os.fspath(path)
    walk = _Walk(anchor)
    try:
        # One read transaction: rows and head record as of one moment, even while a
        # kernel appends.
        async with backend_for(path).open_snapshot(path) as db:
            meta = await db.meta()
            if meta is None:
                return walk.report("an empty database, not a journal")
            walk.journal_id = meta["journal_id"]
            if chain_key is None:
                chain_key = chain_key_from_env(None, path)
            problem = await walk.begin(db, meta, chain_key, public_only)
            if problem:
                return walk.report(problem)
            failed = await walk.rows(db, fold, _helper(path, meta, walk))
            if failed is not None:
                return failed
            tree_problem = await _tree_problem(db, walk.tree.nodes) if walk.tree_stored else ""
    except JournalError as exc:
        return walk.report(exc.detail, exc.seq)
    except (ValueError, TypeError) as exc:
        # Bytes that passed the checks above and still do not decode: reported, never raised.
        bad = walk.events + 1 if walk.journal_id else None
        return walk.report(f"the journal does not read back ({exc})", bad)
    return walk.finish(meta, tree_problem)


class _Walk:
    """What :func:`verify_journal` learns walking the chain: its report's fields."""

    def __init__(self, anchor: Anchor | None) -> None:
        self.anchor = anchor
        self.events, self.prev, self.ts = 0, GENESIS_HASH, 0
        self.journal_id = ""
        self.head_record = True
        self.key: bytes | None = None
        # Set once a kernel that keeps head records has opened the journal.
        self.head_events = False
        self.anchored: tuple[bytes, int] | None = None
        self.hashes_checked = True
        # The Merkle tree, built from the leaves hashed as the rows are checked.
        self.tree = TiledTree()
        self.heads: list[tuple[int, str]] = []
        self.tree_stored = True

    async def rows(
        self,
        db: Snapshot,
        fold: Callable[[list[Event]], Awaitable[object]] | None,
        helper: dict[str, Any] | None = None,
    ) -> VerifyReport | None:
        """Check every row, batch by batch, folding each batch that checked out; the report
        of the first bad row, or None when all check out.

        With a ``helper`` request, a helper process reads and checks the rows from its
        start on while the first batch is checked here (kernel.journal._helper); from
        where it stops, they are read here again.
        """
        start = -(2**63)  # rows below seq 1 would be forgeries: look at them too
        async with contextlib.AsyncExitStack() as stack:
            frames = await stack.enter_async_context(aclosing(helped(helper))) if helper else None
            if frames is not None:
                await anext(frames)
            while True:
                rows = await db.rows_from(start, READ_BATCH)
                failed = await self.batch(rows, fold)
                if failed is not None or len(rows) < READ_BATCH:
                    return failed
                start = self.events + 1
                if frames is not None and helper is not None and start == helper["start"]:
                    await self.helped(frames, fold)
                    frames, start = None, self.events + 1

    async def batch(
        self, rows: list[Row], fold: Callable[[list[Event]], Awaitable[object]] | None
    ) -> VerifyReport | None:
        """Check one batch of rows, folding what checked out; the report of a bad row."""
        # Each body inflated and decoded once: its hash, its tree leaf, its columns.
        leaves: list[bytes] = []
        batch, problem = check_rows(
            rows, self.events + 1, self.prev, self.key, self.hashes_checked, leaves
        )
        if batch:
            self.take([row[4] for row in rows[: len(batch)]], batch, leaves)
        if problem:
            return self.report(problem, min(rows[len(batch)][0], self.events + 1))
        if fold is not None and batch:
            await fold(with_derived(batch))  # folded as every reader sees them
        return None

    async def helped(
        self,
        frames: AsyncIterator[list[list[Any]] | int],
        fold: Callable[[list[Event]], Awaitable[object]] | None,
    ) -> None:
        """Take the rows the helper checked, each event decoded and compared with its type
        and dfid columns here, until it stops or one does not agree."""
        async for frame in frames:
            if isinstance(frame, int):
                return
            bodies, hashes, types, dfids, leaves = frame
            batch = decoded(bodies, self.events + 1)
            good = next(
                (
                    i
                    for i, event in enumerate(batch)
                    if types[i] != type(event.payload).__name__ or dfids[i] != event.dfid
                ),
                len(batch),
            )
            if good:
                self.take(hashes, batch[:good], leaves[:good])
                if fold is not None:
                    await fold(with_derived(batch[:good]))
            if good < len(bodies):
                return

    def report(self, problem: str = "", first_bad_seq: int | None = None) -> VerifyReport:
        """Return the report of what was walked so far, with ``problem`` if any."""
        return VerifyReport(
            ok=not problem,
            events=self.events,
            head=self.prev.hex(),
            first_bad_seq=first_bad_seq,
            problem=problem,
            journal_id=self.journal_id,
            head_ts=self.ts,
            head_record=self.head_record,
            keyed=self.key is not None,
            tree_root=self.tree.root().hex(),
            tree_stored=self.tree_stored,
            tree_heads=self.heads,
            chain_checked=self.hashes_checked,
        )

    async def begin(
        self, db: Snapshot, meta: dict[str, str], chain_key: bytes | None, public_only: bool
    ) -> str:
        """Take the journal's key, tree and checkpoints; return what is wrong ("" if nothing)."""
        problem = key_problem(meta, chain_key, events=1, need_key=not public_only)
        if problem:
            return problem
        self.key = chain_key
        self.hashes_checked = chain_key is not None or meta.get("chain") != KEYED_CHAIN
        self.tree_stored = meta.get("tree") == TREE_MARK
        self.heads = await db.tree_heads()
        self.tree = TiledTree(size for size, _ in self.heads)
        return ""

    def take(self, hashes: Sequence[bytes], batch: list[Event], leaves: list[bytes]) -> None:
        """Count the events that checked out (their rows' ``hashes``, their Merkle
        ``leaves``): head events, the anchor, the tree."""
        for event in batch:
            payload = event.payload
            if type(payload) in _HEAD_EVENTS and cast(_Head, payload).head_hash:
                self.head_events = True
        events, anchor = self.events, self.anchor
        if anchor is not None and events < anchor.seq <= events + len(batch):
            self.anchored = (hashes[anchor.seq - events - 1], batch[anchor.seq - events - 1].ts)
        self.tree.add(leaves)
        self.events, self.prev, self.ts = events + len(batch), hashes[len(batch) - 1], batch[-1].ts

    def finish(self, meta: dict[str, str], tree_problem: str) -> VerifyReport:
        """Check the head record, the checkpoints, the anchor and the tree; return the report."""
        if "head" not in meta:
            self.head_record = False
            if self.head_events:
                return self.report(
                    "its head record was removed (a kernel that keeps one has written to it)",
                    self.events,
                )
        problem, seq = head_problem(meta, self.events, self.prev, self.key)
        if not problem:
            problem, seq = _heads_problem(self.heads, self.tree.roots, self.events)
        if not problem and self.anchor is not None:
            problem, seq = _anchor_problem(self.anchor, self.journal_id, self.events, self.anchored)
        if not problem and tree_problem:
            problem, seq = tree_problem, None
        return self.report(problem, seq if problem else None)


async def _tree_problem(db: Snapshot, computed: dict[tuple[int, int], bytes]) -> str:
    """Compare the stored tree nodes with those the events give; "" when they agree."""
    seen = 0
    for level in await db.tree_levels():
        after = -1
        while True:
            nodes: list[Node] = await db.tree_nodes_from(level, after, READ_BATCH)
            for lv, index, node in nodes:
                if computed.get((lv, index)) != node:
                    return (
                        f"the Merkle tree's node at level {lv}, index {index} is not the events'"
                        " (the tree or the events were altered)"
                    )
            seen += len(nodes)
            if len(nodes) < READ_BATCH:
                break
            after = nodes[-1][1]
    if seen != len(computed):
        return f"the Merkle tree lacks {len(computed) - seen} of its {len(computed)} stored nodes"
    return ""


def _heads_problem(
    heads: list[tuple[int, str]], roots: dict[int, bytes], events: int
) -> tuple[str, int | None]:
    """Check each stored signed checkpoint's tree against the events (signatures: kernel.proofs)."""
    for size, note in heads:
        try:
            text, _ = split_note(note)
            checkpoint = parse_checkpoint(text)
        except NoteError as exc:
            return f"the signed checkpoint stored for size {size} does not parse ({exc})", None
        if checkpoint.size != size:
            return (
                f"the signed checkpoint stored for size {size} is of size {checkpoint.size}",
                None,
            )
        if size > events:
            return (
                f"a signed checkpoint covers {size} events, but the journal ends at event"
                f" {events}: events {events + 1}..{size} were removed",
                events + 1,
            )
        if roots.get(size) != checkpoint.root:
            return (
                f"the signed checkpoint of size {size} has another root than events 1..{size}:"
                " the journal was rewritten at or before event {size}".replace("{size}", str(size)),
                size,
            )
    return "", None


def _anchor_problem(
    anchor: Anchor, journal_id: str, events: int, anchored: tuple[bytes, int] | None
) -> tuple[str, int | None]:
    if anchor.journal_id != journal_id:
        return f"the anchor is of journal {anchor.journal_id}, this is journal {journal_id}", None
    if anchor.seq > events:
        return (
            f"the journal ends at event {events}, before the anchored event {anchor.seq}:"
            " its tail was removed",
            events + 1,
        )
    if anchor.seq == 0:
        return ("", None) if anchor.hash == GENESIS_HASH.hex() else ("the anchor is forged", 0)
    assert anchored is not None
    hash_, ts = anchored
    if hash_.hex() != anchor.hash or anchor_time(ts) != anchor.ts:
        return (
            f"event {anchor.seq} is not the anchored one (hash {hash_.hex()[:16]}...,"
            f" anchor {anchor.hash[:16]}...): the journal was rewritten from there or before",
            anchor.seq,
        )
    return "", None


def _helper(path: str, meta: dict[str, str], walk: _Walk) -> dict[str, Any] | None:
    """The request for a helper to check rows after the first batch, up to the head record
    (rows of this read's moment, whatever a kernel appends meanwhile); None: no helper."""
    head = parse_head(meta.get("head"))
    if head is None or walk.key is not None or not helps(head[0], path):
        return None
    return request(path, READ_BATCH + 1, head[0], walk.hashes_checked, True)
