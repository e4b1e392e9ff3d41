"""Re-judging recorded verdicts: replay reproduces them, and what another pack would change.

:func:`rejudge` walks the journal once, folding the projections as it goes.
At each recorded ProposalSubmitted it rebuilds what the DIM judged against
from the projections at that position (the agent, its visible state and
context reference, the pools held, the memory, the agent's unsettled flows),
takes the submission's recorded time as the DIM's clock, and calls the DIM's
own verdict function (:func:`kernel.dim.verdict.verdict`) with the packs it is
given. When the recorded verdict of that proposal arrives, the two are
compared: outcome (accepted, escalated, rejected) and reason code.

- ``dirk verify --verdicts --pack PATH`` checks that replay reproduces every
  verdict. A verdict records the content hash of the pack that judged it; a
  given pack whose hash differs (same name and version, a changed rule) is
  reported as PACK_MISMATCH and its verdicts are not compared.
- ``dirk whatif --pack PATH`` skips the hash check and lists the verdicts the
  given packs would change. Each proposal is judged against history as
  recorded: a flipped verdict's consequences (a reservation not held, an order
  not filled) are not carried forward. With ``--exclude SEQ`` the history lacks
  those events (a standing grant never issued, an amendment never made).

Besides each proposal's verdict, an approved action judged again before it executed
(ProposalAccepted ``rechecked``, or ApprovalSuperseded) is judged again the same way,
and an escalation's quorum is part of what is compared: a pack that asks more
operators shows the escalations it would have opened otherwise, and the approvals
whose recorded votes would not have met it ("approved by ana then, would wait: 1 of
2"). A grant's use is part of an acceptance: excluding the grant shows the proposals
that would have waited for a human instead.

The replayed prefix is what the DIM judged against: a verdict another actor's
events before it (in its group commit, or the one in flight while it judged) would
have changed is never written, but judged again (kernel.dim._raced). A difference
is therefore a finding, never a race. The journal is only read.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from types import ModuleType

import msgspec

from kernel.audit.counterfactual import Change
from kernel.core.events import (
    ApprovalSuperseded,
    Event,
    FlowAborted,
    FlowEscalated,
    HumanDecided,
    KernelStarted,
    PackLoaded,
    PackRef,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
    QuorumRule,
)
from kernel.core.reasons import CliError, ReasonCode
from kernel.dim._judgement import Judgement
from kernel.dim.verdict import form_of, outcome_of, quorum_words, rechecked, verdict
from kernel.journal.store import Journal
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack
from kernel.policy.quorums import SINGLE, tally
from kernel.state.approvals import APPROVE_WORDS
from kernel.state.projections import Projections
from kernel.state.quorums import Quorums


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    """A verdict reduced to what is compared: accepted, escalated or rejected, and why."""

    outcome: str
    reason_code: str = ""
    detail: str = ""
    pack: str = ""
    applied: str = ""
    """A transformed acceptance: the applied form, as canonical JSON (kernel.beliefs)."""
    quorum: str = ""
    """An escalation's quorum, in words ("2 of risk, desk-head"); "" for one operator."""
    grant: str = ""
    """The standing grant an acceptance used."""

    def words(self) -> str:
        """Return the outcome as in ``dirk whatif``'s lines."""
        applied = f" as {self.applied}" if self.applied else ""
        grant = f" under grant {self.grant}" if self.grant else ""
        quorum = f", needing {self.quorum}" if self.quorum else ""
        why = f" ({self.reason_code}{quorum})" if self.reason_code else ""
        return self.outcome + applied + grant + why

    def key(self) -> tuple[str, ...]:
        """What must be equal for two verdicts to be the same."""
        return (self.outcome, self.reason_code, self.applied, self.quorum, self.grant)


