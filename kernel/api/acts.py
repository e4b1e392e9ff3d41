"""The human acts a kernel accepts: decisions, grants, agent status, limits, packs, rules,
artifacts collected, and the inbox.

Each act is admitted at the wall first (an operator and a reason are required,
every field is bounded), then handed to the actor that owns it, and waits for
its durable answer; a refusal is recorded (DecisionRefused, InputRefused). The
embedding code calls these methods in the kernel's own process, trusted as code
(a decision is recorded ``via="api"``). Every other door (``dirk decide``, the
console, the MCP server) writes a signed request into the operator inbox, and the
kernel's poller (kernel.inbox) hands each verified request to :meth:`OperatorActs.apply`:
the one place a request becomes acts.

:class:`OperatorActs` is one part of a :class:`kernel.api.Kernel`, which offers its
acts as its own methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec

from kernel.api.admission import Admission
from kernel.api.calls import Calls, Flows
from kernel.api.documents import Artifacts
from kernel.api.shadow import ShadowActs
from kernel.api.wiring import Actors
from kernel.core import events, wall
from kernel.core.events import (
    Draft,
    Event,
    LimitAmended,
    PackRef,
)
from kernel.core.ports import Clock
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid
from kernel.inbox import (
    AgentStatusRequest,
    AmendRequest,
    ChangeTenantPolicyRequest,
    CollectArtifactsRequest,
    CredentialRequest,
    DecideRequest,
    DeclareTenantRequest,
    GrantRequest,
    InboxProposals,
    InboxRequest,
    Keyring,
    Proof,
    ProposeRequest,
    RevokeGrantRequest,
    RuleChangeRequest,
    RuleDecisionRequest,
    ShadowRequest,
    VoteRequest,
)
from kernel.inbox.keyring import roles_of
from kernel.journal.store import Journal
from kernel.policy.contracts import (
    HandshakeRefused,
    Verdict,
)
from kernel.policy.packs import PackError, PolicyPack
from kernel.runtime.actors import Reply
from kernel.runtime.messages import (
    AmendLimit,
    Decide,
    DecideRule,
    Decision,
    IssueCredential,
    IssueGrant,
    LoadPack,
    RecordAct,
    RetractRule,
    RevokeGrant,
    SetStatus,
    SubmitRule,
    VoteGrant,
)
from kernel.state.amendments import AmendmentInvalid
from kernel.state.artifacts import collectable
from kernel.state.projections import AgentStatus, Projections
from kernel.state.rulebook import RuleNotInForce, RuleNotPending

T = TypeVar("T")

DimAct = IssueGrant | VoteGrant | RevokeGrant | SubmitRule | DecideRule | RetractRule | RecordAct
"""The acts the DIM owns (grants and the rulebook): each answers with the events it recorded."""


class Origin(msgspec.Struct, frozen=True, kw_only=True):
    """An act of the embedding code, in the kernel's own process (trusted as code, ``via="api"``).

    Attributes:
        roles: the operator's roles as the code gives them (None: what the keyring says).
        inbox_id: the inbox row the act answers, if the code names one.
        dry_run: for a collection of artifacts: only answer what would go.
    """

    roles: Sequence[str] | None = None
    inbox_id: int | None = None
    dry_run: bool = False


class _Act(msgspec.Struct, frozen=True, kw_only=True):
    """Who brings an act, as its step records it: the inbox row's proof or the embedding code."""

    origin: Proof | Origin
    via: str
    signer: str
    inbox_id: int | None

    @classmethod
    def of(cls, origin: Proof | Origin) -> _Act:
        if isinstance(origin, Proof):
            return cls(origin=origin, via="inbox", signer=origin.signer, inbox_id=origin.inbox_id)
        return cls(origin=origin, via="api", signer="", inbox_id=origin.inbox_id)

    @property
    def trusted(self) -> bool:
        """The embedding code's act: a refusal raises as the DIM gave it, not as bad input."""
        return isinstance(self.origin, Origin)


