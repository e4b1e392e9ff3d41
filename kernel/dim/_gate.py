"""The DIM's pipeline as a pure function: (proposal, inputs, time, packs) -> judgement.

The layers run in this fixed order and the first that fails decides; its
feedback names the layer, the rule, the field and the limit:

1. ``schema``: kind, version and parameters of the policy kind (SCHEMA_INVALID);
1b. ``principal``: on whose behalf, on journals whose fold rules know principals
   (kernel.dim._principal: PRINCIPAL_MISSING, TENANT_NOT_MEMBER, SCOPE_MISSING,
   SCOPE_NOT_DELEGATED, POLICY_DENIED, RATE_LIMITED; a layer that flags the call
   escalates it, APPROVAL_REQUIRED, unless a human modified it);
2. ``status``: the agent is ACTIVE (AGENT_PASSIVE, AGENT_SUSPENDED, AGENT_RETIRED),
   and none of its sagas has effects not yet converged (AGENT_PASSIVE);
3. ``authority``: the kind is among the agent's capabilities, and every parameter
   its manifest ``limits`` name is in scope (a list: allowed values; a number: a
   maximum) (UNAUTHORIZED);
4. ``time``: the validity window (EXPIRED);
5. ``state``: the context reference is the current visible state's (STALE_CONTEXT);
6. ``resources``: what the kind consumes fits its pools (INSUFFICIENT_RESOURCES
   when the capacity is too small, RESOURCE_CONTENTION when other open flows hold it);
7. ``rules``: the pack's invariants, then its rules (RISK_LIMIT_EXCEEDED and the
   pack's own codes; KERNEL_FAULT when a rule raises or returns nothing), then its
   emergency rules (GUARD_EMERGENCY, see kernel.policy.guards);
8. ``memory``: constraints from governed memory (a port, :data:`MemoryCheck`;
   CONSTRAINT_VIOLATION, VERIFICATION_REQUIRED);
9. ``escalation``: a money budget over its ceiling that says so (BUDGET_EXHAUSTED),
   thresholds (LOW_CONFIDENCE, APPROVAL_REQUIRED), then the kind's own rule,
   ``needs_human()`` (an authority threshold, ambiguity): an ESCALATE verdict, with the
   quorum the pack asks for it (kernel.policy.quorums). A live standing grant that
   covers the proposal (kernel.state.grants) turns it into an acceptance that uses
   the grant; a budget's escalation no grant covers.

Between 6 and 7, ``budgets``: what the kind costs (kernel.policy.money) is held in
each of its money budgets' pools, beside its resources, against the budget's ceiling
less what was spent within its window and what other open flows hold
(BUDGET_EXHAUSTED, or an escalation as the budget says).

Human modifications skip the state and escalation layers and the unsettled-saga
check: a human already looked (an escalation whose quorum takes more than one
operator, or a role, is kept: the modifier cannot approve what they changed). A
*recheck* (an approved or queued action judged again just before it executes) skips
the time layer (the engine checks the validity window at the call itself), the state
layer and the unsettled-saga check, and keeps the escalation, for the DIM to
compare with what was approved. The DIM and replay reach this function only
through :func:`kernel.dim.verdict.verdict`, which builds the inputs.
Nothing here reads a clock: the verdict is a function of its arguments, which the
journal records, so replay judges as the live kernel did. How long each rule took
is measured beside the verdict by an optional :class:`~kernel.policy.rules.Stopwatch`,
whose findings never change it (see kernel.policy.rules).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import msgspec
from msgspec.structs import replace

from kernel.core.events import Feedback, ProposalRecord, QuorumRule
from kernel.core.reasons import ReasonCode
from kernel.dim._judgement import GrantUse, Inputs, Judgement, reject
from kernel.dim._principal import on_behalf_refusal
from kernel.dim._resources import cost_of, money_held, pools_held
from kernel.policy.contracts import field_of
from kernel.policy.guards import emergency
from kernel.policy.kinds import Impact
from kernel.policy.money import format_money
from kernel.policy.packs import PolicyCatalog, PolicyPack, Threshold, amount_of
from kernel.policy.quorums import SINGLE
from kernel.policy.rules import (
    DECIMAL_PATTERN,
    Range,
    RuleVerdict,
    StateMatch,
    Stopwatch,
    View,
    decimal_of,
    is_decimal,
    run_rule,
)
from kernel.state.grants import covering
from kernel.state.projections import AgentStatus, AgentView

LAYERS = (
    "schema",
    "principal",
    "status",
    "authority",
    "time",
    "state",
    "resources",
    "budgets",
    "rules",
    "memory",
    "escalation",
)
"""The layers of the pipeline, in the order they run."""

_STATUS_CODES = {
    AgentStatus.PASSIVE: ReasonCode.AGENT_PASSIVE,
    AgentStatus.SUSPENDED: ReasonCode.AGENT_SUSPENDED,
    AgentStatus.RETIRED: ReasonCode.AGENT_RETIRED,
}

MemoryCheck = Callable[[ProposalRecord, View], Feedback | None]
"""The memory layer's port: return the feedback of a violated constraint, or None."""


