"""The checks a client makes before it posts a request: one set, for the CLI, console and MCP.

``dirk decide``, the console's review page and the MCP server's ``decide`` tool all
build their request here, from the flow as the journal shows it, and refuse here
what the kernel would refuse at once: no operator or reason, a flow that does not
wait for a human, a decision already queued for it, an approval of a HIGH_IMPACT
action without its hash typed back, a hash of another action, a decision other than
reconcile or retry on an effect that may have happened, new parameters that are no
JSON object, or a value the kernel's wall refuses (kernel.inbox.requests.normalized:
a NaN, 1e999, a string that is not UTF-8, JSON nested past the wall's depth). The
kernel checks everything again when it applies the request; these checks only
spare the operator a round trip, with the same reason codes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import msgspec

from kernel.core.flow import FlowState, FlowStatus
from kernel.core.reasons import CliError, ReasonCode
from kernel.core.wall import InputInvalid, who_and_why
from kernel.inbox.requests import (
    AgentStatusRequest,
    AmendRequest,
    CredentialRequest,
    DecideRequest,
    GrantRequest,
    InboxRequest,
    RevokeGrantRequest,
    RuleChangeRequest,
    RuleDecisionRequest,
    VoteRequest,
    normalized,
)
from kernel.inbox.requests import grant_request as build_grant
from kernel.policy.kinds import Impact
from kernel.runtime.messages import Decision
from kernel.state.approvals import Approval
from kernel.state.grants import Grant, GrantStatus
from kernel.state.projections import AgentStatus
from kernel.state.quorums import Ballot
from kernel.state.rulebook import Rulebook

CHOICES = ("approve", "reject", "modify", "reconcile", "retry")
"""The decisions an operator picks from (``override`` and ``abort`` are older words)."""
MAX_PARAMS_TEXT = 64 * 1024
"""The longest new-parameters text a client sends (the wall caps what is recorded)."""
RULE_ACTIONS = ("add", "edit", "retract")


class RequestRefused(Exception):
    """A request a client will not post: its code (as the kernel would record it) and why.

    ``malformed``: the request itself is wrong (a blank reason, text that is no JSON, a
    value the wall refuses), not the state it meets (``dirk`` exits USAGE for it).
    """

    def __init__(
        self, code: ReasonCode | CliError, message: str, *, malformed: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.malformed = malformed


def checked(request: InboxRequest) -> Any:
    """Return ``request`` normalized, or refuse it as the kernel's wall would (SCHEMA_INVALID)."""
    try:
        return normalized(request)
    except InputInvalid as exc:
        raise RequestRefused(
            exc.reason_code, f"{exc.field}: {exc.detail}", malformed=True
        ) from None


def _who(operator: str, reason: str) -> None:
    problem = who_and_why(operator, reason)
    if problem is not None:
        raise RequestRefused(ReasonCode.SCHEMA_INVALID, problem.replace("--", ""), malformed=True)


def prepare_decision(
    flow: FlowState | None,
    approval: Approval | None,
    *,
    dfid: str,
    choice: str,
    operator: str,
    reason: str,
    confirm: str = "",
    params: str | Mapping[str, Any] | None = None,
    outcome: str = "",
    external_id: str = "",
    queued: bool = False,
    ballot: Ballot | None = None,
) -> DecideRequest:
    """Return the request for a decision on flow ``dfid`` (its state and approval as read).

    Args:
        flow, approval: the flow and its approval as the journal shows them (None: none).
        choice: approve, reject, modify, reconcile or retry.
        confirm: the action's hash (or a prefix of 8 or more) typed back; an approval of a
            HIGH_IMPACT action takes it.
        params: the new parameters of a modification: a JSON object, or its text.
        outcome, external_id: a reconciliation: ``done`` with the external id, or
            ``not_done``.
        queued: a decision on the flow already waits in the inbox.
        ballot: the flow's ballot (kernel.state.quorums): a vote the kernel would refuse
            (the operator voted already, proposed or modified the action) is refused here.

    Raises:
        RequestRefused: with the code the kernel would record (or ``dirk``'s own).
    """
    _who(operator, reason)
    if choice not in CHOICES:
        raise RequestRefused(
            ReasonCode.SCHEMA_INVALID, f"no such decision: {choice[:32]!r}", malformed=True
        )
    if flow is None:
        raise RequestRefused(CliError.UNKNOWN_FLOW, f"no flow {dfid[:64]}")
    if flow.status is not FlowStatus.ESCALATED or approval is None:
        raise RequestRefused(
            ReasonCode.FLOW_NOT_ACTIVE,
            f"flow {dfid[:64]} is {flow.status}, not waiting for a human",
        )
    if queued:
        raise RequestRefused(
            CliError.DECISION_QUEUED, f"a decision on {dfid[:64]} already waits for the kernel"
        )
    if ballot is not None and choice in ("approve", "reject", "modify"):
        _ballot_problem(ballot, operator, choice)
    _check_outcome(flow, approval, dfid, resolving=choice in ("reconcile", "retry"))
    new: dict[str, Any] | None = None
    action_hash = approval.action_hash
    if choice == "reconcile":
        new = _reconciled(outcome, external_id)
    elif choice == "approve":
        action_hash = _confirmed(approval, confirm, dfid)
    elif choice == "modify":
        new = _params(params)
    request = DecideRequest(
        dfid=dfid,
        decision=Decision(choice),
        operator=operator,
        reason=reason,
        params=new,
        action_hash=action_hash,
    )
    decided: DecideRequest = checked(request)
    return decided


