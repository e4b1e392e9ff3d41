"""Agents the mesh tests run in host processes (``python -m agents_sdk.serve``).

``MESH_AGENT_MODE=hang`` makes the clerk print ``DECIDING <dfid>`` and never
return (the test SIGKILLs its host there); otherwise it prints ``DECIDED <dfid>
<attempt>`` and proposes the suite's transfer.
"""

from __future__ import annotations

import os

import anyio

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
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
