"""Events: canonical bytes, round trips and the hash chain."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.core import events as ev
from kernel.core.events import GENESIS_HASH, Draft, body_of, chain, decode_body
from kernel.core.reasons import ReasonCode

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

SAMPLES: list[ev.AnyPayload] = [
    ev.KernelStarted(kernel_version="0.1.0", packs=[ev.PackRef(name="p", version="1", hash="h")]),
    ev.KernelStopped(reason="KERNEL_CLOSED"),
    ev.TenantDeclared(
        tenant=ev.TenantSpec(
            id="acme",
            members={"ann": ev.Member(email="a@x.test", scopes=["pay"])},
            policy=ev.TenantPolicy(
                tiers={"*": ev.Layer(rate_per_minute=3)},
                user_kinds={"ann": {"k.pay": {"api": ev.Layer(permission="deny")}}},
            ),
        ),
        reason="onboarding",
    ),
    ev.TenantPolicyChanged(tenant="acme", user="ann", permission="flag", scopes=["read"]),
    ev.Delegated(
        delegation="dlg-1",
        principal=ev.Principal(tenant="acme", user="ann", scopes=None),
        from_agent="front",
        to_agent="helper",
        scopes=["read"],
        chain=["front", "helper"],
    ),
    ev.DecidedWithoutJournal(
        spool_id=1,
        decided_ns=5,
        dfid="f-1",
        agent_id="front",
        kind="k.look",
        on_behalf=ev.OnBehalf(principal=ev.Principal(tenant="acme", user="ann"), tier="api"),
        allowed=True,
    ),
    ev.ActorRestarted(actor="dim", error="RuntimeError: x", restarts=1),
    ev.MessageDeadLettered(actor="dim", message="Judge(...)", error="x"),
    ev.AgentRegistered(manifest=ev.Manifest(agent_id="a", version="1.0"), session_hash="s"),
    ev.AgentRefused(reason_code=ReasonCode.UNKNOWN_AGENT),
    ev.AgentStatusChanged(status="PASSIVE", operator="ana"),
    ev.TriggerFired(topic="market.ACME", facts={"market.ACME.price": "101.25"}),
    ev.FlowCreated(root_dfid="r", topic="market"),
    ev.ContextCompiled(attempt=1, context_ref="c", state={"k": 1}),
    ev.ProposalSubmitted(attempt=1, proposal=ev.ProposalRecord(kind="k", params={"q": 1})),
    ev.ProposalRejected(attempt=1, feedback=ev.Feedback(reason_code=ReasonCode.EXPIRED)),
    ev.ProposalAccepted(attempt=1),
    ev.FlowEscalated(reason_code=ReasonCode.LOW_CONFIDENCE),
    ev.HumanDecided(decision="override", operator="ana", reason="ok"),
    ev.ApprovalExpired(action_hash="ab12"),
    ev.DecisionRefused(reason_code=ReasonCode.EXPIRED, inbox_id=3),
    ev.ExecutionStarted(intent=ev.ExecutionIntent(key="k", kind="k", adapter="a")),
    ev.ExecutionSucceeded(key="k", external_id="x"),
    ev.ExecutionFailed(key="k", error="boom", transient=True),
    ev.DuplicateSuppressed(key="k", source="delivery"),
    ev.FlowClosed(),
    ev.FlowAborted(reason_code=ReasonCode.KERNEL_FAULT),
    ev.SubmissionRefused(reason_code=ReasonCode.INVALID_SESSION),
    ev.ExecutionRetried(key="k", attempt=1, error="503", delay_ns=5, retry_at_ns=10),
    ev.ExecutionRefused(
        key="k",
        reason_code=ReasonCode.EXECUTION_CONSTRAINT_VIOLATED,
        bound="max_slippage_bps",
        bounds={"max_slippage_bps": 50, "reference_price": "100.00"},
        observed={"price": "101.20"},
    ),
    ev.FlowDirty(step=2, reason_code=ReasonCode.EXECUTION_FAILED, detail="no rooms"),
    ev.CompensationStarted(
        intent=ev.ExecutionIntent(
            key="c", kind="k", adapter="a", step=1, action="book", compensation=True
        )
    ),
    ev.CompensationSucceeded(key="c", step=1, external_id="x"),
    ev.CompensationFailed(key="c", step=1, error="boom"),
    ev.FlowCompensated(steps=1),
    ev.ResourceReserved(pool="cash:desk", amount=100),
    ev.ResourceReleased(pool="cash:desk", amount=100, reason="CLOSED"),
    ev.ProjectionCheckpoint(seq=10, digest="d"),
    ev.FactAdded(name="guest.needs", value="step-free access", correlation_id="r", key="k"),
    ev.ConstraintAdded(
        text="verify accessibility before booking", priority="learned", triggered_by=3
    ),
    ev.ConstraintDeactivated(constraint=4, reason="obsolete"),
    ev.DecisionMade(text="book Granvia", rationale="step-free", refs=[4]),
    ev.MemoryQueried(topic="accessibility", facts=["guest.needs"], constraints=[4]),
    ev.PackLoaded(pack=ev.PackRef(name="p", version="2", hash="h2"), previous="h", operator="ana"),
    ev.LimitAmended(
        limit="max_position",
        value=20_000,
        floor="0",
        ceiling="50000",
        expires_at_ns=10,
        operator="ana",
        inbox_id=4,
    ),
    ev.AmendmentRefused(reason_code=ReasonCode.LIMIT_OUT_OF_BOUNDS, limit="max_position"),
    ev.FlowFlagged(guard="direction", reason="says hedge beside a buy", confidence="0.75"),
    ev.RuleProposed(
        rule="access",
        title="Accessibility",
        content="Query accessibility before booking.",
        labels=["booking"],
        source=ev.RuleSource(repo="acme/runbooks", ref="main", path="a.md", blob="3f2a"),
        base_version=1,
        proposer="booker",
    ),
    ev.RuleDecided(
        rule="access", decision="promote", actor="promoter", reason="NEW_RULE", version=1
    ),
    ev.CitationsChecked(correct=["access@v1"], incorrect={"x@v2": "UNKNOWN_RULE"}),
    ev.ConstraintAdvisory(constraints=[4], detail="preferred: #4 'avoid sudo'"),
    ev.InputRefused(
        reason_code=ReasonCode.SCHEMA_INVALID,
        entry="inbox:agent_status",
        field="reason",
        detail="missing required field `reason`",
        operator="ana",
        inbox_id=3,
    ),
    ev.RuleRetracted(rule="access", operator="rui", reason="superseded by law", version=2),
    ev.CredentialIssued(
        verifier="sha256:" + "ab" * 32, operator="ana", reason="rotate", inbox_id=4
    ),
    ev.OperatorKeyTrusted(name="ana", role="operator", key="ed25519:AAAA", fingerprint="f" * 16),
    ev.OperatorKeyRevoked(name="ana", key="ed25519:AAAA", fingerprint="f" * 16, detail="gone"),
    ev.RequestVerified(
        inbox_id=3, request_id="r" * 22, request="decide", principal="ana", signer="console"
    ),
    # governed beliefs (kernel.beliefs)
    ev.SourceRegistered(source="wire", independence_group="wire", reliability=500_000),
    ev.ObservationRecorded(observation="o1", source="wire", parsed_payload={"city": "Lyon"}),
    ev.EntityCandidateRecorded(entity="e2", name="J. Smith", possible_same_as=["e1"]),
    ev.PropositionProposed(proposition="p", text="Acme is in Lyon", derived_from=["o1"]),
    ev.EvidenceAttached(evidence="o1>p", proposition="p", observation="o1", stance="contradicts"),
    ev.TestResultIngested(test="t1", proposition="p", outcome="failed", observation="test:t1"),
    ev.PropositionTransitioned(
        proposition="p", from_state="provisional", to_state="rejected", cause="test"
    ),
    ev.ConsolidationRecorded(
        consolidation="c1",
        trigger="cadence",
        archived=[ev.Archived(proposition="p", reason="REJECTED")],
    ),
    ev.EpisodeArchived(episode="e", propositions={"p": "rejected"}),
    ev.ApprovalVoted(
        vote="approve",
        operator="ana",
        roles=["risk"],
        counted=["ana"],
        required=2,
        waiting="1 of 2, waiting for a desk-head",
    ),
    ev.ApprovalSuperseded(
        reason_code=ReasonCode.SCHEMA_INVALID,
        action_hash="h",
        approved=ev.PackRef(name="trading", version="0.3.0", hash="a"),
        current=ev.PackRef(name="trading", version="0.3.1", hash="b"),
    ),
    ev.GrantIssued(
        grant="g-1",
        kind="booking.reserve_room",
        valid_until_ns=10,
        uses=3,
        operator="ana",
        bounds={"traveller": {"eq": "ana"}, "nightly_rate_cents": {"max": "20000"}},
        cap=100_000,
        currency="EUR",
        quorum=ev.QuorumRule(required=2, roles=["risk", "desk-head"]),
    ),
    ev.GrantVoted(grant="g-1", vote="approve", operator="bo", met=True),
    ev.GrantRevoked(grant="g-1", operator="ana", reason="trip cancelled"),
    ev.GrantUsed(grant="g-1", uses=1, amount=15_000, currency="EUR"),
    ev.ReasoningCharged(tokens={"m": 1200}, amount=3, currency="USD", pools=["money:USD:x:desk"]),
    ev.WebhookDelivered(hook="slack", notice="request", about=7, status=200),
    ev.WebhookFailed(hook="slack", notice="request", about=7, error="503", attempts=5),
    # proofs (kernel.proofs)
    ev.CheckpointKeyChanged(
        origin="dirk/j", key="ed25519:AAAA", vkey="dirk/j+00000000+AQ==", previous="ed25519:BBBB"
    ),
    ev.SubjectErased(subject="ana", keys=1, operator="rui", reason="asked", inbox_id=7),
    ev.ProposalAccepted(
        attempt=1,
        applied=ev.Applied(kind="governance.attach_support", params={"proposition": "p"}),
    ),
    # meaning, artifacts (kernel.state.meaning, kernel.state.artifacts)
    ev.MeaningScored(
        model="fake", version="1", threshold=800_000, text="ab" * 32, scores={"4": 912_345}
    ),
    ev.ArtifactStored(
        ref="sha256:" + "ab" * 32,
        size=4096,
        media_type="text/plain",
        summary="Granvia's accessibility statement",
        by="app",
    ),
    ev.ArtifactsCollected(refs=["sha256:" + "cd" * 32], size=10, operator="ana", reason="gc"),
    # drift monitors (kernel.state.drift)
    ev.DriftBreached(
        pack="ops@1.0.0",
        monitor="refusals",
        metric="refusal_rate",
        by="agent",
        subject="a",
        value=0.4,
        bound=0.1,
        baseline=0.02,
        window_start_ns=1,
        window_end_ns=3_600_000_000_001,
        samples=60,
        action="demote",
        first_seq=3,
        last_seq=62,
    ),
    # shadow packs (kernel.dim._shadow)
    ev.ShadowLoaded(
        pack=ev.PackRef(name="desk", version="1.1.0", hash="ab" * 32),
        enforced=ev.PackRef(name="desk", version="1.0.0", hash="cd" * 32),
        kinds=["desk.order"],
        operator="ana",
        reason="try it",
    ),
    ev.ShadowDiffered(
        shadow="ab" * 32,
        kind="desk.order",
        enforced=ev.Judged(outcome="accepted"),
        judged=ev.Judged(outcome="rejected", reason_code="RISK_LIMIT_EXCEEDED", detail="qty"),
        costs={"USD": 1200},
    ),
    ev.ShadowRetired(pack=ev.PackRef(name="desk", version="1.1.0", hash="ab" * 32), operator="ana"),
    ev.ShadowPromoted(
        pack=ev.PackRef(name="desk", version="1.1.0", hash="ab" * 32),
        report="ef" * 32,
        as_of_seq=40,
        judged=12,
        differed=3,
        operator="ana",
        reason="reviewed",
    ),
]


def test_every_event_type_has_a_sample_and_round_trips() -> None:
    assert {type(p) for p in SAMPLES} == set(ev.AnyPayload.__args__)
    prev = GENESIS_HASH
    for seq, payload in enumerate(SAMPLES, 1):
        draft = Draft(payload=payload, dfid="d", agent_id="a", caused_by=seq - 1 or None)
        body = body_of(draft, seq, 1_000 + seq)
        hash_ = chain(prev, body)
        event = decode_body(body, prev, hash_)
        assert (
            event.payload == payload and event.seq == seq and event.type == type(payload).__name__
        )
        assert event.hash == hash_.hex() and event.prev_hash == prev.hex()
        prev = hash_


def test_canonical_bytes_sort_keys_and_omit_defaults() -> None:
    body = body_of(Draft(payload=ev.FlowClosed(), dfid="d"), 3, 9)
    assert body == b'{"dfid":"d","payload":{"type":"FlowClosed"},"seq":3,"ts":9}'
    decoded = json.loads(body)
    assert list(decoded) == sorted(decoded)


@given(
    facts=st.dictionaries(st.text(max_size=12), json_values, max_size=6), seq=st.integers(1, 10**9)
)
def test_trigger_facts_round_trip_and_any_change_changes_the_hash(
    facts: dict[str, Any], seq: int
) -> None:
    draft = Draft(payload=ev.TriggerFired(topic="t", facts=facts))
    body = body_of(draft, seq, 0)
    assert msgspec.json.decode(body, type=ev.Event).payload == draft.payload
    changed = body_of(Draft(payload=ev.TriggerFired(topic="t", facts={**facts, "\0": 1})), seq, 0)
    assert chain(GENESIS_HASH, body) != chain(GENESIS_HASH, changed)
    assert chain(GENESIS_HASH, body) != chain(b"\1" * 32, body)


def test_payload_of_reads_the_payload_as_the_type_it_names_and_refuses_another() -> None:
    restarted = ev.Event(seq=3, ts=1, payload=ev.ActorRestarted(actor="dim", error="x", restarts=2))
    stopped = ev.Event(seq=4, ts=2, payload=ev.KernelStopped(reason="KERNEL_CLOSED"))
    assert ev.payload_of(restarted, ev.ActorRestarted).restarts == 2
    with pytest.raises(TypeError, match="event 4 is KernelStopped, not ActorRestarted"):
        ev.payload_of(stopped, ev.ActorRestarted)
    assert ev.payloads([stopped, restarted, stopped], ev.ActorRestarted) == [restarted.payload]
    assert ev.payloads([stopped], ev.ActorRestarted) == []