class Rejudged(msgspec.Struct, frozen=True, kw_only=True):
    """What re-judging a journal found.

    Attributes:
        judged: recorded verdicts judged again and compared.
        skipped: verdicts not compared (no given pack for their kind, or a hash mismatch).
        changes: verdicts that differ, in journal order.
        mismatches: one line per pack whose hash differs from the recorded one.
    """

    judged: int
    skipped: int
    changes: list[Change]
    mismatches: list[str] = []


class _Pending(msgspec.Struct, kw_only=True):
    seq: int
    agent_id: str
    kind: str
    now: Recorded


def _recorded(payload: ProposalAccepted | ProposalRejected | FlowEscalated) -> Recorded:
    match payload:
        case ProposalRejected(feedback=f, pack=pack):
            return Recorded(
                outcome="rejected", reason_code=str(f.reason_code), detail=f.detail, pack=pack
            )
        case FlowEscalated(reason_code=code, detail=detail, pack=pack):
            return Recorded(
                outcome="escalated",
                reason_code=str(code),
                detail=detail,
                pack=pack,
                quorum=quorum_words(payload.quorum),
            )
        case ProposalAccepted(pack=pack, applied=applied, grant=grant):
            return Recorded(outcome="accepted", pack=pack, applied=form_of(applied), grant=grant)


def judge_at(projections: Projections, event: Event, catalog: PolicyCatalog) -> Recorded | None:
    """Judge the ProposalSubmitted ``event`` as the DIM did, against ``projections`` before it.

    Returns None when the flow or its agent is unknown at that position.
    """
    judged = _judged_at(projections, event, catalog)
    return _reduced(judged) if judged is not None else None


def _judged_at(projections: Projections, event: Event, catalog: PolicyCatalog) -> Judgement | None:
    payload = event.payload
    assert isinstance(payload, ProposalSubmitted)
    flow = projections.flows.get(event.dfid or "")
    agent = projections.agents.get(flow.agent_id) if flow is not None else None
    if flow is None or agent is None:
        return None
    return verdict(
        payload.proposal,
        flow,
        agent,
        catalog,
        event.ts,
        projections,
        by_human=payload.by_human,
    )


def _reduced(judgement: Judgement) -> Recorded:
    # The reduction the DIM's shadow compares on (kernel.dim.verdict.outcome_of), with the pack.
    found = outcome_of(judgement)
    return Recorded(**msgspec.structs.asdict(found), pack=judgement.pack)


def recheck_at(
    projections: Projections, event: Event, catalog: PolicyCatalog
) -> tuple[Recorded, Judgement] | None:
    """Judge an approved action again as the DIM did just before it executed, at ``event``.

    Returns the outcome (``accepted``, or ``superseded`` with what the judgement found)
    and the judgement; None when the flow or its agent is unknown there.
    """
    flow = projections.flows.get(event.dfid or "")
    agent = projections.agents.get(flow.agent_id) if flow is not None else None
    if flow is None or agent is None or flow.proposal is None:
        return None
    judgement = verdict(flow.proposal, flow, agent, catalog, event.ts, projections, recheck=True)
    approval = projections.approvals.get(flow.dfid)
    ballot = projections.domain(Quorums).ballots.get(flow.dfid)
    if rechecked(judgement, ballot, approval):
        return Recorded(outcome="accepted", pack=judgement.pack), judgement
    found = judgement.rejection or judgement.escalation
    assert found is not None
    return (
        Recorded(
            outcome="superseded",
            reason_code=str(found.reason_code),
            detail=found.detail,
            pack=judgement.pack,
        ),
        judgement,
    )


async def rejudge(
    journal: Journal,
    packs: Sequence[PolicyPack],
    *,
    check_hash: bool = True,
    exclude: Collection[int] = (),
) -> Rejudged:
    """Judge every recorded proposal again with ``packs``; return the verdicts that differ.

    Args:
        journal: the journal (only read).
        packs: the packs to judge with; kinds of packs not given are skipped. Several
            versions of one pack may be given: with ``check_hash``, each proposal is
            judged by the version the journal says was in force (``KernelStarted``,
            ``PackLoaded``); without it, by the first version given.
        check_hash: compare each verdict's recorded pack hash with the given pack's,
            and skip (reporting PACK_MISMATCH) where they differ.
        exclude: seqs of events the judged history does not have (``dirk whatif
            --exclude``): a grant never issued, a pack never loaded.
    """
    return (await _walk(journal, packs, check_hash, exclude)).result()


