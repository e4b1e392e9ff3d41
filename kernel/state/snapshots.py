"""Replay: time travel, projection checkpoints, snapshots and their verification.

Every state the kernel was ever in is a fold of a prefix of the journal
(:func:`state_at`). Every ``every`` events the running kernel records a
:class:`~kernel.core.events.ProjectionCheckpoint`: the seq it describes and the hash
of the canonical projected state after it (ESAA's projection hash). Beside
the checkpoint it stores a snapshot of that state (msgspec MessagePack, in the
journal file's ``snapshots`` table, outside the hash chain), so that opening a
long journal folds only the tail after the latest snapshot.

A snapshot is trusted only when it matches a checkpoint event: its bytes hash
to the checkpoint's ``snapshot`` (checkpoints recorded before that field
existed: its decoded state hashes to the checkpoint's digest). The event is in
the hash chain, the snapshot is not, so an edited snapshot is never loaded
(the kernel replays from zero instead) and ``dirk verify`` reports it.
Checking the bytes' hash rather than re-hashing the decoded state is what
makes opening a long journal fast: the state's canonical JSON costs as much
as decoding it.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from typing import Any, ClassVar, cast

import anyio
import msgspec

from kernel.core.events import Draft, Event, ProjectionCheckpoint
from kernel.core.flow import IllegalTransition
from kernel.journal.store import Journal, JournalError
from kernel.state.collector import collector_paused
from kernel.state.domain import DomainType
from kernel.state.projections import Projections

log = logging.getLogger(__name__)

CHECKPOINT_EVERY = 10_000
"""Events between projection checkpoints, unless ``open_kernel`` is told otherwise."""


class SavedState(msgspec.Struct, kw_only=True):
    """The canonical projected state as stored in a snapshot (see Projections.snapshot).

    Its fields are the saved fields of the projections it was captured from
    (``Projections.saved_fields()``: the kernel's own, then each domain's), so each
    set of domains has its own subclass (:func:`saved_type`); only ``last_seq`` is
    declared here. Only open flows are stored, finished ones as counts and their
    rolling hash: a snapshot's size does not grow with the flows that ever ran.
    """

    domains: ClassVar[tuple[DomainType, ...]] = ()
    """The domains whose state it holds."""

    last_seq: int


_types: dict[tuple[DomainType, ...], type[SavedState]] = {}
_decoders: dict[type[SavedState], msgspec.msgpack.Decoder[Any]] = {}
_encoder = msgspec.msgpack.Encoder()


def saved_type(projections: Projections) -> type[SavedState]:
    """Return the snapshot type of ``projections``: one field per saved field, in order."""
    domains = tuple(type(domain) for domain in projections.domains)
    found = _types.get(domains)
    if found is None:
        declared = SavedState.__struct_fields__
        fields = [
            (f.name, f.type) if f.default is msgspec.NODEFAULT else (f.name, f.type, f.default)
            for f in projections.saved_fields()
            if f.name not in declared
        ]
        made = msgspec.defstruct(
            "ProjectedState",
            fields,
            bases=(SavedState,),
            kw_only=True,
            namespace={"domains": domains, "__module__": __name__},
        )
        found = _types[domains] = cast(type[SavedState], made)
    return found


ProjectedState = saved_type(Projections())
"""The snapshot type of the registered domains (as they were when this module was imported)."""


def capture(projections: Projections) -> SavedState:
    """Return a copy of the state that later folds leave alone (the records are immutable)."""
    made = saved_type(projections)
    return made(**{f.name: f.copy(f.get()) for f in projections.saved_fields()})


def restore_state(
    captured: SavedState,
    keep_finished: int | None = None,
    domains: tuple[DomainType, ...] | None = None,
) -> Projections:
    """Return live projections holding ``captured`` (no finished flow in the index yet).

    ``domains`` defaults to those ``captured`` was taken from.
    """
    projections = Projections(keep_finished, captured.domains if domains is None else domains)
    _load(projections, captured)
    return projections


def _load(projections: Projections, captured: SavedState) -> None:
    for field in projections.saved_fields():
        field.load(getattr(captured, field.name))


def encode_snapshot(captured: SavedState) -> tuple[str, bytes]:
    """Return the projection hash and the snapshot body of a captured state."""
    return restore_state(captured).digest(), _encoder.encode(captured)


def decode_snapshot(
    body: bytes, keep_finished: int | None = None, domains: tuple[DomainType, ...] | None = None
) -> Projections | None:
    """Return the projections a snapshot body holds, or None if it does not decode.

    ``domains``: those it was taken from (default: the registered ones).
    """
    projections = Projections(keep_finished, domains)
    made = saved_type(projections)
    decoder = _decoders.get(made)
    if decoder is None:
        decoder = _decoders[made] = msgspec.msgpack.Decoder(made)
    try:
        _load(projections, decoder.decode(body))
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
        return None
    return projections


async def checkpoints(journal: Journal, stop: int | None = None) -> list[ProjectionCheckpoint]:
    """Return the checkpoints recorded in the journal (before seq ``stop``), oldest first."""
    events = await journal.read(stop=stop, types=["ProjectionCheckpoint"])
    return [e.payload for e in events if isinstance(e.payload, ProjectionCheckpoint)]


def _matches(
    point: ProjectionCheckpoint, body: bytes, keep_finished: int | None
) -> Projections | None:
    """Return the projections of a snapshot if it is the one ``point`` recorded, else None."""
    if point.snapshot:
        if hashlib.sha256(body).hexdigest() != point.snapshot:
            return None
        return decode_snapshot(body, keep_finished)
    projections = decode_snapshot(body, keep_finished)
    if projections is None or projections.digest() != point.digest:
        return None
    return projections


async def trusted_snapshot(
    journal: Journal, at: int | None = None, keep_finished: int | None = None
) -> Projections | None:
    """Return the latest snapshot (after at most event ``at``) that matches its checkpoint."""
    for point in reversed(await checkpoints(journal)):
        if at is not None and point.seq > at:
            continue
        stored = await journal.read_snapshot(point.seq)
        if stored is None:
            continue
        projections = _matches(point, stored[1], keep_finished)
        if projections is not None:
            return projections
        log.warning("snapshot at seq %d does not match its checkpoint; not used", point.seq)
    return None


async def restore(journal: Journal, keep_finished: int | None = None) -> Projections:
    """Return the projections of the whole journal: the latest trusted snapshot plus the tail.

    The tail's chain is checked first, from the snapshot to the head (the whole
    chain when there is no snapshot), so a kernel never starts on a journal
    edited after its latest trusted snapshot; the chain before the snapshot is left
    to :meth:`Journal.check_history <kernel.journal.store.Journal.check_history>`,
    which every read of an event there waits for. The index holds the open flows and
    at most ``keep_finished`` finished ones (those that ended in the tail); None
    keeps every finished flow of the tail.

    Raises:
        JournalCorrupt: An event after the snapshot is missing or altered (with its seq).
    """
    projections = await trusted_snapshot(journal, None, keep_finished) or Projections(keep_finished)
    # The checkpoint vouching for the snapshot comes after it, so it is in the checked tail.
    skipped = projections.last_seq
    with collector_paused():
        async for batch in journal.scan_checked(skipped + 1):
            projections.apply(batch)
    # What lies before the snapshot is checked later (a kernel does it in the background);
    # until then no read returns an event of it.
    journal.defer_history(skipped)
    return projections


async def state_at(
    journal: Journal, seq: int | None, keep_finished: int | None = None
) -> Projections:
    """Return the projected state after event ``seq`` (the whole journal when None)."""
    projections = await trusted_snapshot(journal, seq, keep_finished) or Projections(keep_finished)
    return await _fold_tail(journal, projections, seq)


async def _fold_tail(journal: Journal, projections: Projections, seq: int | None) -> Projections:
    """Fold the events after ``projections`` (up to ``seq``, when given) into them."""
    stop = None if seq is None else seq + 1
    with collector_paused():
        async for batch in journal.scan(projections.last_seq + 1, hashes=False):
            if stop is not None and batch[0].seq >= stop:
                break
            projections.apply(batch if stop is None else [e for e in batch if e.seq < stop])
    return projections


class ProjectionReport(msgspec.Struct, frozen=True, kw_only=True):
    """What replaying the projections found.

    Attributes:
        ok: every event folded and every checkpoint and snapshot matched replay.
        digest: the projection hash after the last event.
        checkpoints: checkpoints compared with replay.
        snapshots: snapshots compared with replay.
        problems: one line per mismatch, with its seq.
    """

    ok: bool
    digest: str
    checkpoints: int = 0
    snapshots: int = 0
    problems: list[str] = []


async def verify_projections(
    journal: Journal, batches: AsyncIterable[Sequence[Event]] | None = None
) -> ProjectionReport:
    """Fold the journal from scratch, comparing each checkpoint and snapshot with replay.

    ``batches`` are the events to fold, from event 1 in order (by default the journal's
    own): ``dirk verify`` hands over those its chain check decoded, so each is read once.
    """
    points: dict[int, list[ProjectionCheckpoint]] = {}
    for point in await checkpoints(journal):
        points.setdefault(point.seq, []).append(point)
    replay = _Replay(journal, points)
    if 0 in points:
        await replay.compare(0)
    with collector_paused():
        async for batch in journal.scan(hashes=False) if batches is None else batches:
            if not await replay.fold(batch):
                return ProjectionReport(ok=False, digest="", problems=replay.problems)
    for seq in points:
        replay.problems.append(f"at seq {seq}: checkpoint beyond the last event")
    return ProjectionReport(
        ok=not replay.problems,
        digest=replay.projections.digest(),
        checkpoints=replay.compared,
        snapshots=replay.snapshots,
        problems=replay.problems,
    )


class _Replay:
    """Folds a journal from scratch, comparing the checkpoints and snapshots on the way."""

    def __init__(self, journal: Journal, points: dict[int, list[ProjectionCheckpoint]]) -> None:
        self.journal = journal
        self.points = points
        """The checkpoints not compared yet, by the seq they describe."""
        self.projections = Projections()
        self.problems: list[str] = []
        self.compared = 0
        self.snapshots = 0

    async def fold(self, batch: Sequence[Event]) -> bool:
        """Fold one batch in runs that end at a checkpoint; False at an event that does not fold.

        Runs, not event by event: apply() costs the same for a run as for one event.
        """
        begin = 0
        for end in _run_ends(batch, self.points):
            run = batch[begin:end] if begin or end < len(batch) else batch
            try:
                self.projections.apply(run)
            except IllegalTransition as exc:
                # apply stops at the event that does not fold: the first past last_seq.
                last = self.projections.last_seq
                seq = next((e.seq for e in run if e.seq > last), run[-1].seq)
                self.problems.append(f"at seq {seq}: projection: {exc}")
                return False
            begin = end
            if run and run[-1].seq in self.points:
                await self.compare(run[-1].seq)
        return True

    async def compare(self, seq: int) -> None:
        """Compare the checkpoints and the snapshot of ``seq`` with the state folded so far."""
        replayed = self.projections.digest()
        here = self.points.pop(seq, [])
        for point in here:
            self.compared += 1
            if point.digest != replayed:
                self.problems.append(f"at seq {seq}: checkpoint digest differs from replay")
        stored = await self.journal.read_snapshot(seq)
        if stored is not None:
            self.snapshots += 1
            if not _snapshot_matches(stored, here, replayed, self.projections):
                self.problems.append(f"at seq {seq}: snapshot does not match replay")


def _run_ends(batch: Sequence[Event], points: Mapping[int, object]) -> list[int]:
    """Return where the runs of ``batch`` end: after each checkpointed seq, and at its end.

    A seq may hold two events (a FlowClosed derived from its success: kernel.core.events
    ``with_derived``); the state it checkpoints is after both.
    """
    # The few checkpointed seqs this batch spans, each found by bisection (not a look at
    # every event: verify folds every event of the journal through here).
    first, last = (batch[0].seq, batch[-1].seq) if batch else (0, -1)
    seqs = [event.seq for event in batch] if any(first <= s <= last for s in points) else []
    ends = [bisect.bisect_right(seqs, s) for s in sorted(points) if first <= s <= last]
    return ends if ends and ends[-1] == len(batch) else [*ends, len(batch)]


def _snapshot_matches(
    stored: tuple[str, bytes],
    points: Sequence[ProjectionCheckpoint],
    replayed: str,
    projections: Projections,
) -> bool:
    """Whether a stored snapshot (its digest column, its body) is the state replay reached.

    Bytes that are the very ones replay's own state encodes to are that state: the kernel
    that stored them hashed the state they restore to (the digest column, which must be
    replay's). Other bytes (another kernel's encoder, dicts filled in another order) are
    decoded and their state hashed, as opening would load them.
    """
    digest, body = stored
    recorded = {p.snapshot for p in points} - {""}
    if digest != replayed or recorded - {hashlib.sha256(body).hexdigest()}:
        return False
    # The state as it is now, not a copy (encoded at once: no later fold can change it).
    now = saved_type(projections)(**{f.name: f.get() for f in projections.saved_fields()})
    if _encoder.encode(now) == body:
        return True
    restored = decode_snapshot(body)
    return restored is not None and restored.digest() == replayed


class Checkpointer:
    """Records a checkpoint and a snapshot every ``every`` events of a running kernel.

    :meth:`observe` runs in the journal listener, right after a batch was folded:
    it only copies the state (cheap: the records are immutable). The hashing and
    encoding run in a worker thread, then the snapshot is stored and the
    checkpoint appended, by the kernel itself and not by any actor.
    """

    def __init__(self, every: int, head: int) -> None:
        self._every = every
        self._next = (head // every + 1) * every if every > 0 else 0
        self._captured: SavedState | None = None
        self._ready = anyio.Event()

    def observe(self, projections: Projections) -> None:
        """Capture the state when the journal crossed the next multiple of ``every``."""
        if self._every <= 0 or projections.last_seq < self._next:
            return
        self._next = (projections.last_seq // self._every + 1) * self._every
        self._captured = capture(projections)
        self._ready.set()

    async def run(self, journal: Journal) -> None:
        """Store snapshots and append checkpoints until cancelled; thin out old snapshots."""
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            captured, self._captured = self._captured, None
            if captured is None:
                continue
            await record_checkpoint(journal, captured)
            try:
                stored = await journal.snapshot_seqs()
                kept = retained(stored, self._every)
                await journal.drop_snapshots([seq for seq in stored if seq not in kept])
            except JournalError as exc:
                log.warning("old snapshots not thinned out: %s", exc)


def retained(seqs: Sequence[int], every: int) -> set[int]:
    """Return which of the snapshots at ``seqs`` to keep: the last two, then ever fewer.

    A snapshot ``age`` checkpoints old is kept while its checkpoint number is a
    multiple of the largest power of two not above ``age``, so about two per
    doubling of age survive: opening needs only the latest, time travel to any
    point folds at most about as many events as lie between it and now, and the
    file holds O(log n) snapshots instead of n. Each snapshot's condition only
    tightens as it ages, so a dropped one would never have been wanted back.
    """
    if not seqs or every <= 0:
        return set(seqs)
    latest = max(seqs) // every
    kept = set()
    for seq in seqs:
        number = seq // every
        age = latest - number
        if age < 2 or number % (1 << (age.bit_length() - 1)) == 0:
            kept.add(seq)
    return kept


async def record_checkpoint(
    journal: Journal,
    captured: SavedState,
    encode: Callable[[SavedState], tuple[str, bytes]] = encode_snapshot,
) -> Event | None:
    """Store the snapshot of ``captured``, then append its checkpoint; return the event.

    The snapshot goes first: a checkpoint whose snapshot is missing only costs a
    longer replay, never a wrong state.
    """
    digest, body = await anyio.to_thread.run_sync(encode, captured)
    snapshot = hashlib.sha256(body).hexdigest()
    try:
        await journal.write_snapshot(captured.last_seq, digest, body)
    except JournalError as exc:
        log.warning("snapshot at seq %d not stored: %s", captured.last_seq, exc)
    try:
        [event] = await journal.append(
            [
                Draft(
                    payload=ProjectionCheckpoint(
                        seq=captured.last_seq, digest=digest, snapshot=snapshot
                    )
                )
            ]
        )
    except JournalError as exc:
        log.warning("checkpoint at seq %d not recorded: %s", captured.last_seq, exc)
        return None
    return event


def state_json(projections: Projections) -> Any:
    """Return the whole projected state as JSON-ready builtins, keys sorted."""
    return msgspec.to_builtins(projections.snapshot(), order="sorted")
