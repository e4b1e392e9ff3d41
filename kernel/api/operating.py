"""The operator's acts a Kernel offers as its own methods.

Each builds the typed inbox request that bounds its fields (kernel.inbox.requests)
and applies it through :meth:`kernel.api.acts.OperatorActs.apply`, the one path the
inbox, the CLI and the console take too; the request holds what the caller passed,
and the acts check it at the wall there (a refusal recorded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from kernel.api.acts import OperatorActs, Origin
from kernel.core import events
from kernel.core.events import Event, LimitAmended, PackRef, TenantSpec
from kernel.inbox import (
    AgentStatusRequest,
    AmendRequest,
    ChangeTenantPolicyRequest,
    CollectArtifactsRequest,
    CredentialRequest,
    DecideRequest,
    DeclareTenantRequest,
    InboxRequest,
    Proof,
    RevokeGrantRequest,
    RuleChangeRequest,
    RuleDecisionRequest,
    ShadowRequest,
    VoteRequest,
)
from kernel.inbox.requests import grant_request
from kernel.policy.contracts import Verdict
from kernel.policy.packs import PolicyPack
from kernel.runtime.messages import Decision as HumanDecision
from kernel.state.projections import AgentStatus

T = TypeVar("T")


class Operating:
    """The operator's acts of a :class:`kernel.api.Kernel` (each recorded with who and why)."""

    _acts: OperatorActs

    async def decide(
        self,
        dfid: str,
        decision: HumanDecision | str,
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
        request = DecideRequest(
            dfid=dfid,
            decision=decision,  # type: ignore[arg-type]  # checked at the wall
            operator=operator,
            reason=reason,
            params=params,  # type: ignore[arg-type]
            action_hash=action_hash,
        )
        verdict = await self._acts.apply(request, Origin(roles=roles))
        assert isinstance(verdict, Verdict)
        return verdict

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
        return await self._act(request, Origin(roles=roles), Event)

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
        request = VoteRequest(grant=grant, vote=vote, operator=operator, reason=reason)  # type: ignore[arg-type]
        return await self._act(request, Origin(roles=roles), Event)

    async def revoke_grant(self, grant: str, *, operator: str, reason: str) -> Event:
        """Take a standing grant out of force (GrantRevoked); later proposals escalate again.

        Raises:
            InputInvalid: GRANT_NOT_LIVE or a bad field (recorded).
        """
        request = RevokeGrantRequest(grant=grant, operator=operator, reason=reason)
        return await self._act(request, Origin(), Event)

    async def apply(self, request: InboxRequest, proof: Proof) -> None:
        """Apply one verified inbox request (the inbox's poller calls it once per row).

        Raises:
            InputInvalid, HandshakeRefused, ProofRefused: the request cannot be applied.
        """
        await self._acts.apply(request, proof)

    async def set_agent_status(
        self, agent_id: str, status: AgentStatus | str, *, operator: str, reason: str
    ) -> None:
        """Change an agent's status (an operator's act, recorded with who and why).

        Raises:
            InputInvalid: no operator or reason, or a field of the wrong type (recorded).
            HandshakeRefused: UNKNOWN_AGENT.
        """
        request = AgentStatusRequest(
            agent_id=agent_id,
            status=status,  # type: ignore[arg-type]  # checked at the wall
            operator=operator,
            reason=reason,
        )
        await self._acts.apply(request, Origin())

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
        request = CredentialRequest(
            agent_id=agent_id, verifier=verifier, operator=operator, reason=reason
        )
        await self._acts.apply(request, Origin())

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
        request = AmendRequest(
            agent_id=agent_id,
            limit=limit,
            value=value,  # type: ignore[arg-type]  # kernel.state.amendments checks it
            ttl_s=ttl_s,
            operator=operator,
            reason=reason,
        )
        return await self._act(request, Origin(), LimitAmended)

    async def load_pack(self, pack: PolicyPack, *, operator: str, reason: str) -> PackRef:
        """Load a new version of a pack (or a new pack); record PackLoaded and judge with it.

        Raises:
            InputInvalid: no operator or reason, or one too long (recorded).
            PackError: the pack is invalid (nothing changes), with the same message as at start.
        """
        return await self._acts.load_pack(pack, operator=operator, reason=reason)

    async def load_shadow(self, pack: PolicyPack, *, operator: str, reason: str) -> PackRef:
        """Judge by ``pack`` beside the enforced version of its name, recording differences.

        Every proposal of the pack's kinds is judged by the shadow too, on the same state;
        only a differing verdict is recorded (ShadowDiffered); the shadow never reserves,
        escalates or executes (docs/policy-lifecycle.md).

        Raises:
            InputInvalid: no operator or reason, or one too long (recorded).
            ShadowRefused: SHADOW_INVALID: nothing changes.
        """
        return await self._acts.shadows.load(pack, operator=operator, reason=reason)

    def offer_shadow(self, pack: PolicyPack) -> None:
        """Offer ``pack`` for an operator to load as a shadow (``dirk shadow load``).

        The candidate is code, so it enters from the embedding program; nothing is
        recorded until an operator's signed request loads it (``ShadowLoaded`` with the
        inbox row). Offering again replaces the offer of the same name and version.

        Raises:
            ShadowRefused: SHADOW_INVALID: ``pack`` is not a policy pack.
        """
        self._acts.shadows.offer(pack)

    async def retire_shadow(
        self, name: str, *, operator: str, reason: str, version: str = ""
    ) -> PackRef:
        """Stop the shadow of pack ``name``; the enforced pack is unchanged.

        Raises:
            InputInvalid: a field the wall refuses (recorded).
            ShadowRefused: SHADOW_NOT_LOADED.
        """
        request = ShadowRequest(
            action="retire", pack=name, version=version, operator=operator, reason=reason
        )
        ref: PackRef = await self._acts.apply(request, Origin())
        return ref

    async def promote_shadow(
        self, name: str, *, operator: str, reason: str, version: str = "", report: str = ""
    ) -> PackRef:
        """Make the shadow of pack ``name`` the enforced version, with its report's digest.

        ``report``, when given, is the digest of the report reviewed (``dirk shadow
        report``): the promotion is refused if the report has changed since.

        Raises:
            InputInvalid: a field the wall refuses (recorded).
            ShadowRefused: SHADOW_NOT_LOADED, SHADOW_REPORT_CHANGED, SHADOW_INVALID.
        """
        request = ShadowRequest(
            action="promote",
            pack=name,
            version=version,
            report=report,
            operator=operator,
            reason=reason,
        )
        ref: PackRef = await self._acts.apply(request, Origin())
        return ref

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

        The proposal passes the promoter like an agent's (kernel.state.rulebook); with
        ``override`` the operator puts it in force at once, recorded as an override
        with their name and reason. ``ns`` is the rulebook namespace (a tenant);
        ``input_event`` the id of the input that brought it (a webhook delivery): the
        promoter skips a second one from it.
        """
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
        return await self._acts.propose_rule(proposal, override=override)

    async def decide_rule(
        self, proposal_seq: int, decision: str, *, operator: str, reason: str
    ) -> Event:
        """Override or skip a deferred rule proposal; return the audit record (RuleDecided).

        Raises:
            RuleNotPending: the proposal is not waiting for an operator.
            ValueError: another decision than override or skip, or no operator or reason
                (InputInvalid, recorded, for a field of the wrong type or size).
        """
        request = RuleDecisionRequest(
            proposal_seq=proposal_seq,
            decision=decision,  # type: ignore[arg-type]  # the DIM refuses another
            operator=operator,
            reason=reason,
        )
        return await self._act(request, Origin(), Event)

    async def retract_rule(
        self, rule: str, *, operator: str, reason: str, ns: str = "default"
    ) -> Event:
        """Take rule ``rule`` of namespace ``ns`` out of force (RuleRetracted, with who and why);
        its history stays.

        Raises:
            RuleNotInForce: no version of the rule is in force in that namespace.
            InputInvalid: no operator or reason, or a field of the wrong type or size (recorded).
        """
        request = RuleChangeRequest(
            action="retract", rule=rule, operator=operator, reason=reason, ns=ns
        )
        return await self._act(request, Origin(), Event)

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
        request = CollectArtifactsRequest(operator=operator, reason=reason)
        refs = await self._acts.apply(request, Origin(inbox_id=inbox_id, dry_run=dry_run))
        assert isinstance(refs, list)
        return refs

    async def declare_tenant(
        self, spec: TenantSpec, *, reason: str = "", operator: str = "host"
    ) -> None:
        """Declare a tenant, or declare it again (TenantDeclared): members and policy.

        The whole spec replaces the one before; the next decision judges by it. Once any
        tenant is declared, a principal of an undeclared tenant is refused
        TENANT_NOT_MEMBER (docs/identity.md).

        Raises:
            InputInvalid: a field of the wrong type or too long.
        """
        request = DeclareTenantRequest(tenant=spec, operator=operator, reason=reason)
        await self._acts.apply(request, Origin())

    async def change_tenant_policy(
        self,
        tenant: str,
        *,
        tier: str = "*",
        user: str = "",
        kind: str = "",
        permission: str | None = None,
        rate_per_minute: int | None = None,
        scopes: Sequence[str] | None = None,
        reason: str = "",
        operator: str = "host",
    ) -> None:
        """Set one layer of a tenant's policy (TenantPolicyChanged), in force at once.

        The layer is named by ``user`` and ``kind`` (both empty: the tier default) and
        ``tier`` (``*``: every tier at that level); the most specific layer that sets a
        value wins. ``scopes`` replaces ``user``'s scopes in the tenant.

        Raises:
            InputInvalid: a field of the wrong type, an unknown permission (recorded).
        """
        request = ChangeTenantPolicyRequest(
            tenant=tenant,
            tier=tier,
            user=user,
            kind=kind,
            permission=permission,  # type: ignore[arg-type]  # checked at the wall
            rate_per_minute=rate_per_minute,
            scopes=list(scopes) if scopes is not None else None,
            operator=operator,
            reason=reason,
        )
        await self._acts.apply(request, Origin())

    async def _act(self, request: InboxRequest, origin: Origin, answer: type[T]) -> T:
        """Apply an act of the embedding code; return its answer, of the type it has."""
        done = await self._acts.apply(request, origin)
        assert isinstance(done, answer)
        return done