def _tenant(inputs: Inputs) -> str:
    """The tenant the proposal is made for ("" for none, or a journal before principals)."""
    behalf = inputs.principal.on_behalf if inputs.principal is not None else None
    return behalf.principal.tenant if behalf is not None else ""


def _from_rule(verdict: RuleVerdict, name: str, layer: str = "rules") -> Feedback:
    code = verdict.reason_code or ReasonCode.KERNEL_FAULT
    field = f"params.{verdict.field}" if verdict.field else ""
    return reject(layer, code, verdict.detail, field, name, verdict.limit)


def judge(
    proposal: ProposalRecord,
    agent: AgentView,
    catalog: PolicyCatalog,
    now_ns: int,
    inputs: Inputs,
    *,
    by_human: bool = False,
    recheck: bool = False,
    memory: MemoryCheck | None = None,
    stopwatch: Stopwatch | None = None,
) -> Judgement:
    """Run the pipeline; the first failing layer decides.

    ``stopwatch`` times each rule and keeps the overruns of their budgets for the
    caller to record; the judgement is the same with or without it. ``recheck`` judges
    an approved or queued action again before it executes (see the module's docstring).
    """
    kind = catalog.kinds.get(proposal.kind)
    if kind is None:
        return Judgement(
            rejection=reject(
                "schema",
                ReasonCode.SCHEMA_INVALID,
                f"unknown policy kind {proposal.kind!r}",
                "kind",
            )
        )
    pack = catalog.pack_of[proposal.kind]
    params = _schema(proposal, kind, catalog)
    if isinstance(params, Feedback):
        return Judgement(rejection=params, pack=pack.hash)
    flagged = None
    if inputs.principal is not None:
        scopes = getattr(kind, "scopes", ())
        flagged = on_behalf_refusal(proposal.kind, scopes, inputs.principal, rate=not recheck)
        if flagged is not None and flagged.reason_code is not ReasonCode.APPROVAL_REQUIRED:
            return Judgement(rejection=flagged, pack=pack.hash)
    # A recheck leaves the validity window to the engine, which checks it at the call.
    timed_at = None if recheck else now_ns
    failed = _admission(proposal, params, agent, timed_at, inputs, by_human or recheck)
    if failed is not None:
        return Judgement(rejection=failed, pack=pack.hash)
    held = _held(proposal.kind, params, catalog, pack, agent, inputs)
    if isinstance(held, Feedback):
        return Judgement(rejection=held, pack=pack.hash)
    need, costs, over = held
    view = View(
        params,
        inputs.state,
        now_ns,
        agent.manifest.agent_id,
        limits_of(pack, agent, inputs.amendments),
        proposal.confidence,
        _tenant(inputs),
    )
    failed, escalate = _checked(proposal, params, view, pack, catalog, stopwatch, memory, by_human)
    if escalate:
        return Judgement(escalation=failed, reserve=need, pack=pack.hash, policy=params)
    if failed is not None:
        return Judgement(rejection=failed, pack=pack.hash)
    escalation = None if by_human and not recheck else over or flagged
    if escalation is None:
        escalation = _thresholds(proposal, params, catalog, pack) or _needs_human(proposal, params)
        if escalation is not None and escalation.layer != "escalation":
            return Judgement(rejection=escalation, pack=pack.hash)
    judged = Judgement(reserve=need, pack=pack.hash, policy=params, costs=costs)
    if escalation is None:
        return judged
    return _escalation(
        proposal,
        params,
        agent,
        catalog,
        now_ns,
        inputs,
        judged,
        escalation,
        by_human=by_human,
        recheck=recheck,
    )


