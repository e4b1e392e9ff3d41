"""The tokens a flow spent carry to its next attempt, and the host forgets ended flows'.

A rejected flow's spend waits for its next attempt; a flow that ended before it (its
deadline, a shutdown) never comes back for it, so the host prunes what it holds to the
flows still moving once the map has grown, instead of keeping it for months.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import closing
from typing import Any

import anyio

from kernel.core.events import Manifest
from kernel.core.reasons import ReasonCode
from kernel.hosting import AgentHost
from kernel.policy.contracts import Outcome, Proposal, Session, Verdict, WorkingContext
from kernel.runtime.actors import Mailbox, Reply
from kernel.runtime.messages import AgentMessage, DimMessage, Judge, Withdraw
from kernel.testing import ManualClock

SPEND = 60
BUDGET = 100  # one attempt fits, two do not


class Spender:
    manifest = Manifest(agent_id="a", version="1", capabilities=["x"], subscriptions=["t"])

    async def decide(self, ctx: WorkingContext) -> Proposal:
        ctx.report_usage(tokens=SPEND)
        return Proposal(policy={"kind": "x"}, explain="spend")


def context(dfid: str, attempt: int) -> WorkingContext:
    return WorkingContext(
        dfid=dfid, agent_id="a", attempt=attempt, topic="t", state={}, context_ref="", now_ns=0
    )


async def test_a_moving_flow_keeps_its_spend_while_ended_flows_are_forgotten() -> None:
    moving = {"kept"}
    submitted: list[str] = []
    enough = anyio.Event()

    class Answers:
        """Every submission rejected: the spend carries to the flow's next attempt."""

        async def submit(
            self,
            token: str,
            dfid: str,
            proposal: Proposal,
            *,
            usage: Mapping[str, int] | None = None,
        ) -> Verdict:
            submitted.append(dfid)
            if len(submitted) == 1 + 600:
                enough.set()
            return Verdict(outcome=Outcome.REJECTED, dfid=dfid, attempt=1)

        def judge_now(
            self, token: str, dfid: str, proposal: Proposal, usage: Mapping[str, int]
        ) -> bool:
            return False

        def judge_early(
            self,
            token: str,
            dfid: str,
            proposal: Proposal,
            usage: Mapping[str, int],
            reply: Reply[Verdict] | None,
        ) -> Judge:
            raise AssertionError("no agent here decides synchronously")

    dim: Mailbox[DimMessage] = Mailbox("dim")
    host = AgentHost(
        dim=dim,
        clock=ManualClock(),
        concurrency=1,
        token_budget=BUDGET,
        reasoning_timeout_s=None,
        moving=moving,
        answers=Answers(),
    )
    host.sessions["a"] = Session(agent_id="a", token="t", schemas={}, kernel_version="t")
    mailbox: Mailbox[AgentMessage] = Mailbox("agent")
    with closing(dim), closing(mailbox):
        withdrawn = await _run(host, mailbox, dim, enough)
    assert isinstance(withdrawn, Withdraw) and withdrawn.dfid == "kept"
    assert withdrawn.reason_code is ReasonCode.TOKEN_BUDGET_EXHAUSTED


async def _run(
    host: AgentHost, mailbox: Mailbox[AgentMessage], dim: Mailbox[DimMessage], enough: anyio.Event
) -> DimMessage:
    async with anyio.create_task_group() as tg:
        host.tg = tg
        host.host(Spender(), mailbox)
        await mailbox.send(context("kept", 1))
        for n in range(600):  # rejected, then ended before their next attempt
            await mailbox.send(context(f"ended-{n}", 1))
        await enough.wait()
        usage: dict[str, Any] = host._usage
        assert len(usage) < 600 and "kept" in usage and usage["kept"] == SPEND

        await mailbox.send(context("kept", 2))  # its second attempt spends past the budget
        withdrawn = await dim.receive()
        tg.cancel_scope.cancel()
    return withdrawn
