"""Projections: the kernel's whole state, folded from the journal.

Every actor reads state from here and nowhere else. The live kernel applies
each committed batch as the journal reports it; ``fold`` rebuilds the same
state from scratch, and the two must agree (``digest`` compares them). Nothing
here reads the clock or the network: time enters only as recorded event data.

The state is the flows (folded by ``kernel.core.flow``), the kernel's own records
beside them (agents and sessions, the state layer fed by triggers, approvals and
escalation budgets, pack versions, amendments, operator inbox rows), and the
domains registered in :data:`DOMAINS` (reservations, governed memory, the rulebook,
governed beliefs; see :mod:`kernel.state.domain`). One table maps each payload type
to its fold, the flow's own first: :meth:`Projections.apply` looks each event up
once and dispatches nothing by hand. The saved state (snapshots, the digest) is the
list of :class:`~kernel.state.domain.Saved` fields: the kernel's own
(:meth:`Projections.saved_fields` lists them first), then each domain's.

A finished flow (CLOSED, ABORTED, COMPENSATED) leaves the canonical state the
moment it ends (kernel.state.flow_index): the digest covers the open flows, the count
of finished ones by status and a rolling hash of their final states. A fold from
scratch keeps every finished flow in the index (``keep_finished=None``, what the CLI
uses), the live kernel only the most recent ``keep_finished``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property, partial
from typing import Any, cast

import msgspec

from kernel.core import flow
from kernel.core.events import (
    AgentRegistered,
    AgentStatusChanged,
    AmendmentRefused,
    ApprovalExpired,
    ApprovalVoted,
    CredentialIssued,
    DecisionRefused,
    Event,
    ExecutionStarted,
    FlowEscalated,
    GrantIssued,
    GrantRevoked,
    GrantVoted,
    HumanDecided,
    InputRefused,
    KernelStarted,
    LimitAmended,
    PackLoaded,
    PackRef,
    Payload,
    RuleDecided,
    RuleRetracted,
    ShadowLoaded,
    ShadowPromoted,
    ShadowRetired,
    TenantDeclared,
    TenantPolicyChanged,
    TriggerFired,
    digest,
)
from kernel.core.flow import FLOW_EVENTS, FlowState
from kernel.state import approvals
from kernel.state.amendments import Amendment, folded
from kernel.state.approvals import Approval
from kernel.state.artifacts import Artifacts, ArtifactState
from kernel.state.beliefs.domain import Beliefs
from kernel.state.beliefs.graph import BeliefGraph
from kernel.state.domain import OMIT, D, Domain, DomainType, Fold, Saved, compose, same
from kernel.state.flow_index import MOVING as MOVING
from kernel.state.flow_index import NOTES, FlowIndex
from kernel.state.memory import Memory, MemoryState
from kernel.state.records import AgentStatus as AgentStatus
from kernel.state.records import AgentView as AgentView
from kernel.state.records import Fact as Fact
from kernel.state.records import context_ref as context_ref
from kernel.state.records import session_hash as session_hash
from kernel.state.records import visible as visible
from kernel.state.registry import DOMAINS as DOMAINS
from kernel.state.registry import one_executor_each, unique
from kernel.state.reservations import Reservations

FOLD = 3
"""The fold rules this kernel records in KernelStarted and applies from then on.