def _held(
    kind: str,
    params: Any,
    catalog: PolicyCatalog,
    pack: PolicyPack,
    agent: AgentView,
    inputs: Inputs,
) -> tuple[dict[str, int], dict[str, int], Feedback | None] | Feedback:
    """Layers 6 and 6b: the pools to hold, the costs, and a budget's escalation; or why not."""
    need = pools_held(kind, params, catalog, pack, inputs)
    if isinstance(need, Feedback):
        return need
    costs = cost_of(kind, params, catalog)
    if isinstance(costs, Feedback):
        return costs
    money = money_held(kind, costs, catalog, agent, inputs)
    if isinstance(money, Feedback):
        return money
    need.update(money[0])
    return need, costs, money[1]


def _checked(
    proposal: ProposalRecord,
    params: Any,
    view: View,
    pack: PolicyPack,
    catalog: PolicyCatalog,
    stopwatch: Stopwatch | None,
    memory: MemoryCheck | None,
    by_human: bool,
) -> tuple[Feedback | None, bool]:
    """Layers 7 and 8: the pack's rules, its emergency rules, then governed memory.

    Returns the first refusal, and whether the pack sends it to a human instead (a
    memory refusal it names, e.g. a constraint conflict; never a human's modification).
    """
    failed = _rules(proposal.kind, view, catalog, stopwatch)
    if failed is None and not by_human and proposal.kind in catalog.emergencies_of:
        failed = emergency(proposal, params, view.state, catalog.emergencies_of[proposal.kind])
    if failed is not None or memory is None:
        return failed, False
    failed = memory(proposal, view)
    escalate = failed is not None and failed.reason_code in pack.escalate_refusals
    return failed, escalate and not by_human


def _escalation(
    proposal: ProposalRecord,
    params: Any,
    agent: AgentView,
    catalog: PolicyCatalog,
    now_ns: int,
    inputs: Inputs,
    judged: Judgement,
    escalation: Feedback,
    *,
    by_human: bool,
    recheck: bool,
) -> Judgement:
    """Layer 9's end: the quorum an escalation needs, or the grant that stands in for it."""
    quorum = _quorum(proposal.kind, escalation.reason_code, params, catalog)
    if by_human and not recheck and (quorum is None or (quorum.required < 2 and not quorum.roles)):
        return judged  # a human's modification, which one operator may make and approve
    grant = None
    if not (by_human or recheck) and escalation.reason_code is not ReasonCode.BUDGET_EXHAUSTED:
        # A grant stands in for a human's approval, never for a money ceiling.
        grant = _grant(proposal, agent, now_ns, inputs, quorum or SINGLE, judged.costs, escalation)
    if grant is not None:
        return replace(judged, grant=grant)
    return replace(judged, escalation=escalation, quorum=quorum)


def _quorum(
    kind: str, reason: ReasonCode, params: Any, catalog: PolicyCatalog
) -> QuorumRule | None:
    """The first quorum of the kind's pack that applies to this escalation, as recorded."""
    policy_kind = catalog.kinds[kind]
    for q in catalog.quorums_of.get(kind, ()):
        if q.applies(reason, Impact(policy_kind.impact), params):
            return q.rule()
    return None


