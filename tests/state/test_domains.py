"""A domain plugs in with one registration line (issue 28).

``Tally`` below is a domain of this module's own, written as the budgets, grants,
artifacts and roadmap to come will be: a ledger of amounts by name. Its events are
the execution events of its own policy kind (``tally.add``: an event type of a new
domain would join the journal's schema in kernel.core), its fold keeps the totals,
its DIM check refuses an amount past a cap, its executor carries ``tally.add`` out
and its share of the saved state is ``tally``. No kernel module names it: the one
registration line is ``kernel.state.projections.DOMAINS``, set here through
``monkeypatch`` so that it does not outlive the test.
"""

from __future__ import annotations

import gc
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings

import kernel.state.projections
from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import FlowStatus, ReasonCode, open_kernel
from kernel.adapters import Receipt
from kernel.audit import open_journal, payload_of
from kernel.audit.reverify import rejudge
from kernel.config import KernelConfig, Ports
from kernel.core.events import (
    Event,
    ExecutionIntent,
    ExecutionStarted,
    ExecutionSucceeded,
    Feedback,
    Payload,
    ProposalRecord,
    ProposalRejected,
)
from kernel.core.flow import FlowState
from kernel.dim.verdict import domain_checks
from kernel.policy import PolicyKind, PolicyPack
from kernel.policy.packs import PackError
from kernel.policy.rules import View
from kernel.state.domain import (
    OMIT,
    Domain,
    DomainType,
    ExecutorFactory,
    ExecutorPorts,
    Fold,
    Saved,
    State,
)
from kernel.state.projections import DOMAINS, Projections, built_in, fold
from kernel.state.snapshots import (
    capture,
    decode_snapshot,
    encode_snapshot,
    saved_type,
    verify_projections,
)
from kernel.testing import ManualClock, SeededIds
from tests.support import GOLDEN
from tests.support.helpers import configured
from tests.support.hostile import hostile_scalars, hostile_text
from tests.support.principals import LOCAL

CAP = 10
"""The most a name may total."""


class Add(PolicyKind, frozen=True, tag="tally.add"):
    """Add ``amount`` to the total of ``name``."""

    adapter: ClassVar[str] = "tally"

    name: str
    amount: int


TALLY_PACK = PolicyPack(name="tally", version="1.0.0", kinds=(Add,), escalate_below_confidence=0.0)


class TallyState(msgspec.Struct, kw_only=True):
    totals: dict[str, int] = {}
    started: dict[str, tuple[str, int]] = {}
    """Intent key -> (name, amount) of each add started and not yet done."""


class TallyExecutor:
    """The domain's executor: the effect of an add is its recorded ExecutionSucceeded."""

    calls: ClassVar[list[str]] = []

    def __init__(self, ports: ExecutorPorts) -> None:
        self._projections = ports.projections

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        TallyExecutor.calls.append(intent.key)
        total = self._projections.domain(Tally).state.totals.get(intent.params["name"], 0)
        return Receipt(external_id=f"tally:{intent.key}", detail={"before": total})


class Tally(Domain):
    """The tally domain: everything a domain brings, in its own module."""

    name = "tally"

    def __init__(self, projections: State) -> None:
        self.state = TallyState()

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {ExecutionStarted: self._started, ExecutionSucceeded: self._succeeded}

    def _started(self, event: Event) -> None:
        intent = payload_of(event, ExecutionStarted).intent
        if intent.kind == "tally.add":
            self.state.started[intent.key] = (intent.params["name"], intent.params["amount"])

    def _succeeded(self, event: Event) -> None:
        found = self.state.started.pop(payload_of(event, ExecutionSucceeded).key, None)
        if found is not None:
            name, amount = found
            self.state.totals[name] = self.state.totals.get(name, 0) + amount

    def saved(self) -> Sequence[Saved]:
        def load(state: TallyState) -> None:
            self.state = state

        return (
            Saved(
                name="tally",
                type=TallyState,
                get=lambda: self.state,
                load=load,
                copy=lambda s: TallyState(totals=dict(s.totals), started=dict(s.started)),
                # Added after journals exist: left out while empty, so their digests hold.
                canonical=lambda s: msgspec.to_builtins(s) if s.totals or s.started else OMIT,
                default=msgspec.field(default_factory=TallyState),
            ),
        )

    def check(self, proposal: ProposalRecord, view: View, flow: FlowState) -> Feedback | None:
        if proposal.kind != "tally.add":
            return None
        name, amount = proposal.params["name"], proposal.params["amount"]
        running = sum(a for n, a in self.state.started.values() if n == name)
        total = self.state.totals.get(name, 0) + running + amount
        if amount <= 0 or total > CAP:
            return Feedback(
                reason_code=ReasonCode.RISK_LIMIT_EXCEEDED,
                detail=f"{name!r} would total {total}, past {CAP}",
                layer="tally",
                field="params.amount",
            )
        return None

    def executors(self) -> Mapping[str, ExecutorFactory | str]:
        return {"tally": TallyExecutor}