def _check_outcome(flow: FlowState, approval: Approval, dfid: str, *, resolving: bool) -> None:
    """Refuse a resolution of a known outcome, and a decision on an unknown one."""
    if flow.pending is not None and not resolving:
        raise RequestRefused(
            ReasonCode.OUTCOME_UNKNOWN,
            f"the effect of {dfid[:64]} may have happened (key {flow.pending.key}): look it up,"
            " then reconcile (done with the external id, or not done) or retry",
        )
    if flow.pending is None and resolving:
        raise RequestRefused(
            ReasonCode.SCHEMA_INVALID,
            f"reconcile and retry apply to an unknown outcome; {dfid[:64]} escalated for"
            f" {approval.reason_code}",
        )


def _reconciled(outcome: str, external_id: str) -> dict[str, Any]:
    """Return a reconciliation's parameters: done with the external id, or not done."""
    if outcome == "not_done":
        return {"outcome": "not_done"}
    if outcome == "done" and external_id.strip():
        return {"outcome": "done", "external_id": external_id.strip()}
    raise RequestRefused(
        ReasonCode.SCHEMA_INVALID,
        "reconcile takes done with an external id, or not done",
        malformed=True,
    )


def _confirmed(approval: Approval, confirm: str, dfid: str) -> str:
    """Return the action hash an approval names: ``confirm`` typed back, or the approval's."""
    typed = confirm.strip()
    if approval.impact is Impact.HIGH_IMPACT and not typed:
        raise RequestRefused(
            CliError.CONFIRMATION_REQUIRED,
            f"approving a HIGH_IMPACT action takes its short hash typed back"
            f" ({dfid[:64]} waits on {approval.short_hash})",
        )
    action_hash = typed or approval.action_hash
    if not approval.names(action_hash):
        raise RequestRefused(
            ReasonCode.ACTION_MISMATCH,
            f"{action_hash[:64]!r} is not the hash of the action this flow waits on",
        )
    return action_hash


def _ballot_problem(ballot: Ballot, operator: str, choice: str) -> None:
    """Refuse a vote the desk would refuse: a second one, or the proposer's or a modifier's."""
    from kernel.escalation import same_principal  # the desk's own rule of one name

    rule = ballot.quorum
    if rule.required < 2 and not rule.roles:
        return  # no quorum: one decision, as ever
    waiting = ballot.waiting or f"0 of {rule.required}"
    for who in ballot.excluded:
        withdrawing = choice == "reject" and who == ballot.excluded[0]
        if same_principal(operator, who) and not withdrawing:
            raise RequestRefused(
                ReasonCode.SELF_APPROVAL_FORBIDDEN,
                f"{operator} proposed or modified this action and may not vote on it ({waiting})",
            )
    if any(v.operator == operator for v in ballot.votes) and rule.vote_ttl_s == 0:
        raise RequestRefused(
            ReasonCode.DUPLICATE_VOTE, f"{operator} voted on this approval already ({waiting})"
        )