1: every journal before them. 2: state kept per key is bounded (see MemoryState): an
intent's idempotency record goes with its outcome, a flow tree's queries when it ends.
3: the DIM's principal layer judges (kernel.dim._principal): a flow acts for someone;
journals written under 1 or 2 re-judge without it, as their kernels did.
A journal folds by the highest rules any kernel that opened it recorded, so an older
journal keeps folding (and its checkpoints keep hashing) exactly as its kernel did."""

VerdictCheck = Callable[["Projections", Sequence[Event], Mapping[str, FlowState]], None]
"""Called with each append of a transaction and the flows the appends before it staged."""
HISTORY = 256
"""Escalations kept per agent for its budget; older ones no longer matter to any bucket."""

# Operational failures are the adapters' doing, not the agent's: they spend no budget.
# So is an approval a later pack supersedes: the pack changed, not the agent.
_UNCHARGED = frozenset({"EXECUTION_FAILED", "OUTCOME_UNKNOWN", "APPROVAL_SUPERSEDED"})
# Events that may take an operator inbox row.
_INBOX_EVENTS: frozenset[type[Payload]] = frozenset(
    {
        HumanDecided,
        DecisionRefused,
        LimitAmended,
        AmendmentRefused,
        AgentStatusChanged,
        RuleDecided,
        InputRefused,
        RuleRetracted,
        CredentialIssued,
        ApprovalVoted,
        GrantIssued,
        GrantVoted,
        GrantRevoked,
        TenantDeclared,
        TenantPolicyChanged,
        ShadowRetired,
        ShadowPromoted,
        ShadowLoaded,
    }
)
_Table = dict[type[Payload], Fold]
_JUDGING = 1024
"""Proposal kinds whose judging domains are kept (``Projections.judging``)."""


class Projections(FlowIndex):
    """The state of the kernel as of ``last_seq``.

    Args:
        keep_finished: how many finished flows ``flows`` keeps beside the open
            ones (the most recently ended); None keeps every one.
        domains: the domains to fold (default: :data:`DOMAINS` as registered now).

    Raises:
        ValueError: A domain is registered twice, two parts save a field of the same
            name, or two domains provide an executor for the same adapter.
    """

    def __init__(
        self, keep_finished: int | None = None, domains: Sequence[DomainType] | None = None
    ) -> None:
        self.last_seq = 0
        self.keep_finished = keep_finished
        self.fold = 1
        """The fold rules in force (see :data:`FOLD`); canonical."""
        self.flows: dict[str, FlowState] = {}
        """Open flows, and the finished ones kept (see ``keep_finished``)."""
        self.ended: dict[str, None] = {}
        """The finished flows in ``flows``, oldest first (an ordered set)."""
        self.finished: dict[str, int] = {}
        """How many flows ended, by final status (canonical)."""
        # The rolling hash of finished flows (finished_hash) as a number (None: not yet
        # read from the text set), and as text (None: not yet written since a flow ended).
        self._finished_sum: int | None = 0
        self._finished_hex: str | None = ""
        self.agents: dict[str, AgentView] = {}
        self.agents_version = 0
        """Moved by each registration and status change (kernel.context.Subscribers)."""
        self.sessions: dict[str, str] = {}
        self.credentials: dict[str, str] = {}
        """Per agent, the verifier of the credential its handshakes must show (kernel.registry)."""
        self.state: dict[str, Fact] = {}
        self.moving: set[str] = set()
        # Derived (not part of the digest): per agent, its flows whose effects have not
        # converged (a saga unwinding, or escalated with steps still in effect).
        self.unsettled: dict[str, set[str]] = {}
        # The flows the transition check folded for the transaction being committed,
        # while apply() adopts them (current_flow reads them first).
        self._committing: dict[str, FlowState] | None = None
        self.verdict_check: VerdictCheck | None = None
        """Refuses an append whose verdicts the flows staged before it would change (the DIM's)."""
        self._adopting: dict[str, FlowState] | None = None
        self._were_ended: set[str] = set()
        self.approvals: dict[str, Approval] = {}
        self.waiting: set[str] = set()
        """Flows waiting for a human (ESCALATED)."""
        # Per agent: (dfid, ts) of its escalations since its budget was last filled.
        self.escalations: dict[str, list[tuple[str, int]]] = {}
        # Operator inbox rows already taken, and the seq of the event that took each.
        self.inbox_taken: dict[int, int] = {}
        self.packs: dict[str, PackRef] = {}
        """The pack versions in force, by name (KernelStarted, then PackLoaded)."""
        self.amendments: dict[str, dict[str, Amendment]] = {}
        """Per agent, its amended limits by name (expired ones too: see amendments.in_force)."""
        # What these projections hand out to their domains and keep in their table reaches
        # them weakly: with no reference cycle, a Projections dropped (a fold, a recall, a
        # replay) is freed at once, not left to the cyclic GC with all the state it holds.
        weak = cast(Projections, weakref.proxy(self))
        self._by_type: dict[type[Domain], Domain] = {}
        self._build(DOMAINS if domains is None else domains, weak)
        self.domains: tuple[Domain, ...] = tuple(self._by_type.values())
        """Every domain this state folds, in registration order."""
        self.records: dict[str, frozenset[type[Payload]]] = {
            adapter: kinds for domain in self.domains for adapter, kinds in domain.records().items()
        }
        """The event types each domain executor may return to record, by adapter name."""
        self.recording = frozenset(self.records)
        """The adapters whose executors return events to record (their idempotency
        record is the memory's ``written``/``pending``)."""
        one_executor_each(self.domains)
        self.checking = tuple(d for d in self.domains if type(d).check is not Domain.check)
        """The domains with a DIM check of their own, in registration order."""
        self.transforming = tuple(
            d for d in self.domains if type(d).transform is not Domain.transform
        )
        """The domains that may apply an accepted proposal in another form."""
        self._judging: dict[str, tuple[tuple[Domain, ...], tuple[Domain, ...]]] = {}
        self.saved_fields()  # refuses a field saved twice now, not at the first snapshot
        self._on_flow, self._on_other = self._tables(weak)

    def _build(self, domains: Sequence[DomainType], weak: Projections) -> None:
        """Build each domain, one by one: a domain may look up those registered before it."""
        for make in domains:
            domain = make(weak)
            if type(domain) in self._by_type:
                raise ValueError(f"the domain {type(domain).__name__} is registered twice")
            self._by_type[type(domain)] = domain

    # --- the table --------------------------------------------------------------

    def _tables(self, weak: Projections) -> tuple[_Table, _Table]:
        """Return the folds by payload type: of flow events on their flow, of the others.

        A flow event reaches the folds registered for its type only on its flow (after
        the flow's own fold); without one, it only takes the inbox row it names.
        """
        own: _Table = {kind: partial(fold, weak) for kind, fold in _KERNEL_FOLDS.items()}
        inbox = partial(Projections._take_inbox_row, weak)
        by_type: dict[type[Payload], list[Fold]] = {}
        for folds in (own, *(domain.folds() for domain in self.domains)):
            for kind, fold in folds.items():
                by_type.setdefault(kind, []).append(fold)
        for kind in _INBOX_EVENTS:
            by_type.setdefault(kind, []).append(inbox)
        on_flow = {kind: compose(folds) for kind, folds in by_type.items()}
        on_other = {kind: fold for kind, fold in on_flow.items() if kind not in FLOW_EVENTS}
        on_other.update((kind, inbox) for kind in _INBOX_EVENTS & FLOW_EVENTS)
        return on_flow, on_other

    def judging(self, kind: str) -> tuple[tuple[Domain, ...], tuple[Domain, ...]]:
        """Return the domains that check, and those that may transform, a proposal of ``kind``."""
        found = self._judging.get(kind)
        if found is None:
            found = (
                tuple(d for d in self.checking if d.judges(kind)),
                tuple(d for d in self.transforming if d.judges(kind)),
            )
            if len(self._judging) < _JUDGING:  # kinds come from packs; bounded all the same
                self._judging[kind] = found
        return found

    def domain(self, kind: type[D]) -> D:
        """Return this state's instance of the registered domain ``kind``.

        Raises:
            LookupError: ``kind`` is not among this state's domains.
        """
        found = self._by_type.get(kind)
        if found is None:
            raise LookupError(f"the domain {kind.__name__} is not registered")
        return cast(D, found)

    # The built-in domains as attributes: actors read them per proposal and per flow.

    @property
    def memory(self) -> MemoryState:
        """Governed memory (kernel.memory), the rulebook and the executors' record in it."""
        return self._memory.state

    @cached_property
    def _memory(self) -> Memory:
        return self.domain(Memory)

    @cached_property
    def _reservations(self) -> Reservations:
        return self.domain(Reservations)

    @property
    def beliefs(self) -> BeliefGraph:
        """Governed beliefs: workspaces and the canonical graph (kernel.beliefs)."""
        return self.domain(Beliefs).graph

    @property
    def artifacts(self) -> ArtifactState:
        """Artifact references, and what each open flow's context referenced."""
        return self.domain(Artifacts).state

    @property
    def reservations(self) -> dict[str, dict[str, int]]:
        """What each open flow holds, by pool (semantic locks)."""
        return self._reservations.holds

    @property
    def held(self) -> dict[str, int]:
        """The total held of each pool."""
        return self._reservations.held

    # --- folding -----------------------------------------------------------------

    def apply(self, events: Iterable[Event]) -> None:
        """Fold committed events, in seq order, into the state."""
        # Flows the transition check already folded for the transaction being committed.
        committing, self._committing = self._committing, None
        self._adopting = committing
        # Replay runs this for every event of a journal: names bound once, types compared
        # by identity (no payload type is subclassed; isinstance costs more per event),
        # the flow's own fold inline (a call per event costs about a tenth of a fold).
        flows, flow_apply, set_flow = self.flows, flow.apply, self._set_flow
        on_flow, on_other = self._on_flow, self._on_other
        try:
            for event in events:
                kind = type(event.payload)
                dfid = event.dfid
                if dfid is not None and kind in FLOW_EVENTS:
                    if committing is None or dfid not in committing:
                        current = flows.get(dfid)
                        if current is not None or kind not in NOTES:
                            set_flow(flow_apply(current, event))
                    fold = on_flow.get(kind)
                else:
                    fold = on_other.get(kind)
                if fold is not None:
                    fold(event)
                self.last_seq = event.seq
        finally:
            self._adopting = None
        self._adopt(committing)

    def _adopt(self, committing: dict[str, FlowState] | None) -> None:
        """Take the flows the transition check folded for the transaction just committed."""
        for state in (committing or {}).values():
            if state.dfid in self._were_ended:
                # Only notes reach a finished flow: the index sees them, if it kept it.
                if state.dfid in self.ended:
                    self.flows[state.dfid] = state
                continue
            self._set_flow(state)

    def current_flow(self, dfid: str) -> FlowState | None:
        """Return flow ``dfid`` as folded so far (inside a commit: as the transaction has it)."""
        adopting = self._adopting
        if adopting is not None:
            state = adopting.get(dfid)
            if state is not None:
                return state
        return self.flows.get(dfid)

    def _approval(self, event: Event) -> None:
        approvals.apply(self.approvals, event)

    def _consumed(self, event: Event) -> None:
        # ExecutionStarted only consumes an approval the flow has.
        if event.dfid in self.approvals:
            approvals.apply(self.approvals, event)

    def _escalated(self, event: Event) -> None:
        approvals.apply(self.approvals, event)
        if cast(FlowEscalated, event.payload).reason_code in _UNCHARGED:
            return
        dfid = cast(str, event.dfid)
        state = self.current_flow(dfid)
        if state is not None:
            history = self.escalations.setdefault(state.agent_id, [])
            history.append((dfid, event.ts))
            del history[:-HISTORY]

    def _facts(self, event: Event) -> None:
        payload = cast(TriggerFired, event.payload)
        for key, value in payload.facts.items():
            self.state[key] = Fact(
                value=value,
                source=payload.source or payload.topic,
                seq=event.seq,
                ts=event.ts,
            )

    def _registered(self, event: Event) -> None:
        payload = cast(AgentRegistered, event.payload)
        manifest = payload.manifest
        previous = self.agents.get(manifest.agent_id)
        if previous is not None:
            self.sessions.pop(previous.session_hash, None)
        # A new handshake never lifts a demotion: only an operator does.
        self.agents_version += 1
        self.agents[manifest.agent_id] = AgentView(
            manifest=manifest,
            status=previous.status if previous else AgentStatus.ACTIVE,
            session_hash=payload.session_hash,
            registered_seq=event.seq,
        )
        self.sessions[payload.session_hash] = manifest.agent_id

    def _status_changed(self, event: Event) -> None:
        payload = cast(AgentStatusChanged, event.payload)
        agent = self.agents.get(event.agent_id or "")
        if agent is None:
            return
        self.agents_version += 1
        self.agents[agent.manifest.agent_id] = msgspec.structs.replace(
            agent, status=AgentStatus(payload.status)
        )
        if payload.status == AgentStatus.ACTIVE:
            # Restored by an operator: a full escalation budget again.
            self.escalations.pop(agent.manifest.agent_id, None)

    def _kernel_started(self, event: Event) -> None:
        payload = cast(KernelStarted, event.payload)
        self.packs = {pack.name: pack for pack in payload.packs}
        self.fold = max(self.fold, payload.fold)

    def _pack_loaded(self, event: Event) -> None:
        pack = cast(PackLoaded, event.payload).pack
        self.packs[pack.name] = pack

    def _credential(self, event: Event) -> None:
        self.credentials[event.agent_id or ""] = cast(CredentialIssued, event.payload).verifier

    def _amended(self, event: Event) -> None:
        payload = cast(LimitAmended, event.payload)
        limits = self.amendments.setdefault(event.agent_id or "", {})
        limits[payload.limit] = folded(payload, event.seq)

    def _take_inbox_row(self, event: Event) -> None:
        inbox_id = event.payload.inbox_id  # type: ignore[union-attr]
        if inbox_id is not None:
            self.inbox_taken.setdefault(inbox_id, event.seq)

    def transition_check(self) -> Callable[[Sequence[Event]], None]:
        """Return a check for one journal transaction: it refuses illegal flow transitions.

        The journal calls it for each append in the transaction, in order, before
        writing anything; an append whose events do not fold (because another actor
        moved the flow first) raises IllegalTransition and is not written, while the
        others are. This is what makes an illegal transition impossible on disk.
        The flows it folds are the flows the transaction commits, so :meth:`apply`
        adopts them rather than folding the same events a second time.
        """
        staged: dict[str, FlowState] = {}
        self._committing = staged
        were_ended = self._were_ended = set()

        def check(events: Sequence[Event]) -> None:
            mine: dict[str, FlowState] = {}
            for event in events:
                dfid = event.dfid
                if dfid is None or type(event.payload) not in FLOW_EVENTS:
                    continue
                current = mine.get(dfid) or staged.get(dfid)
                if current is None:
                    current = self.flows.get(dfid)
                    if current is None and type(event.payload) in NOTES:
                        continue  # a note on a finished flow the index forgot
                    if current is not None and current.terminal:
                        were_ended.add(dfid)  # it had ended before this transaction
                mine[dfid] = flow.apply(current, event)
            if self.verdict_check is not None:
                self.verdict_check(self, events, staged)
            staged.update(mine)

        return check

    def visible_state(
        self, subscriptions: Iterable[str], staged: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Return the state an agent with these subscriptions may see, sorted by key.

        ``staged`` holds facts recorded but not yet folded (they win over the state).
        """
        subs = tuple(subscriptions)
        seen = {k: fact.value for k, fact in self.state.items() if visible(subs, k)}
        if staged:
            seen.update((k, v) for k, v in staged.items() if visible(subs, k))
        return dict(sorted(seen.items()))

    # --- the saved state ---------------------------------------------------------

    def saved_fields(self) -> tuple[Saved, ...]:
        """Return the saved state, field by field: the kernel's own, then each domain's.

        Raises:
            ValueError: Two parts save a field of the same name.
        """
        return unique(self._saved(), *(domain.saved() for domain in self.domains))

    def _saved(self) -> tuple[Saved, ...]:
        """Return the kernel's own share of the saved state, in snapshot order.

        Finished flows are saved only as counts by status and their rolling hash; the
        index of them (``flows``, ``approvals``) is left out. ``credentials`` and
        ``fold`` are left out of the digest while they hold nothing new: journals'
        checkpoints recorded before them hashed the state without them.
        """

        def kept(name: str, kind: Any, copy: Callable[[Any], Any] = dict, **how: Any) -> Saved:
            # A field kept as an attribute of its own name.
            get, load = partial(getattr, self, name), partial(setattr, self, name)
            return Saved(name=name, type=kind, get=get, load=load, copy=copy, **how)

        return (
            kept("last_seq", int, copy=same),
            Saved(
                name="flows", type=dict[str, FlowState], get=self.open_flows, load=self._load_flows
            ),
            kept("agents", dict[str, AgentView]),
            kept("sessions", dict[str, str]),
            kept("state", dict[str, Fact]),
            kept("finished", dict[str, int], canonical=_sorted, default={}),
            kept("finished_hash", str, copy=same, default=""),
            Saved(
                name="approvals",
                type=dict[str, Approval],
                get=self._open_approvals,
                load=partial(setattr, self, "approvals"),
                default={},
            ),
            kept("escalations", dict[str, list[tuple[str, int]]], copy=_copy_lists, default={}),
            kept("inbox_taken", dict[int, int], canonical=_items, default={}),
            kept("packs", dict[str, PackRef], default={}),
            kept("amendments", dict[str, dict[str, Amendment]], copy=_copy_dicts, default={}),
            kept("credentials", dict[str, str], canonical=_unless_empty, default={}),
            kept("fold", int, copy=same, canonical=_unless_first, default=1),
        )

    def snapshot(self) -> dict[str, Any]:
        """Return the canonical state as plain data (for digests, time travel and the CLI)."""
        shown: dict[str, Any] = {}
        for field in self.saved_fields():
            value = field.canonical(field.get())
            if value is not OMIT:
                shown[field.name] = value
        return shown

    def digest(self) -> str:
        """Return the hash of the canonical projected state."""
        return digest(self.snapshot())


_KERNEL_FOLDS: dict[type[Payload], Callable[[Projections, Event], None]] = {
    FlowEscalated: Projections._escalated,
    HumanDecided: Projections._approval,
    ApprovalExpired: Projections._approval,
    ExecutionStarted: Projections._consumed,
    TriggerFired: Projections._facts,
    AgentRegistered: Projections._registered,
    AgentStatusChanged: Projections._status_changed,
    KernelStarted: Projections._kernel_started,
    PackLoaded: Projections._pack_loaded,
    CredentialIssued: Projections._credential,
    LimitAmended: Projections._amended,
}
"""The kernel's own folds (beside the flow's, which runs first)."""


def _sorted(counts: dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items()))


def _items(rows: dict[int, int]) -> list[tuple[int, int]]:
    return sorted(rows.items())


def _unless_empty(value: dict[str, str]) -> Any:
    return value if value else OMIT


def _unless_first(rules: int) -> Any:
    return rules if rules > 1 else OMIT


def _copy_lists(history: dict[str, list[tuple[str, int]]]) -> dict[str, list[tuple[str, int]]]:
    return {agent: list(h) for agent, h in history.items()}


def _copy_dicts(limits: dict[str, dict[str, Amendment]]) -> dict[str, dict[str, Amendment]]:
    return {agent: dict(by_name) for agent, by_name in limits.items()}


def built_in(domains: Sequence[DomainType] | None = None) -> frozenset[str]:
    """Return the adapters the domains (default: those registered) provide executors for.

    A pack may name them without being given one: the kernel builds it (kernel.api.wiring).
    """
    return frozenset(name for d in Projections(domains=domains).domains for name in d.executors())


def fold(events: Iterable[Event], keep_finished: int | None = None) -> Projections:
    """Rebuild projections from scratch (keeping every finished flow unless told otherwise)."""
    projections = Projections(keep_finished)
    projections.apply(events)
    return projections