WITH_TALLY: tuple[DomainType, ...] = (*DOMAINS, Tally)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The one registration line, for this test only."""
    monkeypatch.setattr(kernel.state.projections, "DOMAINS", WITH_TALLY)
    TallyExecutor.calls.clear()
    yield


class Counter(Agent):
    """Proposes the next amount of its list, one per flow, once (no second attempt)."""

    def __init__(self, amounts: list[int]) -> None:
        self.manifest = Manifest(
            agent_id="counter",
            version="1.0.0",
            capabilities=["tally.add"],
            subscriptions=["tally"],
            max_attempts=1,
        )
        self.amounts = amounts

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        return ctx.propose(Add(name="apples", amount=self.amounts.pop(0)), explain="count")


def _config(**settings: Any) -> KernelConfig:
    return configured(
        KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(7))),
        **settings,
    )


async def test_a_domain_plugs_in_with_one_registration_line(
    tmp_path: Path, registered: None
) -> None:
    path = tmp_path / "j.db"
    amounts = [3, 4, 5, 2]
    async with open_kernel(
        path,
        packs=[TALLY_PACK],
        adapters={},
        allow=["counter"],
        config=_config(checkpoint_every=12),
    ) as running:
        await running.register(Counter(amounts))
        ended = []
        for n in range(4):
            [dfid] = await running.trigger("tally", {"tally.request": n})
            ended.append((await running.wait_flow(dfid)).status)
        live = running.projections
        # 3 + 4 + 2 counted; 5 refused by the domain's check (7 + 5 > 10), never executed.
        assert ended == [
            FlowStatus.CLOSED,
            FlowStatus.CLOSED,
            FlowStatus.ABORTED,
            FlowStatus.CLOSED,
        ]
        assert live.domain(Tally).state.totals == {"apples": 9}
        assert len(TallyExecutor.calls) == 3  # built by the kernel: no "tally" adapter given
        digest, last = live.digest(), live.last_seq
        assert live.snapshot()["tally"] == {"totals": {"apples": 9}, "started": {}}

        # The saved state round trips through a snapshot, the domain's share with it.
        body_digest, body = encode_snapshot(capture(live))
        restored = decode_snapshot(body)
        assert restored is not None and body_digest == restored.digest() == digest
        assert restored.domain(Tally).state == live.domain(Tally).state

    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
        # Replay equals the live fold; every checkpoint and snapshot the kernel wrote agrees.
        assert fold(e for e in events if e.seq <= last).digest() == digest
        report = await verify_projections(journal)
        assert report.ok and report.checkpoints and report.snapshots, report.problems
        # The domain's check is part of the verdict replay judges again.
        judged = await rejudge(journal, [TALLY_PACK])
    assert judged.mismatches == [] and judged.judged == 4
    [rejected] = [e.payload for e in events if isinstance(e.payload, ProposalRejected)]
    assert rejected.feedback.layer == "tally"
    assert rejected.feedback.reason_code is ReasonCode.RISK_LIMIT_EXCEEDED


async def test_without_the_registration_line_the_kernel_knows_no_tally(tmp_path: Path) -> None:
    assert "tally" not in built_in() and "tally" in built_in(WITH_TALLY)
    with pytest.raises(PackError, match="no adapter registered for tally"):
        async with open_kernel(
            tmp_path / "j.db", packs=[TALLY_PACK], adapters={}, allow=[], config=_config()
        ):
            pass


async def test_a_domain_added_later_leaves_older_digests_alone(
    tmp_path: Path, registered: None
) -> None:
    # Folded with the tally registered, the golden journal hashes as its kernel recorded.
    expected = msgspec.json.decode((GOLDEN / "trading.json").read_bytes())["projection_hash"]
    path = tmp_path / "trading.db"
    path.write_bytes((GOLDEN / "trading.db").read_bytes())
    async with open_journal(path, readonly=True) as journal:
        projections = fold(await journal.read())
    assert "tally" in saved_type(projections).__struct_fields__
    assert projections.digest() == expected


def test_a_field_saved_twice_or_a_domain_registered_twice_is_refused() -> None:
    class Twin(Tally):
        name = "twin"

        def executors(self) -> Mapping[str, ExecutorFactory | str]:
            return {}

    with pytest.raises(ValueError, match="saved-state fields declared twice: tally"):
        Projections(domains=(*DOMAINS, Tally, Twin))
    with pytest.raises(ValueError, match="registered twice"):
        Projections(domains=(*DOMAINS, Tally, Tally))
    with pytest.raises(LookupError, match="Tally is not registered"):
        Projections().domain(Tally)


class Hostile(Counter):
    """Proposes one add of whatever it is given, past the SDK's types."""

    def __init__(self, name: Any, amount: Any) -> None:
        super().__init__([])
        self.name, self.amount = name, amount

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        policy = {"kind": "tally.add", "name": self.name, "amount": self.amount}
        return ctx.propose(policy, explain="count")


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=hostile_text(max_size=16), amount=hostile_scalars())
@example(name="pears", amount=3)  # within the cap: counted
@example(name="pears", amount=11)  # past it: refused by the domain's check
async def test_hostile_adds_are_judged_or_refused_and_replay_agrees(
    tmp_path: Path, registered: None, name: Any, amount: Any
) -> None:
    path = tmp_path / f"{uuid.uuid4()}.db"
    async with open_kernel(
        path, packs=[TALLY_PACK], adapters={}, allow=["counter"], config=_config()
    ) as running:
        await running.register(Hostile(name, amount))
        [dfid] = await running.trigger("tally", {"tally.request": 1})
        ended = await running.wait_flow(dfid)
        assert ended.status in (FlowStatus.CLOSED, FlowStatus.ABORTED)
        totals = running.projections.domain(Tally).state.totals
        # Counted only as judged: an int within the cap, under a name the journal can hold.
        assert all(0 < total <= CAP for total in totals.values())
        assert (ended.status is FlowStatus.CLOSED) == (totals == {name: amount})
        digest, last = running.projections.digest(), running.projections.last_seq
    async with open_journal(path, readonly=True) as journal:
        assert fold(e for e in await journal.read() if e.seq <= last).digest() == digest


