"""The agents' answers: how a proposal reaches the DIM and comes back as a verdict.

Three ways, one judgement. :meth:`Answers.submit` is the door every agent goes
through (the agent host's crews, the mesh, the embedding code): the proposal is
admitted at the wall, its flow recalled, and it is prepared (personal fields
sealed, meaning scored) before the DIM judges it and the verdict is durable. A
hosted agent that decides synchronously skips the wait: :meth:`Answers.judge_now`
hands its proposal to the DIM and returns at once, and :meth:`Answers.carry`
records the compiler's batch in the DIM's own append with what its agents
answered (two commits per flow instead of three, issue 35, lever 4).

:class:`Answers` is one part of a :class:`kernel.api.Kernel`; the runtime (the
compiler's carrier), the agent host and the mesh (through ``Kernel.submit``) call it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anyio

from kernel.api.calls import Calls, Flows
from kernel.api.conversations import admitted_usage
from kernel.api.edge import Edge, admitted
from kernel.api.wiring import Actors
from kernel.core import wall
from kernel.core.events import Event, Feedback
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid, clip
from kernel.policy.contracts import Outcome, Proposal, Verdict
from kernel.runtime.actors import MailboxClosed, Outbox, Reply
from kernel.runtime.messages import Carry, Judge, Withdraw
from kernel.state.projections import Projections

log = logging.getLogger("kernel")


class Answers:
    """The agents' answers on their way to the DIM: submitted, judged at once, or carried.

    Args:
        projections: the flows in memory (what may be judged without a wait).
        actors: the DIM's mailbox and the agent host.
        calls: sends a Judge and waits for its durable verdict.
        flows: recalls a flow a submission names.
        edge: what a proposal goes through before its verdict.
    """

    def __init__(
        self, projections: Projections, actors: Actors, calls: Calls, flows: Flows, edge: Edge
    ) -> None:
        self._projections = projections
        self._actors = actors
        self._calls = calls
        self._flows = flows
        self._edge = edge

    async def submit(
        self,
        token: str,
        dfid: str,
        proposal: Proposal | Mapping[str, Any] | bytes | str,
        *,
        usage: Mapping[str, int] | None = None,
    ) -> Verdict:
        """Submit a proposal for flow ``dfid``; return the verdict once it is durable.

        ``usage``: the tokens the reasoning behind it spent, by model (the DIM prices
        them with ``KernelConfig.prices`` and records ReasoningCharged).
        """
        try:
            wall.admit(wall.fields(token=token, dfid=dfid), wall.SubmissionSpec)
        except InputInvalid as exc:
            # Nothing to name: no flow could have such an id, and the token is unchecked.
            feedback = Feedback(
                reason_code=ReasonCode.SCHEMA_INVALID,
                detail=f"the token and the DFID are ids (text, at most {wall.MAX_ID}"
                f" characters, no control character): {exc.detail}"[:500],
                layer="schema",
                field=exc.field,
            )
            return Verdict(outcome=Outcome.REFUSED, dfid=clip(dfid), feedback=feedback)
        record, invalid = admitted(proposal)
        await self._flows.recall(dfid)
        if invalid is None:
            record = await self._edge.prepare(dfid, record)
        reply: Reply[Verdict] = Reply()
        msg = Judge(
            dfid=dfid,
            proposal=record,
            token=token,
            invalid=invalid,
            reply=reply,
            usage=admitted_usage(usage),
        )
        return await self._calls.call(self._actors.dim, msg, reply)

    def judge_now(
        self, token: str, dfid: str, proposal: Proposal, usage: Mapping[str, int]
    ) -> bool:
        """Hand a hosted agent's proposal to the DIM without waiting for its verdict.

        The run-to-completion path of a synchronous agent (kernel.hosting): the same
        judgement as :meth:`submit`, when nothing in it waits (the flow is in memory, no
        meaning to score, room in the DIM's mailbox). False leaves it to :meth:`submit`.
        """
        if self._calls.stopped is not None or self._edge.scores:
            return False
        if dfid not in self._projections.flows:
            return False
        # No id check of token and dfid: both are the kernel's own (the session, the flow).
        msg = self.judge_early(token, dfid, proposal, usage, None)
        try:
            self._actors.dim.send_nowait(msg)
        except anyio.WouldBlock:
            return False
        return True

    async def carry(self, out: Outbox) -> bool:
        """Record the compiler's batch in the DIM's append with its agents' answers.

        Two commits per flow instead of three (issue 35, lever 4): the synchronous
        agents decide on their contexts before those are durable, and the DIM records
        the compiler's events, the proposals (or withdrawals), the verdicts and the
        intents in one append. Nothing acts before it; a crash before it repeats only
        the reasoning (nothing of the batch, not even the trigger, was recorded, and
        ``trigger()`` had not answered). False (nothing taken early, a batch that
        stages facts the DIM would judge against, a judgement that would wait, or the
        DIM could not record it) leaves the batch to the compiler's own commit, its
        contexts delivered after it as before.
        """
        if self._calls.stopped is not None or self._edge.scores:
            return False
        if out.scratch.get("facts"):
            # The DIM judges against committed facts (kernel.dim.verdict.Staged).
            return False
        actors = self._actors
        dim = actors.dim
        if dim.pending() >= actors.capacity:
            return False  # checked before anyone reasons: no answer is then lost to it
        answers: list[Judge | Withdraw] = []
        taken: list[int] = []
        for index, mailbox, ctx in out.early:
            if type(ctx) is Judge:  # a caller's proposal (Kernel.propose), prepared already
                answers.append(ctx)
                taken.append(index)
                continue
            try:
                answer = actors.agents.early(mailbox, ctx)
            except Exception as exc:
                # Never a crash of the compiler's commit: this context goes out after it.
                log.warning("flow %s could not be judged with its context: %r", ctx.dfid, exc)
                continue
            if answer is not None:
                answers.append(answer)
                taken.append(index)
        if not answers:
            return False
        done: Reply[list[Event] | None] = Reply()
        try:
            dim.send_nowait(
                Carry(
                    drafts=tuple(out.drafts),
                    flows=out.opened,
                    messages=tuple(answers),
                    done=done,
                )
            )
        except (anyio.WouldBlock, MailboxClosed):
            return False  # the contexts go out after the compiler's commit: reasoned again
        committed = await done.wait()
        if committed is None:
            return False
        out.committed = committed
        for index in taken:
            out.taken_early(index)
        return True

    def judge_early(
        self,
        token: str,
        dfid: str,
        proposal: Proposal,
        usage: Mapping[str, int],
        reply: Reply[Verdict] | None,
    ) -> Judge:
        """Return the Judge of a proposal a hosted agent decided with nothing to wait for.

        Sealed, not scored: run to completion, or before its context is durable.
        """
        record, invalid = admitted(proposal)
        if invalid is None:
            record = self._edge.seal(record)
        return Judge(
            dfid=dfid,
            proposal=record,
            token=token,
            invalid=invalid,
            reply=reply,
            usage=admitted_usage(usage),
        )
