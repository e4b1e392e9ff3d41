"""A kernel in its own process for the operator CLI tests: ``-m tests.support.operator_kernel DB``.

With ``--flows N`` it opens N flows that escalate (HIGH_IMPACT transfers) and
one LOW_IMPACT memo that escalates, prints their DFIDs as one JSON line, then
``ready``. It polls the operator inbox every 50 ms on the system clock. It
stops when its stdin closes (after every flow that can move on has), or with
``--drain`` once the inbox holds no untaken decision and no flow moves.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import ClassVar

import anyio

from kernel import EscalationBudget, EscalationPolicy, Proposal, WorkingContext, open_kernel
from kernel.config import KernelConfig, Supervision
from kernel.journal.errors import JournalError
from kernel.journal.inbox_store import open_inbox
from kernel.policy import Impact, PolicyKind, PolicyPack
from tests.support.helpers import PACK, Bank, ScriptedAgent, transfer
from tests.support.principals import LOCAL

POLL_S = 0.05
# The proposals wait for people typing commands, on the system clock: a window that outlasts
# any test run under load, so an approval the test makes is never late (the window's own
# refusal is tested with a ManualClock elsewhere).
VALID_FOR_S = 3600.0


class Memo(PolicyKind, tag="ops.memo"):
    """A note to the team: reversible, informational."""

    adapter: ClassVar[str] = "bank"
    impact: ClassVar[Impact] = Impact.LOW_IMPACT

    text: str


OPS = PolicyPack(name="ops", version="1.0.0", kinds=(Memo,), escalate_below_confidence=0.5)


def memo(ctx: WorkingContext) -> Proposal:
    return ctx.propose(
        Memo(text="rates change on Monday"),
        explain="tell the team",
        confidence=0.1,
        valid_for_s=VALID_FOR_S,
    )


def pending(db: str) -> int:
    with open_inbox(db, readonly=True) as store:
        return len(store.rows(pending=True))


async def main(db: str, flows: int, drain: bool) -> None:
    async with open_kernel(
        db,
        packs=[PACK, OPS],
        adapters={"bank": Bank()},
        allow=["clerk", "scribe"],
        config=KernelConfig(
            principal=LOCAL,
            supervision=Supervision(inbox_poll_s=POLL_S),
            escalation=EscalationPolicy(budget=EscalationBudget(capacity=20)),
        ),
    ) as kernel:
        await kernel.register(
            ScriptedAgent("clerk", [transfer(100, confidence=0.2, valid_for_s=VALID_FOR_S)])
        )
        await kernel.register(
            ScriptedAgent("scribe", [memo], capabilities=["ops.memo"], subscriptions=["ops"])
        )
        dfids = [(await kernel.trigger("bank.invoice"))[0] for _ in range(flows)]
        if flows:
            dfids += await kernel.trigger("ops.memo")
        for dfid in dfids:
            await kernel.wait_flow(dfid)
        print(json.dumps(dfids), flush=True)
        print("ready", flush=True)
        if drain:
            while True:
                try:
                    if pending(db) == 0 and not kernel.projections.moving:
                        break
                except JournalError:
                    pass
                await anyio.sleep(POLL_S)
        else:
            await anyio.to_thread.run_sync(sys.stdin.read)
        await kernel.wait_quiet()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("--flows", type=int, default=0)
    parser.add_argument("--drain", action="store_true")
    args = parser.parse_args()
    anyio.run(main, args.db, args.flows, args.drain)
