"""Minting ExecutionIntents from accepted flows, and staging their start.

Kept apart from the engine's actor so that whoever records an acceptance can
record the start of its execution in the same append: the DIM stages
ProposalAccepted and ExecutionStarted together (one commit per flow fewer; one
row, when nothing was recorded between them: ``ProposalAccepted.start``), then
hands the engine a :class:`Dispatch`, and only the engine calls adapters.
Record first still holds: the dispatch is sent after the batch committed. The
execution engine uses the same functions for human approvals, recovery, later
saga steps and compensations, so an intent is minted one way.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from kernel.adapters.constraints import bounds_of
from kernel.adapters.contract import SagaStep, compensation_key, idempotency_key
from kernel.core.events import (
    CompensationStarted,
    ExecutionIntent,
    ExecutionStarted,
    FlowAborted,
    Payload,
    ProposalRecord,
)
from kernel.core.flow import FlowState
from kernel.core.reasons import ReasonCode
from kernel.policy.packs import PolicyCatalog


class Emits(Protocol):
    """Where a start is staged: an actor's Outbox (kernel.runtime.actors)."""

    def emit(self, payload: Payload, *, dfid: str | None = None) -> int: ...

    def travel_with(self, dfid: str, payload: Payload) -> int | None: ...


def policy_of(
    catalog: PolicyCatalog, proposal: ProposalRecord, policy: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Return the proposal as its kind's typed policy, and that policy's parameters.

    The parameters go through the kind's type so the adapter sees exactly what
    the DIM validated; ``policy``, when given, is that typed policy already.
    """
    kind = catalog.kinds[proposal.kind]
    if type(policy) is not kind:
        policy = msgspec.convert({"kind": proposal.kind, **proposal.params}, kind)
    params = msgspec.to_builtins(policy)
    params.pop("kind", None)
    return policy, params


def steps_of(policy: Any) -> list[SagaStep]:
    """Return a policy's saga steps (empty for a single action)."""
    steps = getattr(policy, "steps", None)
    return list(steps()) if callable(steps) else []


def mint(
    catalog: PolicyCatalog,
    flow: FlowState,
    step: int | None = None,
    *,
    compensation: bool = False,
    policy: Any = None,
) -> ExecutionIntent:
    """Mint the intent of ``flow``'s step ``step`` (0: the single action; None: the first).

    A compensation carries no bounds and no deadline: undoing must not be refused.
    ``policy`` is the proposal already converted to its kind (by the DIM), if at hand.
    """
    proposal = flow.proposal
    assert proposal is not None
    policy, params = policy_of(catalog, proposal, policy)
    kind = catalog.kinds[proposal.kind]
    common: dict[str, Any] = {"kind": proposal.kind, "adapter": kind.adapter}
    steps = steps_of(policy) if step != 0 else []
    if step is None:
        step = 1 if steps else 0
    if step == 0:
        return ExecutionIntent(
            key=idempotency_key(flow.dfid, proposal.kind),
            params=params,
            valid_until_ns=proposal.valid_until_ns,
            bounds=bounds_of(policy, params),
            **common,
        )
    saga = steps[step - 1]
    if compensation:
        return ExecutionIntent(
            key=compensation_key(flow.dfid, saga.action, step),
            params=saga.compensation or {},
            step=step,
            action=saga.action,
            compensation=True,
            **common,
        )
    return ExecutionIntent(
        key=idempotency_key(flow.dfid, saga.action, step),
        params=saga.params,
        step=step,
        action=saga.action,
        valid_until_ns=proposal.valid_until_ns,
        bounds=bounds_of(policy, params),
        **common,
    )


def stage_start(
    catalog: PolicyCatalog,
    flow: FlowState,
    out: Emits,
    intent: ExecutionIntent | None = None,
    *,
    policy: Any = None,
) -> ExecutionIntent | None:
    """Stage the start of an accepted flow's execution; return the intent, or None if refused.

    ``intent`` (default: the flow's first) is what to start; a compensation stages
    CompensationStarted instead. The caller sends the engine a :class:`Dispatch`
    once the batch commits.
    """
    if intent is None and flow.done > 0:
        # A saga a human took over after a compensation failed: its effects are
        # partly undone, so running it forward again would guess. Refuse loudly.
        out.emit(
            FlowAborted(
                reason_code=ReasonCode.EXECUTION_FAILED,
                detail=f"saga has {flow.done - flow.undone} step(s) in effect after a"
                " failed compensation; it cannot be executed again, resolve by hand",
            ),
            dfid=flow.dfid,
        )
        return None
    if intent is None:
        intent = mint(catalog, flow, policy=policy)
    if intent.compensation:
        out.emit(CompensationStarted(intent=intent), dfid=flow.dfid)
        return intent
    started = ExecutionStarted(intent=intent)
    # Accepted in this append with nothing recorded since: the start travels with it.
    if out.travel_with(flow.dfid, started) is None:
        out.emit(started, dfid=flow.dfid)
    return intent
