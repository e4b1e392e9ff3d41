"""Run governance tool calls through a kernel, and SIGKILL this process after a chosen commit.

Usage: ``belief_worker.py JOURNAL MODE KILL`` where MODE is ``run`` (register the
agent and make the calls, one flow at a time) or ``recover`` (only open the kernel
and let it finish the flows an earlier run left executing); KILL is ``none`` or
``commit:N`` (die right after the Nth journal commit of this process).
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from kernel import FlowStatus, KernelConfig, open_kernel
from kernel.beliefs import GOVERNANCE_PACK
from tests.support.beliefs_domain import Believer
from tests.support.crash import die_after_commit
from tests.support.principals import LOCAL

CALLS: list[dict[str, Any]] = [
    {"kind": "governance.record_observation", "observation": "o1", "source": "wire"},
    {"kind": "governance.record_observation", "observation": "o2", "source": "registry"},
    {"kind": "governance.record_observation", "observation": "o3", "source": "blog"},
    {
        "kind": "governance.propose_proposition",
        "proposition": "p",
        "text": "Acme is in Lyon",
        "derived_from": ["o1"],
    },
    {"kind": "governance.attach_support", "proposition": "p", "observation": "o2"},
    {
        "kind": "governance.propose_proposition",
        "proposition": "q",
        "text": "Acme is in Paris",
        "derived_from": ["o3"],
    },
    {"kind": "governance.attach_contradiction", "proposition": "q", "observation": "o1"},
    {
        "kind": "governance.propose_proposition",
        "proposition": "p-again",
        "text": "Acme is in Lyon",
        "derived_from": ["o3"],
    },
    {"kind": "governance.request_consolidation"},
]


async def main(journal: str, mode: str, kill: str) -> None:
    async with open_kernel(
        journal,
        packs=[GOVERNANCE_PACK],
        adapters={},
        allow=["believer"],
        config=KernelConfig(principal=LOCAL),
    ) as kernel:
        die_after_commit(kernel, kill)
        if mode == "run":
            agent = Believer()
            await kernel.register(agent)
            for n, call in enumerate(CALLS, 1):
                agent.calls.append({**call, "task": "t"})
                [dfid] = await kernel.trigger("desk.believer", {"desk.believer.n": n})
                await kernel.wait_flow(dfid)
        else:
            unfinished = (FlowStatus.ACCEPTED, FlowStatus.EXECUTING, FlowStatus.DIRTY)
            for flow in kernel.flows():
                if flow.status in unfinished:
                    await kernel.wait_flow(flow.dfid)
    print("DONE", flush=True)


if __name__ == "__main__":
    anyio.run(lambda: main(*sys.argv[1:4]))
