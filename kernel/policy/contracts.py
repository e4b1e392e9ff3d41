"""What crosses the wall between agents (user space) and the kernel.

Agents receive a :class:`WorkingContext` and answer with a :class:`Proposal`;
the kernel answers with a :class:`Verdict`. Nothing here gives an agent a
handle on adapters, credentials or the journal.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import msgspec

from kernel.core.events import Feedback, ProposalRecord
from kernel.core.fetching import ArtifactSlice, fetch_artifact
from kernel.core.reasoning import report_usage
from kernel.core.reasons import ReasonCode
from kernel.policy.kinds import PolicyKind, kind_name

MAX_PROPOSAL_BYTES = 64 * 1024
"""Proposals larger than this (as JSON) are refused with SCHEMA_INVALID."""


class Proposal(msgspec.Struct, frozen=True, kw_only=True):
    """A PolicyProposal: a typed intent beside a free-text explanation.

    Attributes:
        policy: the intent, an instance of a policy kind (or its wire form as a mapping).
        explain: the agent's reasoning, for humans; the kernel never executes it.
        confidence: the agent's own confidence in [0, 1]; low values go to a human.
        valid_until_ns: after this instant the proposal is refused as EXPIRED.
        context_ref: the hash of the WorkingContext the agent reasoned on.
    """

    policy: Any
    explain: str = ""
    confidence: float = 1.0
    valid_until_ns: int | None = None
    context_ref: str = ""


class WorkingContext(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Everything an agent may know for one attempt of one DecisionFlow; immutable.

    The layers: ``session`` (the flow), ``state`` (need-to-know facts), ``memory``
    (the memory document: namespace, constraints, facts, rules), ``artifacts``
    (documents by reference, state key -> ``sha256:<hex>``, with their size, media
    type and summary in ``artifact_info``; read one with :meth:`fetch_artifact`),
    ``knowledge`` (beliefs of canonical memory brought back for this task, with
    provenance and freshness); ``schemas`` of the kinds the agent may propose;
    ``tokens`` the estimate and ``dropped`` what the token budget or the limits left
    out (see kernel.context._layers).
    """

    dfid: str
    agent_id: str
    attempt: int
    topic: str
    state: dict[str, Any]
    context_ref: str
    now_ns: int
    root_dfid: str = ""
    parent_dfid: str | None = None
    feedback: Feedback | None = None
    session: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    artifacts: dict[str, str] = {}
    schemas: dict[str, Any] = {}
    tokens: int = 0
    dropped: list[str] = []
    artifact_info: dict[str, dict[str, Any]] = {}
    knowledge: dict[str, Any] = {}

    async def fetch_artifact(
        self, ref: str, *, start: int = 0, length: int | None = None
    ) -> ArtifactSlice:
        """Read bytes ``[start, start + length)`` of an artifact this context references.

        ``ref`` is a value of ``artifacts`` (or the key it is under). At most
        256 KiB come back per call (``length`` None asks for that much); the slice says
        the artifact's ``size`` and whether ``more`` follows. Works while the kernel
        asks this agent for a decision, in the kernel's process and on a mesh host alike.

        Raises:
            kernel.FetchRefused: UNAUTHORIZED (no context of this flow referenced it),
                ARTIFACT_MISSING (collected, or its bytes no longer hash to it),
                SCHEMA_INVALID (a bad range).
        """
        return await fetch_artifact(self.dfid, self.artifacts.get(ref, ref), start, length)

    def report_usage(self, *, tokens: int, model: str = "") -> None:
        """Tell the kernel this flow's reasoning spent ``tokens`` more (e.g. LLM tokens).

        Past the flow's cap the kernel cancels this reasoning at its next await
        and aborts the flow with TOKEN_BUDGET_EXHAUSTED. Naming the ``model`` lets the
        kernel's price table (``KernelConfig.prices``) turn the tokens into money,
        recorded (ReasoningCharged) against the budgets that count reasoning.
        """
        report_usage(self.dfid, tokens, model)

    def propose(
        self,
        policy: PolicyKind | Mapping[str, Any],
        *,
        explain: str = "",
        confidence: float = 1.0,
        valid_for_s: float = 30.0,
    ) -> Proposal:
        """Return a proposal bound to this context, valid for ``valid_for_s`` seconds."""
        return Proposal(
            policy=policy,
            explain=explain,
            confidence=confidence,
            valid_until_ns=self.now_ns + int(valid_for_s * 1e9),
            context_ref=self.context_ref,
        )