def _grant(
    proposal: ProposalRecord,
    agent: AgentView,
    now_ns: int,
    inputs: Inputs,
    quorum: QuorumRule,
    costs: Mapping[str, int],
    escalation: Feedback,
) -> GrantUse | None:
    """The standing grant that covers an escalating proposal, if one does (its use)."""
    if not inputs.grants:
        return None
    found = covering(
        inputs.grants,
        proposal.kind,
        agent.manifest.agent_id,
        proposal.params,
        now_ns,
        needs=quorum,
        cost=costs,
        staged=inputs.granted,
    )
    if found is None:
        return None
    amount = costs.get(found.currency, 0) if found.cap is not None else 0
    return GrantUse(
        grant=found.grant,
        uses=found.used + 1,
        amount=amount,
        currency=found.currency if found.cap is not None else "",
        escalation=escalation.reason_code,
    )


def schema_of(proposal: ProposalRecord, kind: type[Any], catalog: PolicyCatalog) -> Any:
    """The proposal's params as its kind (the schema layer), or the layer's refusal."""
    return _schema(proposal, kind, catalog)


def _schema(proposal: ProposalRecord, kind: type[Any], catalog: PolicyCatalog) -> Any:
    if proposal.version and proposal.version.split(".")[0] != kind.version.split(".")[0]:
        return reject(
            "schema",
            ReasonCode.SCHEMA_INVALID,
            f"{proposal.kind} version {proposal.version} does not match the current {kind.version}",
            "version",
        )
    try:
        params = msgspec.convert({"kind": proposal.kind, **proposal.params}, kind)
    except msgspec.ValidationError as exc:
        name = f"params.{field_of(exc)}"
        detail = _not_decimal(name) if repr(DECIMAL_PATTERN) in str(exc) else str(exc)
        return reject("schema", ReasonCode.SCHEMA_INVALID, detail, name)
    # A field the pack's invariants or amounts read as a number is held to DecimalStr's
    # spelling even when its kind types it plain ``str`` (an older pack): what is
    # judged is then what is executed, and no parse fails later, in a rule.
    for name in numbers_of(proposal.kind, catalog):
        value = getattr(params, name, None)
        if isinstance(value, str) and not is_decimal(value):
            return reject(
                "schema",
                ReasonCode.SCHEMA_INVALID,
                _not_decimal(f"params.{name}"),
                f"params.{name}",
            )
    if not 0.0 <= proposal.confidence <= 1.0:
        return reject(
            "schema", ReasonCode.SCHEMA_INVALID, "confidence must lie in [0, 1]", "confidence"
        )
    if proposal.valid_until_ns is None:
        return reject(
            "schema",
            ReasonCode.SCHEMA_INVALID,
            "a proposal needs a validity window",
            "valid_until_ns",
        )
    return params


def _not_decimal(name: str) -> str:
    return (
        f"{name} must be a decimal string: ASCII digits, an optional leading '-' and '.',"
        " no '+', leading zeros, exponent or spaces (e.g. '100.25')"
    )


_numbers: dict[str, tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], tuple[str, ...]]] = {}
"""Per kind, the fields :func:`numbers_of` found, with the pack's tables it read them from."""


def numbers_of(kind: str, catalog: PolicyCatalog) -> tuple[str, ...]:
    """Return the fields of ``kind`` its pack reads as numbers (invariants, named amounts).

    Found once per pack version: while the catalog's tables for ``kind`` are the very
    objects they were (a pack loaded builds new ones), the answer is the one kept.
    """
    invariants = catalog.invariants_of.get(kind, ())
    consumes = catalog.consumes_of.get(kind, ())
    thresholds = catalog.thresholds_of.get(kind, ())
    hit = _numbers.get(kind)
    if hit is not None and hit[0] is invariants and hit[1] is consumes and hit[2] is thresholds:
        return hit[3]
    names = [i.field for i in invariants if isinstance(i, Range | StateMatch)]
    for amount in [c.amount for c in consumes] + [t.amount for t in thresholds]:
        if isinstance(amount, str) and amount:
            names.append(amount)
    _numbers[kind] = (invariants, consumes, thresholds, tuple(names))
    return tuple(names)


