"""The journal store and inbox store contracts as reusable test suites.

Every journal store must give the same appends the same journal: the same
reads with every filter, the same chain and head across reopens, the same
refusals, snapshots, subscriptions, followers and Merkle tree. The kernel runs
these suites against its SQLite and PostgreSQL stores (tests/journal and
tests/inbox); a third party runs them against its own database the same way,
as eventsourcing's recorder test cases are subclassed per backend. Mix a class
into a pytest class named ``Test...`` and say where a fresh journal goes::

    class TestMyPostgres(JournalStoreContract):
        def journal_location(self, tmp_path):
            return my_server.new_empty_database_url()  # "postgresql://..."

    class TestMyPostgresInbox(InboxStoreContract):
        def journal_location(self, tmp_path):
            return my_server.new_empty_database_url()

A location is whatever :func:`~kernel.journal.opening.open_journal` takes: a
SQLite file path or a ``postgresql://`` URL (a managed server, a proxy, a
server that speaks PostgreSQL's protocol). Each call must give a place no
journal was written to yet.

The test methods are synchronous (each runs its own event loop), so the mixins
work in any pytest setup, with or without an async plugin. A broken rule raises
:class:`~kernel.testing.ContractBroken` naming the rule.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import anyio
import anyio.lowlevel
import msgspec

from kernel.core.events import Draft, Event, FlowCreated, TriggerFired, canonical
from kernel.core.merkle import leaf_hash, root_of, verify_consistency, verify_inclusion
from kernel.core.ports import ManualClock
from kernel.journal.errors import (
    JournalClosed,
    JournalFaults,
    JournalForeign,
    JournalKeyError,
    JournalWriteFailed,
)
from kernel.journal.follow import follow_journal
from kernel.journal.inbox_store import StoredRow, on_server, open_inbox
from kernel.journal.opening import open_journal
from kernel.journal.verify import verify_journal
from kernel.testing._contract import ContractBroken

KEY = b"k" * 32
"""The chain key of the keyed journals the suite writes."""


def _expect(condition: bool, rule: str) -> None:
    if not condition:
        raise ContractBroken(rule)


async def _refused(
    error: type[Exception],
    rule: str,
    location: str,
    *,
    readonly: bool = False,
    chain_key: bytes | None = None,
) -> None:
    """Check that opening ``location`` so raises ``error``."""
    try:
        async with open_journal(location, readonly=readonly, chain_key=chain_key):
            pass
    except error:
        return
    raise ContractBroken(rule)


def _trigger(x: int, dfid: str | None = None) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"x": x}), dfid=dfid)


def _flow(dfid: str) -> Draft:
    return Draft(payload=FlowCreated(root_dfid=dfid), dfid=dfid)


def _seqs(events: list[Event]) -> list[int]:
    return [event.seq for event in events]


def _bare(event: Event) -> bytes:
    """The canonical bytes a Merkle leaf is over (an event's hashes are not part of them)."""
    return canonical(msgspec.structs.replace(event, prev_hash="", hash=""))


class _Location:
    def journal_location(self, tmp_path: Path) -> str:
        """Where a fresh journal goes: a file path or a server URL no journal is at yet."""
        raise NotImplementedError("a store contract test class defines journal_location")


class JournalStoreContract(_Location):
    """A pytest mixin: what every journal store must do, run against ``journal_location``."""

    def make_blank(self, location: str) -> None:
        """Leave something that is no journal at ``location`` (default: an empty file).

        A server URL is already blank: an empty database holds nothing.
        """
        if not on_server(location):
            Path(location).touch()

    # --- the checks ---------------------------------------------------------------------

    def test_contract_appends_read_back_in_order_with_every_filter(self, tmp_path: Path) -> None:
        anyio.run(self._reads, self.journal_location(tmp_path))

    def test_contract_a_reopened_journal_goes_on_from_its_head(self, tmp_path: Path) -> None:
        anyio.run(self._reopened, self.journal_location(tmp_path))

    def test_contract_a_keyed_journal_needs_its_key_to_be_written(self, tmp_path: Path) -> None:
        anyio.run(self._keyed, self.journal_location(tmp_path))

    def test_contract_snapshots_are_written_read_and_dropped(self, tmp_path: Path) -> None:
        anyio.run(self._snapshots, self.journal_location(tmp_path))

    def test_contract_a_failed_transaction_writes_nothing(self, tmp_path: Path) -> None:
        anyio.run(self._failed_transaction, self.journal_location(tmp_path))

    def test_contract_a_subscriber_sees_history_then_live_commits(self, tmp_path: Path) -> None:
        anyio.run(self._subscriber, self.journal_location(tmp_path))

    def test_contract_a_read_only_open_of_nothing_is_refused(self, tmp_path: Path) -> None:
        location = self.journal_location(tmp_path)
        self.make_blank(location)
        anyio.run(self._read_only_blank, location)

    def test_contract_a_follower_sees_history_then_new_commits(self, tmp_path: Path) -> None:
        anyio.run(self._follower, self.journal_location(tmp_path))

    def test_contract_the_merkle_tree_is_kept_across_reopens(self, tmp_path: Path) -> None:
        anyio.run(self._tree, self.journal_location(tmp_path))

    # --- how each check runs ------------------------------------------------------------

    async def _reads(self, location: str) -> None:
        async with open_journal(location, clock=ManualClock()) as journal:
            first = await journal.append([_trigger(1), _trigger(2, "d1")])
            await journal.append([_trigger(3, "d2"), _flow("d1")])
            _expect(_seqs(first) == [1, 2], f"an append is numbered from 1 ({_seqs(first)})")
            _expect(journal.head_seq == 4, f"the head follows the appends ({journal.head_seq})")
            reads = {
                "all": (await journal.read(), [1, 2, 3, 4]),
                "start..stop": (await journal.read(2, 4), [2, 3]),
                "a flow": (await journal.flow_events("d1"), [2, 4]),
                "a type": (await journal.read(types=["FlowCreated"]), [4]),
                "no types": (await journal.read(types=[]), []),
                "a limit": (await journal.read(limit=1, start=3), [3]),
            }
            for what, (events, seqs) in reads.items():
                _expect(_seqs(events) == seqs, f"a read of {what} gives {seqs}, not {events}")
            events = await journal.read()
            _expect(events[0].prev_hash == "00" * 32, "event 1 chains on the genesis hash")
            _expect(
                all(a.hash == b.prev_hash for a, b in itertools.pairwise(events)),
                "each event chains on the one before",
            )
            _expect(events[-1].hash == journal.head_hash, "the head hash is the last event's")
            await journal.check_chain(2)
            scanned = [e.seq async for batch in journal.scan_checked(3) for e in batch]
            _expect(scanned == [3, 4], f"a checked scan from 3 gives 3 and 4, not {scanned}")
            # What a fold reads: the same events from seq 2 on, without their hashes.
            bare = [e async for batch in journal.scan(2, batch_size=2, hashes=False) for e in batch]
            _expect(
                bare == [msgspec.structs.replace(e, prev_hash="", hash="") for e in events[1:]],
                "a scan without hashes gives the same events without their hashes",
            )

    async def _reopened(self, location: str) -> None:
        async with open_journal(location) as journal:
            await journal.append([_trigger(1)])
            journal_id, head = journal.journal_id, journal.head_hash
        async with open_journal(location) as journal:
            _expect(
                (journal.journal_id, journal.head_seq, journal.head_hash) == (journal_id, 1, head),
                "a reopened journal keeps its id and head",
            )
            await journal.append([_trigger(2)])
        async with open_journal(location, readonly=True) as journal:
            _expect(journal.head_seq == 2, "a read-only open sees the head")
            try:
                await journal.append([_trigger(3)])
            except JournalClosed:
                pass
            else:
                raise ContractBroken("a read-only journal refuses appends with JournalClosed")
        report = await verify_journal(location)
        _expect(
            (report.ok, report.events, report.journal_id) == (True, 2, journal_id),
            f"the journal verifies with its two events ({report.problem})",
        )

    async def _keyed(self, location: str) -> None:
        async with open_journal(location, chain_key=KEY) as journal:
            await journal.append([_trigger(1)])
            _expect(journal.keyed, "a journal opened with a chain key is keyed")
        await _refused(JournalKeyError, "a keyed journal is not written without its key", location)
        await _refused(
            JournalKeyError,
            "a keyed journal is not written with another key",
            location,
            chain_key=b"x" * 32,
        )
        async with open_journal(location, readonly=True) as journal:
            _expect(journal.head_seq == 1, "a keyed journal is read without its key")
        _expect((await verify_journal(location, chain_key=KEY)).ok, "it verifies with its key")
        _expect(not (await verify_journal(location)).ok, "it does not verify without its key")

    async def _snapshots(self, location: str) -> None:
        async with open_journal(location) as journal:
            await journal.append([_trigger(1)])
            await journal.write_snapshot(1, "d1", b"\x00body")
            await journal.write_snapshot(1, "d2", b"\x01body")
            await journal.write_snapshot(3, "d3", b"x")
            seqs = await journal.snapshot_seqs()
            _expect(seqs == [1, 3], f"the snapshots stored are of seqs 1 and 3, not {seqs}")
            _expect(
                await journal.read_snapshot(1) == ("d2", b"\x01body"),
                "a snapshot written again replaces the one before",
            )
            await journal.drop_snapshots([3])
            _expect(await journal.snapshot_seqs() == [1], "a dropped snapshot is gone")
            _expect(await journal.read_snapshot(3) is None, "a dropped snapshot reads as None")

    async def _failed_transaction(self, location: str) -> None:
        async with open_journal(location, faults=JournalFaults(fail_transaction=2)) as journal:
            await journal.append([_trigger(1)])
            for n in (2, 3):
                try:
                    await journal.append([_trigger(n)])
                except JournalWriteFailed:
                    continue
                raise ContractBroken(f"append {n} after a failed transaction is refused")
        async with open_journal(location) as journal:
            _expect(journal.head_seq == 1, "a failed transaction wrote nothing")
        _expect((await verify_journal(location)).ok, "a journal whose write failed verifies")

    async def _subscriber(self, location: str) -> None:
        async with open_journal(location) as journal:
            await journal.append([_trigger(1), _trigger(2)])
            seen: list[int] = []
            async with journal.subscribe(2) as sub:
                async for batch in sub:
                    seen += _seqs(batch)
                    if seen[-1] == 2:
                        await journal.append([_trigger(3)])
                    if seen[-1] == 3:
                        break
            _expect(seen == [2, 3], f"a subscriber from 2 sees 2 then 3, not {seen}")

    async def _read_only_blank(self, location: str) -> None:
        await _refused(
            JournalForeign, "a read-only open of no journal is refused", location, readonly=True
        )

    async def _follower(self, location: str) -> None:
        clock = ManualClock()
        seen: list[int] = []
        async with open_journal(location) as journal:
            await journal.append([_trigger(1), _trigger(2)])

            async def follow() -> None:
                stream = follow_journal(location, 2, poll_s=1.0, clock=clock)
                async with contextlib.aclosing(stream) as batches:
                    async for batch in batches:
                        seen.extend(_seqs(batch))
                        if seen[-1] == 2:
                            await journal.append([_trigger(3)])
                        if seen[-1] == 3:
                            return

            # A bound on a follower that never sees event 3, not a timing assertion.
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(follow)
                    while seen[-1:] != [3]:
                        clock.advance(1.0)  # a polling follower reads again on its clock
                        await anyio.lowlevel.checkpoint()
        _expect(seen == [2, 3], f"a follower from 2 sees 2 then 3, not {seen}")

    async def _tree(self, location: str) -> None:
        async with open_journal(location, clock=ManualClock()) as journal:
            for n in range(7):
                await journal.append([_trigger(x) for x in range(n * 5, n * 5 + 5)])
            first = journal.tree_root
        async with open_journal(location, clock=ManualClock()) as journal:
            # Rebuilt from at most log2(n) stored nodes and the last < 16 events.
            _expect(journal.tree_root == first, "a reopened journal has the same tree root")
            await journal.append([_trigger(99)])
            leaves = [leaf_hash(_bare(e)) for e in await journal.read()]
            _expect(journal.tree_root == root_of(leaves), "the tree is over the events' bytes")
            trees = journal.trees()
            for size in (1, 16, 17, 35, 36):
                _expect(
                    await trees.root(size) == root_of(leaves[:size]), f"the root of size {size}"
                )
            for seq in (1, 16, 17, 36):
                proof = await trees.inclusion(seq, 36)
                _expect(
                    verify_inclusion(seq - 1, 36, leaves[seq - 1], proof, root_of(leaves)),
                    f"the inclusion proof of event {seq}",
                )
            proof = await trees.consistency(17, 36)
            _expect(
                verify_consistency(17, 36, proof, root_of(leaves[:17]), root_of(leaves)),
                "the consistency proof of 17 in 36",
            )
        report = await verify_journal(location)
        _expect(
            report.ok and report.tree_root == root_of(leaves).hex() and report.tree_stored,
            f"verify recomputes the stored tree ({report.problem})",
        )


class InboxStoreContract(_Location):
    """A pytest mixin: what every operator inbox store must do (kernel.journal.inbox_store)."""

    def test_contract_rows_are_inserted_read_and_marked_taken(self, tmp_path: Path) -> None:
        location = self.journal_location(tmp_path)
        anyio.run(_new_journal, location)
        with open_inbox(location) as store:
            _expect(store.rows() == [] and store.last_id() == 0, "a new inbox is empty")
            first = store.insert(b'{"a": 1}', 5)
            second = store.insert(b"\xff\xfe not utf-8", 6)
            _expect(second > first and store.last_id() == second, "ids grow with each insert")
            _expect(
                store.rows()
                == [
                    StoredRow(id=first, body=b'{"a": 1}', created_ts=5),
                    StoredRow(id=second, body=b"\xff\xfe not utf-8", created_ts=6),
                ],
                "rows read back as inserted, bytes that are not UTF-8 too",
            )
            _expect(store.taken_seq(first) is None, "a row not taken has no seq")
            store.mark_taken(first, 42)
            _expect(store.taken_seq(first) == 42, "a row marked taken has its seq")
            _expect(store.taken_seq(999) is None, "no row has no seq")
            _expect([r.id for r in store.rows(pending=True)] == [second], "pending: untaken rows")
            _expect(
                [r.id for r in store.rows(pending=False, after=first)] == [second],
                "after: rows with a greater id",
            )
            _expect(store.rows(pending=False)[0].taken_seq == 42, "a row read says what took it")
        with open_inbox(location, readonly=True) as reader:
            ids = [r.id for r in reader.rows(pending=False)]
            _expect(ids == [first, second], f"a read-only inbox reads every row ({ids})")


async def _new_journal(location: str) -> None:
    async with open_journal(location):
        pass
