"""Hosting agents: a crew of reasoning tasks per agent, in user space.

The context compiler addresses each WorkingContext to its agent's mailbox; a
crew of tasks takes them, runs ``agent.decide`` under the token and time caps
(kernel.core.reasoning) and submits what comes back, or withdraws the flow with the
reason it ended without a proposal. No task is spawned per flow: a crew starts with one
task and grows by one whenever all of its tasks are busy, up to its size (``concurrency``).

An agent that declares it decides synchronously (``synchronous = True``: its ``decide``
never waits) runs to completion where its context is delivered, in the compiler's
after-commit step: no mailbox, no crew task, no reply to wait for; its proposal goes
straight to the DIM's mailbox (issue 35). It is the same reasoning under the same
token meter, trace and fetcher; what it saves is the hops between tasks. A ``decide``
that waits after all is closed at its first wait and run again by the crew, which
takes the agent's contexts from then on. Such an agent's crew is started only then (or
when a context is otherwise left to the mailbox): a thousand of them idle are no tasks,
and nothing for the cyclic collector to walk (issue 45, P19).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Container, Coroutine, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from kernel.core.errors import KernelShutdown
from kernel.core.events import Manifest
from kernel.core.fetching import ArtifactSlice, current_fetcher
from kernel.core.ports import Clock
from kernel.core.reasoning import UsageMeter, current_meter, metered
from kernel.core.reasons import ReasonCode
from kernel.core.wall import clip
from kernel.policy.contracts import Outcome, Proposal, Session, Verdict, WorkingContext
from kernel.runtime.actors import Mailbox, MailboxClosed, Reply
from kernel.runtime.messages import AgentMessage, DimMessage, Judge, Withdraw

log = logging.getLogger("kernel")


class _Crew:
    """One agent's reasoning tasks: how many there are, how many wait, how many may be."""

    __slots__ = ("idle", "limit", "size", "tg")

    def __init__(self, tg: TaskGroup, limit: int) -> None:
        self.tg, self.limit = tg, limit
        self.size, self.idle = 1, 0


class Answering(Protocol):
    """Where a hosted agent's answers go (kernel.api.answers): submitted, or judged at once."""

    async def submit(
        self,
        token: str,
        dfid: str,
        proposal: Proposal,
        *,
        usage: Mapping[str, int] | None = None,
    ) -> Verdict:
        """Submit ``proposal`` for flow ``dfid``; return the verdict once it is durable."""
        ...

    def judge_now(
        self, token: str, dfid: str, proposal: Proposal, usage: Mapping[str, int]
    ) -> bool:
        """Hand ``proposal`` to the DIM without waiting; False if it must be submitted."""
        ...

    def judge_early(
        self,
        token: str,
        dfid: str,
        proposal: Proposal,
        usage: Mapping[str, int],
        reply: Reply[Verdict] | None,
    ) -> Judge:
        """Return the Judge of a proposal decided before its context is durable."""
        ...


Fetch = Callable[[str, str, str, int, int | None], Awaitable[ArtifactSlice]]
"""The kernel's fetch of an artifact: (agent id, dfid, ref, start, length)."""
TraceScope = Callable[[str, int], AbstractContextManager[object]]
"""The span context to make current while a flow's attempt is reasoned about (dfid, attempt)."""
_PRUNE_AT = 256
"""Flows with tokens carried to their next attempt before the host first prunes the ended."""


def _no_trace(dfid: str, attempt: int) -> AbstractContextManager[object]:
    return nullcontext()


class _Suspended(Exception):
    """A ``decide`` declared synchronous waited: the crew runs it instead."""


class AgentLike(Protocol):
    """What the kernel needs of an agent it hosts (agents_sdk.Agent provides it).

    An agent may also say ``synchronous = True``: its ``decide`` never waits, so the
    kernel runs it to completion where its context is delivered.
    """

    manifest: Manifest

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        """Reason over ``ctx`` and propose (or return None to decline)."""
        ...