async def rejudge_costed(
    journal: Journal, packs: Sequence[PolicyPack], stop: int | None = None
) -> tuple[Rejudged, dict[int, ProposalRecord]]:
    """:func:`rejudge` without the hash check, through ``stop``; with each submission judged.

    The second value maps the seq of every submission judged again to its proposal
    (a shadow report prices it, kernel.dim.verdict.money_of).
    """
    replay = await _walk(journal, packs, False, (), stop)
    return replay.result(), replay.proposals


async def _walk(
    journal: Journal,
    packs: Sequence[PolicyPack],
    check_hash: bool,
    exclude: Collection[int],
    stop: int | None = None,
) -> _Replay:
    replay = _Replay(packs, check_hash)
    excluded = frozenset(exclude)
    async for batch in journal.scan():
        for event in batch:
            if stop is not None and event.seq > stop:
                return replay
            if event.seq not in excluded:
                replay.step(event)
    return replay


class _Replay:
    """The walk :func:`rejudge` makes: the projections folded so far, and what it found."""

    def __init__(self, packs: Sequence[PolicyPack], check_hash: bool) -> None:
        self.check_hash = check_hash
        self.by_hash = {pack.hash: pack for pack in packs}
        self.in_force_now: dict[str, PolicyPack] = {}
        for pack in packs:
            self.in_force_now.setdefault(pack.name, pack)
        self.catalog = PolicyCatalog(list(self.in_force_now.values()))
        self.recorded_refs: dict[str, PackRef] = {}
        self.projections = Projections()
        self.waiting: dict[str, _Pending] = {}
        self.changes: list[Change] = []
        self.mismatched: dict[tuple[str, str, str], int] = {}
        self.judged = self.skipped = 0
        self.rules: dict[str, QuorumRule | None] = {}
        """Per flow, the quorum its escalation needs under the given packs (as re-judged)."""
        self.proposals: dict[int, ProposalRecord] = {}
        """Per submission seq judged again, the proposal (what shadow reports price)."""

    def adopt(self, refs: Sequence[PackRef]) -> None:
        """Switch to the given versions the journal names as in force from here on."""
        swapped = False
        for ref in refs:
            pack = self.by_hash.get(ref.hash)
            if self.check_hash and pack is not None and self.in_force_now.get(ref.name) is not pack:
                self.in_force_now[ref.name], swapped = pack, True
        if swapped:
            self.catalog = PolicyCatalog(list(self.in_force_now.values()))

    def step(self, event: Event) -> None:
        """Judge what ``event`` asks to be judged again, then fold it."""
        payload, dfid = event.payload, event.dfid or ""
        if isinstance(payload, HumanDecided) and payload.decision in APPROVE_WORDS:
            self._found(_quorum_change(event, self.projections, self.rules.get(dfid, _UNJUDGED)))
        if (isinstance(payload, ProposalAccepted) and payload.rechecked) or isinstance(
            payload, ApprovalSuperseded
        ):
            self.judged += 1
            self._found(_recheck_change(event, self.projections, self.catalog))
        elif isinstance(payload, KernelStarted):
            self.recorded_refs.update((ref.hash, ref) for ref in payload.packs)
            self.adopt(payload.packs)
        elif isinstance(payload, PackLoaded):
            self.recorded_refs[payload.pack.hash] = payload.pack
            self.adopt([payload.pack])
        elif isinstance(payload, ProposalSubmitted):
            self._submitted(event, payload, dfid)
        elif isinstance(payload, ProposalAccepted | ProposalRejected | FlowEscalated):
            pending = self.waiting.pop(dfid, None)
            if pending is not None:
                self._verdict(event, payload, dfid, pending)
        elif isinstance(payload, FlowAborted):
            self.waiting.pop(dfid, None)
        self.projections.apply((event,))

    def _found(self, change: Change | None) -> None:
        if change is not None:
            self.changes.append(change)

    def _submitted(self, event: Event, payload: ProposalSubmitted, dfid: str) -> None:
        flow = self.projections.flows.get(dfid)
        judged_now = _judged_at(self.projections, event, self.catalog)
        if judged_now is None or flow is None:
            return
        self.waiting[dfid] = _Pending(
            seq=event.seq,
            agent_id=flow.agent_id,
            kind=payload.proposal.kind,
            now=_reduced(judged_now),
        )
        if judged_now.escalation is not None:
            self.rules[dfid] = judged_now.quorum
        self.proposals[event.seq] = payload.proposal

    def _verdict(
        self,
        event: Event,
        payload: ProposalAccepted | ProposalRejected | FlowEscalated,
        dfid: str,
        pending: _Pending,
    ) -> None:
        then = _recorded(payload)
        if then.pack and pending.kind not in self.catalog.kinds:
            self.skipped += 1  # judged by a pack not given
        elif self.check_hash and then.pack and then.pack != pending.now.pack:
            ref = self.recorded_refs.get(then.pack)
            name = ref.name if ref else self.catalog.pack_of[pending.kind].name
            version = ref.version if ref else "?"
            key = (f"{name} {version}", then.pack, pending.now.pack)
            self.mismatched[key] = self.mismatched.get(key, 0) + 1
            self.skipped += 1
        else:
            self.judged += 1
            self._found(_compare(event, dfid, pending, then))

    def result(self) -> Rejudged:
        mismatches = [
            f"{CliError.PACK_MISMATCH} pack {name}: {count} verdict(s) recorded under hash"
            f" {recorded[:16]}, the given pack hashes to {now[:16]}"
            for (name, recorded, now), count in sorted(self.mismatched.items())
        ]
        return Rejudged(
            judged=self.judged, skipped=self.skipped, changes=self.changes, mismatches=mismatches
        )


