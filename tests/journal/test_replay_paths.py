"""The fast paths of replay and verify give what the general paths give.

- ``check_rows`` (verify's loop over a batch of rows) against ``check_row`` row by row,
  on rows of every event type, sound or damaged in each way a row can be.
- ``Journal.scan(hashes=False)`` (what ``dirk state`` and the P5 replay fold) against
  ``scan()``: the same events but for their hex hashes, the same state, on the golden
  journals.
- ``verify_projections`` folding runs of events up to each checkpoint against a fold
  of one event at a time: the same digest, the same problems, the same seq named for
  an illegal transition.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.audit import Projections, open_journal
from kernel.core import events as ev
from kernel.core.events import GENESIS_HASH, Draft, Event, canonical
from kernel.core.flow import IllegalTransition
from kernel.journal.codec import BodyPacker
from kernel.journal.sealing import check_row, check_rows, seal
from kernel.state import snapshots
from tests.core.test_events import SAMPLES
from tests.support import GOLDEN

KEY = b"k" * 32
_packer = BodyPacker()


def _journal_rows(key: bytes | None) -> list[tuple[Any, ...]]:
    """Rows of one event of every type, chained from genesis, bodies stored packed or plain."""
    drafts = [
        Draft(payload=p, dfid="d" if i % 3 else None, agent_id="a") for i, p in enumerate(SAMPLES)
    ]
    rows, _ = seal(drafts, 0, GENESIS_HASH, 1_000, key)
    return [
        (seq, type_, dfid, _packer.pack(body) if seq % 2 else body, hash_)
        for seq, type_, dfid, body, hash_ in rows
    ]


_ROWS = {None: _journal_rows(None), KEY: _journal_rows(KEY)}


def _damage(rows: list[tuple[Any, ...]], at: int, how: str, byte: int) -> list[tuple[Any, ...]]:
    """Return ``rows`` with row ``at`` damaged ``how``."""
    rows = list(rows)
    seq, type_, dfid, body, hash_ = rows[at]
    if how == "drop":
        del rows[at]
        return rows
    if how == "flip_body":
        i = byte % len(body)
        body = body[:i] + bytes([body[i] ^ 0x20]) + body[i + 1 :]
    elif how == "truncate_body":
        body = body[: byte % len(body)]
    elif how == "trailing_bytes":
        body = body + b"\x00"
    elif how == "flip_hash":
        hash_ = bytes([hash_[0] ^ 1]) + hash_[1:]
    elif how == "seq_column":
        seq = seq + 1 + byte % 3
    elif how == "type_column":
        type_ = "FlowClosed" if type_ != "FlowClosed" else "FlowAborted"
    elif how == "dfid_column":
        dfid = None if dfid else "other"
    elif how == "body_not_bytes":
        body = memoryview(body)
    elif how == "hash_not_bytes":
        hash_ = hash_.hex()
    elif how == "body_of_another_seq":
        # A body that decodes, chained correctly, but records another seq.
        other = msgspec.json.decode(canonical(Event(seq=seq + 7, ts=1, payload=ev.FlowClosed())))
        body = msgspec.json.encode(other)
    elif how == "not_json":
        body = b"{not json"
    rows[at] = (seq, type_, dfid, body, hash_)
    return rows


def _reference(
    rows: Sequence[tuple[Any, ...]], key: bytes | None, hashes_checked: bool
) -> tuple[list[Event], str]:
    events: list[Event] = []
    expected, prev = 1, GENESIS_HASH
    for row in rows:
        problem, event = check_row(row, expected, prev, key, hashes_checked, False)
        if event is None:
            return events, problem
        events.append(event)
        expected, prev = expected + 1, row[4]
    return events, ""


HOW = [
    "none",
    "drop",
    "flip_body",
    "truncate_body",
    "trailing_bytes",
    "flip_hash",
    "seq_column",
    "type_column",
    "dfid_column",
    "body_not_bytes",
    "hash_not_bytes",
    "body_of_another_seq",
    "not_json",
]


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    at=st.integers(0, len(SAMPLES) - 1),
    how=st.sampled_from(HOW),
    byte=st.integers(0, 10_000),
    key=st.sampled_from([None, KEY]),
    hashes_checked=st.booleans(),
    split=st.integers(0, len(SAMPLES)),
)
def test_check_rows_gives_check_rows_verdict_row_by_row(
    at: int, how: str, byte: int, key: bytes | None, hashes_checked: bool, split: int
) -> None:
    rows = _ROWS[key] if how == "none" else _damage(_ROWS[key], at, how, byte)
    expected = _reference(rows, key, hashes_checked)
    # Checked in two batches, as verify reads them: the second goes on from the first.
    first, problem = check_rows(rows[:split], 1, GENESIS_HASH, key, hashes_checked)
    if not problem and split < len(rows):
        prev = rows[split - 1][4] if split else GENESIS_HASH
        second, problem = check_rows(rows[split:], split + 1, prev, key, hashes_checked)
        first = first + second
    assert (first, problem) == expected


def test_a_sound_journal_of_every_event_type_checks_whole() -> None:
    for key in (None, KEY):
        events, problem = check_rows(_ROWS[key], 1, GENESIS_HASH, key, True)
        assert problem == "" and [e.payload for e in events] == SAMPLES
        assert all(e.hash == "" == e.prev_hash for e in events)
        # Checked with the wrong key (or none), every hash is refused at the first event.
        wrong = None if key else KEY
        assert check_rows(_ROWS[key], 1, GENESIS_HASH, wrong, True) == (
            [],
            "event 1 does not match its hash: its body or hash was altered",
        )


@pytest.mark.parametrize("name", ["trading", "booking"])
async def test_a_scan_without_hashes_folds_the_same_events(name: str, tmp_path: Path) -> None:
    db = tmp_path / f"{name}.db"
    shutil.copyfile(GOLDEN / f"{name}.db", db)
    whole, light = Projections(), Projections()
    async with open_journal(db, readonly=True) as journal:
        full = [e async for batch in journal.scan(batch_size=97) for e in batch]
        bare = [e async for batch in journal.scan(batch_size=97, hashes=False) for e in batch]
    assert [msgspec.structs.replace(e, prev_hash="", hash="") for e in full] == bare
    assert all(e.hash for e in full) and not any(e.hash or e.prev_hash for e in bare)
    whole.apply(full)
    light.apply(bare)
    assert whole.digest() == light.digest()
    assert whole.flows == light.flows and whole.finished_hash == light.finished_hash


# --- verify_projections folds runs up to each checkpoint ---------------------------------

_FLOW_STEPS: list[ev.AnyPayload] = [
    ev.FlowCreated(root_dfid="r", topic="t"),
    ev.ContextCompiled(attempt=1, context_ref="c"),
    ev.ProposalSubmitted(attempt=1, proposal=ev.ProposalRecord(kind="k", params={"q": 1})),
    ev.ProposalAccepted(attempt=1),
    ev.ExecutionStarted(intent=ev.ExecutionIntent(key="i", kind="k", adapter="x")),
    ev.ExecutionSucceeded(key="i", external_id="e"),
    ev.FlowClosed(),
]


def _events(steps: list[tuple[int, int]]) -> list[Event]:
    """Events seq 1.. of flows ``f<n>``, each taking step ``k`` of the happy path."""
    return [
        Event(seq=seq, ts=seq, payload=_FLOW_STEPS[step], dfid=f"f{flow}", agent_id="a")
        for seq, (flow, step) in enumerate(steps, 1)
    ]


def _one_by_one(events: list[Event], points: dict[int, str]) -> tuple[str, list[str]]:
    """The report of folding one event at a time (verify_projections before runs)."""
    projections, problems = Projections(), []
    for event in events:
        try:
            projections.apply((event,))
        except IllegalTransition as exc:
            problems.append(f"at seq {event.seq}: projection: {exc}")
            return "", problems
        if event.seq in points and points.pop(event.seq) != projections.digest():
            problems.append(f"at seq {event.seq}: checkpoint digest differs from replay")
    problems += [f"at seq {seq}: checkpoint beyond the last event" for seq in sorted(points)]
    return projections.digest(), problems


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=40),
    cuts=st.lists(st.integers(1, 40), max_size=4),
    marks=st.lists(st.tuples(st.integers(1, 44), st.booleans()), max_size=6),
)
def test_verify_projections_folds_runs_as_it_folded_events(
    steps: list[tuple[int, int]],
    cuts: list[int],
    marks: list[tuple[int, bool]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import anyio

    events = _events(steps)
    # Checkpoints at some seqs: some with the digest replay reaches there, some not.
    truth: dict[int, str] = {}
    projections = Projections()
    for event in events:
        try:
            projections.apply((event,))
        except IllegalTransition:
            break
        truth[event.seq] = projections.digest()
    points = {seq: truth.get(seq, "0" * 64) if right else "f" * 64 for seq, right in marks}
    bounds = sorted({0, len(events), *(c for c in cuts if c < len(events))})
    batches = [events[a:b] for a, b in itertools.pairwise(bounds)]
    expected_digest, expected_problems = _one_by_one(events, dict(points))

    async def run() -> snapshots.ProjectionReport:
        async def checkpoints(journal: Any, stop: int | None = None) -> list[Any]:
            return [ev.ProjectionCheckpoint(seq=s, digest=d) for s, d in sorted(points.items())]

        async def given_batches() -> AsyncIterator[list[Event]]:
            for batch in batches:
                yield batch

        path = tmp_path_factory.mktemp("runs") / "j.db"
        async with open_journal(path) as journal:
            original = snapshots.checkpoints
            snapshots.checkpoints = checkpoints
            try:
                return await snapshots.verify_projections(journal, batches=given_batches())
            finally:
                snapshots.checkpoints = original

    report = anyio.run(run)
    assert report.problems == expected_problems
    assert report.digest == expected_digest
    assert report.ok == (not expected_problems)
