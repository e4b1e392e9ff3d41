"""What a proposal goes through at the kernel's edge, before the DIM judges it.

Every proposal that reaches the DIM from outside (an agent's submission, a
framework's ``Kernel.propose``, an inbox row) passes here first, once its record
passed the wall:

- its personal fields are sealed (kernel.proofs.erasure): tokens, before anything
  judges or records them, so that erasing a subject later takes what the journal
  held of it;
- when an embedding matcher is configured (``Ports.meaning``), how close it comes
  to the memory constraints its words did not match is scored here, at the edge,
  and recorded (``MeaningScored``): the DIM reads the recorded scores, so its
  verdict stays a function of the journal.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kernel.core import wall
from kernel.core.events import Draft, Feedback, MeaningScored, ProposalRecord
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid, clip
from kernel.journal.store import Journal
from kernel.policy.contracts import Proposal, ProposalInvalid, to_record
from kernel.proofs.erasure import Sealer
from kernel.state.constraints import about_of, scorable
from kernel.state.meaning import EmbeddingMatcher, text_hash
from kernel.state.projections import Projections

log = logging.getLogger("kernel")


class Edge:
    """Seals a proposal's personal fields and scores its meaning, before its verdict.

    Args:
        journal: where the scores are recorded.
        projections: the flows and the memory the scores are about.
        sealer: seals the personal fields of the packs' kinds (None: no kind has any).
        meaning: the embedding matcher (None: constraints match words only).
    """

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        *,
        sealer: Sealer | None = None,
        meaning: EmbeddingMatcher | None = None,
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._sealer = sealer
        self._meaning = meaning

    @property
    def scores(self) -> bool:
        """Whether :meth:`prepare` scores meaning (it then waits for the model and the journal)."""
        return self._meaning is not None

    def seal(self, record: ProposalRecord) -> ProposalRecord:
        """Return ``record`` with its personal fields sealed.

        All of :meth:`prepare` that never waits: what a proposal judged at once (a
        synchronous agent's, run to completion) goes through when nothing scores.
        """
        if self._sealer is not None:
            # Personal fields become tokens before anything judges or records them.
            record = self._sealer.seal(record)
        return record

    async def prepare(self, dfid: str, record: ProposalRecord) -> ProposalRecord:
        """Return ``record`` as the DIM may judge it in flow ``dfid`` (the wall passed it)."""
        record = self.seal(record)
        if self._meaning is not None:
            await self._score_meaning(self._meaning, dfid, record)
        return record

    async def _score_meaning(
        self, matcher: EmbeddingMatcher, dfid: str, record: ProposalRecord
    ) -> None:
        """Record how close the proposal comes to the constraints its words did not match.

        A model that fails scores nothing: the words still match as they always do.
        """
        flow = self._projections.flows.get(dfid)
        if flow is None or flow.terminal:
            return
        memory = self._projections.memory
        wanted = scorable(memory, record)
        about = about_of(record)
        hashed = text_hash(about)
        if not wanted or hashed in memory.scores.get(dfid, {}):
            return
        seqs = sorted(wanted)
        try:
            scores = await matcher.scores(about, [wanted[seq] for seq in seqs])
        except Exception as exc:  # the model is the outside world: it never stops a verdict
            log.warning("the embedding matcher failed on flow %s: %r", dfid, exc)
            return
        scored = MeaningScored(
            model=clip(matcher.embedder.model),
            version=clip(matcher.embedder.version),
            threshold=matcher.threshold,
            text=hashed,
            scores={str(seq): score for seq, score in zip(seqs, scores, strict=True)},
        )
        await self._journal.append([Draft(payload=scored, dfid=dfid, agent_id=flow.agent_id)])


def admitted(
    proposal: Proposal | Mapping[str, Any] | bytes | str, *, policy: Any = None
) -> tuple[ProposalRecord, Feedback | None]:
    """Return the proposal as the wall admits it, or its kind and why not.

    The kind of a refused proposal is read from ``policy`` when given (the policy a
    proposal was built from), else from the proposal itself when it is a mapping.
    """
    try:
        try:
            record = to_record(proposal)
        except RecursionError:
            raise InputInvalid("$", f"nested deeper than {wall.MAX_DEPTH} levels") from None
        wall.admit(record, wall.ProposalSpec)
    except (ProposalInvalid, InputInvalid) as exc:
        source = proposal if policy is None else policy
        kind = source.get("kind") if isinstance(source, Mapping) else None
        record = ProposalRecord(kind=clip(kind) if isinstance(kind, str) else "")
        return record, Feedback(
            reason_code=ReasonCode.SCHEMA_INVALID,
            detail=exc.detail[:500],
            layer="schema",
            field=exc.field,
        )
    return record, None