async def test_projections_are_freed_without_the_cyclic_gc(tmp_path: Path) -> None:
    """No reference cycle: a fold, a recall or a replay frees its state as it is dropped.

    Domains and the fold table reach their projections weakly; a cycle would leave every
    dropped Projections, and all it holds, to the cyclic GC (replay slowed by a tenth).
    """
    path = tmp_path / "booking.db"
    path.write_bytes((GOLDEN / "booking.db").read_bytes())
    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
    gc.disable()
    try:
        folded = fold(events)
        restored = decode_snapshot(encode_snapshot(capture(folded))[1])
        assert restored is not None and restored.memory.constraints  # it folded something
        gone = [weakref.ref(folded), weakref.ref(restored)]
        del folded, restored
        assert [ref() for ref in gone] == [None, None]
    finally:
        gc.enable()


def test_a_domain_is_asked_only_about_the_kinds_it_judges() -> None:
    asked: list[str] = []

    class Judging(Tally):
        def judges(self, kind: str) -> bool:
            return kind.startswith("tally.")

        def check(self, proposal: ProposalRecord, view: View, flow: FlowState) -> Feedback | None:
            asked.append(proposal.kind)
            return super().check(proposal, view, flow)

    projections = Projections(domains=(*DOMAINS, Judging))
    [judging] = [d for d in projections.domains if isinstance(d, Judging)]
    assert judging in projections.judging("tally.add")[0]
    # Governed memory judges every kind; beliefs and the roadmap only their own.
    assert [type(d).__name__ for d in projections.judging("bench.order")[0]] == ["Memory"]
    assert projections.judging("bench.order")[1] == ()
    flow = FlowState(
        dfid="d",
        root_dfid="d",
        parent_dfid=None,
        agent_id="a",
        topic="t",
        status=FlowStatus.ACTIVE,
        created_ts=0,
        updated_ts=0,
        last_seq=0,
    )
    check = domain_checks(projections, flow)
    view = View({}, {}, 0, "a")
    over = {"name": "n", "amount": CAP + 1}
    assert check(ProposalRecord(kind="other.kind", params=over), view) is None
    refused = check(ProposalRecord(kind="tally.add", params=over), view)
    assert refused is not None and refused.reason_code is ReasonCode.RISK_LIMIT_EXCEEDED
    assert asked == ["tally.add"]
