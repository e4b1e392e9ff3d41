"""Agent credentials: provisioned by an operator, shown on every handshake once provisioned.

A handshake without the credential, or with another, is refused with
CREDENTIAL_INVALID, recorded, and never revokes the live session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import FlowStatus, HandshakeRefused, Kernel, Outcome, ReasonCode
from kernel.audit import payloads
from kernel.core.events import AgentRefused
from kernel.core.wall import InputInvalid
from kernel.registry import credential_matches, credential_verifier, new_credential
from kernel.state.projections import session_hash
from tests.cli.test_operator_admin import WAIT, dirk, live
from tests.support.bodies import readable_bytes
from tests.support.helpers import ScriptedAgent, kernel_for
from tests.support.operators import Keys


async def provision(kernel, agent_id="clerk") -> str:  # type: ignore[no-untyped-def]
    secret = new_credential()
    await kernel.issue_credential(
        agent_id, credential_verifier(secret), operator="ana", reason="onboarding"
    )
    return secret


async def test_without_a_provisioned_credential_in_process_agents_handshake_as_before(
    kernel: Kernel,
) -> None:
    session = await kernel.register(ScriptedAgent())
    assert session.agent_id == "clerk"
    # The bus asks for one: nothing provisioned means no handshake there.
    with pytest.raises(HandshakeRefused) as refused:
        await kernel.handshake(ScriptedAgent().manifest, require_credential=True)
    assert refused.value.reason_code is ReasonCode.CREDENTIAL_INVALID


async def test_a_handshake_without_the_credential_is_refused_and_the_live_session_survives(
    tmp_path: Path,
) -> None:
    gate = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        secret = await provision(kernel)
        agent = ScriptedAgent(hold=gate)
        session = await kernel.register(agent, credential=secret)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()

        # An impostor: no credential, then a wrong one, then the right one but not a string.
        impostor = ScriptedAgent(capabilities=["test.transfer", "test.note"])
        for shown in (None, new_credential(), secret[:-1], 12345):
            with pytest.raises(HandshakeRefused) as refused:
                await kernel.handshake(impostor.manifest, credential=shown)  # type: ignore[arg-type]
            assert refused.value.reason_code is ReasonCode.CREDENTIAL_INVALID
        refusals = await kernel.journal.read(types=["AgentRefused"])
        assert [p.reason_code for p in payloads(refusals, AgentRefused)] == [
            ReasonCode.CREDENTIAL_INVALID
        ] * 4
        assert all(e.agent_id == "clerk" for e in refusals)
        # The real agent's session was not revoked: its proposal is judged.
        assert kernel.projections.sessions[session_hash(session.token)] == "clerk"
        proposal = agent.steps[0](agent.contexts[0])
        assert proposal is not None
        verdict = await kernel.submit(session.token, dfid, proposal)
        assert verdict.outcome is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        gate.set()
        # The secret is nowhere in the journal; its verifier is.
        raw = readable_bytes(tmp_path / "j.db")
        assert secret.encode() not in raw
        assert credential_verifier(secret).encode() in raw


async def test_rotation_replaces_the_credential_and_keeps_sessions(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        old = await provision(kernel)
        session = await kernel.register(ScriptedAgent(), credential=old)
        new = await provision(kernel)
        with pytest.raises(HandshakeRefused):
            await kernel.handshake(ScriptedAgent().manifest, credential=old)
        assert kernel.projections.sessions[session_hash(session.token)] == "clerk"
        fresh = await kernel.handshake(ScriptedAgent().manifest, credential=new)
        # A handshake that passes replaces the session, as before.
        assert session_hash(session.token) not in kernel.projections.sessions
        assert kernel.projections.sessions[session_hash(fresh.token)] == "clerk"
    # Replayed from the journal, the rotated credential is still the one in force.
    async with kernel_for(tmp_path / "j.db") as kernel:
        assert credential_matches(kernel.projections.credentials["clerk"], new)
        with pytest.raises(HandshakeRefused):
            await kernel.register(ScriptedAgent())
        await kernel.register(ScriptedAgent(), credential=new)


async def test_credentials_are_refused_for_unknown_agents_and_malformed_verifiers(
    kernel: Kernel,
) -> None:
    with pytest.raises(HandshakeRefused) as refused:
        await kernel.issue_credential("mallory", credential_verifier("x"), operator="a", reason="b")
    assert refused.value.reason_code is ReasonCode.UNKNOWN_AGENT
    with pytest.raises(HandshakeRefused) as refused:
        await kernel.issue_credential("clerk", "the secret itself", operator="a", reason="b")
    assert refused.value.reason_code is ReasonCode.SCHEMA_INVALID
    with pytest.raises(InputInvalid):
        await kernel.issue_credential("clerk", credential_verifier("x"), operator="", reason="b")
    assert await kernel.journal.read(types=["CredentialIssued"]) == []


async def test_an_operator_issues_a_credential_through_the_inbox(
    tmp_path: Path, operator_keys: Keys
) -> None:
    db = tmp_path / "j.db"
    async with live(db) as kernel:
        change = ("--operator", "ana", "--reason", "new host", "--wait", WAIT, "--db", db)
        code, out, err = await dirk("agent", "clerk", "--issue-credential", *change)
        assert code == 0, err
        secret, applied = out.splitlines()
        assert applied.startswith("applied: credential of clerk by ana")
        assert "shown only this once" in err
        with pytest.raises(HandshakeRefused):
            await kernel.register(ScriptedAgent())
        await kernel.register(ScriptedAgent(), credential=secret)
        [issued] = await kernel.journal.read(types=["CredentialIssued"])
        assert issued.payload.inbox_id == 1 and issued.payload.operator == "ana"
        assert issued.payload.verifier == credential_verifier(secret)
    code, _, err = await dirk("agent", "clerk", "--issue-credential", "--db", db)
    assert code == 2 and err.startswith("error: SCHEMA_INVALID:")


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(shown=st.one_of(st.none(), st.text(max_size=80), st.integers(), st.binary(max_size=40)))
def test_no_credential_but_the_provisioned_one_handshakes(
    tmp_path_factory: pytest.TempPathFactory, shown: Any
) -> None:
    secret = "dirk_fixed-secret-for-the-property"

    async def main() -> None:
        path = tmp_path_factory.mktemp("cred") / "j.db"
        async with kernel_for(path) as kernel:
            await kernel.issue_credential(
                "clerk", credential_verifier(secret), operator="ana", reason="property"
            )
            session = await kernel.register(ScriptedAgent(), credential=secret)
            if shown == secret:
                return
            with pytest.raises(HandshakeRefused) as refused:
                await kernel.handshake(ScriptedAgent().manifest, credential=shown)
            assert refused.value.reason_code is ReasonCode.CREDENTIAL_INVALID
            assert kernel.projections.sessions[session_hash(session.token)] == "clerk"

    anyio.run(main)