def _params(params: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The new parameters of a modification, as a JSON object (text parsed without recursion)."""
    if params is None:
        raise RequestRefused(
            ReasonCode.SCHEMA_INVALID, "a modification takes new parameters", malformed=True
        )
    if isinstance(params, str):
        if len(params) > MAX_PARAMS_TEXT:
            raise RequestRefused(
                ReasonCode.SCHEMA_INVALID, "the new parameters are too long", malformed=True
            )
        try:
            # msgspec, not json: no NaN or Infinity literals, and no recursion to exhaust.
            params = msgspec.json.decode(params.encode("utf-8", "surrogatepass"))
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            raise RequestRefused(
                ReasonCode.SCHEMA_INVALID,
                f"the new parameters are not JSON ({exc})",
                malformed=True,
            ) from None
        except UnicodeDecodeError:
            raise RequestRefused(
                ReasonCode.SCHEMA_INVALID, "the new parameters are not UTF-8 text", malformed=True
            ) from None
    if not isinstance(params, Mapping):
        raise RequestRefused(
            ReasonCode.SCHEMA_INVALID, "the new parameters must be a JSON object", malformed=True
        )
    return dict(params)


def status_change(
    known: Collection[str], agent_id: str, status: str, *, operator: str, reason: str
) -> AgentStatusRequest:
    """Return the request that sets ``agent_id``'s status (``known``: the agents registered).

    Raises:
        RequestRefused: no operator or reason, an unknown agent or status.
    """
    _who(operator, reason)
    if agent_id not in known:
        raise RequestRefused(
            ReasonCode.UNKNOWN_AGENT, f"no agent {agent_id[:64]!r} ever registered"
        )
    if status not in {s.value for s in AgentStatus}:
        raise RequestRefused(
            ReasonCode.SCHEMA_INVALID, f"no such status: {status[:32]!r}", malformed=True
        )
    request: AgentStatusRequest = checked(
        AgentStatusRequest(
            agent_id=agent_id, status=AgentStatus(status), operator=operator, reason=reason
        )
    )
    return request


def rule_decision(
    book: Rulebook, seq: int, decision: str, *, operator: str, reason: str
) -> RuleDecisionRequest:
    """Return the request that overrides or skips deferred rule proposal ``seq``.

    Raises:
        RequestRefused: no operator or reason, an unknown decision, or no such proposal.
    """
    _who(operator, reason)
    if decision not in ("override", "skip"):
        raise RequestRefused(
            ReasonCode.SCHEMA_INVALID, f"no such decision: {decision[:32]!r}", malformed=True
        )
    if seq not in book.pending:
        raise RequestRefused(CliError.RULE_NOT_PENDING, f"no deferred rule proposal #{seq}")
    request: RuleDecisionRequest = checked(
        RuleDecisionRequest(
            proposal_seq=seq,
            decision=decision,  # type: ignore[arg-type]
            operator=operator,
            reason=reason,
        )
    )
    return request


def rule_change(
    book: Rulebook,
    rule: str,
    action: str,
    *,
    operator: str,
    reason: str,
    title: str = "",
    content: str = "",
    labels: Iterable[str] = (),
    ns: str = "default",
) -> RuleChangeRequest:
    """Return the request that adds, edits or retracts ``rule`` of namespace ``ns`` in ``book``.

    Raises:
        RequestRefused: no operator or reason, an unknown action, a retract or edit of a
            rule not in force, an add of one in force, or an add or edit without a title
            and a text.
    """
    _who(operator, reason)
    if action not in RULE_ACTIONS:
        raise RequestRefused(CliError.BAD_ARGUMENT, f"no such rule action: {action[:32]!r}")
    item = book.item(rule, ns)
    in_force = item is not None and item.current is not None
    if action in ("retract", "edit") and not in_force:
        raise RequestRefused(CliError.UNKNOWN_RULE, f"no rule {rule[:64]!r} in force")
    if action == "retract":
        request = RuleChangeRequest(
            action="retract", rule=rule, operator=operator, reason=reason, ns=ns
        )
    else:
        if not title or not content:
            raise RequestRefused(CliError.BAD_ARGUMENT, "an add or edit takes a title and a text")
        if action == "add" and in_force:
            raise RequestRefused(CliError.BAD_ARGUMENT, f"rule {rule[:64]!r} exists: edit it")
        request = RuleChangeRequest(
            action=action,  # type: ignore[arg-type]
            rule=rule,
            operator=operator,
            reason=reason,
            title=title,
            content=content,
            labels=list(labels),
            base_version=item.latest if item is not None else 0,
            ns=ns,
        )
    changed: RuleChangeRequest = checked(request)
    return changed


def amendment(
    agent_id: str,
    limit: str,
    value: int | str,
    ttl_s: float,
    *,
    operator: str,
    reason: str,
) -> AmendRequest:
    """Return the request that amends ``agent_id``'s ``limit`` to ``value`` for ``ttl_s`` s.

    Raises:
        RequestRefused: no operator or reason, or a value or time the wall refuses.
    """
    _who(operator, reason)
    request: AmendRequest = checked(
        AmendRequest(
            agent_id=agent_id,
            limit=limit,
            value=value,
            ttl_s=ttl_s,
            operator=operator,
            reason=reason,
        )
    )
    return request


def credential(agent_id: str, verifier: str, *, operator: str, reason: str) -> CredentialRequest:
    """Return the request that provisions ``agent_id``'s credential from its verifier.

    Raises:
        RequestRefused: no operator or reason, or a field the wall refuses.
    """
    _who(operator, reason)
    request: CredentialRequest = checked(
        CredentialRequest(agent_id=agent_id, verifier=verifier, operator=operator, reason=reason)
    )
    return request


_BOUND_WORDS = (("<=", "max"), (">=", "min"), ("=", "eq"))


def bounds_of(terms: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Read a grant's bounds from ``field=value``, ``field<=n``, ``field>=n`` and
    ``field=a|b`` terms (a value that reads as JSON is taken as JSON: ``guests=2``).

    Raises:
        RequestRefused: a term that is none of these.
    """
    bounds: dict[str, dict[str, Any]] = {}
    for term in terms:
        for sign, word in _BOUND_WORDS:
            name, found, value = term.partition(sign)
            if found and name.strip() and value.strip():
                spec = bounds.setdefault(name.strip(), {})
                text = value.strip()
                if word == "eq" and "|" in text:
                    spec["in"] = [_scalar(v) for v in text.split("|")]
                else:
                    spec[word] = text if word != "eq" else _scalar(text)
                break
        else:
            raise RequestRefused(
                CliError.BAD_ARGUMENT, f"{term[:64]!r} is not FIELD=VALUE, FIELD<=N or FIELD>=N"
            )
    return bounds


def _scalar(text: str) -> Any:
    try:
        value = msgspec.json.decode(text.encode("utf-8", "surrogatepass"))
    except (msgspec.DecodeError, UnicodeDecodeError):
        return text
    return value if isinstance(value, int | str | bool) and not isinstance(value, float) else text


def grant_request(
    kinds: Collection[str],
    kind: str,
    *,
    operator: str,
    reason: str,
    uses: int,
    agent: str = "*",
    bounds: Mapping[str, Mapping[str, Any]] | None = None,
    valid_from_ns: int | None = None,
    valid_until_ns: int | None = None,
    valid_for_s: float | None = None,
    cap: str = "",
) -> GrantRequest:
    """Return the request for a standing grant (``kinds``: the policy kinds the journal knows).

    Raises:
        RequestRefused: no operator or reason, an unknown kind, a cap that is not money
            (``"1,000.00 EUR"``), no end, or a field the wall refuses.
    """
    _who(operator, reason)
    if kinds and kind not in kinds:
        raise RequestRefused(ReasonCode.SCHEMA_INVALID, f"no policy kind {kind[:64]!r} is known")
    try:
        return build_grant(
            kind,
            operator=operator,
            reason=reason,
            uses=uses,
            agent=agent,
            bounds=bounds,
            valid_from_ns=valid_from_ns,
            valid_until_ns=valid_until_ns,
            valid_for_s=valid_for_s,
            cap=cap or None,
        )
    except InputInvalid as exc:
        message = exc.detail if exc.field == "cap" else f"{exc.field}: {exc.detail}"
        raise RequestRefused(exc.reason_code, message, malformed=True) from None


def grant_vote(
    grant: Grant | None, grant_id: str, vote: str, *, operator: str, reason: str
) -> VoteRequest:
    """Return the request for a vote on a pending grant (``grant`` as the journal shows it).

    Raises:
        RequestRefused: no operator or reason, a grant not waiting for votes, a second vote.
    """
    _who(operator, reason)
    if grant is None or grant.status is not GrantStatus.PENDING:
        status = grant.status if grant is not None else "unknown"
        raise RequestRefused(
            ReasonCode.GRANT_NOT_LIVE, f"grant {grant_id[:64]} is {status}, not voted on"
        )
    if any(v.operator == operator for v in grant.votes):
        raise RequestRefused(
            ReasonCode.DUPLICATE_VOTE, f"{operator} voted on {grant_id[:64]} already"
        )
    request: VoteRequest = checked(
        VoteRequest(grant=grant_id, vote=vote, operator=operator, reason=reason)  # type: ignore[arg-type]
    )
    return request


def grant_revocation(
    grant: Grant | None, grant_id: str, *, operator: str, reason: str
) -> RevokeGrantRequest:
    """Return the request that revokes a grant.

    Raises:
        RequestRefused: no operator or reason, or a grant that is not in force.
    """
    _who(operator, reason)
    if grant is None or grant.status not in (GrantStatus.PENDING, GrantStatus.LIVE):
        status = grant.status if grant is not None else "unknown"
        raise RequestRefused(
            ReasonCode.GRANT_NOT_LIVE, f"grant {grant_id[:64]} is {status}: nothing to revoke"
        )
    request: RevokeGrantRequest = checked(
        RevokeGrantRequest(grant=grant_id, operator=operator, reason=reason)
    )
    return request