def unsettled_detail(agent_id: str, unsettled: Sequence[str]) -> str:
    """The detail of an AGENT_PASSIVE refusal for the agent's unsettled flows."""
    return f"agent {agent_id} has flow(s) {', '.join(unsettled)} with effects not yet converged"


def _admission(
    proposal: ProposalRecord,
    params: Any,
    agent: AgentView,
    now_ns: int | None,
    inputs: Inputs,
    by_human: bool,
) -> Feedback | None:
    """Layers 2-5: status, authority, time (unless ``now_ns`` is None) and state."""
    manifest = agent.manifest
    if agent.status is not AgentStatus.ACTIVE:
        code = _STATUS_CODES[agent.status]
        return reject("status", code, f"agent {manifest.agent_id} is {agent.status}")
    if not by_human and inputs.unsettled:
        # An agent whose earlier intent is half done may start no new side effects.
        return reject(
            "status",
            ReasonCode.AGENT_PASSIVE,
            unsettled_detail(manifest.agent_id, inputs.unsettled),
        )
    if proposal.kind not in manifest.capabilities:
        return reject(
            "authority",
            ReasonCode.UNAUTHORIZED,
            f"{proposal.kind} is not among the capabilities of {manifest.agent_id}",
            "kind",
        )
    for name, limit in manifest.limits.items():
        if name not in params.__struct_fields__:
            continue
        value = getattr(params, name)
        if isinstance(limit, list):
            if value not in limit:
                return reject(
                    "authority",
                    ReasonCode.UNAUTHORIZED,
                    f"{name} {value!r} is outside the scope of {manifest.agent_id}",
                    f"params.{name}",
                    "manifest.limits",
                    ",".join(map(str, limit)),
                )
            continue
        bound, amount = decimal_of(limit), decimal_of(value)
        if bound is None or amount is None or amount > bound:
            return reject(
                "authority",
                ReasonCode.UNAUTHORIZED,
                f"{name} {value} is above the limit {limit} of {manifest.agent_id}",
                f"params.{name}",
                "manifest.limits",
                limit,
            )
    if (
        now_ns is not None
        and proposal.valid_until_ns is not None
        and now_ns > proposal.valid_until_ns
    ):
        late_ms = (now_ns - proposal.valid_until_ns) // 1_000_000
        return reject(
            "time", ReasonCode.EXPIRED, f"validity window ended {late_ms} ms ago", "valid_until_ns"
        )
    if not by_human and proposal.context_ref != inputs.context_ref:
        return reject(
            "state",
            ReasonCode.STALE_CONTEXT,
            "the state this proposal reasoned on has changed since its context was compiled",
            "context_ref",
        )
    return None


def limits_of(
    pack: PolicyPack, agent: AgentView, amendments: Mapping[str, int | str]
) -> dict[str, Any]:
    """An agent's limits: the pack's default, tightened by its manifest, or as amended.

    A manifest is the agent's own declaration, so it may only lower a limit; only an
    operator's amendment (within the pack's floor and ceiling) may raise one. A declared
    limit that is not a number in the one accepted spelling is the pack's floor (fail
    closed); one that is, reaches rules parsed (an int, or a Decimal), so a rule's
    ``int()`` of it cannot raise.
    """
    limits: dict[str, Any] = {}
    for name, spec in pack.limits.items():
        value: Any = spec.default
        if name in agent.manifest.limits:
            declared = decimal_of(agent.manifest.limits[name])
            if declared is None:
                value = spec.floor
            elif declared < Decimal(value):
                whole = declared == declared.to_integral_value()
                value = int(declared) if whole else declared
        if name in amendments:
            value = amendments[name]
        limits[name] = value
    return limits


