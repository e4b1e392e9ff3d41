"""Run flows against a durable ledger, and SIGKILL this process at a chosen point.

Usage: ``execution_worker.py JOURNAL LEDGER MODE KILL LOOKUP [AGENT]`` where MODE is
``run`` (register a clerk and trigger a stream of flows), ``recover`` (only
open the kernel and let it finish what an earlier run left), or ``retry`` /
``reconcile`` (an operator decides every flow escalated with OUTCOME_UNKNOWN:
calls it again, or records what the ledger shows); KILL is
``none``, ``commit:N`` (after the Nth journal commit), ``call:N`` (before the
Nth adapter call) or ``effect:N`` (after the Nth effect is durable in the
ledger, before its answer reaches the kernel) or ``decide:N`` (in the agent's Nth
``decide``, while it holds a context); LOOKUP is ``1`` for a ledger
that does not deduplicate but answers ``lookup(key)``, ``0`` for one that
deduplicates on the key; AGENT is ``crew`` (the default: the clerk reasons in its
crew, after its context committed) or ``sync`` (it decides synchronously: it runs to
completion before its context is durable, and its flow commits twice) or ``propose``
(the same proposals brought by ``Kernel.propose``, each keyed by its tool-call id, the way
a framework resumes a run: opening, verdict and intent in one append; MODE ``run`` proposes
every call again, and a call proposed before is answered from its record).
"""

from __future__ import annotations

import sys

import anyio
import msgspec

from kernel import (
    DecisionVerdict,
    FlowStatus,
    Kernel,
    Manifest,
    Proposal,
    ReasonCode,
    WorkingContext,
    open_kernel,
)
from kernel.adapters import AdapterError, ExecutionIntent
from kernel.config import KernelConfig
from kernel.policy.kinds import kind_name
from kernel.testing import Faults, SimulatedSystem
from tests.support.crash import die, die_after_commit
from tests.support.execution_domain import DESK, KINDS, Ping, Trip, name_of
from tests.support.helpers import LOCAL, ScriptedAgent

FLOWS = 9


class Ledger(SimulatedSystem):
    """The shipped simulated system (durable ledger by key, lost answers, duplicate
    deliveries), plus this harness's kill points and a leg that is always refused."""

    def __init__(self, path: str, kill: str, lookup: bool) -> None:
        faults = Faults(lost_answer=0.15, duplicate=0.2)
        super().__init__(path, seed=7, faults=faults, dedupe=not lookup)
        what, _, n = kill.partition(":")
        self._kill = (what, int(n or 0))
        self._calls_made = 0
        self._effects_made = 0

    def before_call(self, intent: ExecutionIntent, call: int) -> None:
        self._calls_made += 1
        if self._kill == ("call", self._calls_made):
            die()
        if name_of(intent) == "book_fail":
            raise AdapterError("no such leg")

    def after_effect(self, intent: ExecutionIntent, call: int) -> None:
        self._effects_made += 1
        if self._kill == ("effect", self._effects_made):
            die()


class Clerk(ScriptedAgent):
    """The scripted clerk, dying in its Nth ``decide`` when told to."""

    def __init__(self, kill: str, synchronous: bool) -> None:
        super().__init__(steps=[decide], capabilities=KINDS, subscriptions=["desk"])
        self.synchronous = synchronous
        what, _, n = kill.partition(":")
        self._die_at = int(n) if what == "decide" else 0
        self._decided = 0

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self._decided += 1
        if self._decided == self._die_at:
            die()  # the context reached the agent; nothing it leads to was recorded
        return await super().decide(ctx)


def decide(ctx: WorkingContext) -> Proposal:
    """Ping, a saga that completes, or a saga whose last leg fails (and is compensated)."""
    return ctx.propose(policy_of(ctx.topic.split(".")[1]), valid_for_s=3600)


def policy_of(kind: str) -> Ping | Trip:
    policies: dict[str, Ping | Trip] = {
        "ping": Ping(text="hi"),
        "trip": Trip(legs=["flight", "hotel"]),
        "undo": Trip(legs=["flight", "hotel", "fail"]),
    }
    return policies[kind]


async def propose_all(kernel: Kernel) -> None:
    """Propose every call through ``Kernel.propose``, keyed: a repeated key has one effect."""
    await kernel.handshake(Manifest(agent_id="clerk", version="1.0.0", capabilities=KINDS))

    async def call(i: int) -> None:
        policy = policy_of(("ping", "trip", "undo")[i % 3])
        params = msgspec.to_builtins(policy)
        params.pop("kind", None)
        decision = await kernel.propose(
            "clerk",
            kind_name(type(policy)),
            params,
            explain="the desk's stream",
            confidence=0.9,
            tool_call_id=f"call-{i}",
        )
        assert decision.verdict is not DecisionVerdict.REFUSED, decision

    async with anyio.create_task_group() as tg:
        for i in range(FLOWS):
            tg.start_soon(call, i)


async def main(
    journal: str, ledger_path: str, mode: str, kill: str, lookup: str, agent: str = "crew"
) -> None:
    ledger = Ledger(ledger_path, kill, lookup == "1")
    async with open_kernel(
        journal,
        packs=[DESK],
        adapters={"desk": ledger},
        allow=["clerk"],
        config=KernelConfig(principal=LOCAL),
    ) as kernel:
        die_after_commit(kernel, kill)
        if mode == "run" and agent == "propose":
            await propose_all(kernel)
            await kernel.wait_quiet()
            if kill.startswith("commit:"):
                die()
        elif mode == "run":
            clerk = Clerk(kill, synchronous=agent == "sync")
            await kernel.register(clerk)
            async with anyio.create_task_group() as tg:
                for i in range(FLOWS):
                    tg.start_soon(kernel.trigger, f"desk.{('ping', 'trip', 'undo')[i % 3]}.{i}")
            await kernel.wait_quiet()
            if kill.startswith("commit:"):
                # Under load the writer batches more, so fewer commits than the seeded
                # one may happen: the kill point is then the end of the run.
                die()
        else:
            unfinished = (FlowStatus.ACCEPTED, FlowStatus.EXECUTING, FlowStatus.DIRTY)
            for flow in kernel.flows():
                if flow.status in unfinished:
                    await kernel.wait_flow(flow.dfid)
        if mode in ("retry", "reconcile"):
            for flow in kernel.flows():
                if flow.reason_code is ReasonCode.OUTCOME_UNKNOWN and flow.pending is not None:
                    await resolve(kernel, ledger, flow.dfid, flow.pending.key, mode)
    print("DONE", flush=True)


async def resolve(kernel: Kernel, ledger: Ledger, dfid: str, key: str, mode: str) -> None:
    """Decide as an operator would: call again, or record what the system shows."""
    if mode == "retry":
        await kernel.decide(dfid, "retry", operator="ops", reason="the system is back")
    else:
        # The operator looks the key up in the external system (its ledger).
        seen = ledger.receipt_of(key)
        params = (
            {"outcome": "done", "external_id": seen.external_id}
            if seen is not None
            else {"outcome": "not_done"}
        )
        await kernel.decide(dfid, "reconcile", operator="ops", reason="checked", params=params)
    await kernel.wait_flow(dfid)


if __name__ == "__main__":
    anyio.run(lambda: main(*sys.argv[1:7]))
