"""A kernel in its own process for the console's tests: ``-m tests.support.console_kernel DB``.

It registers a clerk (HIGH_IMPACT transfers), a scribe (LOW_IMPACT memos) and
mallory (a transfer whose explanation is markup and script), all proposing with
low confidence so every flow escalates, and polls the operator inbox every 50 ms
on the system clock. It prints ``ready``, then reads commands from stdin, one a
line: ``invoice``, ``memo`` or ``markup`` opens a flow and prints its DFID once
it waits for a human. Every call of its adapter appends the intent's key to
``EFFECTS`` (``DB.effects`` by default; DB may be a ``postgresql://`` URL): what the
world saw, to count effects by. ``--budget N`` gives each agent N escalations an hour
(50 by default): with 1, a second escalation demotes the agent. It stops at end of input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

from kernel import EscalationBudget, EscalationPolicy, Proposal, WorkingContext, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.config import KernelConfig, Supervision
from tests.support.helpers import PACK, Bank, ScriptedAgent, Transfer, transfer
from tests.support.operator_kernel import OPS, memo
from tests.support.principals import LOCAL

POLL_S = 0.05
MARKUP = (
    '<script>document.title="pwned"</script><img src=x onerror="document.title=1"> & <b>bold</b>'
)
TOPICS = {"invoice": "bank.invoice", "memo": "ops.memo", "markup": "shady.invoice"}


class RecordingBank(Bank):
    """The suite's bank, which also writes each call's key to a file (one line a call)."""

    def __init__(self, effects: Path) -> None:
        super().__init__()
        self.effects_file = effects

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        with self.effects_file.open("a", encoding="utf-8") as out:
            out.write(intent.key + "\n")
        return await super().execute(intent)


def shady(ctx: WorkingContext) -> Proposal:
    return ctx.propose(
        Transfer(account="acc-666", amount_cents=66_600), explain=MARKUP, confidence=0.1
    )


async def main(db: str, effects: str, budget: int) -> None:
    async with open_kernel(
        db,
        packs=[PACK, OPS],
        adapters={"bank": RecordingBank(Path(effects))},
        allow=["clerk", "scribe", "mallory"],
        config=KernelConfig(
            principal=LOCAL,
            supervision=Supervision(inbox_poll_s=POLL_S),
            escalation=EscalationPolicy(budget=EscalationBudget(capacity=budget)),
        ),
    ) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250_000, confidence=0.2)]))
        await kernel.register(
            ScriptedAgent("scribe", [memo], capabilities=["ops.memo"], subscriptions=["ops"])
        )
        await kernel.register(ScriptedAgent("mallory", [shady], subscriptions=["shady"]))
        print("ready", flush=True)
        while line := await anyio.to_thread.run_sync(sys.stdin.readline):
            topic = TOPICS.get(line.strip())
            if topic is None:
                continue
            dfids = await kernel.trigger(topic)
            if not dfids:  # no active agent took it (demoted, suspended)
                print("none", flush=True)
                continue
            (dfid,) = dfids
            await kernel.wait_flow(dfid)
            print(dfid, flush=True)
        await kernel.wait_quiet()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("effects", nargs="?")
    parser.add_argument("--budget", type=int, default=50)
    args = parser.parse_args()
    anyio.run(main, args.db, args.effects or args.db + ".effects", args.budget)