_UNJUDGED: QuorumRule | None = QuorumRule(required=0)
"""A flow whose proposal was not judged again (no given pack): its approvals are not compared."""


def _quorum_change(
    event: Event, projections: Projections, rule: QuorumRule | None
) -> Change | None:
    """An approval whose recorded votes would not meet the quorum the given packs ask for."""
    if rule is _UNJUDGED:
        return None
    dfid = event.dfid or ""
    flow = projections.flows.get(dfid)
    payload = event.payload
    assert isinstance(payload, HumanDecided)
    ballot = projections.domain(Quorums).ballots.get(dfid)
    voters = [(v.operator, v.roles) for v in ballot.votes if v.vote == "approve"] if ballot else []
    voters = voters or [(payload.operator, [])]
    counted = tally(rule or SINGLE, voters)
    if counted.met or flow is None or flow.proposal is None:
        return None
    who = ", ".join(op for op, _ in voters)
    return Change(
        seq=event.seq,
        dfid=dfid,
        agent_id=flow.agent_id,
        kind=flow.proposal.kind,
        then=f"approved by {who}",
        now=f"would still wait: {counted.waiting}",
        reason_code=str(ReasonCode.APPROVAL_REQUIRED),
    )


def _recheck_change(
    event: Event, projections: Projections, catalog: PolicyCatalog
) -> Change | None:
    """An approved action judged again before it executed, compared with what was recorded."""
    flow = projections.flows.get(event.dfid or "")
    if flow is None or flow.proposal is None or flow.proposal.kind not in catalog.kinds:
        return None
    found = recheck_at(projections, event, catalog)
    if found is None:
        return None
    now, _ = found
    payload = event.payload
    then = (
        Recorded(outcome="accepted")
        if isinstance(payload, ProposalAccepted)
        else Recorded(outcome="superseded", reason_code=str(payload.reason_code))  # type: ignore[union-attr]
    )
    if (then.outcome, then.reason_code) == (now.outcome, now.reason_code):
        return None
    return Change(
        seq=event.seq,
        dfid=flow.dfid,
        agent_id=flow.agent_id,
        kind=flow.proposal.kind,
        then=f"approval {then.words()} when judged again",
        now=f"would have been {now.outcome}",
        reason_code=now.reason_code,
        detail=now.detail,
    )


