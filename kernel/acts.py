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

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar, assert_never

import msgspec

from kernel.calls import Calls, Flows
from kernel.core import events, wall
from kernel.core.events import (
    DecisionRefused,
    Draft,
    Event,
    Feedback,
    InputRefused,
    LimitAmended,
    PackRef,
)
from kernel.core.ports import Clock
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid, clip
from kernel.documents import Artifacts
from kernel.inbox import (
    AgentStatusRequest,
    AmendRequest,
    CollectArtifactsRequest,
    CredentialRequest,
    DecideRequest,
    GrantRequest,
    InboxProposals,
    InboxRequest,
    Keyring,
    Proof,
    ProposeRequest,
    RevokeGrantRequest,
    RuleChangeRequest,
    RuleDecisionRequest,
    VoteRequest,
)
from kernel.inbox.keyring import roles_of
from kernel.inbox.requests import grant_request, normalized
from kernel.journal.store import Journal
from kernel.policy.contracts import (
    HandshakeRefused,
    Outcome,
    Verdict,
)
from kernel.policy.kinds import Impact
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
    RetractRule,
    RevokeGrant,
    SetStatus,
    SubmitRule,
    VoteGrant,
)
from kernel.state.amendments import AmendmentInvalid
from kernel.state.approvals import APPROVE_WORDS
from kernel.state.artifacts import collectable
from kernel.state.projections import AgentStatus, Projections
from kernel.state.rulebook import RuleNotInForce, RuleNotPending
from kernel.wiring import Actors

T = TypeVar("T")