class AgentHost:
    """Runs the reasoning of every agent a kernel hosts.

    Args:
        answers: where the agents' answers go (kernel.api.answers): submitted (a verdict once
            it is durable), or, for an agent that decides synchronously, judged at once
            (None until the kernel sets it: no agent then runs to completion).
        dim: the DIM's mailbox, where a flow ended without a proposal is withdrawn.
        clock: the kernel's clock, on which ``reasoning_timeout_s`` is measured.
        concurrency: the flows one agent reasons about at once (its crew's size).
        token_budget: the most tokens one flow's reasoning may spend in all attempts.
        reasoning_timeout_s: the longest one reasoning step may take.
        moving: the flows still moving (what the host keeps per flow is pruned to them).
        fetch: the kernel's fetch of an artifact, which ``ctx.fetch_artifact`` reaches.
    """

    def __init__(
        self,
        *,
        dim: Mailbox[DimMessage],
        clock: Clock,
        concurrency: int,
        token_budget: int | None,
        reasoning_timeout_s: float | None,
        moving: Container[str] = frozenset(),
        fetch: Fetch | None = None,
        answers: Answering | None = None,
    ) -> None:
        self._dim = dim
        self._clock = clock
        self._concurrency = concurrency
        self._token_budget = token_budget
        self._timeout_s = reasoning_timeout_s
        self.sessions: dict[str, Session] = {}
        # Tokens each flow's reasoning spent in earlier attempts (dropped when it stops
        # reasoning, or, for a flow that ended before its next attempt, once the map has
        # grown: pruned to the flows still ``moving``, so it never outgrows them).
        self._usage: dict[str, int] = {}
        self._moving = moving
        self._prune_at = _PRUNE_AT
        self.tg: TaskGroup | None = None
        """Where the crews run; set by the kernel while it runs, cancelled when it closes."""
        self._crews: dict[str, anyio.CancelScope] = {}
        self.retired: list[Mailbox[AgentMessage]] = []
        """Mailboxes of displaced crews, still drained (closed with the kernel's)."""
        self.trace_scope: TraceScope = _no_trace
        """Set by the kernel when spans are exported: ``decide()`` runs inside the flow's trace."""
        self.fetch = fetch
        """``ctx.fetch_artifact`` in ``decide()`` reaches it (as the agent)."""
        self.answers = answers
        """Where the agents' answers go (set by the kernel; None: nothing hosted answers)."""

    def host(self, agent: AgentLike, mailbox: Mailbox[AgentMessage]) -> None:
        """Start ``agent``'s crew on the contexts that arrive in ``mailbox``."""
        assert self.tg is not None
        agent_id = agent.manifest.agent_id
        scope = self._crews[agent_id] = anyio.CancelScope()
        if getattr(agent, "synchronous", False) is True:
            # Its contexts are decided where they are delivered: no crew until one is left
            # to the mailbox (a thousand idle agents are no tasks, nothing for the collector).
            mailbox.direct = DirectRun(self, agent, mailbox, scope)
        else:
            self._start_crew(agent, mailbox, scope)

    def _start_crew(
        self, agent: AgentLike, mailbox: Mailbox[AgentMessage], scope: anyio.CancelScope
    ) -> None:
        assert self.tg is not None
        name = f"agent:{agent.manifest.agent_id}"
        self.tg.start_soon(self._crew, agent, mailbox, scope, name=name)

    def hosting(self, agent_id: str) -> bool:
        """Whether a crew in this process reasons for ``agent_id``."""
        return agent_id in self._crews

    def retire(self, agent_id: str, mailbox: Mailbox[AgentMessage], token: str) -> None:
        """Stop the crew of ``agent_id``, displaced by a new session whose token is ``token``.

        The registry ended the flows the crew held when the new session was recorded; a
        context routed to ``mailbox`` after that (the compiler picked it before the
        crew was replaced) ends too: each is withdrawn under the new session, never
        left waiting in a mailbox no one reads.
        """
        assert self.tg is not None
        mailbox.direct = None  # what still arrives is withdrawn, never decided
        scope = self._crews.pop(agent_id, None)
        if scope is not None:
            scope.cancel()
        self.sessions.pop(agent_id, None)
        self.retired.append(mailbox)
        self.tg.start_soon(self._withdraw_all, mailbox, token, name=f"retired:{agent_id}")

    async def _withdraw_all(self, mailbox: Mailbox[AgentMessage], token: str) -> None:
        detail = "its agent was displaced by a new handshake before this flow reached it"
        while True:
            ctx = await mailbox.receive()
            if ctx.dfid in self._moving:  # else it ended already (the DIM checks the rest)
                msg = Withdraw(
                    dfid=ctx.dfid,
                    token=token,
                    attempt=ctx.attempt,
                    reason_code=ReasonCode.INVALID_SESSION,
                    detail=detail,
                )
                await self._dim.send(msg)

    def spawn(self, fn: Any) -> None:
        """Run ``fn`` beside the agents (the reasoning caps' watchdogs)."""
        assert self.tg is not None
        self.tg.start_soon(fn)

    async def _crew(
        self, agent: AgentLike, mailbox: Mailbox[AgentMessage], scope: anyio.CancelScope
    ) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                crew = _Crew(tg, self._concurrency)
                tg.start_soon(self._reasoner, agent, mailbox, crew, name="agent:0")

    async def _reasoner(
        self, agent: AgentLike, mailbox: Mailbox[AgentMessage], crew: _Crew
    ) -> None:
        # The crew grows as it is needed, up to its size: one task waits while the agent
        # is idle (a thousand hosted agents are a thousand tasks, not 64 each).
        while True:
            crew.idle += 1
            ctx = await mailbox.receive()
            crew.idle -= 1
            if not crew.idle and crew.size < crew.limit:
                name = f"agent:{crew.size}"
                crew.size += 1
                crew.tg.start_soon(self._reasoner, agent, mailbox, crew, name=name)
            await self._reason(agent, ctx)

    async def _reason(self, agent: AgentLike, ctx: WorkingContext) -> None:
        """Run one step of an agent's reasoning in user space and submit what it proposes."""
        token = self.sessions[ctx.agent_id].token

        async def withdraw(code: ReasonCode, detail: str) -> None:
            msg = Withdraw(
                dfid=ctx.dfid,
                token=token,
                attempt=ctx.attempt,
                reason_code=code,
                detail=detail,
                usage=dict(meter.models),
            )
            await self._dim.send(msg)

        meter = UsageMeter(ctx.dfid, self._token_budget, self._usage.pop(ctx.dfid, 0))
        fetch = self.fetch
        fetching = None
        if fetch is not None:
            agent_id = ctx.agent_id

            async def fetcher(dfid: str, ref: str, start: int, length: int | None) -> ArtifactSlice:
                return await fetch(agent_id, dfid, ref, start, length)

            fetching = current_fetcher.set(fetcher)
        try:
            try:
                with self.trace_scope(ctx.dfid, ctx.attempt):
                    proposal = await metered(
                        lambda: agent.decide(ctx), meter, self._clock, self._timeout_s, self.spawn
                    )
            except Exception as exc:
                log.warning("agent %s failed on flow %s: %r", ctx.agent_id, ctx.dfid, exc)
                if meter.stopped is not None:
                    await withdraw(*meter.stopped)  # e.g. a malformed usage report
                else:
                    # The agent's own words, clipped and made printable: they are recorded.
                    await withdraw(
                        ReasonCode.AGENT_ERROR, clip(f"{type(exc).__name__}: {exc}", 500)
                    )
                return
            if meter.stopped is not None:
                # The computation budget cancelled the thought; the flow ends with the reason.
                await withdraw(*meter.stopped)
                return
            if proposal is None:
                await withdraw(ReasonCode.AGENT_DECLINED, "no action")
                return
            assert self.answers is not None
            verdict = await self.answers.submit(token, ctx.dfid, proposal, usage=dict(meter.models))
            self._carry(ctx.dfid, verdict, meter)
        except KernelShutdown:
            return
        finally:
            if fetching is not None:
                current_fetcher.reset(fetching)

    def _carry(self, dfid: str, verdict: Verdict, meter: UsageMeter) -> None:
        """Keep a rejected attempt's tokens for the flow's next attempt to spend from."""
        if verdict.outcome is Outcome.REJECTED and meter.tokens:
            self._usage[dfid] = meter.tokens  # the next attempt spends from the rest
            if len(self._usage) > self._prune_at:
                self._usage = {d: n for d, n in self._usage.items() if d in self._moving}
                self._prune_at = 2 * len(self._usage) + _PRUNE_AT

    # --- run to completion: agents that decide synchronously ----------------------

    def early(self, mailbox: Mailbox[AgentMessage], ctx: WorkingContext) -> Judge | Withdraw | None:
        """Decide ``ctx`` before it is durable; return what the DIM is to record with it.

        Two commits per flow (kernel.api.answers): the compiler's events, this answer's verdict
        and its intent go into one append, so nothing acts on the context before it is
        recorded, and a crash before that append repeats only this reasoning. None
        leaves the context to be delivered after the compiler's own commit (a receiver
        that is not this host's, a ``decide`` that waited).
        """
        direct = mailbox.direct
        if not isinstance(direct, DirectRun) or direct.host is not self:
            return None  # not one of this host's agents run to completion (any more)
        answer = self._reason_now(direct, ctx)
        if answer is None or isinstance(answer, Withdraw):
            return answer
        token, meter, proposal = answer
        reply: Reply[Verdict] | None = None
        if meter.tokens:
            # The verdict is needed (tokens to carry past a rejection): it is read
            # once the append that records it committed.
            reply = Reply()
            self._later(self._carry_later, ctx.dfid, reply, meter)
        assert self.answers is not None  # _reason_now answered
        return self.answers.judge_early(token, ctx.dfid, proposal, dict(meter.models), reply)

    async def _carry_later(self, dfid: str, reply: Reply[Verdict], meter: UsageMeter) -> None:
        self._carry(dfid, await reply.wait(), meter)

    def _reason_now(
        self, run: DirectRun, ctx: WorkingContext
    ) -> tuple[str, UsageMeter, Proposal] | Withdraw | None:
        """Run ``decide`` on ``ctx`` to its end: a proposal, a withdrawal, or None (left to
        the agent's crew, started if it was not: the context goes to the mailbox)."""
        session = self.sessions.get(ctx.agent_id)
        if session is None or self.answers is None:
            run.crew()
            return None
        carried = self._usage.pop(ctx.dfid, 0)
        meter = UsageMeter(ctx.dfid, self._token_budget, carried)
        try:
            proposal = self._decide_now(run.agent, ctx, meter)
        except _Suspended:
            log.warning(
                "agent %s says it decides synchronously but its decide() waited: its crew"
                " runs it from now on (this attempt is reasoned again there)",
                ctx.agent_id,
            )
            run.mailbox.direct = None
            run.crew()
            if carried:
                self._usage[ctx.dfid] = carried
            return None
        except Exception as exc:
            log.warning("agent %s failed on flow %s: %r", ctx.agent_id, ctx.dfid, exc)
            if meter.stopped is not None:
                return self._withdrawal(ctx, session.token, meter, *meter.stopped)
            detail = clip(f"{type(exc).__name__}: {exc}", 500)
            return self._withdrawal(ctx, session.token, meter, ReasonCode.AGENT_ERROR, detail)
        if meter.stopped is not None:
            return self._withdrawal(ctx, session.token, meter, *meter.stopped)
        if proposal is None:
            return self._withdrawal(
                ctx, session.token, meter, ReasonCode.AGENT_DECLINED, "no action"
            )
        return session.token, meter, proposal

    def _later(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``fn(*args)`` in a task beside the agents; nothing if the kernel is stopping.

        Called from the compiler's after-commit step, which must never fail for it: a flow
        whose proposal or withdrawal is lost to a stop stays open, and the next run
        recovers it.
        """
        try:
            if self.tg is not None:
                self.tg.start_soon(fn, *args)
        except RuntimeError:
            log.info("the kernel is stopping: %s not run", getattr(fn, "__name__", fn))

    def _decide_now(
        self, agent: AgentLike, ctx: WorkingContext, meter: UsageMeter
    ) -> Proposal | None:
        """Run ``decide`` to its end without a wait; raise _Suspended if it waits."""
        if meter.stopped is not None:
            return None  # the budget was spent before this attempt began
        fetch = self.fetch
        fetching = None
        if fetch is not None:
            agent_id = ctx.agent_id

            async def fetcher(dfid: str, ref: str, start: int, length: int | None) -> ArtifactSlice:
                return await fetch(agent_id, dfid, ref, start, length)

            fetching = current_fetcher.set(fetcher)
        metering = current_meter.set(meter)
        try:
            with self.trace_scope(ctx.dfid, ctx.attempt):
                thought = agent.decide(ctx)
                try:
                    thought.send(None)
                except StopIteration as done:
                    proposal: Proposal | None = done.value
                    return proposal
                thought.close()  # at its first wait, in the task that started it
                raise _Suspended
        finally:
            current_meter.reset(metering)
            if fetching is not None:
                current_fetcher.reset(fetching)

    def _judge_now(self, token: str, dfid: str, proposal: Proposal, meter: UsageMeter) -> bool:
        assert self.answers is not None
        try:
            return self.answers.judge_now(token, dfid, proposal, dict(meter.models))
        except Exception as exc:
            # Never a crash of the compiler: the flow goes the crew's way to the DIM.
            log.warning("judging flow %s at once failed: %r", dfid, exc)
            return False

    async def _submit_later(
        self, token: str, dfid: str, proposal: Proposal, meter: UsageMeter
    ) -> None:
        try:
            assert self.answers is not None
            verdict = await self.answers.submit(token, dfid, proposal, usage=dict(meter.models))
        except KernelShutdown:
            return
        self._carry(dfid, verdict, meter)

    def _withdrawal(
        self, ctx: WorkingContext, token: str, meter: UsageMeter, code: ReasonCode, detail: str
    ) -> Withdraw:
        return Withdraw(
            dfid=ctx.dfid,
            token=token,
            attempt=ctx.attempt,
            reason_code=code,
            detail=detail,
            usage=dict(meter.models),
        )

    def _send_withdrawal(self, msg: Withdraw) -> None:
        try:
            self._dim.send_nowait(msg)
        except anyio.WouldBlock:
            self._later(self._dim.send, msg)
        except MailboxClosed:
            pass  # the kernel is stopping; the flow stays open for the next run


class DirectRun:
    """An agent run to completion where its context is delivered (``synchronous = True``).

    Set as its mailbox's ``direct`` receiver by :meth:`AgentHost.host`; the host reads
    it back to decide a context before it is durable (:meth:`AgentHost.early`). The
    agent's crew is started only when a context is left to the mailbox (:meth:`crew`).

    Attributes:
        host: the host that runs the agent.
        agent: the agent.
        mailbox: the agent's mailbox (its crew takes over if a ``decide`` waits).
        scope: the crew's cancel scope (cancelled when the agent is displaced).
        crewed: whether the crew was started.
    """

    __slots__ = ("agent", "crewed", "host", "mailbox", "scope")

    def __init__(
        self,
        host: AgentHost,
        agent: AgentLike,
        mailbox: Mailbox[AgentMessage],
        scope: anyio.CancelScope,
    ) -> None:
        self.host = host
        self.agent = agent
        self.mailbox = mailbox
        self.scope = scope
        self.crewed = False

    def crew(self) -> None:
        """Start the agent's crew on its mailbox, once; nothing if the kernel is stopping
        (the compiler's after-commit step calls it, which must never fail)."""
        if self.crewed:
            return
        self.crewed = True
        try:
            self.host._start_crew(self.agent, self.mailbox, self.scope)
        except RuntimeError:
            log.info("the kernel is stopping: the crew of %s not started", self.mailbox.name)

    def __call__(self, ctx: WorkingContext) -> bool:
        """Decide ``ctx`` here and now; False leaves it to the crew (the mailbox).

        Runs inside the compiler's after-commit step, so nothing may escape: what the
        agent raises withdraws its flow, as in the crew.
        """
        host = self.host
        answer = host._reason_now(self, ctx)
        if answer is None:
            return False
        if isinstance(answer, Withdraw):
            host._send_withdrawal(answer)
            return True
        token, meter, proposal = answer
        if meter.tokens or not host._judge_now(token, ctx.dfid, proposal, meter):
            # The verdict is needed (tokens to carry past a rejection), or the judgement
            # waits on something: submit it from a task of its own, as the crew would.
            host._later(host._submit_later, token, ctx.dfid, proposal, meter)
        return True
