"""One audit record per attempt, from the journal alone (kernel.audit.attempts).

An attempt is an agent's proposal with its first verdict, whichever layer gave it, or a
call decided while the store was away; whom it was for is its flow's ``on_behalf``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.audit.attempts import Attempt, attempts
from kernel.core import events as ev
from kernel.journal.opening import open_journal
from tests.attempts.journal import LAYERS, Call, Verdict, write
from tests.proposals.test_propose import (
    CHEAP,
    NO_SUCH_ROOM,
    OVER_LIMIT,
    OVER_THRESHOLD,
    Hotel,
    book,
    booking_kernel,
)

pytestmark = pytest.mark.anyio

GOLDEN = Path(__file__).parent.parent / "golden"

DENY_AT = {layer: Verdict("deny", layer) for layer in LAYERS}
CALLS = [
    Call("t-a", "alice", "clerk", "mail.read", (Verdict("allow"),)),
    Call("t-a", "alice", "worker", "mail.send", (DENY_AT["principal"], Verdict("allow")),
         chain=("orchestrator", "worker"), tier="subagent"),
    Call("t-b", "bob", "clerk", "mail.read", (DENY_AT["schema"], DENY_AT["rules"])),
    Call("t-a", "carol", "clerk", "admin.grant", (Verdict("escalate", code="APPROVAL_REQUIRED"),)),
    Call("t-b", "bob", "clerk", "mail.read", (Verdict("allow"),), without_journal=True),
    Call("t-a", "alice", "clerk", "mail.send",
         (Verdict("deny", code="GOVERNANCE_UNAVAILABLE"),), without_journal=True),
    Call("", "", "old-agent", "mail.read", (DENY_AT["limits"], Verdict("allow"))),
]  # fmt: skip


async def rows(path: Path, tenant: str | None = None, user: str | None = None) -> list[Attempt]:
    async with open_journal(path, readonly=True) as journal:
        return [row async for row in attempts(journal, tenant=tenant, user=user)]


async def test_a_journal_with_refusals_at_several_layers_yields_exactly_one_row_per_attempt(
    tmp_path: Path,
) -> None:
    written = await write(tmp_path / "j.db", CALLS)

    found = await rows(written.path)

    assert [(r.tenant, r.user, r.decision, r.trace_id) for r in found] == written.expected
    assert len(found) == 10  # 1 + 2 + 2 + 1 (the human's approval is no attempt) + 1 + 1 + 2
    layers = {r.layer for r in found if r.decision == "deny" and not r.without_journal}
    assert layers == {"principal", "schema", "rules", "limits"}
    delegated = [r for r in found if r.agent == "worker"]
    assert [(r.chain, r.tier, r.attempt) for r in delegated] == [
        (["orchestrator", "worker"], "subagent", 1),
        (["orchestrator", "worker"], "subagent", 2),
    ]
    assert all(r.email == f"{r.user}@example.com" for r in found if r.principal)
    spooled = [r for r in found if r.without_journal]
    assert [(r.tenant, r.decision, r.reason_code) for r in spooled] == [
        ("t-b", "allow", ""),
        ("t-a", "deny", "GOVERNANCE_UNAVAILABLE"),
    ]
    escalated = [r for r in found if r.decision == "escalate"]
    assert [(r.user, r.kind, r.reason_code) for r in escalated] == [
        ("carol", "admin.grant", "APPROVAL_REQUIRED")
    ]


async def test_a_flow_with_no_principal_says_so(tmp_path: Path) -> None:
    written = await write(tmp_path / "j.db", CALLS)

    old = await rows(written.path, tenant="")

    assert [(r.agent, r.decision, r.principal, r.user, r.tier) for r in old] == [
        ("old-agent", "deny", False, "", ""),
        ("old-agent", "allow", False, "", ""),
    ]


tenants = st.sampled_from(["t-a", "t-b", "t-c", ""])
users = st.sampled_from(["alice", "bob", "carol"])
verdicts = st.one_of(
    st.builds(Verdict, st.just("allow")),
    st.builds(Verdict, st.just("deny"), st.sampled_from(LAYERS)),
    st.builds(Verdict, st.just("escalate")),
)
calls = st.builds(
    Call,
    tenants,
    users,
    st.sampled_from(["a1", "a2"]),
    st.sampled_from(["k.read", "k.write"]),
    st.lists(verdicts, min_size=1, max_size=3).map(tuple),
    without_journal=st.booleans(),
)


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(calls, max_size=8), tenants, st.one_of(st.none(), users))
async def test_the_tenant_filter_never_shows_another_tenants_row(
    tmp_path: Path, drawn: list[Call], tenant: str, user: str | None
) -> None:
    path = tmp_path / "j.db"
    path.unlink(missing_ok=True)
    written = await write(path, drawn)

    found = await rows(path, tenant=tenant, user=user)

    assert all(r.tenant == tenant for r in found)
    assert user is None or all(r.user == user for r in found)
    wanted = [e for e in written.expected if e[0] == tenant and (user is None or e[1] == user)]
    assert [(r.tenant, r.user, r.decision, r.trace_id) for r in found] == wanted


async def test_rows_of_a_real_kernel_are_its_verdicts_one_per_proposal(tmp_path: Path) -> None:
    """Driven through Kernel.propose: accepted, refused at two layers, escalated."""
    path = tmp_path / "j.db"
    async with booking_kernel(path, Hotel()) as kernel:
        for params in (CHEAP, OVER_LIMIT, NO_SUCH_ROOM, OVER_THRESHOLD):
            await book(kernel, params)
        verdict_types = {"ProposalAccepted", "ProposalRejected", "FlowEscalated"}
        events = await kernel.journal.read(types=sorted(verdict_types | {"ProposalSubmitted"}))

    found = await rows(path)

    submitted = [e for e in events if isinstance(e.payload, ev.ProposalSubmitted)]
    assert len(found) == len(submitted) == 4
    by_flow = {e.dfid: e.payload for e in events if e.type in verdict_types}
    words = {
        ev.ProposalAccepted: "allow",
        ev.ProposalRejected: "deny",
        ev.FlowEscalated: "escalate",
    }
    assert [r.decision for r in found] == [words[type(by_flow[r.trace_id])] for r in found]
    assert {r.kind for r in found} == {"booking.reserve_room"}
    assert all(r.agent == "sdk-agent" for r in found)


@pytest.mark.parametrize("name", ["booking", "trading"])
async def test_a_golden_journal_from_before_principals_opens_and_its_rows_have_no_principal(
    tmp_path: Path, name: str
) -> None:
    copy = tmp_path / f"{name}.db"
    shutil.copy(GOLDEN / f"{name}.db", copy)

    found = await rows(copy)

    assert found
    assert all(not r.principal and r.tenant == "" and r.user == "" for r in found)
    assert await rows(copy, tenant="t-a") == []