class OperatorActs:
    """The operator's acts, each admitted at the wall and handed to the actor that owns it.

    Args:
        journal: where refusals at the wall are recorded.
        projections: what the checks read (approvals, flows, agents).
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

    async def decide(
        self,
        dfid: str,
        decision: Decision | str,
        *,
        operator: str,
        reason: str,
        params: Mapping[str, Any] | None = None,
        action_hash: str | None = None,
        roles: Sequence[str] | None = None,
    ) -> Verdict:
        """Give a human decision on an escalated flow: approve, modify or reject.

        Where the flow's pack asks for a quorum, an approval is one vote (recorded as
        ApprovalVoted): the verdict stays ESCALATED, its feedback saying what it waits
        for ("1 of 2, waiting for a desk-head"), until the vote that meets it. ``roles``
        are the operator's roles (default: what the kernel's keyring says).

        ``override`` and ``abort`` are accepted for approve and reject. With
        ``action_hash`` (whole, or a prefix of 8 characters or more) the decision
        applies only if the flow still waits on that very action; otherwise it
        is refused with ACTION_MISMATCH. A late decision finds the approval
        expired (EXPIRED), and a flow not waiting for a human refuses it
        (FLOW_NOT_ACTIVE); every refusal is recorded.

        Every field is checked at the wall first: an operator and a reason are
        required (non-blank, bounded), and approving a HIGH_IMPACT action takes
        its ``action_hash``, as ``dirk decide --confirm`` does; a refusal there is
        SCHEMA_INVALID, recorded as DecisionRefused.

        A flow escalated with OUTCOME_UNKNOWN (its effect may have happened)
        takes only ``reconcile`` (``params={"outcome": "done", "external_id":
        ...}`` or ``{"outcome": "not_done"}``: what the external system shows)
        or ``retry`` (call again with the same key); any other decision there
        is refused with OUTCOME_UNKNOWN.
        """
        if isinstance(dfid, str) and len(dfid) <= wall.MAX_ID:
            await self._flows.recall(dfid)
        try:
            checked = self._check_decision(dfid, decision, operator, reason, params, action_hash)
        except InputInvalid as exc:
            return await self._refuse_decision(dfid, decision, operator, exc)
        reply: Reply[Verdict] = Reply()
        msg = Decide(
            dfid=checked.dfid,
            decision=Decision(checked.decision),
            operator=checked.operator,
            reason=checked.reason,
            params=checked.params,
            action_hash=checked.action_hash,
            reply=reply,
            via="api",
            roles=self._roles(checked.operator, roles),
        )
        return await self._calls.call(self._actors.escalation, msg, reply)

    def _roles(self, operator: str, given: Sequence[str] | None) -> tuple[str, ...]:
        """The roles an act counts: as given by embedding code, else the keyring's."""
        if given is not None:
            return tuple(str(r) for r in given)
        return roles_of(self._keyring(), operator)

    async def grant(
        self,
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
        cap: str | None = None,
        roles: Sequence[str] | None = None,
    ) -> Event:
        """Grant in advance: proposals of ``kind`` within ``bounds`` proceed without a human.

        A proposal by ``agent`` (``*``: any) that would escalate for approval and lies
        within ``bounds`` (per parameter: ``{"eq": v}``, ``{"in": [...]}``, ``{"min": n}``,
        ``{"max": n}``) is accepted instead while the grant is live: from
        ``valid_from_ns`` (default: now) until ``valid_until_ns`` (or ``valid_for_s``
        from now) on the kernel's clock, ``uses`` times, and, with ``cap`` (``"1,000.00
        EUR"``), for that much money in all. Each use is recorded (GrantUsed) with the
        acceptance it made. Where the kind's pack asks grants for a quorum, the grant
        waits for the votes (:meth:`vote_grant`) before it is live.

        Returns:
            The recorded GrantIssued (its ``grant`` is the id to vote on or revoke).

        Raises:
            InputInvalid: a field the wall or the DIM refuses (recorded, InputRefused).
        """
        request = grant_request(
            kind,
            operator=operator,
            reason=reason,
            uses=uses,
            agent=agent,
            bounds=bounds,
            valid_from_ns=valid_from_ns,
            valid_until_ns=valid_until_ns,
            valid_for_s=valid_for_s,
            cap=cap,
        )
        return await self._grant_act(
            self._issue_grant(request, self._roles(request.operator, roles), None, "api", "")
        )

    async def vote_grant(
        self,
        grant: str,
        vote: str,
        *,
        operator: str,
        reason: str,
        roles: Sequence[str] | None = None,
    ) -> Event:
        """Vote ``approve`` or ``reject`` on a grant that waits for its quorum (GrantVoted).

        Raises:
            InputInvalid: GRANT_NOT_LIVE, DUPLICATE_VOTE, UNAUTHORIZED, a bad field (recorded).
        """
        request = normalized(VoteRequest(grant=grant, vote=vote, operator=operator, reason=reason))  # type: ignore[arg-type]
        assert isinstance(request, VoteRequest)
        return await self._grant_act(
            VoteGrant(
                grant=request.grant,
                vote=request.vote,
                operator=request.operator,
                reason=request.reason,
                roles=self._roles(request.operator, roles),
            )
        )

    async def revoke_grant(self, grant: str, *, operator: str, reason: str) -> Event:
        """Take a standing grant out of force (GrantRevoked); later proposals escalate again.

        Raises:
            InputInvalid: GRANT_NOT_LIVE or a bad field (recorded).
        """
        request = normalized(RevokeGrantRequest(grant=grant, operator=operator, reason=reason))
        assert isinstance(request, RevokeGrantRequest)
        return await self._grant_act(
            RevokeGrant(grant=request.grant, operator=request.operator, reason=request.reason)
        )

    def _issue_grant(
        self,
        request: GrantRequest,
        roles: tuple[str, ...],
        inbox_id: int | None,
        via: str,
        signer: str,
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
            inbox_id=inbox_id,
            via=via,
            signer=signer,
        )

    async def _grant_act(self, msg: IssueGrant | VoteGrant | RevokeGrant) -> Event:
        """Hand a grant act to the DIM (the grants' owner); return its recorded event.

        Raises:
            InputInvalid: the DIM refused it (recorded as InputRefused).
        """
        reply: Reply[list[Event] | Exception] = Reply()
        answer = await self._calls.call(
            self._actors.dim, msgspec.structs.replace(msg, reply=reply), reply
        )
        assert isinstance(answer, list) and answer  # a refusal was raised by the call
        return answer[-1]

    async def apply(self, request: InboxRequest, proof: Proof) -> None:
        """Apply one verified inbox request: the one place a request becomes the kernel's acts.

        The inbox's poller (kernel.inbox) calls it once per row whose proof held. The
        event the act records names the row (``proof.inbox_id``); a refusal the act
        records itself (DecisionRefused, AmendmentRefused) takes the row too. Anything
        raised here is recorded by the poller as the row's refusal.

        Raises:
            InputInvalid, HandshakeRefused, ProofRefused: the request cannot be applied.
        """
        match request:
            case DecideRequest():
                await self._flows.recall(request.dfid)
                verdict: Reply[Verdict] = Reply()
                decide = Decide(
                    dfid=request.dfid,
                    decision=request.decision,
                    operator=request.operator,
                    reason=request.reason,
                    params=request.params,
                    action_hash=request.action_hash,
                    inbox_id=proof.inbox_id,
                    reply=verdict,
                    via="inbox",
                    signer=proof.signer,
                    roles=proof.roles,
                )
                await self._calls.call(self._actors.escalation, decide, verdict)
            case GrantRequest():
                await self._grant_act(
                    self._issue_grant(request, proof.roles, proof.inbox_id, "inbox", proof.signer)
                )
            case VoteRequest():
                await self._grant_act(
                    VoteGrant(
                        grant=request.grant,
                        vote=request.vote,
                        operator=request.operator,
                        reason=request.reason,
                        roles=proof.roles,
                        inbox_id=proof.inbox_id,
                        via="inbox",
                        signer=proof.signer,
                    )
                )
            case RevokeGrantRequest():
                await self._grant_act(
                    RevokeGrant(
                        grant=request.grant,
                        operator=request.operator,
                        reason=request.reason,
                        inbox_id=proof.inbox_id,
                        via="inbox",
                        signer=proof.signer,
                    )
                )
            case AmendRequest():
                amended: Reply[Any] = Reply()
                amend = AmendLimit(
                    agent_id=request.agent_id,
                    limit=request.limit,
                    value=request.value,
                    ttl_s=request.ttl_s,
                    operator=request.operator,
                    reason=request.reason,
                    inbox_id=proof.inbox_id,
                    reply=amended,
                )
                await self._calls.call(self._actors.dim, amend, amended)
            case AgentStatusRequest():
                changed: Reply[ReasonCode | None] = Reply()
                status = SetStatus(
                    agent_id=request.agent_id,
                    status=request.status,
                    operator=request.operator,
                    reason=request.reason,
                    inbox_id=proof.inbox_id,
                    reply=changed,
                )
                code = await self._calls.call(self._actors.registry, status, changed)
                if code is not None:
                    raise HandshakeRefused(code, f"no agent {request.agent_id!r}")
            case CredentialRequest():
                await self._issue_credential(
                    request.agent_id,
                    request.verifier,
                    request.operator,
                    request.reason,
                    inbox_id=proof.inbox_id,
                )
            case RuleDecisionRequest():
                try:
                    await self._rule_act(
                        DecideRule(
                            proposal_seq=request.proposal_seq,
                            decision=request.decision,
                            operator=request.operator,
                            reason=request.reason,
                            inbox_id=proof.inbox_id,
                        )
                    )
                except RuleNotPending as exc:
                    raise InputInvalid("proposal_seq", str(exc)) from exc
            case RuleChangeRequest(action="retract"):
                try:
                    await self._rule_act(
                        RetractRule(
                            rule=request.rule,
                            operator=request.operator,
                            reason=request.reason,
                            inbox_id=proof.inbox_id,
                            ns=request.ns,
                        )
                    )
                except RuleNotInForce as exc:
                    raise InputInvalid("rule", str(exc)) from exc
            case RuleChangeRequest():
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
                await self._rule_act(
                    SubmitRule(
                        proposal=proposal,
                        override=True,
                        operator=request.operator,
                        reason=request.reason,
                        inbox_id=proof.inbox_id,
                    )
                )
            case ProposeRequest():
                await self._proposals.propose(request, proof)
            case CollectArtifactsRequest():
                await self.collect_artifacts(
                    operator=request.operator, reason=request.reason, inbox_id=proof.inbox_id
                )
            case _:
                assert_never(request)

    async def set_agent_status(
        self, agent_id: str, status: AgentStatus | str, *, operator: str, reason: str
    ) -> None:
        """Change an agent's status (an operator's act, recorded with who and why).

        Raises:
            InputInvalid: no operator or reason, or a field of the wrong type (recorded).
            HandshakeRefused: UNKNOWN_AGENT.
        """
        try:
            checked = self._check_status(
                wall.fields(agent_id=agent_id, status=status, operator=operator, reason=reason)
            )
        except InputInvalid as exc:
            await self._record_refusal("agent_status", exc, operator, target=agent_id)
            raise
        reply: Reply[ReasonCode | None] = Reply()
        msg = SetStatus(
            agent_id=checked.agent_id,
            status=AgentStatus(checked.status),
            operator=checked.operator,
            reason=checked.reason,
            reply=reply,
        )
        code = await self._calls.call(self._actors.registry, msg, reply)
        if code is not None:
            raise HandshakeRefused(code, f"no agent {agent_id!r}")

    async def issue_credential(
        self, agent_id: str, verifier: str, *, operator: str, reason: str
    ) -> None:
        """Provision or rotate ``agent_id``'s credential from its verifier (recorded).

        Make the pair with :func:`kernel.registry.new_credential` and
        :func:`kernel.registry.credential_verifier`; give the secret to whoever runs the
        agent, and only the verifier to the kernel. Live sessions stay valid.

        Raises:
            InputInvalid: a field of the wrong type or too long.
            HandshakeRefused: UNKNOWN_AGENT (not allowed here) or SCHEMA_INVALID (no verifier).
        """
        # The inbox's request is the API's spec too: one set of bounds for both doors.
        checked = normalized(
            CredentialRequest(
                agent_id=agent_id, verifier=verifier, operator=operator, reason=reason
            )
        )
        assert isinstance(checked, CredentialRequest)
        await self._issue_credential(
            checked.agent_id, checked.verifier, checked.operator, checked.reason
        )

    async def _issue_credential(
        self, agent_id: str, verifier: str, operator: str, reason: str, inbox_id: int | None = None
    ) -> None:
        reply: Reply[ReasonCode | None] = Reply()
        msg = IssueCredential(
            agent_id=agent_id,
            verifier=verifier,
            operator=operator,
            reason=reason,
            inbox_id=inbox_id,
            reply=reply,
        )
        code = await self._calls.call(self._actors.registry, msg, reply)
        if code is not None:
            raise HandshakeRefused(code, f"no credential issued for {agent_id!r}")

    async def amend_limit(
        self,
        agent_id: str,
        limit: str,
        value: int | str | Decimal,
        *,
        ttl_s: float,
        operator: str,
        reason: str,
    ) -> LimitAmended:
        """Set one of an agent's pack limits, within the pack's floor and ceiling, for ``ttl_s``.

        The DIM judges that agent with the amended value until it expires on the
        kernel's clock (see kernel.state.amendments). A refusal is recorded too.

        Raises:
            AmendmentInvalid: UNKNOWN_AGENT, UNKNOWN_LIMIT, LIMIT_OUT_OF_BOUNDS, SCHEMA_INVALID.
        """
        try:
            # The agent names the event's envelope; kernel.state.amendments checks the rest.
            agent_id = wall.admit({"agent_id": agent_id}, wall.AgentSpec).agent_id
        except InputInvalid as exc:
            await self._record_refusal("amend", exc, operator, target=agent_id)
            raise AmendmentInvalid(exc.reason_code, f"{exc.field}: {exc.detail}") from None
        reply: Reply[Any] = Reply()
        msg = AmendLimit(
            agent_id=agent_id,
            limit=limit,
            value=value,
            ttl_s=ttl_s,
            operator=operator,
            reason=reason,
            reply=reply,
        )
        event = await self._calls.call(self._actors.dim, msg, reply)
        if not isinstance(event, LimitAmended):
            raise AmendmentInvalid(event.reason_code, event.detail)
        return event

    async def load_pack(self, pack: PolicyPack, *, operator: str, reason: str) -> PackRef:
        """Load a new version of a pack (or a new pack); record PackLoaded and judge with it.

        An operator's act: it names who and why. Flows already judged keep their
        verdicts. Loading the version in force records nothing.

        Raises:
            InputInvalid: no operator or reason, or one too long (recorded).
            PackError: the pack is invalid (nothing changes), with the same message as at start.
        """
        act = await self._admit_act(
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

    async def propose_rule(
        self,
        rule: str,
        *,
        title: str,
        content: str,
        operator: str,
        reason: str,
        labels: Sequence[str] = (),
        source: events.RuleSource | None = None,
        base_version: int = 0,
        override: bool = False,
        ns: str = "default",
        input_event: str = "",
    ) -> Event:
        """Propose a rule version as an operator; return the audited decision (RuleDecided).

        The proposal passes the promoter like an agent's (kernel.state.rulebook);
        with ``override`` the operator puts it in force at once, recorded as an
        override with their name and reason. The DIM, the rulebook's owner, records it.
        ``ns`` is the rulebook namespace (a tenant); ``input_event`` the id of the input
        that brought it (a webhook delivery): the promoter skips a second one from it.
        """
        self._calls.raise_if_stopped()
        await self._admit_act(
            wall.fields(
                rule=rule,
                title=title,
                content=content,
                labels=list(labels),
                operator=operator,
                reason=reason,
                base_version=base_version,
                ns=ns,
                input_event=input_event,
            ),
            wall.RuleProposalSpec,
            "rule",
            operator,
            target=rule,
        )
        proposal = events.RuleProposed(
            rule=rule,
            title=title,
            content=content,
            labels=list(labels),
            source=source or events.RuleSource(),
            base_version=base_version,
            proposer=operator,
            by_operator=True,
            reason=reason,
            ns=ns,
            input_event=input_event,
        )
        msg = SubmitRule(proposal=proposal, override=override, operator=operator, reason=reason)
        return await self._rule_act(msg)

    async def decide_rule(
        self, proposal_seq: int, decision: str, *, operator: str, reason: str
    ) -> Event:
        """Override or skip a deferred rule proposal; return the audit record (RuleDecided).

        Raises:
            RuleNotPending: the proposal is not waiting for an operator.
            ValueError: another decision than override or skip, or no operator or reason
                (InputInvalid, recorded, for a field of the wrong type or size).
        """
        self._calls.raise_if_stopped()
        await self._admit_act(
            wall.fields(
                proposal_seq=proposal_seq, decision=decision, operator=operator, reason=reason
            ),
            wall.RuleDecisionSpec,
            "rule",
            operator,
            target=f"#{proposal_seq}",
        )
        return await self._rule_act(
            DecideRule(
                proposal_seq=proposal_seq, decision=decision, operator=operator, reason=reason
            )
        )

    async def retract_rule(
        self, rule: str, *, operator: str, reason: str, ns: str = "default"
    ) -> Event:
        """Take rule ``rule`` of namespace ``ns`` out of force (RuleRetracted, with who and why);
        its history stays.

        Raises:
            RuleNotInForce: no version of the rule is in force in that namespace.
            InputInvalid: no operator or reason, or a field of the wrong type or size (recorded).
        """
        self._calls.raise_if_stopped()
        act = await self._admit_act(
            wall.fields(rule=rule, operator=operator, reason=reason, ns=ns),
            wall.RuleRetractionSpec,
            "rule",
            operator,
            target=rule,
        )
        return await self._rule_act(
            RetractRule(rule=act.rule, operator=act.operator, reason=act.reason, ns=act.ns)
        )

    async def collect_artifacts(
        self, *, operator: str, reason: str, inbox_id: int | None = None, dry_run: bool = False
    ) -> list[str]:
        """Delete the artifacts nothing live references; return their references.

        Kept: what a context of an open flow referenced, and what a state or memory fact
        names. The rest, journal-recorded or not, is collected: ``ArtifactsCollected``
        (who, why, how many bytes) is recorded first, then the bytes are deleted.
        ``dry_run`` only answers what would go.

        Raises:
            InputInvalid: no operator or reason (recorded).
            ArtifactStoreError: the store cannot be used.
        """
        self._calls.raise_if_stopped()
        await self._admit_act(
            wall.fields(operator=operator, reason=reason),
            wall.HumanActSpec,
            "artifacts",
            operator,
            target="gc",
        )
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
            refs=refs, size=size, operator=operator, reason=reason, inbox_id=inbox_id
        )
        await self._journal.append([Draft(payload=collected)])
        for ref in refs:  # recorded first: bytes left behind by a crash go at the next run
            await store.delete(ref)
        return refs

    async def _rule_act(self, msg: SubmitRule | DecideRule | RetractRule) -> Event:
        """Hand a rule act to the rulebook's owner (the DIM); return its last recorded event.

        Raises:
            RuleNotPending, RuleNotInForce, ValueError: the DIM refused it (nothing recorded).
        """
        reply: Reply[list[Event] | Exception] = Reply()
        answer = await self._calls.call(
            self._actors.dim, msgspec.structs.replace(msg, reply=reply), reply
        )
        assert isinstance(answer, list) and answer  # a refusal was raised by _call
        return answer[-1]

    def _check_decision(
        self,
        dfid: Any,
        decision: Any,
        operator: Any,
        reason: Any,
        params: Any,
        action_hash: Any,
    ) -> wall.DecisionSpec:
        """Return a human decision checked at the wall, or raise InputInvalid."""
        checked = wall.admit(
            wall.fields(
                dfid=dfid,
                decision=decision,
                operator=operator,
                reason=reason,
                params=dict(params) if isinstance(params, Mapping) else params,
                action_hash=action_hash,
            ),
            wall.DecisionSpec,
        )
        try:
            word = Decision(checked.decision)
        except ValueError:
            words = ", ".join(d.value for d in Decision)
            raise InputInvalid("decision", f"a decision is one of {words}") from None
        approval = self._projections.approvals.get(checked.dfid)
        flow = self._projections.flows.get(checked.dfid)
        if (
            word in APPROVE_WORDS
            and not checked.action_hash
            # A flow whose effect may have happened refuses approval anyway, and says why.
            and (flow is None or flow.pending is None)
            and approval is not None
            and approval.action_hash  # else there is nothing to approve (escalation says so)
            and approval.impact is Impact.HIGH_IMPACT
        ):
            raise InputInvalid(
                "action_hash",
                "approving a HIGH_IMPACT action takes its action hash (as dirk decide --confirm)",
            )
        return checked

    async def _admit_act(
        self, value: Mapping[str, Any], spec: type[T], entry: str, operator: Any, *, target: Any
    ) -> T:
        """Return a human act checked at the wall; record the refusal and raise if it fails."""
        try:
            return wall.admit(value, spec)
        except InputInvalid as exc:
            await self._record_refusal(entry, exc, operator, target=target)
            raise

    def _check_status(self, request: Mapping[str, Any]) -> wall.AgentStatusSpec:
        """Return an agent status change checked at the wall, or raise InputInvalid."""
        checked = wall.admit(request, wall.AgentStatusSpec)
        try:
            AgentStatus(checked.status)
        except ValueError:
            words = ", ".join(s.value for s in AgentStatus)
            raise InputInvalid("status", f"a status is one of {words}") from None
        return checked

    async def _refuse_decision(
        self, dfid: Any, decision: Any, operator: Any, exc: InputInvalid
    ) -> Verdict:
        """Record a decision the wall refused (on its flow when it names one) and answer it."""
        known = isinstance(dfid, str) and dfid in self._projections.flows
        detail = clip(f"{exc.field}: {exc.detail}", wall.MAX_DETAIL)
        refused = DecisionRefused(
            reason_code=exc.reason_code,
            decision=clip(decision, 32),
            operator=clip(operator) if operator is not None else "",
            detail=detail,
            target="" if known else clip(dfid),
        )
        self._calls.raise_if_stopped()
        await self._journal.append([Draft(payload=refused, dfid=dfid if known else None)])
        feedback = Feedback(
            reason_code=exc.reason_code, detail=detail, layer="schema", field=exc.field
        )
        return Verdict(outcome=Outcome.REFUSED, dfid=clip(dfid), feedback=feedback)

    async def _record_refusal(
        self,
        entry: str,
        exc: Exception,
        operator: Any = "",
        *,
        target: Any = "",
        inbox_id: int | None = None,
    ) -> Event:
        """Record an act or an inbox row refused at the wall (every string clipped)."""
        refused = InputRefused(
            reason_code=getattr(exc, "reason_code", ReasonCode.SCHEMA_INVALID),
            entry=clip(entry, 32),
            field=clip(getattr(exc, "field", "$"), 64),
            detail=clip(getattr(exc, "detail", str(exc)), wall.MAX_DETAIL),
            operator=clip(operator) if operator is not None else "",
            target=clip(target) if target is not None else "",
            inbox_id=inbox_id,
        )
        self._calls.raise_if_stopped()
        [event] = await self._journal.append([Draft(payload=refused)])
        return event