def _rules(
    kind: str, view: View, catalog: PolicyCatalog, stopwatch: Stopwatch | None
) -> Feedback | None:
    """Layer 7: invariants, then rules; any failure to judge rejects (KERNEL_FAULT)."""
    for invariant in catalog.invariants_of.get(kind, ()):
        try:
            verdict = invariant.check(view)
        except Exception as exc:
            detail = f"invariant {invariant.name}: {type(exc).__name__}: {exc}"[:300]
            return reject("rules", ReasonCode.KERNEL_FAULT, detail, rule=invariant.name)
        if not verdict.ok:
            return _from_rule(verdict, invariant.name)
    for r in catalog.rules_of.get(kind, ()):
        verdict = run_rule(r, view) if stopwatch is None else stopwatch.run(r, view)
        if not verdict.ok:
            return _from_rule(verdict, r.name)
    return None


def _needs_human(proposal: ProposalRecord, params: Any) -> Feedback | None:
    """The kind's own escalation rule; the feedback's layer says which way it went.

    A rule that raises rejects (layer ``rules``, KERNEL_FAULT), as any rule that
    cannot judge does: fail closed.
    """
    try:
        trigger = params.needs_human()
    except Exception as exc:
        detail = f"{proposal.kind}.needs_human: {type(exc).__name__}: {exc}"[:300]
        return reject("rules", ReasonCode.KERNEL_FAULT, detail, rule="needs_human")
    if trigger is None:
        return None
    return reject("escalation", trigger.reason_code, trigger.detail)


def _thresholds(
    proposal: ProposalRecord, params: Any, catalog: PolicyCatalog, pack: PolicyPack
) -> Feedback | None:
    """Layer 9: the escalation thresholds of the pack and of the kind."""
    if proposal.confidence < pack.escalate_below_confidence:
        return reject(
            "escalation",
            ReasonCode.LOW_CONFIDENCE,
            f"confidence {proposal.confidence:g} is below the threshold"
            f" {pack.escalate_below_confidence:g} of pack {pack.name}",
            "confidence",
            f"pack {pack.name}",
            f"{pack.escalate_below_confidence:g}",
        )
    for threshold in catalog.thresholds_of.get(proposal.kind, ()):
        if threshold.confidence_below is not None and (
            proposal.confidence < threshold.confidence_below
        ):
            return reject(
                "escalation",
                ReasonCode.LOW_CONFIDENCE,
                f"confidence {proposal.confidence:g} is below {threshold.confidence_below:g}"
                f" for {proposal.kind}",
                "confidence",
                f"threshold {proposal.kind}",
                f"{threshold.confidence_below:g}",
            )
        if threshold.above is None:
            continue
        try:
            amount = amount_of(threshold.amount, params)
        except Exception as exc:
            amount = None
            detail = f"{type(exc).__name__}: {exc}"
        else:
            detail = _above(amount, threshold)
        # An amount that cannot be computed is not "below the threshold": a human decides.
        if amount is None or amount > Decimal(threshold.above):
            field = threshold.amount if isinstance(threshold.amount, str) else ""
            return reject(
                "escalation",
                ReasonCode.APPROVAL_REQUIRED,
                f"{proposal.kind}: {detail}",
                f"params.{field}" if field else "",
                f"threshold {proposal.kind}",
                threshold.above,
            )
    return None


def _above(amount: Decimal | None, threshold: Threshold) -> str:
    """Say an amount passed a threshold; money as people read it when the pack names a currency."""
    limit = Decimal(str(threshold.above))
    whole = amount is not None and amount == amount.to_integral_value()
    if threshold.currency and amount is not None and whole and limit == int(limit):
        money = format_money(int(amount), threshold.currency)
        return f"{money} is above {format_money(int(limit), threshold.currency)}"
    # Name the field checked; a function of the params is no field: it stays "amount" (the
    # words recorded verdicts carry, which replay compares on).
    what = threshold.amount if isinstance(threshold.amount, str) and threshold.amount else "amount"
    return f"{what} {amount} is above {threshold.above}"
