"""Ballots: what each open approval was judged under, who may not vote on it, and its votes.

A domain (kernel.state.domain) beside the approvals the projections keep. An
escalation recorded by a kernel that knows quorums opens a :class:`Ballot`: the pack
version that judged the action and the rule that escalated it (what a later
re-judgement compares against, kernel.dim), the quorum it needs
(``FlowEscalated.quorum``), and who is excluded from voting: the proposing agent and
every operator who modified the action. Each :class:`~kernel.core.events.ApprovalVoted`
adds a vote; a modification adds its operator to the excluded, and the escalation
that follows opens a fresh ballot that keeps them. A flow that ends takes its ballot
with it. Escalations recorded before quorums open none, so an older journal folds
(and hashes) as it did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from kernel.core.events import (
    ApprovalVoted,
    Event,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowEscalated,
    HumanDecided,
    Payload,
    QuorumRule,
)
from kernel.policy.quorums import SINGLE
from kernel.state.domain import OMIT, Domain, Fold, Saved, State


class Vote(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One operator's vote, with the roles they held and when it was recorded."""

    operator: str
    vote: str
    roles: list[str] = []
    ts: int = 0


class Ballot(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The approval of one escalated flow, as quorums and re-judging see it.

    Attributes:
        dfid: the flow.
        action_hash: the action the votes are bound to.
        reason_code, rule: what escalated it.
        pack, version: the hash and version of the pack that judged it.
        quorum: what it needs (one operator unless the pack said more).
        excluded: who may not vote: the proposing agent, every modifier.
        votes: the votes recorded, oldest first.
        counted: the operators whose approvals counted at the last vote.
        waiting: what operators were shown at the last vote ("1 of 2, waiting for ...").
    """

    dfid: str
    action_hash: str
    reason_code: str
    rule: str = ""
    pack: str = ""
    version: str = ""
    quorum: QuorumRule = SINGLE
    excluded: list[str] = []
    votes: list[Vote] = []
    counted: list[str] = []
    waiting: str = ""

    def voted(self, operator: str, since_ns: int = 0) -> Vote | None:
        """Return ``operator``'s vote recorded at or after ``since_ns``, if any."""
        for vote in self.votes:
            if vote.operator == operator and vote.ts >= since_ns:
                return vote
        return None

    def standing(self, now_ns: int, vote: str = "approve") -> list[Vote]:
        """Return the votes of kind ``vote`` that have not expired at ``now_ns``."""
        ttl = self.quorum.vote_ttl_s
        since = now_ns - ttl * 1_000_000_000 if ttl else None
        return [v for v in self.votes if v.vote == vote and (since is None or v.ts >= since)]


_replace = msgspec.structs.replace


class Quorums(Domain):
    """The ballots of open escalations (saved as ``ballots``)."""

    name = "quorums"

    def __init__(self, projections: State) -> None:
        self._projections = projections
        self.ballots: dict[str, Ballot] = {}

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {
            FlowEscalated: self._opened,
            ApprovalVoted: self._voted,
            HumanDecided: self._decided,
            FlowClosed: self._ended,
            FlowAborted: self._ended,
            FlowCompensated: self._ended,
        }

    def saved(self) -> Sequence[Saved]:
        return (
            Saved(
                name="ballots",
                type=dict[str, Ballot],
                get=lambda: self.ballots,
                load=self._load,
                copy=dict,
                canonical=_unless_empty,
                default={},
            ),
        )

    def _load(self, ballots: dict[str, Ballot]) -> None:
        self.ballots = ballots

    def _opened(self, event: Event) -> None:
        payload: FlowEscalated = event.payload  # type: ignore[assignment]
        dfid = event.dfid or ""
        before = self.ballots.pop(dfid, None)
        if not payload.version and payload.quorum is None:
            return  # an escalation of a kernel before quorums, or one with nothing to approve
        excluded = list(before.excluded) if before is not None else [event.agent_id or ""]
        self.ballots[dfid] = Ballot(
            dfid=dfid,
            action_hash=payload.action_hash,
            reason_code=str(payload.reason_code),
            rule=payload.rule,
            pack=payload.pack,
            version=payload.version,
            quorum=payload.quorum or SINGLE,
            excluded=excluded,
        )

    def _voted(self, event: Event) -> None:
        ballot = self.ballots.get(event.dfid or "")
        if ballot is None:
            return
        p: ApprovalVoted = event.payload  # type: ignore[assignment]
        vote = Vote(operator=p.operator, vote=p.vote, roles=list(p.roles), ts=event.ts)
        self.ballots[ballot.dfid] = _replace(
            ballot,
            votes=[*ballot.votes, vote],
            counted=list(p.counted),
            waiting=p.waiting,
        )

    def _decided(self, event: Event) -> None:
        ballot = self.ballots.get(event.dfid or "")
        p: HumanDecided = event.payload  # type: ignore[assignment]
        if ballot is not None and p.decision == "modify" and p.operator not in ballot.excluded:
            # Whoever changed the action may not approve what they changed.
            self.ballots[ballot.dfid] = _replace(ballot, excluded=[*ballot.excluded, p.operator])

    def _ended(self, event: Event) -> None:
        self.ballots.pop(event.dfid or "", None)


def _unless_empty(ballots: dict[str, Ballot]) -> Any:
    return dict(sorted(ballots.items())) if ballots else OMIT
