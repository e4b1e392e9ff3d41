"""Agents the mesh tests run in host processes (``python -m agents_sdk.serve``).

``MESH_AGENT_MODE=hang`` makes the clerk print ``DECIDING <dfid>`` and never
return (the test SIGKILLs its host there); otherwise it prints ``DECIDED <dfid>
<attempt>`` and proposes the suite's transfer.
"""

from __future__ import annotations

import hashlib
import os

import anyio

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import FetchRefused
from kernel.artifacts import ref_of
from tests.support.helpers import transfer


class Clerk(Agent):
    manifest = Manifest(
        agent_id="clerk", version="1.0.0", capabilities=["test.transfer"], subscriptions=["bank"]
    )

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        if os.environ.get("MESH_AGENT_MODE") == "hang":
            print(f"DECIDING {ctx.dfid}", flush=True)
            await anyio.sleep_forever()
        print(f"DECIDED {ctx.dfid} {ctx.attempt}", flush=True)
        return transfer()(ctx)


GRANVIA = "Book Hotel Granvia"
PAYROLL = b"the payroll, which no context of the clerk's names"


class MemoryClerk(Agent):
    """The clerk with memory (issue 31 through the mesh): it learns, books, and reads.

    ``hotel.learn``: proposes "Verify accessibility before booking". ``hotel.book``:
    decides "Book Hotel Granvia", and queries accessibility when told to verify first.
    ``hotel.read``: reads the artifact its context names in 1000-byte ranges and prints
    ``FETCHED <dfid> <sha256>``, then tries one its context does not name and prints
    ``REFUSED <code>``; it proposes nothing there.
    """

    manifest = Manifest(
        agent_id="clerk",
        version="1.0.0",
        capabilities=["memory.add_constraint", "memory.record_decision", "memory.query"],
        subscriptions=["hotel"],
        max_attempts=2,
    )

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        if ctx.topic == "hotel.learn":
            policy = {
                "kind": "memory.add_constraint",
                "text": "Verify accessibility before booking",
            }
            return ctx.propose(policy, explain="learned")
        if ctx.topic == "hotel.read":
            await self._read(ctx)
            return None
        feedback = ctx.feedback
        if feedback is not None and feedback.reason_code == "VERIFICATION_REQUIRED":
            query = {"kind": "memory.query", "topic": "accessibility at Granvia"}
            return ctx.propose(query, explain="verify first")
        return ctx.propose({"kind": "memory.record_decision", "text": GRANVIA}, explain=GRANVIA)

    @staticmethod
    async def _read(ctx: WorkingContext) -> None:
        [ref] = set(ctx.artifacts.values())
        data, start, more = b"", 0, True
        while more:
            piece = await ctx.fetch_artifact(ref, start=start, length=1000)
            data += piece.data
            start, more = start + len(piece.data), piece.more
        print(f"FETCHED {ctx.dfid} {hashlib.sha256(data).hexdigest()}", flush=True)
        try:
            await ctx.fetch_artifact(ref_of(PAYROLL))
        except FetchRefused as exc:
            print(f"REFUSED {exc.reason_code}", flush=True)