def _compare(event: Event, dfid: str, pending: _Pending, then: Recorded) -> Change | None:
    now = pending.now
    if then.key() == now.key():
        return None
    return Change(
        seq=pending.seq,
        dfid=dfid,
        agent_id=pending.agent_id,
        kind=pending.kind,
        then=then.words(),
        now=f"would have been {now.outcome}"
        + (f" as {now.applied}" if now.applied else "")
        + (f" under grant {now.grant}" if now.grant else "")
        + (f" (needing {now.quorum})" if now.quorum else ""),
        reason_code=now.reason_code,
        detail=now.detail,
    )


# --- loading packs from a path ---------------------------------------------------------


class PackPathError(Exception):
    """A ``--pack`` argument that names no loadable policy pack."""

    code = "BAD_PACK_PATH"


def load_packs(spec: str) -> list[PolicyPack]:
    """Return the policy packs ``spec`` names.

    ``spec`` is ``FILE.py``, ``FILE.py:ATTR``, ``MODULE`` or ``MODULE:ATTR``. ATTR
    is a PolicyPack or a sequence of them; without ATTR, every PolicyPack the
    module defines at its top level.

    Raises:
        PackPathError: the file or module cannot be loaded, ATTR is missing or is
            not a pack, or a pack does not validate.
    """
    where, _, attr = spec.partition(":")
    if not where:
        raise PackPathError(f"{spec!r}: give FILE.py[:ATTR] or MODULE[:ATTR]")
    try:
        module = _module_of(where)
    except PackPathError:
        raise
    except Exception as exc:  # whatever the file raises: one line, never a traceback
        raise PackPathError(f"{where}: cannot be loaded: {type(exc).__name__}: {exc}") from exc
    packs = _packs_in(module, spec, where, attr)
    try:
        PolicyCatalog(packs)
    except PackError as exc:
        raise PackPathError(f"{spec}: {exc}") from exc
    return packs


def _module_of(where: str) -> ModuleType:
    """Import the file or module ``where`` names."""
    if where.endswith(".py") or os.sep in where:
        path = Path(where)
        if not path.is_file():
            raise PackPathError(f"{where}: no such file")
        name = f"_dirk_pack_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise PackPathError(f"{where}: not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    # As `python -m` finds a module: the current directory first. A console
    # script (`dirk`) has its own directory on the path, not the current one,
    # and a checkout's `examples.desk` is never installed; on the path only
    # while the pack is imported.
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(where)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _packs_in(module: ModuleType, spec: str, where: str, attr: str) -> list[PolicyPack]:
    """The packs ``attr`` of ``module`` names, or (no ``attr``) every pack it defines."""
    if not attr:
        packs = list(
            {id(v): v for v in vars(module).values() if isinstance(v, PolicyPack)}.values()
        )
        if not packs:
            raise PackPathError(f"{where} defines no PolicyPack; name one with {where}:ATTR")
        return packs
    if not hasattr(module, attr):
        raise PackPathError(f"{where} has no attribute {attr!r}")
    found = getattr(module, attr)
    packs = (
        [found]
        if isinstance(found, PolicyPack)
        else list(found)
        if isinstance(found, list | tuple)
        else []
    )
    if not packs or not all(isinstance(p, PolicyPack) for p in packs):
        raise PackPathError(f"{spec}: is not a PolicyPack (nor a list of them)")
    return packs
