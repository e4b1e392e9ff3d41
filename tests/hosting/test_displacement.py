"""An in-process agent displaced by a new handshake leaves no flow ACTIVE for good.

Before, a second handshake for a hosted agent id (no credential provisioned: in
process that is allowed) replaced its session; the hosted agent kept thinking under
the old token, its submission was refused, and its flow, and every later one routed
to it, stayed ACTIVE (mission-gaps-and-frameworks.md, F5). Now the flows it was
thinking about end when the new session is recorded (INVALID_SESSION, saying why),
and the id's crew either goes (a handshake that hosts nothing) or is replaced (a new
``register``).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kernel import FlowStatus, HandshakeRefused, Manifest, ReasonCode
from kernel.audit import verify_journal
from kernel.core.events import FlowAborted
from tests.support.helpers import ScriptedAgent, flow_of, kernel_for, transfer


async def test_a_handshake_that_displaces_a_hosted_agent_ends_its_flows(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        hold = anyio.Event()
        thinking = ScriptedAgent(hold=hold)
        await kernel.register(thinking)
        [held] = await kernel.trigger("bank.invoice")
        await thinking.wait_context()
        manifest = Manifest(
            agent_id="clerk", version="1.0", capabilities=["test.transfer"], subscriptions=["bank"]
        )
        await kernel.handshake(manifest)  # the agent now submits on its own
        flow = await kernel.wait_flow(held)
        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.INVALID_SESSION
        [aborted] = await kernel.journal.read(dfid=held, types=["FlowAborted"])
        assert isinstance(aborted.payload, FlowAborted)
        assert "displaced by a new handshake" in aborted.payload.detail
        # No flow is opened for an agent no longer hosted here, and none is left moving.
        assert await kernel.trigger("bank.invoice") == []
        assert not kernel.projections.moving
        hold.set()  # its late answer changes nothing
        await kernel.wait_quiet()
        assert flow_of(kernel, held).status is FlowStatus.ABORTED
    assert (await verify_journal(path)).ok


async def test_registering_another_agent_under_the_id_ends_the_old_ones_flows_and_hosts_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        old = ScriptedAgent(hold=anyio.Event())
        await kernel.register(old)
        [held] = await kernel.trigger("bank.invoice")
        await old.wait_context()
        await kernel.register(ScriptedAgent(steps=[transfer(), transfer()]))
        flow = await kernel.wait_flow(held)
        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.INVALID_SESSION
        # The new agent holds the id now: the next flow is its, and it closes.
        [fresh] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(fresh)).status is FlowStatus.CLOSED
        await kernel.wait_quiet()
        assert not kernel.projections.moving
    assert (await verify_journal(path)).ok


async def test_a_refused_handshake_displaces_no_one(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        hold = anyio.Event()
        thinking = ScriptedAgent(hold=hold)
        await kernel.register(thinking)
        [held] = await kernel.trigger("bank.invoice")
        await thinking.wait_context()
        wrong = Manifest(agent_id="clerk", version="9.0", capabilities=["test.transfer"])
        with pytest.raises(HandshakeRefused) as refused:
            await kernel.handshake(wrong)
        assert refused.value.reason_code is ReasonCode.VERSION_MISMATCH
        hold.set()
        assert (await kernel.wait_flow(held)).status is FlowStatus.CLOSED
    assert (await verify_journal(path)).ok