class Outcome(StrEnum):
    """How the kernel answered a submission."""

    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    ESCALATED = "ESCALATED"
    ABORTED = "ABORTED"
    REFUSED = "REFUSED"
    DUPLICATE = "DUPLICATE"


class Verdict(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The kernel's answer to a submission, given once its events are durable."""

    outcome: Outcome
    dfid: str
    attempt: int = 0
    feedback: Feedback | None = None
    external_id: str = ""

    @property
    def reason_code(self) -> ReasonCode | None:
        """The reason code, when the proposal was not simply accepted."""
        return self.feedback.reason_code if self.feedback else None


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """What a successful handshake returns: the token and the current policy schemas."""

    agent_id: str
    token: str
    schemas: dict[str, Any]
    kernel_version: str


class HandshakeRefused(Exception):
    """The registry refused an agent's manifest."""

    def __init__(self, reason_code: ReasonCode, detail: str) -> None:
        super().__init__(f"{reason_code}: {detail}")
        self.reason_code = reason_code
        self.detail = detail


class ProposalInvalid(Exception):
    """A submission that cannot even be read as a proposal."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail)
        self.field = field
        self.detail = detail


_record_decoder = msgspec.json.Decoder(ProposalRecord)


def to_record(proposal: Proposal | Mapping[str, Any] | bytes | str) -> ProposalRecord:
    """Turn whatever an agent submitted into the record the DIM validates.

    Raises:
        ProposalInvalid: naming the offending field, for anything malformed or oversized.
    """
    try:
        if isinstance(proposal, bytes | str):
            raw = proposal.encode() if isinstance(proposal, str) else proposal
            if len(raw) > MAX_PROPOSAL_BYTES:
                raise ProposalInvalid("$", f"proposal is {len(raw)} bytes, over the limit")
            return _record_decoder.decode(raw)
        if isinstance(proposal, Proposal):
            policy = proposal.policy
            if isinstance(policy, PolicyKind):
                kind, version = kind_name(type(policy)), type(policy).version
                params = msgspec.to_builtins(policy)
                params.pop("kind", None)
            elif isinstance(policy, Mapping):
                params = dict(msgspec.to_builtins(policy))
                kind = params.pop("kind", "")
                version = params.pop("version", "")
            else:
                raise ProposalInvalid("policy", "policy must be a policy kind or a mapping")
            wire: dict[str, Any] = {
                "kind": kind,
                "version": version,
                "params": params,
                "explain": proposal.explain,
                "confidence": proposal.confidence,
                "valid_until_ns": proposal.valid_until_ns,
                "context_ref": proposal.context_ref,
            }
        elif isinstance(proposal, Mapping):
            wire = dict(msgspec.to_builtins(proposal))
        else:
            raise ProposalInvalid("$", f"a proposal cannot be a {type(proposal).__name__}")
        size = len(msgspec.json.encode(wire))
        if size > MAX_PROPOSAL_BYTES:
            raise ProposalInvalid("$", f"proposal is {size} bytes, over the limit")
        return msgspec.convert(wire, ProposalRecord)
    except msgspec.ValidationError as exc:
        raise ProposalInvalid(field_of(exc), str(exc)) from None
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise ProposalInvalid("$", f"malformed proposal: {exc}") from None


def field_of(exc: msgspec.ValidationError) -> str:
    """Return the field a msgspec validation error points at (``$`` for the whole object)."""
    text = str(exc)
    if " - at `" in text:
        path = text.rsplit(" - at `", 1)[1].rstrip("`")
        return path.removeprefix("$.").removeprefix("$") or "$"
    if "unknown field `" in text:
        return text.split("unknown field `", 1)[1].split("`", 1)[0]
    if "missing required field `" in text:
        return text.split("missing required field `", 1)[1].split("`", 1)[0]
    return "$"
