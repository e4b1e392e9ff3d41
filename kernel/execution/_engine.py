"""The execution engine actor: the state machine of carrying intents out (the package says how)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import msgspec

from kernel.adapters.constraints import Violation
from kernel.adapters.contract import (
    Adapter,
    Receipt,
    RetryPolicy,
    SagaStep,
    compensation_key,
)
from kernel.core.events import (
    CompensationFailed,
    CompensationSucceeded,
    DuplicateSuppressed,
    ExecutionFailed,
    ExecutionIntent,
    ExecutionRefused,
    ExecutionRetried,
    ExecutionSucceeded,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowDirty,
)
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.ports import Clock
from kernel.core.reasons import ReasonCode
from kernel.execution._calls import AdapterCalls
from kernel.policy.contracts import Outcome, Verdict
from kernel.policy.packs import PolicyCatalog
from kernel.runtime.actors import Mailbox, Outbox
from kernel.runtime.messages import (
    AdapterDone,
    DimMessage,
    Dispatch,
    Escalate,
    EscalationMessage,
    Execute,
    ExecutionMessage,
    Recheck,
    Recover,
    Resolve,
)
from kernel.state.approvals import ApprovalStatus, escalated_event
from kernel.state.domain import RecordingReceipt
from kernel.state.intents import mint, policy_of, stage_start, steps_of
from kernel.state.projections import Projections

Spawn = Callable[[Callable[[], Any]], None]


class ExecutionEngine:
    """The execution engine actor.

    Args:
        spawn: starts a coroutine function in the kernel's task group (adapter calls
            run beside the actor, so one slow adapter never stalls other flows).
        clock: the time port: backoff waits and validity checks read it.
        rng: the seeded source of backoff jitter (shared across actor restarts).
        retry: the retry policy of adapters that declare none.
        unsure: keys whose outcome an attempt left unknown (shared across actor restarts).
        dim: the DIM's mailbox: an accepted flow left unstarted (or an approval the DIM had
            not judged again) goes there to be judged again before it starts.
    """

    def __init__(
        self,
        catalog: PolicyCatalog,
        adapters: Mapping[str, Adapter],
        mailbox: Mailbox[ExecutionMessage],
        spawn: Spawn,
        *,
        projections: Projections | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        retry: RetryPolicy | None = None,
        escalation: Mailbox[EscalationMessage] | None = None,
        unsure: set[str] | None = None,
        dim: Mailbox[DimMessage] | None = None,
    ) -> None:
        self._catalog = catalog
        self._adapters = adapters
        self._mailbox = mailbox
        self._spawn = spawn
        self._projections = projections
        self._clock = clock
        self._rng = rng or random.Random(0)
        self._retry = retry or RetryPolicy()
        self._escalation = escalation
        self._dim = dim
        records = projections.records if projections is not None else {}
        self._calls = AdapterCalls(adapters, mailbox, clock, records)
        self._resumed: set[str] = set()
        """Keys recovery called again: a Dispatch racing with recovery must not call twice."""
        self._unsure = unsure if unsure is not None else set()
        """Keys an attempt (or a crash) of this run may have carried out unanswered."""

    async def handle(self, msg: ExecutionMessage, out: Outbox) -> None:
        match msg:
            case Execute():
                self._execute(msg, out)
            case AdapterDone():
                self._done(msg, out)
            case Dispatch():
                self._dispatch(msg, out)
            case Recover():
                self._recover(out)
            case Resolve():
                self._resolve(msg, out)

    # --- starting ------------------------------------------------------------

    def _execute(self, msg: Execute, out: Outbox) -> None:
        flow = out.flow(msg.dfid)
        if flow is None or flow.proposal is None:
            return
        if flow.status is not FlowStatus.ACCEPTED:
            # Delivered again (or late): answer from the record, never call twice.
            out.emit(DuplicateSuppressed(key=flow.intent_key, source="delivery"), dfid=msg.dfid)
            outcome = Outcome.DUPLICATE if flow.status is FlowStatus.CLOSED else Outcome.ACCEPTED
            out.reply(
                msg.reply,
                Verdict(
                    outcome=outcome,
                    dfid=msg.dfid,
                    attempt=flow.attempts,
                    external_id=flow.external_id,
                ),
            )
            return
        if self._dim is not None:
            # It waited: judged again against what is in force before it starts.
            out.send(self._dim, Recheck(dfid=msg.dfid, via="queue", reply=msg.reply))
            return
        self._start_accepted(flow, out)
        out.reply(
            msg.reply, Verdict(outcome=Outcome.ACCEPTED, dfid=msg.dfid, attempt=flow.attempts)
        )

    def _start_accepted(self, flow: FlowState, out: Outbox) -> None:
        if self._dim is not None and flow.done == 0:
            # An accepted flow an earlier run left unstarted waited: it is judged again
            # against what is in force now, and the DIM starts it (or refuses it).
            out.send(self._dim, Recheck(dfid=flow.dfid, via="queue"))
            return
        intent = stage_start(self._catalog, flow, out)
        if intent is not None:
            self._call_after_commit(flow.dfid, intent, 1, fresh=True, out=out)

    def _start(self, dfid: str, intent: ExecutionIntent, out: Outbox) -> None:
        flow = out.flow(dfid)
        assert flow is not None
        stage_start(self._catalog, flow, out, intent)
        self._call_after_commit(dfid, intent, 1, fresh=True, out=out)

    def _dispatch(self, msg: Dispatch, out: Outbox) -> None:
        """Call the adapter of an intent whose start the DIM recorded with its acceptance."""
        flow = out.flow(msg.dfid)
        if (
            flow is None
            or flow.pending is None
            or flow.pending.key != msg.key
            or flow.retries != 0
            or msg.key in self._resumed
        ):
            return  # recovery already called it, or it was answered meanwhile
        self._call_after_commit(msg.dfid, flow.pending, 1, fresh=True, out=out)

    def _call_after_commit(
        self,
        dfid: str,
        intent: ExecutionIntent,
        attempt: int,
        *,
        fresh: bool,
        out: Outbox,
        at_ns: int | None = None,
    ) -> None:
        out.after_commit_with(
            self._spawn, partial(self._calls.call, dfid, intent, attempt, fresh, at_ns)
        )

    def _steps(self, flow: FlowState) -> list[SagaStep]:
        assert flow.proposal is not None
        return steps_of(policy_of(self._catalog, flow.proposal)[0])

    def _policy_of(self, adapter_name: str) -> RetryPolicy:
        policy = getattr(self._adapters[adapter_name], "retry_policy", None)
        return policy if isinstance(policy, RetryPolicy) else self._retry

    # --- results ----------------------------------------------------------------

    def _done(self, msg: AdapterDone, out: Outbox) -> None:
        flow = out.flow(msg.dfid)
        intent = _answered(flow, msg)
        if flow is None or intent is None:
            return  # a late answer to something already decided (or waiting for a human)
        policy = self._policy_of(intent.adapter)
        if msg.receipt is None and msg.violation is None:
            if self._answered_later(flow, intent, msg, policy, out):
                return
        if intent.compensation:
            self._compensation_done(flow, intent, msg, out)
        elif msg.receipt is not None:
            self._succeeded(intent, msg, msg.receipt, out)
        elif msg.violation is not None:
            self._violated(flow, intent, msg, msg.violation, out)
        else:
            self._failed(flow, intent, msg, policy, out)

    def _violated(
        self,
        flow: FlowState,
        intent: ExecutionIntent,
        msg: AdapterDone,
        v: Violation,
        out: Outbox,
    ) -> None:
        out.emit(
            ExecutionRefused(
                key=msg.key,
                reason_code=ReasonCode.EXECUTION_CONSTRAINT_VIOLATED,
                bound=v.bound,
                detail=v.detail,
                bounds=intent.bounds,
                observed=v.observed,
            ),
            dfid=msg.dfid,
        )
        self._fail(flow, intent, ReasonCode.EXECUTION_CONSTRAINT_VIOLATED, v.detail, out)

    def _failed(
        self,
        flow: FlowState,
        intent: ExecutionIntent,
        msg: AdapterDone,
        policy: RetryPolicy,
        out: Outbox,
    ) -> None:
        out.emit(
            ExecutionFailed(key=msg.key, error=msg.error, transient=msg.transient),
            dfid=msg.dfid,
        )
        detail = (
            f"{policy.max_attempts} attempts failed; last: {msg.error}"
            if msg.transient
            else msg.error
        )
        escalate = msg.transient and policy.on_exhausted == "escalate"
        self._fail(flow, intent, ReasonCode.EXECUTION_FAILED, detail, out, escalate=escalate)

    def _answered_later(
        self,
        flow: FlowState,
        intent: ExecutionIntent,
        msg: AdapterDone,
        policy: RetryPolicy,
        out: Outbox,
    ) -> bool:
        """For a call without a result: retry, look the key up or escalate; False to fail it."""
        unknown = self._unknown(intent, msg)
        if msg.transient and msg.attempt < policy.max_attempts:
            self._retry_later(flow, intent, msg, policy, out, unknown=unknown)
            return True
        if unknown and not msg.looked_up and self._has_lookup(intent.adapter):
            # Before any human: ask the system what became of the key (a read,
            # nothing to record first). Its answer comes back as this attempt's.
            out.after_commit_with(self._spawn, partial(self._calls.look_up, msg.dfid, intent, msg))
            return True
        if unknown and msg.transient and self._still_valid(intent, policy):
            # The adapter honours the key: calling again cannot double the effect.
            self._retry_later(flow, intent, msg, policy, out, unknown=True)
            return True
        if unknown:
            self._escalate_unknown(flow, intent, msg, out)
            return True
        return False

    def _succeeded(
        self, intent: ExecutionIntent, msg: AdapterDone, receipt: Receipt, out: Outbox
    ) -> None:
        self._unsure.discard(msg.key)
        if isinstance(receipt, RecordingReceipt):
            self._remember(receipt, msg.key, out)
        out.emit(
            ExecutionSucceeded(
                key=msg.key,
                external_id=receipt.external_id,
                detail=receipt.detail,
                recovered=msg.found,
                # A single action's success ends its flow: one row where two events
                # travel together, the FlowClosed derived from it for every reader.
                closes=intent.step == 0,
            ),
            dfid=msg.dfid,
        )
        if intent.step == 0 and self._catalog.reads_only.get(intent.kind, False):
            out.commit_lazily(msg.dfid)  # a read's outcome: group commit
        self._advance_after(intent, msg.dfid, out)

    def _remember(self, receipt: RecordingReceipt, key: str, out: Outbox) -> None:
        """Stage a memory intent's events, before its ExecutionSucceeded in the same append.

        Caused by the intent's ExecutionStarted, on its flow and agent, as the memory
        projection noted them; a key already recorded is not recorded again.
        """
        memory = self._projections.memory if self._projections is not None else None
        pending = memory.pending.get(key) if memory is not None else None
        if memory is None or pending is None or key in memory.written:
            return
        for record in receipt.records:
            out.emit(
                record,
                dfid=pending.dfid,
                caused_by=pending.started_seq,
                agent_id=pending.agent_id,
            )

    def _advance_after(self, intent: ExecutionIntent, dfid: str, out: Outbox) -> None:
        if intent.step != 0:
            self._advance(dfid, out)
        # else a single action: its success closes the flow (``closes``), nothing follows

    # --- unknown outcomes ---------------------------------------------------------

    def _has_lookup(self, adapter_name: str) -> bool:
        return callable(getattr(self._adapters[adapter_name], "lookup", None))

    def _unknown(self, intent: ExecutionIntent, msg: AdapterDone) -> bool:
        """Whether the effect of ``intent`` may exist although no answer says so.

        With ``lookup``, every repeated call asked first, so only this attempt
        counts (and a lookup's own None settles it). Without, an earlier
        attempt's lost answer, or a crash while the key was pending, may be the
        effect that a later transient refusal (a gateway's 503, which never
        reached the system's key) does not reveal. A terminal refusal does: a
        system that honours keys answers a key that took effect with its
        receipt, never with a refusal.
        """
        if msg.looked_up:
            return msg.unknown
        if msg.unknown:
            self._unsure.add(msg.key)
            return True
        if self._has_lookup(intent.adapter):
            return False
        if not msg.transient:
            self._unsure.discard(msg.key)
            return False
        return msg.key in self._unsure or msg.key in self._resumed

    def _still_valid(self, intent: ExecutionIntent, policy: RetryPolicy) -> bool:
        """Whether one more call, after the next delay, falls inside the intent's validity."""
        if self._clock is None or intent.valid_until_ns is None:
            return False
        delay_ns = int(policy.max_s * 1e9)
        return self._clock.now_ns() + delay_ns < intent.valid_until_ns

    def _escalate_unknown(
        self,
        flow: FlowState,
        intent: ExecutionIntent,
        msg: AdapterDone,
        out: Outbox,
    ) -> None:
        """Hand the flow to a human, the intent still pending: it may have taken effect."""
        what = f"compensation of step {intent.step}" if intent.compensation else "the effect"
        detail = (
            f"outcome unknown: {what} may have happened (key {intent.key});"
            f" {msg.attempt} attempt(s), last: {msg.error}; reconcile or retry"
        )[:1000]
        if intent.compensation:
            out.emit(
                CompensationFailed(
                    key=msg.key,
                    step=intent.step,
                    error=msg.error,
                    transient=msg.transient,
                    unknown=True,
                ),
                dfid=flow.dfid,
            )
        else:
            out.emit(
                ExecutionFailed(
                    key=msg.key, error=msg.error, transient=msg.transient, unknown=True
                ),
                dfid=flow.dfid,
            )
        event = escalated_event(
            flow.dfid, flow.proposal, self._catalog, ReasonCode.OUTCOME_UNKNOWN, detail
        )
        if flow.done > 0 or intent.compensation:
            event = msgspec.structs.replace(event, partial=self._partial(flow, intent))
        out.emit(event, dfid=flow.dfid)
        if self._escalation is not None:
            out.send(self._escalation, Escalate(dfid=flow.dfid))

    def _partial(self, flow: FlowState, intent: ExecutionIntent) -> dict[str, Any]:
        """The saga's state for the human: steps in effect, undone, and the one in doubt."""
        if intent.compensation:
            return {
                "in_effect": list(range(1, intent.step + 1)),
                "undone": list(range(flow.done, intent.step, -1)),
                "unknown_compensation": intent.step,
            }
        return {
            "in_effect": list(range(1, flow.done + 1)),
            "undone": [],
            "unknown_step": intent.step,
        }

    def _resolve(self, msg: Resolve, out: Outbox) -> None:
        """Go on after a human's recorded reconcile (the result) or retry (call again)."""
        flow = out.flow(msg.dfid)
        if flow is not None and flow.status in (FlowStatus.EXECUTING, FlowStatus.DIRTY):
            self._resume(flow, out)

    def _retry_later(
        self,
        flow: FlowState,
        intent: ExecutionIntent,
        msg: AdapterDone,
        policy: RetryPolicy,
        out: Outbox,
        *,
        unknown: bool = False,
    ) -> None:
        assert self._clock is not None
        delay_ns = int(policy.delay_s(msg.attempt, self._rng) * 1e9)
        at_ns = self._clock.now_ns() + delay_ns
        out.emit(
            ExecutionRetried(
                key=msg.key,
                attempt=msg.attempt,
                error=msg.error,
                delay_ns=delay_ns,
                retry_at_ns=at_ns,
                unknown=unknown,
            ),
            dfid=flow.dfid,
        )
        self._call_after_commit(
            flow.dfid, intent, msg.attempt + 1, fresh=False, out=out, at_ns=at_ns
        )

    def _advance(self, dfid: str, out: Outbox) -> None:
        """Start the next step of an executing flow, or close it when none is left."""
        flow = out.flow(dfid)
        assert flow is not None
        steps = self._steps(flow)
        if flow.done < len(steps):
            self._start(dfid, mint(self._catalog, flow, flow.done + 1), out)
        else:
            out.emit(FlowClosed(), dfid=dfid)

    def _fail(
        self,
        flow: FlowState,
        intent: ExecutionIntent,
        code: ReasonCode,
        detail: str,
        out: Outbox,
        *,
        escalate: bool = False,
    ) -> None:
        if flow.done > 0:
            out.emit(FlowDirty(step=intent.step, reason_code=code, detail=detail), dfid=flow.dfid)
            self._compensate_next(flow.dfid, out)
        elif escalate:
            # An operational escalation: the human approves (or not) the very action.
            out.emit(
                escalated_event(flow.dfid, flow.proposal, self._catalog, code, detail),
                dfid=flow.dfid,
            )
            if self._escalation is not None:
                out.send(self._escalation, Escalate(dfid=flow.dfid))
        else:
            out.emit(FlowAborted(reason_code=code, detail=detail), dfid=flow.dfid)

    # --- compensation -------------------------------------------------------------

    def _compensate_next(self, dfid: str, out: Outbox) -> None:
        """Undo the latest step still in effect, or end the flow COMPENSATED."""
        flow = out.flow(dfid)
        assert flow is not None
        steps = self._steps(flow)
        step = flow.done - flow.undone
        while step >= 1 and steps[step - 1].compensation is None:
            # Nothing to undo for this step: record that, so recovery need not ask.
            key = compensation_key(dfid, steps[step - 1].action, step)
            out.emit(CompensationSucceeded(key=key, step=step), dfid=dfid)
            step -= 1
        if step == 0:
            out.emit(FlowCompensated(steps=flow.done), dfid=dfid)
            return
        flow = out.flow(dfid)
        assert flow is not None
        self._start(dfid, mint(self._catalog, flow, step, compensation=True), out)

    def _compensation_done(
        self, flow: FlowState, intent: ExecutionIntent, msg: AdapterDone, out: Outbox
    ) -> None:
        if msg.receipt is not None:
            out.emit(
                CompensationSucceeded(
                    key=msg.key,
                    step=intent.step,
                    external_id=msg.receipt.external_id,
                    detail=msg.receipt.detail,
                    recovered=msg.found,
                ),
                dfid=flow.dfid,
            )
            self._compensate_next(flow.dfid, out)
            return
        out.emit(
            CompensationFailed(
                key=msg.key, step=intent.step, error=msg.error, transient=msg.transient
            ),
            dfid=flow.dfid,
        )
        in_effect = list(range(1, intent.step + 1))
        undone = list(range(flow.done, intent.step, -1))
        detail = (
            f"compensation of step {intent.step} ({intent.action}) failed: {msg.error};"
            f" steps {in_effect} are still in effect, steps {undone} were undone,"
            f" step {flow.done + 1} failed ({flow.detail})"
        )
        partial = {
            "in_effect": in_effect,
            "undone": undone,
            "failed_step": flow.done + 1,
            "failed_compensation": intent.step,
        }
        event = escalated_event(
            flow.dfid, flow.proposal, self._catalog, ReasonCode.EXECUTION_FAILED, detail[:1000]
        )
        out.emit(msgspec.structs.replace(event, partial=partial), dfid=flow.dfid)
        if self._escalation is not None:
            out.send(self._escalation, Escalate(dfid=flow.dfid))

    # --- recovery -------------------------------------------------------------------

    def _recover(self, out: Outbox) -> None:
        """Resume what an earlier run left between acceptance and a recorded end."""
        if self._projections is None:
            return
        approvals = self._projections.approvals
        for flow in list(self._projections.flows.values()):
            if flow.status is FlowStatus.ACCEPTED:
                self._start_accepted(flow, out)
            elif (
                flow.status is FlowStatus.ESCALATED
                and self._dim is not None
                and flow.dfid in approvals
                and approvals[flow.dfid].status is ApprovalStatus.APPROVED
            ):
                # Approved, and stopped before the DIM judged it again: it does now.
                out.send(self._dim, Recheck(dfid=flow.dfid, via="approval"))
            elif flow.status in (FlowStatus.EXECUTING, FlowStatus.DIRTY):
                self._resume(flow, out)

    def _resume(self, flow: FlowState, out: Outbox) -> None:
        """Go on with an executing (or compensating) flow from what the journal says."""
        if flow.pending is not None:
            # Started, maybe carried out, not answered: the same key again,
            # asking the adapter's lookup first where it has one.
            attempt = flow.retries + 1
            self._resumed.add(flow.pending.key)
            self._call_after_commit(flow.dfid, flow.pending, attempt, fresh=False, out=out)
        elif flow.status is FlowStatus.DIRTY:
            self._compensate_next(flow.dfid, out)
        else:
            self._advance(flow.dfid, out)


def _answered(flow: FlowState | None, msg: AdapterDone) -> ExecutionIntent | None:
    """The intent ``msg`` is the awaited answer to, or None for a late one."""
    if (
        flow is None
        or flow.pending is None
        or flow.pending.key != msg.key
        or msg.attempt != flow.retries + 1
        or flow.status not in (FlowStatus.EXECUTING, FlowStatus.DIRTY)
    ):
        return None
    return flow.pending
