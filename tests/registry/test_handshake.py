"""The manifest handshake, session tokens and agent status."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from kernel import AgentStatus, FlowStatus, HandshakeRefused, Kernel, Outcome, ReasonCode
from kernel.audit import payload_of
from kernel.core.events import AgentRefused, AgentRegistered, ProposalRejected, SubmissionRefused
from kernel.state.projections import session_hash
from tests.support.bodies import readable_bytes
from tests.support.helpers import ALL_KINDS, ScriptedAgent, flow_of, kernel_for


@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        ("1.0.0", True),
        ("1.2", True),
        ("1.2.7-rc.1", True),
        ("1.3.0", False),
        ("2.0.0", False),
        ("0.9.0", False),
        ("one", False),
    ],
)
async def test_contract_versions(kernel: Kernel, version: str, accepted: bool) -> None:
    agent = ScriptedAgent(version=version)
    if accepted:
        session = await kernel.register(agent)
        assert session.agent_id == "clerk"
        return
    with pytest.raises(HandshakeRefused) as refused:
        await kernel.register(agent)
    assert refused.value.reason_code is ReasonCode.VERSION_MISMATCH
    [event] = await kernel.journal.read(types=["AgentRefused"])
    assert payload_of(event, AgentRefused).reason_code is ReasonCode.VERSION_MISMATCH


async def test_an_agent_outside_the_allowlist_is_unknown(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db", allow=["clerk"]) as kernel:
        with pytest.raises(HandshakeRefused) as refused:
            await kernel.register(ScriptedAgent("mallory"))
        assert refused.value.reason_code is ReasonCode.UNKNOWN_AGENT
        assert "mallory" not in kernel.projections.agents


async def test_capabilities_must_be_known_kinds(kernel: Kernel) -> None:
    with pytest.raises(HandshakeRefused) as refused:
        await kernel.register(ScriptedAgent(capabilities=["test.transfer", "bank.drain"]))
    assert refused.value.reason_code is ReasonCode.SCHEMA_INVALID
    assert "bank.drain" in refused.value.detail


async def test_the_session_carries_schemas_and_the_journal_only_a_hash_of_the_token(
    tmp_path: Path, kernel: Kernel
) -> None:
    session = await kernel.register(ScriptedAgent(capabilities=ALL_KINDS[:2]))
    assert set(session.schemas) == {"test.transfer", "test.note"}
    transfer = session.schemas["test.transfer"]["$defs"]["Transfer"]
    assert transfer["properties"]["amount_cents"] == {"type": "integer"}
    [registered] = await kernel.journal.read(types=["AgentRegistered"])
    assert payload_of(registered, AgentRegistered).session_hash == session_hash(session.token)
    raw = readable_bytes(tmp_path / "j.db")
    assert session.token.encode() not in raw


async def test_a_forged_token_is_refused_and_the_flow_goes_on(tmp_path: Path) -> None:
    gate = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(hold=gate)
        await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()
        proposal = agent.steps[0](agent.contexts[0])
        assert proposal is not None

        verdict = await kernel.submit("forged-token", dfid, proposal)
        assert verdict.outcome is Outcome.REFUSED
        assert verdict.reason_code is ReasonCode.INVALID_SESSION
        assert flow_of(kernel, dfid).status is FlowStatus.ACTIVE
        assert flow_of(kernel, dfid).attempts == 0

        gate.set()
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        [refused] = await kernel.journal.read(dfid=dfid, types=["SubmissionRefused"])
        assert payload_of(refused, SubmissionRefused).reason_code is ReasonCode.INVALID_SESSION


async def test_another_agents_token_cannot_act_on_a_flow(tmp_path: Path) -> None:
    gate = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(hold=gate)
        await kernel.register(agent)
        other = await kernel.handshake(ScriptedAgent("other", subscriptions=["elsewhere"]).manifest)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()
        proposal = agent.steps[0](agent.contexts[0])
        assert proposal is not None
        verdict = await kernel.submit(other.token, dfid, proposal)
        assert verdict.reason_code is ReasonCode.FLOW_NOT_ACTIVE
        gate.set()
        await kernel.wait_flow(dfid)


async def test_a_kind_outside_the_capabilities_is_unauthorized(kernel: Kernel) -> None:
    agent = ScriptedAgent(
        max_attempts=1, steps=[lambda ctx: ctx.propose({"kind": "test.note", "text": "hi"})]
    )
    await kernel.register(agent)
    [dfid] = await kernel.trigger("bank.invoice")
    flow = await kernel.wait_flow(dfid)
    [rejected] = await kernel.journal.read(dfid=dfid, types=["ProposalRejected"])
    feedback = payload_of(rejected, ProposalRejected).feedback
    assert feedback.reason_code is ReasonCode.UNAUTHORIZED
    assert feedback.layer == "authority"
    assert flow.status is FlowStatus.ABORTED


async def test_a_new_handshake_replaces_the_old_token(tmp_path: Path) -> None:
    gate = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(hold=gate)
        first = await kernel.register(agent)
        second = await kernel.handshake(agent.manifest)
        assert first.token != second.token
        # The agent submits on its own now (as over the bus): its contexts come here.
        contexts = kernel.route("clerk")
        [dfid] = await kernel.trigger("bank.invoice")
        context = await contexts.receive()
        proposal = agent.steps[0](context)
        assert proposal is not None
        assert (
            await kernel.submit(first.token, dfid, proposal)
        ).reason_code is ReasonCode.INVALID_SESSION
        assert (await kernel.submit(second.token, dfid, proposal)).outcome is Outcome.ACCEPTED


async def test_status_changes_gate_proposals_and_handshakes(tmp_path: Path) -> None:
    gate = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(hold=gate, max_attempts=1)
        await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()
        await kernel.set_agent_status("clerk", AgentStatus.PASSIVE, operator="ana", reason="review")
        gate.set()
        flow = await kernel.wait_flow(dfid)
        assert flow.reason_code is ReasonCode.REASONING_EXHAUSTION
        [rejected] = await kernel.journal.read(dfid=dfid, types=["ProposalRejected"])
        assert (
            payload_of(rejected, ProposalRejected).feedback.reason_code is ReasonCode.AGENT_PASSIVE
        )
        # A PASSIVE agent is not woken; a new handshake does not lift the demotion.
        assert await kernel.trigger("bank.invoice") == []
        await kernel.register(agent)
        assert kernel.projections.agents["clerk"].status is AgentStatus.PASSIVE

        await kernel.set_agent_status("clerk", "SUSPENDED", operator="ana", reason="incident")
        with pytest.raises(HandshakeRefused) as refused:
            await kernel.handshake(agent.manifest)
        assert refused.value.reason_code is ReasonCode.AGENT_SUSPENDED
        await kernel.set_agent_status("clerk", "ACTIVE", operator="ana", reason="cleared")
        assert len(await kernel.trigger("bank.invoice")) == 1
