"""Replay: a journal with principals re-judges exactly as recorded; old journals act for nobody."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from kernel.audit import Projections, open_journal
from kernel.audit.reverify import Rejudged, rejudge
from kernel.cli import main
from kernel.core.events import Event, FlowCreated, ProposalAccepted, ProposalRejected
from kernel.dim.verdict import PRINCIPAL_FOLD, Staged, behalf_of
from kernel.state.principals import Principals
from kernel.testing import ManualClock
from policies.booking import BOOKING
from policies.booking_0_1 import BOOKING_0_1
from policies.memory_1_0 import MEMORY_PACK_1_0
from tests.principals.kit import ACME, ANN, BOB, GLOBEX, PEOPLE, call, people
from tests.support import GOLDEN


async def _workload(db: Path) -> None:
    clock = ManualClock()
    async with people(db, clock=clock) as kernel:
        await call(kernel, "people.ping")  # nobody
        await call(kernel, "people.pay", ANN)  # no tenant declared yet: runs
        await kernel.declare_tenant(ACME)
        await kernel.declare_tenant(GLOBEX)
        await kernel.change_tenant_policy("acme", rate_per_minute=3)
        await kernel.change_tenant_policy("acme", user="bob", kind="people.look", permission="deny")
        for _ in range(4):
            await call(kernel, "people.look", ANN)
        await call(kernel, "people.look", BOB)
        await call(kernel, "people.pay", BOB)
        await kernel.delegate(ANN, from_agent="front", to_agent="helper", scopes=["read"])
        clock.advance(61)
        await call(kernel, "people.pay", ANN, agent="helper", tier="subagent")
        await call(kernel, "people.look", ANN, agent="helper", tier="subagent")
        await kernel.change_tenant_policy("acme", rate_per_minute=1, reason="tighten")
        await call(kernel, "people.look", ANN)
        await call(kernel, "people.look", ANN)


async def _rejudged(db: Path) -> tuple[list[Event], list[Event], Rejudged]:
    async with open_journal(db, readonly=True) as journal:
        rejected = await journal.read(types=["ProposalRejected"])
        accepted = await journal.read(types=["ProposalAccepted"])
        return rejected, accepted, await rejudge(journal, [PEOPLE])


def test_a_journal_with_principals_rejudges_as_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    anyio.run(_workload, db)
    rejected, accepted, result = anyio.run(_rejudged, db)
    codes = {
        str(e.payload.feedback.reason_code)
        for e in rejected
        if isinstance(e.payload, ProposalRejected)
    }
    assert codes >= {
        "PRINCIPAL_MISSING",
        "RATE_LIMITED",
        "POLICY_DENIED",
        "SCOPE_MISSING",
        "SCOPE_NOT_DELEGATED",
    }
    assert all(isinstance(e.payload, ProposalAccepted) for e in accepted) and accepted
    assert result.changes == [] and result.mismatches == []
    assert result.judged == len(rejected) + len(accepted) and result.skipped == 0
    pack = "tests.principals.kit:PEOPLE"
    assert main(["verify", "--db", str(db), "--verdicts", "--pack", pack]) == 0
    assert "0 differ" in capsys.readouterr().out


async def test_an_old_journal_opens_and_its_flows_act_for_nobody(tmp_path: Path) -> None:
    db = tmp_path / "booking.db"
    shutil.copyfile(GOLDEN / "booking.db", db)
    expected = json.loads((GOLDEN / "booking.json").read_text())
    async with open_journal(db, readonly=True) as journal:
        created = await journal.read(types=["FlowCreated"])
        projections = Projections()
        async for batch in journal.scan():
            projections.apply(batch)
        result = await rejudge(journal, [BOOKING, BOOKING_0_1, MEMORY_PACK_1_0])
    assert created and all(
        isinstance(e.payload, FlowCreated) and e.payload.on_behalf is None for e in created
    )
    # Its fold rules predate principals: the layer does not judge its flows.
    assert projections.fold < PRINCIPAL_FOLD
    flow = next(iter(projections.flows.values()))
    assert behalf_of(projections, flow, 0, Staged()) is None
    domain = projections.domain(Principals)
    assert not (domain.tenants or domain.delegations or domain.on_behalf)
    assert projections.digest() == expected["projection_hash"]
    assert result.changes == [] and result.mismatches == []


async def _racing(db: Path) -> None:
    async with people(db) as kernel:
        await kernel.declare_tenant(ACME)

        async def calls(agent: str) -> None:
            for _ in range(40):
                await call(kernel, "people.look", ANN, agent=agent)

        async def changes() -> None:
            for i in range(40):
                permission = "deny" if i % 2 == 0 else "allow"
                await kernel.change_tenant_policy(
                    "acme", user="ann", kind="people.look", permission=permission
                )

        async with anyio.create_task_group() as tg:
            for agent in ("front", "helper", "worker"):
                tg.start_soon(calls, agent)
            tg.start_soon(changes)


def test_policy_changes_racing_calls_rejudge_as_recorded(tmp_path: Path) -> None:
    # Tenant acts are ordered with the verdicts (the DIM records them): a change and the
    # calls judged around it, in one group commit or not, replay as they were recorded.
    db = tmp_path / "j.db"
    anyio.run(_racing, db)
    rejected, accepted, result = anyio.run(_rejudged, db)
    assert rejected and accepted  # the changes fell between calls both ways
    assert result.changes == [] and result.mismatches == []
