"""A decision made in the browser, checked the way ``dirk decide`` checks it, as an inbox row.

The console never decides by itself: it writes the same row ``dirk decide``
writes, and the running kernel (whenever it runs) applies it once and records
what it made of it. The checks here spare the operator a round trip; the
kernel checks everything again at its wall.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kernel.core.flow import FlowStatus
from kernel.core.reasons import CliError, ReasonCode
from kernel.core.wall import who_and_why
from kernel.policy.kinds import Impact
from kernel.state.projections import Projections

DECISIONS = ("approve", "reject", "modify", "reconcile", "retry")
MAX_PARAMS_TEXT = 64 * 1024
"""The longest modified-parameters text a form may send (the wall caps what is recorded)."""


class Refused(Exception):
    """A decision the console will not queue, with its code (as ``dirk decide`` prints it)."""

    def __init__(self, code: ReasonCode | CliError, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def decision_row(
    projections: Projections,
    queued: set[str],
    dfid: str,
    form: Mapping[str, Any],
    operator: str,
) -> dict[str, Any]:
    """Return the inbox row for a decision form on flow ``dfid`` by ``operator``.

    ``form`` holds ``decision`` (one of DECISIONS), ``reason``, and as the
    decision needs: ``confirm`` (the short hash, to approve HIGH_IMPACT),
    ``params`` (JSON object text, to modify), ``outcome`` and ``external_id``
    (to reconcile).

    Raises:
        Refused: the decision cannot be queued, with the code ``dirk decide`` gives.
    """
    reason = _text(form, "reason").strip()
    problem = who_and_why(operator, reason)
    if problem is not None:
        raise Refused(ReasonCode.SCHEMA_INVALID, problem.replace("--", ""))
    choice = _text(form, "decision")
    if choice not in DECISIONS:
        raise Refused(ReasonCode.SCHEMA_INVALID, f"no such decision: {choice[:32]!r}")
    flow = projections.flows.get(dfid)
    approval = projections.approvals.get(dfid)
    if flow is None:
        raise Refused(CliError.UNKNOWN_FLOW, f"no flow {dfid[:64]}")
    if flow.status is not FlowStatus.ESCALATED or approval is None:
        raise Refused(ReasonCode.FLOW_NOT_ACTIVE, f"the flow is {flow.status}, not waiting")
    if dfid in queued:
        raise Refused(CliError.DECISION_QUEUED, "a decision on this flow already waits")
    row: dict[str, Any] = {"operator": operator, "reason": reason}
    resolving = choice in ("reconcile", "retry")
    if flow.pending is not None and not resolving:
        raise Refused(
            ReasonCode.OUTCOME_UNKNOWN,
            f"the effect may have happened (key {flow.pending.key}): look it up, then"
            " reconcile or retry",
        )
    if flow.pending is None and resolving:
        raise Refused(
            ReasonCode.SCHEMA_INVALID, f"reconcile and retry apply to an unknown outcome ({choice})"
        )
    if choice == "retry":
        return row | {"decision": "retry", "action_hash": approval.action_hash}
    if choice == "reconcile":
        outcome = _text(form, "outcome")
        external_id = _text(form, "external_id").strip()
        if outcome == "not_done":
            params: dict[str, Any] = {"outcome": "not_done"}
        elif outcome == "done" and external_id:
            params = {"outcome": "done", "external_id": external_id}
        else:
            raise Refused(
                ReasonCode.SCHEMA_INVALID, "reconcile takes done with an external id, or not done"
            )
        return (
            row
            | {"decision": "reconcile", "action_hash": approval.action_hash}
            | {"params": params}
        )
    if choice == "approve":
        typed = _text(form, "confirm").strip()
        if approval.impact is Impact.HIGH_IMPACT and not typed:
            raise Refused(
                CliError.CONFIRMATION_REQUIRED,
                "approving a HIGH_IMPACT action takes its short action hash typed back"
                " (under The proposed action)",
            )
        typed = typed or approval.action_hash
        if not approval.names(typed):
            raise Refused(
                ReasonCode.ACTION_MISMATCH,
                f"{typed[:64]!r} is not the hash of the action this flow waits on",
            )
        return row | {"decision": "approve", "action_hash": typed}
    if choice == "reject":
        return row | {"decision": "reject", "action_hash": approval.action_hash}
    text = _text(form, "params")
    if len(text) > MAX_PARAMS_TEXT:
        raise Refused(ReasonCode.SCHEMA_INVALID, "the new parameters are too long")
    try:
        params = json.loads(text)
    except (ValueError, RecursionError) as exc:
        problem = f"the new parameters are not JSON ({exc})"
        raise Refused(ReasonCode.SCHEMA_INVALID, problem) from None
    if not isinstance(params, dict):
        raise Refused(ReasonCode.SCHEMA_INVALID, "the new parameters must be a JSON object")
    return row | {"decision": "modify", "action_hash": approval.action_hash, "params": params}


def _text(form: Mapping[str, Any], key: str) -> str:
    value = form.get(key, "")
    return value if isinstance(value, str) else ""
