"""Issue 31 through the mesh: a remote agent is held to a constraint by meaning, and reads
only the artifacts its context names (real nats-server, a real host process)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import anyio

from kernel import MEMORY_PACK, FlowStatus, Kernel, ReasonCode
from kernel.core.events import InputRefused
from tests.support.mesh_agents import GRANVIA, PAYROLL
from tests.support.mesh_helpers import STEP_S, host, meshed, provision
from tests.support.nats import (  # noqa: F401
    NatsServer,
    nats_server_fixture,
    principals_fixture,
)

STATEMENT = b"Hotel Granvia: level entrance, lift to all floors, room 4 step-free.\n" * 60


async def ended(kernel: Kernel, topic: str) -> str:
    [dfid] = await kernel.trigger(topic)
    with anyio.fail_after(STEP_S):
        await kernel.wait_flow(dfid)
    return dfid


async def rejections(kernel: Kernel, dfid: str) -> list[ReasonCode]:
    return [
        e.payload.feedback.reason_code  # type: ignore[union-attr]
        for e in await kernel.journal.read(dfid=dfid, types=["ProposalRejected"])
    ]


async def test_book_hotel_granvia_from_a_remote_host_waits_for_the_query(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server, packs=[MEMORY_PACK]) as kernel:
        secret = await provision(kernel, nats_server)
        async with host(nats_server, secret, agent="MemoryClerk"):
            learned = await ended(kernel, "hotel.learn")
            first = await ended(kernel, "hotel.book")
            again = await ended(kernel, "hotel.book")

        assert kernel.flow(learned).status is FlowStatus.CLOSED  # type: ignore[union-attr]
        # Attempt 1 ("Book Hotel Granvia") is refused; attempt 2 queries (and closes).
        assert await rejections(kernel, first) == [ReasonCode.VERIFICATION_REQUIRED]
        [decided] = [
            e.payload.proposal  # type: ignore[union-attr]
            for e in await kernel.journal.read(dfid=again, types=["ProposalSubmitted"])
        ]
        assert decided.params["text"] == GRANVIA
        assert await rejections(kernel, again) == []
        assert kernel.flow(again).status is FlowStatus.CLOSED  # type: ignore[union-attr]


async def test_a_remote_agent_reads_its_artifact_in_ranges_and_is_refused_another(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server, packs=[MEMORY_PACK]) as kernel:
        secret = await provision(kernel, nats_server)
        ref = await kernel.put_artifact(STATEMENT, media_type="text/plain", by="hotel")
        await kernel.put_artifact(PAYROLL, media_type="text/plain", by="hr")
        async with host(nats_server, secret, agent="MemoryClerk") as remote:
            [dfid] = await kernel.trigger("hotel.read", {"hotel.read.statement": ref})
            fetched = await remote.line("FETCHED")
            refused = await remote.line("REFUSED")
            with anyio.fail_after(STEP_S):
                await kernel.wait_flow(dfid)

        assert fetched.split() == ["FETCHED", dfid, hashlib.sha256(STATEMENT).hexdigest()]
        assert refused.split() == ["REFUSED", "UNAUTHORIZED"]
        [attempt] = [
            e.payload
            for e in await kernel.journal.read(types=["InputRefused"])
            if isinstance(e.payload, InputRefused)
        ]
        assert attempt.entry == "artifact" and attempt.reason_code == "UNAUTHORIZED"
        # The kernel goes on: another flow still runs to its end.
        assert kernel.flow(dfid) is not None
