"""The shadow events: a candidate pack judged live beside the enforced one, its differences.

An operator loads a candidate version of an enforced pack as its shadow
(:class:`ShadowLoaded`). The DIM then judges every proposal of the pack's kinds by the
shadow too, on the same state and time, through the same verdict function replay
calls (kernel.dim.verdict), and records only where the two differ: one compact
:class:`ShadowDiffered` per differing verdict, on the proposal's flow, caused by its
submission. The shadow never reserves, escalates or executes; its verdict is data.

A shadow ends when it is retired (:class:`ShadowRetired`), promoted
(:class:`ShadowPromoted`, followed in the same append by the ``PackLoaded`` that makes
it the enforced pack, with the digest of the report the promotion was made on), or
when the kernel stops: a kernel that starts again runs no shadow until one is loaded.
"""

from __future__ import annotations

from kernel.core._records import PackRef, Payload, Record


class Judged(Record, frozen=True):
    """A verdict reduced to what two verdicts are compared on (kernel.dim.verdict.outcome_of).

    Attributes:
        outcome: ``accepted``, ``escalated`` or ``rejected``.
        reason_code: why it refused or escalated ("" when accepted).
        detail: the refusal's or escalation's detail.
        applied: a transformed acceptance's applied form, as canonical JSON.
        quorum: an escalation's quorum in words ("" for one operator).
        grant: the standing grant an acceptance used.
    """

    outcome: str
    reason_code: str = ""
    detail: str = ""
    applied: str = ""
    quorum: str = ""
    grant: str = ""

    def key(self) -> tuple[str, ...]:
        """What must be equal for two verdicts to be the same (the detail is not)."""
        return (self.outcome, self.reason_code, self.applied, self.quorum, self.grant)

    def words(self) -> str:
        """The verdict as ``dirk whatif`` writes what was recorded."""
        applied = f" as {self.applied}" if self.applied else ""
        grant = f" under grant {self.grant}" if self.grant else ""
        quorum = f", needing {self.quorum}" if self.quorum else ""
        why = f" ({self.reason_code}{quorum})" if self.reason_code else ""
        return self.outcome + applied + grant + why

    def would(self) -> str:
        """The verdict as ``dirk whatif`` writes what another pack would have done."""
        return (
            f"would have been {self.outcome}"
            + (f" as {self.applied}" if self.applied else "")
            + (f" under grant {self.grant}" if self.grant else "")
            + (f" (needing {self.quorum})" if self.quorum else "")
        )


class ShadowLoaded(Payload, frozen=True, tag=True):
    """A candidate pack version judging beside the enforced version of the same pack.

    Attributes:
        pack: the shadow (name, version, content hash).
        enforced: the version in force it shadows.
        kinds: the policy kinds it judges (the shadow's, by name).
        previous: the hash of the shadow it replaced, if one was loaded.
        operator / reason: who loaded it, and why.
        inbox_id: the inbox row the load answers (a signed request), if any.
    """

    pack: PackRef
    enforced: PackRef
    kinds: list[str] = []
    previous: str = ""
    operator: str = ""
    reason: str = ""
    inbox_id: int | None = None


class ShadowDiffered(Payload, frozen=True, tag=True):
    """The shadow's verdict on a proposal differs from the enforced one (on the flow).

    ``caused_by`` is the proposal's ProposalSubmitted. ``costs`` is the proposal's cost
    by currency as the shadow counts it (integer minor units): the money the difference
    touches.
    """

    shadow: str
    kind: str
    enforced: Judged
    judged: Judged
    costs: dict[str, int] = {}


class ShadowRetired(Payload, frozen=True, tag=True):
    """A shadow stops judging; the enforced pack is unchanged.

    ``operator`` is ``kernel`` when the kernel retired it (the enforced pack changed
    so that the shadow no longer fits beside it; ``reason`` says why).
    """

    pack: PackRef
    operator: str = ""
    reason: str = ""
    inbox_id: int | None = None


class ShadowPromoted(Payload, frozen=True, tag=True):
    """A shadow becomes the enforced pack: ``PackLoaded`` follows in the same append.

    Attributes:
        pack: the shadow promoted.
        report: the digest of the shadow report the promotion was made on
            (kernel.audit.shadow.digest): the report over the journal through
            ``as_of_seq``, which anyone holding the journal can compute again.
        as_of_seq: the last seq that report read.
        judged / differed: the report's counts, for a reader of this event alone.
        operator / reason: who promoted it, and why.
        inbox_id: the inbox row the promotion answers (a signed request), if any.
    """

    pack: PackRef
    report: str
    as_of_seq: int
    judged: int = 0
    differed: int = 0
    operator: str = ""
    reason: str = ""
    inbox_id: int | None = None


SHADOW_PAYLOADS = (ShadowLoaded, ShadowDiffered, ShadowRetired, ShadowPromoted)
"""The shadow event types, for the union of every payload (kernel.core.events)."""
