"""The DIM as the rulebook's owner: rule proposals, operators' decisions and retractions.

Every rule event is staged here, on the DIM's Outbox, and committed by its
runner like any other event. A decision names the prior version, so two
decisions must never read the same rulebook: the DIM's mailbox handles one
message at a time, and each message reads the rulebook as the events staged
before it in the same batch leave it (a copy, folded with provisional seqs
above any recorded one; only their order matters, and they are never recorded).
A refusal (RuleNotPending, RuleNotInForce, ValueError) stages nothing and is the
reply. The promoter's gate itself is a pure function (kernel.state.rulebook).
"""

from __future__ import annotations

from collections.abc import Sequence

from kernel.core.events import Event, RuleDecided, RuleProposed, RuleRetracted
from kernel.runtime.actors import Outbox
from kernel.runtime.messages import DecideRule, RetractRule, RuleMessage, SubmitRule
from kernel.state import rulebook
from kernel.state.projections import Projections
from kernel.state.rulebook import Rulebook, RuleNotInForce, RuleNotPending


class _Staged:
    """The rulebook as this batch leaves it, and the memory keys it recorded."""

    def __init__(self, projections: Projections) -> None:
        self.book: Rulebook = projections.memory.rulebook.copy()
        self.seq = projections.last_seq
        self.keys: set[str] = set()

    def fold(
        self,
        payloads: Sequence[RuleProposed | RuleDecided | RuleRetracted],
        caused_by_first: bool = False,
    ) -> None:
        """Fold staged rule events; with ``caused_by_first`` the later ones answer the first."""
        first = self.seq + 1
        for payload in payloads:
            self.seq += 1
            caused_by = first if caused_by_first and self.seq != first else None
            self.book.apply(Event(seq=self.seq, ts=0, payload=payload, caused_by=caused_by))


def handle(msg: RuleMessage, projections: Projections, out: Outbox) -> None:
    """Stage what ``msg`` records on the rulebook, and its reply; or reply why not."""
    staged = out.scratch.get("rulebook")
    if staged is None:
        staged = out.scratch["rulebook"] = _Staged(projections)
    assert isinstance(staged, _Staged)
    try:
        match msg:
            case SubmitRule():
                _submit(msg, projections, staged, out)
            case DecideRule():
                decided = rulebook.operator_decision(
                    staged.book,
                    msg.proposal_seq,
                    msg.decision,
                    operator=msg.operator,
                    reason=msg.reason,
                    inbox_id=msg.inbox_id,
                )
                index = out.emit(decided, caused_by=msg.proposal_seq)
                # Folded by hand: the proposal is a recorded seq, not one staged here.
                staged.seq += 1
                staged.book.apply(
                    Event(seq=staged.seq, ts=0, payload=decided, caused_by=msg.proposal_seq)
                )
                out.reply_events(msg.reply, [index])
            case RetractRule():
                retracted = rulebook.retraction(
                    staged.book,
                    msg.rule,
                    operator=msg.operator,
                    reason=msg.reason,
                    inbox_id=msg.inbox_id,
                    ns=msg.ns,
                )
                index = out.emit(retracted)
                staged.fold([retracted])
                out.reply_events(msg.reply, [index])
    except (RuleNotPending, RuleNotInForce, ValueError) as exc:
        out.reply(msg.reply, exc)


def _submit(msg: SubmitRule, projections: Projections, staged: _Staged, out: Outbox) -> None:
    proposal = msg.proposal
    key = proposal.key
    if key and (key in projections.memory.written or key in staged.keys):
        # An agent's proposal is recorded once per intent key, like any memory effect.
        out.reply(msg.reply, [])
        return
    if msg.override:
        decided = rulebook.override(
            staged.book, proposal, operator=msg.operator, reason=msg.reason, inbox_id=msg.inbox_id
        )
    else:
        decided = rulebook.promote(staged.book, proposal)
    proposed = out.emit(proposal, dfid=msg.flow, caused_by=msg.caused_by, agent_id=msg.agent_id)
    answer = out.emit(decided, dfid=msg.flow, agent_id=msg.agent_id, after=proposed)
    staged.fold([proposal, decided], caused_by_first=True)
    if key:
        staged.keys.add(key)
    out.reply_events(msg.reply, [proposed, answer])