class OperatorActs:
    """The operator's acts, each admitted at the wall and handed to the actor that owns it.

    Args:
        journal: where refusals at the wall are recorded (kernel.api.admission checks).
        projections: what the checks and the collection of artifacts read.
        actors: the mailboxes the acts go to.
        calls: sends an act and waits for its durable answer.
        flows: reads back a finished flow an act names.
        proposals: opens the flows of the inbox's ``propose`` requests.
        artifacts: the artifact store an operator collects.
        keyring: the operator keyring as last read (the roles a quorum counts).
        clock: where a grant's validity starts when it names no start.
    """

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        actors: Actors,
        calls: Calls,
        flows: Flows,
        proposals: InboxProposals,
        *,
        artifacts: Artifacts,
        keyring: Callable[[], Keyring | None],
        clock: Clock,
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._actors = actors
        self._calls = calls
        self._flows = flows
        self._proposals = proposals
        self._artifacts = artifacts
        self._keyring = keyring
        self._clock = clock
        self._adapter_names = frozenset(actors.adapters)
        self._admission = Admission(journal, projections, calls, flows)
        self.shadows = ShadowActs(
            journal, projections, self._admission, calls, actors, self._adapter_names
        )
        """The shadow acts (kernel.api.shadow): ``Kernel.load_shadow`` loads through them."""

    async def apply(self, request: InboxRequest, origin: Proof | Origin) -> Any:
        """Apply one operator act: the one place a request becomes the kernel's acts.

        ``origin`` says who brings it. A verified inbox row (its :class:`Proof`; the
        poller calls this once per row whose proof held): the event the act records
        names the row (``proof.inbox_id``), and anything raised here is recorded by the
        poller as the row's refusal. The embedding code (an :class:`Origin`): the
        request as the Kernel's method built it, admitted at the wall first (a refusal
        recorded: DecisionRefused, InputRefused), recorded ``via="api"``.

        Returns:
            The act's answer: a Verdict (decide), the recorded event (grants, rules,
            amendments), the references collected, or None.

        Raises:
            InputInvalid, HandshakeRefused, ProofRefused: the request cannot be applied.
        """
        if isinstance(origin, Origin):
            admitted = await self._admission.admit(request)
            if isinstance(admitted, Verdict):
                return admitted  # a decision refused at the wall: recorded, and answered
            request = admitted
        return await STEPS[type(request)](self, request, _Act.of(origin))

    async def _decide(self, request: DecideRequest, act: _Act) -> Verdict:
        await self._flows.recall(request.dfid)
        verdict: Reply[Verdict] = Reply()
        decide = Decide(
            dfid=request.dfid,
            decision=Decision(request.decision),
            operator=request.operator,
            reason=request.reason,
            params=request.params,
            action_hash=request.action_hash,
            inbox_id=act.inbox_id,
            reply=verdict,
            via=act.via,
            signer=act.signer,
            roles=self._roles(request.operator, act.origin),
        )
        return await self._calls.call(self._actors.escalation, decide, verdict)

    async def _grant(self, request: GrantRequest, act: _Act) -> Event:
        roles = self._roles(request.operator, act.origin)
        return await self._dim_act(self._issue_grant(request, roles, act))

    async def _vote(self, request: VoteRequest, act: _Act) -> Event:
        vote = VoteGrant(
            grant=request.grant,
            vote=request.vote,
            operator=request.operator,
            reason=request.reason,
            roles=self._roles(request.operator, act.origin),
            inbox_id=act.inbox_id,
            via=act.via,
            signer=act.signer,
        )
        return await self._dim_act(vote)

    async def _revoke(self, request: RevokeGrantRequest, act: _Act) -> Event:
        revoke = RevokeGrant(
            grant=request.grant,
            operator=request.operator,
            reason=request.reason,
            inbox_id=act.inbox_id,
            via=act.via,
            signer=act.signer,
        )
        return await self._dim_act(revoke)

    async def _amend(self, request: AmendRequest, act: _Act) -> Any:
        amended: Reply[Any] = Reply()
        amend = AmendLimit(
            agent_id=request.agent_id,
            limit=request.limit,
            value=request.value,
            ttl_s=request.ttl_s,
            operator=request.operator,
            reason=request.reason,
            inbox_id=act.inbox_id,
            reply=amended,
        )
        event = await self._calls.call(self._actors.dim, amend, amended)
        if act.trusted and not isinstance(event, LimitAmended):
            raise AmendmentInvalid(event.reason_code, event.detail)
        return event

    async def _status(self, request: AgentStatusRequest, act: _Act) -> None:
        changed: Reply[ReasonCode | None] = Reply()
        status = SetStatus(
            agent_id=request.agent_id,
            status=AgentStatus(request.status),
            operator=request.operator,
            reason=request.reason,
            inbox_id=act.inbox_id,
            reply=changed,
        )
        code = await self._calls.call(self._actors.registry, status, changed)
        if code is not None:
            raise HandshakeRefused(code, f"no agent {request.agent_id!r}")

    async def _credential(self, request: CredentialRequest, act: _Act) -> None:
        issued: Reply[ReasonCode | None] = Reply()
        credential = IssueCredential(
            agent_id=request.agent_id,
            verifier=request.verifier,
            operator=request.operator,
            reason=request.reason,
            inbox_id=act.inbox_id,
            reply=issued,
        )
        code = await self._calls.call(self._actors.registry, credential, issued)
        if code is not None:
            raise HandshakeRefused(code, f"no credential issued for {request.agent_id!r}")

    async def _rule_decision(self, request: RuleDecisionRequest, act: _Act) -> Event:
        decide = DecideRule(
            proposal_seq=request.proposal_seq,
            decision=request.decision,
            operator=request.operator,
            reason=request.reason,
            inbox_id=act.inbox_id,
        )
        try:
            return await self._dim_act(decide)
        except RuleNotPending as exc:
            if act.trusted:
                raise
            raise InputInvalid("proposal_seq", str(exc)) from exc

    async def _rule_change(self, request: RuleChangeRequest, act: _Act) -> Event:
        if request.action == "retract":
            return await self._retract(request, act)
        proposal = events.RuleProposed(
            rule=request.rule,
            title=request.title,
            content=request.content,
            labels=list(request.labels),
            base_version=request.base_version,
            proposer=request.operator,
            by_operator=True,
            reason=request.reason,
            ns=request.ns,
        )
        return await self._submit_rule(proposal, True, act.inbox_id)

    async def _retract(self, request: RuleChangeRequest, act: _Act) -> Event:
        retract = RetractRule(
            rule=request.rule,
            operator=request.operator,
            reason=request.reason,
            inbox_id=act.inbox_id,
            ns=request.ns,
        )
        try:
            return await self._dim_act(retract)
        except RuleNotInForce as exc:
            if act.trusted:
                raise
            raise InputInvalid("rule", str(exc)) from exc

    async def _propose(self, request: ProposeRequest, act: _Act) -> None:
        assert isinstance(act.origin, Proof), "an agent proposes with Kernel.propose"
        await self._proposals.propose(request, act.origin)

    async def _collect_act(self, request: CollectArtifactsRequest, act: _Act) -> list[str]:
        dry_run = isinstance(act.origin, Origin) and act.origin.dry_run
        return await self._collect(request, act.inbox_id, dry_run)

    async def _tenant_act(
        self, request: DeclareTenantRequest | ChangeTenantPolicyRequest, act: _Act
    ) -> Event:
        return await self._tenant(request, act.inbox_id)

    async def _shadow(self, request: ShadowRequest, act: _Act) -> Any:
        return await self.shadows.apply(request, act.inbox_id)

    def _roles(self, operator: str, origin: Proof | Origin) -> tuple[str, ...]:
        """The roles an act counts: the row's, as given by embedding code, else the keyring's."""
        if isinstance(origin, Proof):
            return origin.roles
        if origin.roles is not None:
            return tuple(str(r) for r in origin.roles)
        return roles_of(self._keyring(), operator)

    def _issue_grant(
        self,
        request: GrantRequest,
        roles: tuple[str, ...],
        act: _Act,
    ) -> IssueGrant:
        until = request.valid_until_ns
        if until is None:
            assert request.valid_for_s is not None
            start = request.valid_from_ns or self._clock.now_ns()
            until = start + int(request.valid_for_s * 1e9)
        return IssueGrant(
            kind=request.kind,
            agent=request.agent,
            bounds={k: dict(v) for k, v in request.bounds.items()},
            valid_from_ns=request.valid_from_ns,
            valid_until_ns=until,
            uses=request.uses,
            operator=request.operator,
            reason=request.reason,
            roles=roles,
            cap=request.cap,
            currency=request.currency,
            inbox_id=act.inbox_id,
            via=act.via,
            signer=act.signer,
        )

    async def load_pack(self, pack: PolicyPack, *, operator: str, reason: str) -> PackRef:
        """Load a new version of a pack (or a new pack); record PackLoaded and judge with it.

        An operator's act: it names who and why. Flows already judged keep their
        verdicts. Loading the version in force records nothing.

        Raises:
            InputInvalid: no operator or reason, or one too long (recorded).
            PackError: the pack is invalid (nothing changes), with the same message as at start.
        """
        act = await self._admission.admit_act(
            wall.fields(operator=operator, reason=reason),
            wall.HumanActSpec,
            "load_pack",
            operator,
            target=pack.name,
        )
        reply: Reply[Any] = Reply()
        msg = LoadPack(
            pack=pack,
            adapters=self._adapter_names,
            operator=act.operator,
            reason=act.reason,
            reply=reply,
        )
        answer = await self._calls.call(self._actors.dim, msg, reply)
        if isinstance(answer, PackError):
            raise answer
        return answer if answer is not None else pack.ref

    async def propose_rule(self, proposal: events.RuleProposed, *, override: bool) -> Event:
        """Propose a rule version as an operator; return the audited decision (RuleDecided).

        The proposal passes the promoter like an agent's (kernel.state.rulebook);
        with ``override`` the operator puts it in force at once, recorded as an
        override with their name and reason. The DIM, the rulebook's owner, records it.
        ``ns`` is the rulebook namespace (a tenant); ``input_event`` the id of the input
        that brought it (a webhook delivery): the promoter skips a second one from it.
        """
        self._calls.raise_if_stopped()
        await self._admission.admit_act(
            wall.fields(
                rule=proposal.rule,
                title=proposal.title,
                content=proposal.content,
                labels=proposal.labels,
                operator=proposal.proposer,
                reason=proposal.reason,
                base_version=proposal.base_version,
                ns=proposal.ns,
                input_event=proposal.input_event,
            ),
            wall.RuleProposalSpec,
            "rule",
            proposal.proposer,
            target=proposal.rule,
        )
        return await self._submit_rule(proposal, override, None)

    async def _submit_rule(
        self, proposal: events.RuleProposed, override: bool, inbox_id: int | None
    ) -> Event:
        msg = SubmitRule(
            proposal=proposal,
            override=override,
            operator=proposal.proposer,
            reason=proposal.reason,
            inbox_id=inbox_id,
        )
        return await self._dim_act(msg)

    async def _collect(
        self, request: CollectArtifactsRequest, inbox_id: int | None, dry_run: bool
    ) -> list[str]:
        """Delete the artifacts nothing live references; return their references.

        Kept: what a context of an open flow referenced, and what a state or memory fact
        names. The rest, journal-recorded or not, is collected: ``ArtifactsCollected``
        (who, why, how many bytes) is recorded first, then the bytes are deleted.
        ``dry_run`` only answers what would go.

        Raises:
            ArtifactStoreError: the store cannot be used.
        """
        self._calls.raise_if_stopped()
        store = await self._artifacts.store()
        projections = self._projections
        facts = [fact.value for fact in projections.state.values()]
        facts += [fact.value for fact in projections.memory.facts.values()]
        refs = collectable(projections.artifacts, facts, await store.refs())
        if dry_run or not refs:
            return refs
        stored = projections.artifacts.stored
        size = 0
        for ref in refs:
            known = stored.get(ref)
            size += known.size if known is not None else (await store.size(ref) or 0)
        collected = events.ArtifactsCollected(
            refs=refs,
            size=size,
            operator=request.operator,
            reason=request.reason,
            inbox_id=inbox_id,
        )
        await self._journal.append([Draft(payload=collected)])
        for ref in refs:  # recorded first: bytes left behind by a crash go at the next run
            await store.delete(ref)
        return refs

    async def _tenant(
        self, request: DeclareTenantRequest | ChangeTenantPolicyRequest, inbox_id: int | None
    ) -> Event:
        """Record a tenant's declaration or one layer of its policy; in force from the next call."""
        self._calls.raise_if_stopped()
        payload: events.TenantDeclared | events.TenantPolicyChanged
        if isinstance(request, DeclareTenantRequest):
            payload = events.TenantDeclared(
                tenant=request.tenant,
                operator=request.operator,
                reason=request.reason,
                inbox_id=inbox_id,
            )
        else:
            payload = events.TenantPolicyChanged(
                tenant=request.tenant,
                tier=request.tier or "*",
                user=request.user,
                kind=request.kind,
                permission=request.permission,
                rate_per_minute=request.rate_per_minute,
                scopes=list(request.scopes) if request.scopes is not None else None,
                operator=request.operator,
                reason=request.reason,
                inbox_id=inbox_id,
            )
        return await self.record_act(payload)

    async def record_act(self, payload: Any) -> Event:
        """Record a principals act through the DIM, in order with its verdicts; return it."""
        return await self._dim_act(RecordAct(payload=payload))

    async def _dim_act(self, msg: DimAct) -> Event:
        """Hand a grant, rule or principals act to the DIM (their owner); return its last event.

        Raises:
            InputInvalid: the DIM refused a grant act (recorded as InputRefused).
            RuleNotPending, RuleNotInForce, ValueError: the DIM refused a rule act.
        """
        reply: Reply[list[Event] | Exception] = Reply()
        answer = await self._calls.call(
            self._actors.dim, msgspec.structs.replace(msg, reply=reply), reply
        )
        assert isinstance(answer, list) and answer  # a refusal was raised by the call
        return answer[-1]


_Step = Callable[[OperatorActs, Any, _Act], Awaitable[Any]]
STEPS: dict[type[InboxRequest], _Step] = {
    DecideRequest: OperatorActs._decide,
    GrantRequest: OperatorActs._grant,
    VoteRequest: OperatorActs._vote,
    RevokeGrantRequest: OperatorActs._revoke,
    AmendRequest: OperatorActs._amend,
    AgentStatusRequest: OperatorActs._status,
    CredentialRequest: OperatorActs._credential,
    RuleDecisionRequest: OperatorActs._rule_decision,
    RuleChangeRequest: OperatorActs._rule_change,
    ProposeRequest: OperatorActs._propose,
    CollectArtifactsRequest: OperatorActs._collect_act,
    DeclareTenantRequest: OperatorActs._tenant_act,
    ChangeTenantPolicyRequest: OperatorActs._tenant_act,
    ShadowRequest: OperatorActs._shadow,
}
"""Each inbox request's step: :meth:`OperatorActs.apply` looks it up once (a test holds
that every member of ``InboxRequest`` has one)."""
