"""The whole verdict of a proposal, in one place: the DIM judges with it, replay re-judges with it.

:func:`verdict` builds what the pipeline judges against from the projections
(the agent's visible state and its reference, the pools held, the capacities
facts set, the limits amended and still in force, the agent's unsettled sagas,
and the domains registered with the projections) and runs
:func:`kernel.dim._gate.judge`, whose layers, in their documented order, include the
unsettled-saga check (status) and the kind's own ``needs_human`` rule (escalation).
The gate's memory layer is every domain's check in registration order (governed
memory's constraints, then the beliefs layer: kernel.state.domain); an accepted
proposal a domain transforms is applied in the form it names.

The DIM actor (kernel.dim._actor) calls it with what its current batch staged
and has not committed yet (:class:`Staged`); ``dirk verify --verdicts`` and
``dirk whatif --pack`` (kernel.audit.reverify) call it with nothing staged, against
the projections folded up to the submission. A layer added here or in the gate
is therefore in both, and the live judgement and its replay cannot drift apart.
What other actors' appends record before the DIM's own (in its group commit, or
the one in flight while it judged) is checked at the commit (kernel.dim._raced):
a verdict it would change is judged again, never written.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from msgspec.structs import replace

from kernel.core.events import (
    Applied,
    ContextCompiled,
    Delegated,
    Draft,
    Feedback,
    FlowCreated,
    Judged,
    OnBehalf,
    ProposalRecord,
    QuorumRule,
    TenantDeclared,
    TenantPolicyChanged,
    TenantSpec,
    canonical,
)
from kernel.core.flow import FlowState
from kernel.dim._gate import MemoryCheck, judge, schema_of
from kernel.dim._judgement import Behalf, Inputs, Judgement
from kernel.dim._resources import cost_of
from kernel.policy.packs import PolicyCatalog
from kernel.policy.quorums import SINGLE, tally
from kernel.policy.rules import Stopwatch, View
from kernel.state.amendments import Amendment, in_force
from kernel.state.approvals import Approval
from kernel.state.budgets import Budgets
from kernel.state.grants import Grant, Grants
from kernel.state.principals import Principals, changed, rate_key
from kernel.state.projections import AgentView, Projections, context_ref
from kernel.state.quorums import Ballot

PRINCIPAL_FOLD = 3
"""The fold rules from which the principal layer judges (kernel.state.projections.FOLD)."""


class FactCapacities(Mapping[str, int]):
    """Capacities set by ``capacity.<pool>`` facts, looked up only for the pools needed."""

    def __init__(self, projections: Projections) -> None:
        self._state = projections.state

    def __getitem__(self, pool: str) -> int:
        return int(self._state["capacity." + pool].value)

    def __contains__(self, pool: object) -> bool:
        return isinstance(pool, str) and "capacity." + pool in self._state

    def __iter__(self) -> Iterator[str]:
        return (k.removeprefix("capacity.") for k in self._state if k.startswith("capacity."))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Spent(Mapping[str, int]):
    """What each money pool spent within its window at ``now_ns``, staged spending included."""

    def __init__(self, projections: Projections, now_ns: int, staged: Mapping[str, int]) -> None:
        self._budgets = projections.domain(Budgets)
        self._now = now_ns
        self._staged = staged

    def __getitem__(self, pool: str) -> int:
        return self._budgets.spent(pool, self._now) + self._staged.get(pool, 0)

    def __contains__(self, pool: object) -> bool:
        return isinstance(pool, str)

    def __iter__(self) -> Iterator[str]:
        return iter(self._budgets.spent_in)

    def __len__(self) -> int:
        return len(self._budgets.spent_in)


def domain_checks(projections: Projections, flow: FlowState) -> MemoryCheck:
    """The gate's memory layer: each domain's check, in registration order; the first refusal.

    Only the domains that judge the proposal's kind run (``Projections.judging``).
    """

    def check(proposal: ProposalRecord, view: View) -> Feedback | None:
        for domain in projections.judging(proposal.kind)[0]:
            refused = domain.check(proposal, view, flow)
            if refused is not None:
                return refused
        return None

    return check


def transformed(
    projections: Projections, proposal: ProposalRecord, flow: FlowState
) -> Applied | None:
    """Return the form an accepted proposal is applied in, if a domain transforms it."""
    for domain in projections.judging(proposal.kind)[1]:
        applied = domain.transform(proposal, flow)
        if applied is not None:
            return applied
    return None


@dataclass
class Staged:
    """What the DIM's current batch staged and has not committed: it counts as committed.

    Attributes:
        reserved: the pools each flow holds as staged (replacing what it held).
        amended: the limits amended, by agent, then by limit.
        visible: the visible state and its reference, by subscriptions (a cache: the
            DIM stages no facts, so the state cannot change within its batch).
        granted: per standing grant, the uses and money its staged acceptances took.
        grants: grants issued, voted on or revoked in this batch, as they now stand.
        spent: per money pool, what staged reasoning charges spent.
        calls: per rate window (kernel.state.principals.rate_key), the acceptances staged.
        behalf: whom the flows of a compiler batch carried into this one act for (their
            FlowCreated is staged here, not folded yet).
        tenants: tenants declared or changed in this batch, as they now stand.
        delegations: delegations recorded in this batch.
        shown: the rules the contexts of a carried compiler batch showed, by flow (their
            ContextCompiled is staged here: a synchronous agent's citations are of them).
    """

    reserved: dict[str, dict[str, int]] = field(default_factory=dict)
    amended: dict[str, dict[str, Amendment]] = field(default_factory=dict)
    visible: dict[tuple[str, ...], tuple[dict[str, Any], str]] = field(default_factory=dict)
    granted: dict[str, tuple[int, int]] = field(default_factory=dict)
    spent: dict[str, int] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    behalf: dict[str, OnBehalf] = field(default_factory=dict)
    tenants: dict[str, TenantSpec] = field(default_factory=dict)
    delegations: dict[str, Delegated] = field(default_factory=dict)
    shown: dict[str, list[str]] = field(default_factory=dict)
    # held() as of the seq folded when it was last counted, kept as reserve() stages more.
    _held: dict[str, int] | None = field(default=None, repr=False)
    _held_seq: int = field(default=-1, repr=False)
    _counted: Projections | None = field(default=None, repr=False)

    def acted(self, projections: Projections, payload: Any) -> None:
        """Count a principals act this batch staged (kernel.runtime.messages.RecordAct)."""
        if isinstance(payload, TenantDeclared):
            self.tenants[payload.tenant.id] = payload.tenant
        elif isinstance(payload, TenantPolicyChanged):
            tenant = payload.tenant
            spec = self.tenants.get(tenant) or projections.domain(Principals).tenants.get(tenant)
            self.tenants[tenant] = changed(spec or TenantSpec(id=tenant), payload)
        elif isinstance(payload, Delegated):
            self.delegations[payload.delegation] = payload

    def principals(
        self, projections: Projections
    ) -> tuple[Mapping[str, TenantSpec], Mapping[str, Delegated]]:
        """The tenants and delegations as committed, with this batch's acts over them."""
        domain = projections.domain(Principals)
        if not (self.tenants or self.delegations):
            return domain.tenants, domain.delegations
        return {**domain.tenants, **self.tenants}, {**domain.delegations, **self.delegations}

    def carried(self, drafts: Iterable[Draft], projections: Projections) -> None:
        """Note whom the flows a carried compiler batch opens act for, and the rules their
        contexts showed (not folded yet).

        The domains see whom they act for too (``Principals.staging``), until the flows'
        FlowCreated fold.
        """
        staging = projections.domain(Principals).staging
        for draft in drafts:
            payload, dfid = draft.payload, draft.dfid
            if not dfid:
                continue
            if isinstance(payload, FlowCreated):
                if payload.on_behalf is not None:
                    self.behalf[dfid] = staging[dfid] = payload.on_behalf
                # A flow's first context travels with its FlowCreated (one row, two events).
                payload = payload.context  # type: ignore[assignment]
            if isinstance(payload, ContextCompiled):
                self.shown[dfid] = list(payload.rules)

    def on_behalf(self, projections: Projections, dfid: str) -> OnBehalf | None:
        """Whom flow ``dfid`` acts for: as this batch staged it, or as committed."""
        staged = self.behalf.get(dfid)
        if staged is not None:
            return staged
        return projections.domain(Principals).on_behalf.get(dfid)

    def count_call(self, projections: Projections, dfid: str) -> None:
        """Count a staged acceptance of flow ``dfid`` in its principal's rate window."""
        on_behalf = self.on_behalf(projections, dfid)
        if on_behalf is not None:
            key = rate_key(on_behalf)
            self.calls[key] = self.calls.get(key, 0) + 1

    def held(self, projections: Projections) -> dict[str, int]:
        """Return the total held of each pool by open flows, staged reservations included.

        Counted once per batch (again only if a commit was folded meanwhile), then kept as
        each staged reservation changes it: a batch of n flows reserving costs n, not n².
        """
        if self._held is None or self._held_seq != projections.last_seq:
            held = dict(projections.held)
            for dfid, pools in self.reserved.items():
                before = projections.reservations.get(dfid, {})
                for pool, amount in pools.items():
                    held[pool] = held.get(pool, 0) + amount - before.get(pool, 0)
            self._held, self._held_seq, self._counted = held, projections.last_seq, projections
        return dict(self._held)

    def reserve(self, dfid: str, pools: dict[str, int]) -> None:
        """Stage what flow ``dfid`` now holds (replacing what it held, staged or committed)."""
        held, projections = self._held, self._counted
        if held is not None and projections is not None and self._held_seq == projections.last_seq:
            before = projections.reservations.get(dfid, {})
            for pool, amount in self.reserved.get(dfid, {}).items():
                held[pool] -= amount - before.get(pool, 0)
            for pool, amount in pools.items():
                held[pool] = held.get(pool, 0) + amount - before.get(pool, 0)
        self.reserved[dfid] = pools

    def all_grants(self, projections: Projections) -> tuple[Grant, ...]:
        """Return every grant: as committed, or as this batch left it."""
        committed = projections.domain(Grants).grants
        if not self.grants:
            return tuple(committed.values())
        return tuple({**committed, **self.grants}.values())

    def own(self, projections: Projections, dfid: str) -> Mapping[str, int]:
        """Return what the flow holds (staged, or else committed)."""
        return self.reserved.get(dfid, projections.reservations.get(dfid, {}))

    def amendments(
        self, projections: Projections, agent_id: str, now_ns: int
    ) -> dict[str, int | str]:
        """Return the agent's amended limits in force at ``now_ns``."""
        amended = projections.amendments.get(agent_id, {})
        staged = self.amended.get(agent_id)
        return in_force({**amended, **staged} if staged else amended, now_ns)

    def state(self, projections: Projections, agent: AgentView) -> tuple[dict[str, Any], str]:
        """Return the state the agent's subscriptions see and its reference."""
        key = tuple(agent.manifest.subscriptions)
        found = self.visible.get(key)
        if found is None:
            visible = projections.visible_state(key)
            found = self.visible[key] = (visible, context_ref(visible))
        return found


def inputs_of(
    projections: Projections,
    flow: FlowState,
    agent: AgentView,
    now_ns: int,
    staged: Staged | None = None,
) -> Inputs:
    """Return what a proposal of ``flow`` is judged against at ``now_ns``."""
    staged = Staged() if staged is None else staged
    state, ref = staged.state(projections, agent)
    return Inputs(
        context_ref=ref,
        state=state,
        held=staged.held(projections),
        own=staged.own(projections, flow.dfid),
        capacities=FactCapacities(projections),
        amendments=staged.amendments(projections, flow.agent_id, now_ns),
        unsettled=projections.unsettled_flows(flow.agent_id),
        tree=flow.root_dfid,
        spent=Spent(projections, now_ns, staged.spent),
        grants=staged.all_grants(projections),
        granted=staged.granted,
        principal=behalf_of(projections, flow, now_ns, staged),
    )


def behalf_of(
    projections: Projections, flow: FlowState, now_ns: int, staged: Staged
) -> Behalf | None:
    """What the principal layer judges ``flow`` against; None on journals before principals."""
    if projections.fold < PRINCIPAL_FOLD:
        return None
    domain = projections.domain(Principals)
    on_behalf = staged.on_behalf(projections, flow.dfid)
    accepted = 0
    if on_behalf is not None:
        key = rate_key(on_behalf)
        accepted = domain.accepted_within(key, now_ns) + staged.calls.get(key, 0)
    tenants, delegations = staged.principals(projections)
    return Behalf(
        on_behalf=on_behalf,
        agent_id=flow.agent_id,
        tenants=tenants,
        delegations=delegations,
        accepted=accepted,
    )


def verdict(
    proposal: ProposalRecord,
    flow: FlowState,
    agent: AgentView,
    catalog: PolicyCatalog,
    now_ns: int,
    projections: Projections,
    *,
    by_human: bool = False,
    recheck: bool = False,
    staged: Staged | None = None,
    stopwatch: Stopwatch | None = None,
    inputs: Inputs | None = None,
) -> Judgement:
    """Judge a proposal of ``flow``: the one function the DIM and replay both call.

    Args:
        proposal: the proposal as recorded.
        flow: its flow (the agent's, or the one a human modifies).
        agent: the flow's agent as projected.
        catalog: the policy packs in force.
        now_ns: the DIM's clock when it judges (replay: the submission's time).
        projections: the state as committed before the proposal.
        by_human: a human's modification (skips state, unsettled and escalation checks).
        recheck: an approved or queued action judged again before it executes (skips
            state and unsettled checks; kernel.dim._gate).
        staged: what the current batch staged and has not committed (the DIM only).
        stopwatch: times each rule beside the verdict; never changes it.
        inputs: what :func:`inputs_of` returns for these arguments, when the caller
            built it already (the DIM's shadow judges on the enforced verdict's).
    """
    if inputs is None:
        inputs = inputs_of(projections, flow, agent, now_ns, staged)
    judgement = judge(
        proposal,
        agent,
        catalog,
        now_ns,
        inputs,
        by_human=by_human,
        recheck=recheck,
        memory=domain_checks(projections, flow),
        stopwatch=stopwatch,
    )
    if judgement.rejection is None and judgement.escalation is None:
        # A transformed verdict: accepted, and applied in another form (kernel.beliefs).
        applied = transformed(projections, proposal, flow)
        if applied is not None:
            return replace(judgement, applied=applied)
    return judgement


def rechecked(judgement: Judgement, ballot: Ballot | None, approval: Approval | None) -> bool:
    """Whether a re-judged action may execute on the approval (None: no human approved it).

    It may if nothing refuses it and it needs no human, or (approved) if what it now
    escalates for is what was approved (same reason and rule) and the approval's votes
    meet the quorum the pack now asks for. An approval of an operational escalation
    (no ballot: the engine's) approved the very action, whatever would escalate it.
    """
    if judgement.rejection is not None:
        return False
    escalation = judgement.escalation
    if escalation is None:
        return True
    if approval is None:
        return False
    if ballot is None:
        return True
    if (str(escalation.reason_code), escalation.rule) != (ballot.reason_code, ballot.rule):
        return False
    voters = [(v.operator, v.roles) for v in ballot.votes if v.vote == "approve"]
    if not voters:
        voters = [(approval.operator, [])]
    return tally(judgement.quorum or SINGLE, voters).met


def quorum_words(rule: QuorumRule | None) -> str:
    """A quorum rule in words for comparing and showing; "" for one operator's approval."""
    if rule is None or (rule.required < 2 and not rule.roles):
        return ""
    roles = f" of {', '.join(rule.roles)}" if rule.roles else " operators"
    return f"{rule.required}{roles}"


def form_of(applied: Applied | None) -> str:
    """A transformed acceptance's applied form as canonical JSON ("" when none)."""
    return "" if applied is None else canonical(applied).decode()


def outcome_of(judgement: Judgement) -> Judged:
    """Reduce a judgement to what two verdicts are compared on: the DIM's shadow and replay's."""
    for outcome, f in (("rejected", judgement.rejection), ("escalated", judgement.escalation)):
        if f is not None:
            return Judged(
                outcome=outcome,
                reason_code=str(f.reason_code),
                detail=f.detail,
                quorum=quorum_words(judgement.quorum) if outcome == "escalated" else "",
            )
    grant = judgement.grant.grant if judgement.grant is not None else ""
    return Judged(outcome="accepted", applied=form_of(judgement.applied), grant=grant)


def money_of(proposal: ProposalRecord, catalog: PolicyCatalog) -> dict[str, int]:
    """What ``proposal`` costs by currency under ``catalog`` ({} when it cannot say).

    The money a shadow's difference touches: the same whatever either verdict was (a
    refused proposal's cost is not in its judgement), for the live shadow and its replay.
    """
    kind = catalog.kinds.get(proposal.kind)
    if kind is None:
        return {}
    params = schema_of(proposal, kind, catalog)
    if isinstance(params, Feedback):
        return {}
    costs = cost_of(proposal.kind, params, catalog)
    return {} if isinstance(costs, Feedback) else costs
