"""Projections: the kernel's whole state, folded from the journal.

Every actor reads state from here and nowhere else. The live kernel applies
each committed batch as the journal reports it; ``fold`` rebuilds the same
state from scratch, and the two must agree (``digest`` compares them). Nothing
here reads the clock or the network: time enters only as recorded event data.

A finished flow (CLOSED, ABORTED, COMPENSATED) leaves the canonical state the
moment it ends: the digest covers the open flows, the count of finished ones
by status and a rolling hash of their final states, so a kernel that runs for
months holds nothing per finished flow in what it must keep. The flows
themselves stay readable in ``flows`` as an index beside the canonical state:
a fold from scratch keeps every one (``keep_finished=None``, what the CLI
uses), the live kernel only the most recent ``keep_finished`` (older ones are
read back from the journal on demand, see :meth:`Projections.recall`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, cast

import msgspec

from kernel.core import flow
from kernel.core.events import (
    BELIEF_PAYLOADS,
    AgentRegistered,
    AgentStatusChanged,
    AmendmentRefused,
    ContextCompiled,
    CredentialIssued,
    DecisionRefused,
    DuplicateSuppressed,
    Event,
    ExecutionFailed,
    ExecutionRefused,
    ExecutionStarted,
    ExecutionSucceeded,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowEscalated,
    FlowFlagged,
    HumanDecided,
    InputRefused,
    KernelStarted,
    LimitAmended,
    Manifest,
    PackLoaded,
    PackRef,
    ResourceReleased,
    ResourceReserved,
    RuleDecided,
    RuleRetracted,
    SubmissionRefused,
    TriggerFired,
    digest,
)
from kernel.core.flow import FLOW_EVENTS, TERMINAL, FlowState, FlowStatus
from kernel.state import approvals
from kernel.state.amendments import Amendment, folded
from kernel.state.approvals import APPROVAL_EVENTS, Approval
from kernel.state.beliefs import BELIEFS_ADAPTER
from kernel.state.beliefs.effects import PROPOSE_TEST
from kernel.state.beliefs.graph import BeliefGraph
from kernel.state.memory import MEMORY_ADAPTER, MEMORY_EVENTS, MemoryState, Pending

FOLD = 2
"""The fold rules this kernel records in KernelStarted and applies from then on.

1: every journal before them. 2: state kept per key is bounded (see MemoryState): an
intent's idempotency record goes with its outcome, a flow tree's queries when it ends.
A journal folds by the highest rules any kernel that opened it recorded, so an older
journal keeps folding (and its checkpoints keep hashing) exactly as its kernel did."""

_BELIEF_EVENTS = frozenset(BELIEF_PAYLOADS)
_RECORDING_ADAPTERS = frozenset({MEMORY_ADAPTER, BELIEFS_ADAPTER})

MOVING = frozenset(
    {
        FlowStatus.CREATED,
        FlowStatus.ACTIVE,
        FlowStatus.VALIDATING,
        FlowStatus.ACCEPTED,
        FlowStatus.EXECUTING,
        FlowStatus.DIRTY,
    }
)
"""Statuses in which a flow moves on without a human."""

_UNSETTLED = frozenset({FlowStatus.DIRTY, FlowStatus.ESCALATED})
HISTORY = 256
"""Escalations kept per agent for its budget; older ones no longer matter to any bucket."""

# Operational failures are the adapters' doing, not the agent's: they spend no budget.
_UNCHARGED = frozenset({"EXECUTION_FAILED", "OUTCOME_UNKNOWN"})
# Events that may take an operator inbox row.
_INBOX_EVENTS = frozenset(
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
    }
)
# Flow events allowed in any status that never change it: the only ones a flow gets
# after it ended. On a finished flow they touch the index, never the canonical state.
_NOTES = frozenset({DecisionRefused, DuplicateSuppressed, SubmissionRefused, FlowFlagged})
# Events that end a flow.
_ENDINGS = frozenset({FlowClosed, FlowAborted, FlowCompensated})
# Events that record an intent's outcome (ExecutionFailed only when it is known).
_OUTCOMES = frozenset({ExecutionSucceeded, ExecutionRefused, ExecutionFailed})
_Outcome = ExecutionSucceeded | ExecutionRefused | ExecutionFailed
_MODULUS = 1 << 256
# Sorted keys: a live payload and the same payload decoded from the journal encode alike.
_flow_encoder = msgspec.msgpack.Encoder(order="sorted")


def _flow_hash(state: FlowState) -> int:
    """Return what a finished flow adds to the rolling hash of finished flows.

    The rolling hash is a sum of these SHA-256 values modulo 2**256: the order in which
    flows of one batch end does not matter (the live kernel and a fold may see them in
    different orders), and each finished flow changes it.
    """
    return int.from_bytes(hashlib.sha256(_flow_encoder.encode(state)).digest())


class AgentStatus(StrEnum):
    """What an agent may do: ACTIVE proposes, PASSIVE only observes, the others nothing."""

    ACTIVE = "ACTIVE"
    PASSIVE = "PASSIVE"
    SUSPENDED = "SUSPENDED"
    RETIRED = "RETIRED"


class AgentView(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A registered agent as the registry knows it."""

    manifest: Manifest
    status: AgentStatus
    session_hash: str
    registered_seq: int


class Fact(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One key of the state layer: its value, where it came from and when."""

    value: Any
    source: str
    seq: int
    ts: int


def session_hash(token: str) -> str:
    """Return what the journal records of a session token (never the token itself)."""
    return hashlib.sha256(token.encode()).hexdigest()


def context_ref(state: Mapping[str, Any]) -> str:
    """Return the snapshot reference of a visible state."""
    return digest(state)


def visible(subscriptions: Iterable[str], key: str) -> bool:
    """Whether a state key or topic falls under one of the dotted-prefix subscriptions."""
    for prefix in subscriptions:
        if key == prefix or key.startswith(prefix + ".") or prefix == "*":
            return True
    return False


class Projections:
    """The state of the kernel as of ``last_seq``.

    Args:
        keep_finished: how many finished flows ``flows`` keeps beside the open
            ones (the most recently ended); None keeps every one.
    """

    def __init__(self, keep_finished: int | None = None) -> None:
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
        self.sessions: dict[str, str] = {}
        self.credentials: dict[str, str] = {}
        """Per agent, the verifier of the credential its handshakes must show (kernel.registry)."""
        self.state: dict[str, Fact] = {}
        self.moving: set[str] = set()
        # Derived (not part of the digest): per agent, its flows whose effects have not
        # converged (a saga unwinding, or escalated with steps still in effect).
        self.unsettled: dict[str, set[str]] = {}
        self.memory = MemoryState()
        self.beliefs = BeliefGraph()
        """Governed beliefs: workspaces and the canonical graph (kernel.beliefs)."""
        self._committing: dict[str, FlowState] | None = None
        self._were_ended: set[str] = set()
        self.reservations: dict[str, dict[str, int]] = {}
        """What each open flow holds, by pool (semantic locks)."""
        self.held: dict[str, int] = {}
        """The total held of each pool."""
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

    def apply(self, events: Iterable[Event]) -> None:
        """Fold committed events, in seq order, into the state."""
        # Flows the transition check already folded for the transaction being committed.
        committing, self._committing = self._committing, None
        # Replay runs this for every event of a journal: names bound once, types compared
        # by identity (no payload type is subclassed; isinstance costs more per event).
        flows = self.flows
        flow_apply = flow.apply
        set_flow = self._set_flow
        for event in events:
            payload = event.payload
            kind = type(payload)
            dfid = event.dfid
            if dfid is not None and kind in FLOW_EVENTS:
                if committing is None or dfid not in committing:
                    current = flows.get(dfid)
                    if current is not None or kind not in _NOTES:
                        set_flow(flow_apply(current, event))
                if kind is ContextCompiled:
                    # The rules this attempt showed: what its citations are checked against.
                    self.memory.rulebook.context_shown(dfid, cast(ContextCompiled, payload).rules)
                elif kind in APPROVAL_EVENTS:
                    # ExecutionStarted only consumes an approval the flow has.
                    if kind is not ExecutionStarted or dfid in self.approvals:
                        approvals.apply(self.approvals, event)
                    if (
                        kind is FlowEscalated
                        and cast(FlowEscalated, payload).reason_code not in _UNCHARGED
                    ):
                        owner = committing.get(dfid) if committing else None
                        agent_id = (owner or flows[dfid]).agent_id
                        history = self.escalations.setdefault(agent_id, [])
                        history.append((dfid, event.ts))
                        del history[:-HISTORY]
                    elif kind is ExecutionStarted:
                        started = cast(ExecutionStarted, payload)
                        intent = started.intent
                        if intent.adapter in _RECORDING_ADAPTERS:
                            self._memory_started(event, started)
                        elif intent.kind == PROPOSE_TEST:
                            self.beliefs.test_started(
                                intent.key, intent.params, intent.adapter, event.seq
                            )
                elif kind is ExecutionSucceeded:
                    succeeded = cast(ExecutionSucceeded, payload)
                    if succeeded.key in self.beliefs.test_keys:
                        self.beliefs.test_done(succeeded.key, succeeded.detail)
                if self.fold > 1:
                    # An intent's outcome is recorded (an unknown one waits for a human).
                    if kind in _OUTCOMES and not (
                        kind is ExecutionFailed and cast(ExecutionFailed, payload).unknown
                    ):
                        self.memory.settled(cast(_Outcome, payload).key)
                    elif kind in _ENDINGS:
                        self._flow_ended(dfid, committing)
            elif kind in MEMORY_EVENTS:
                self.memory.apply(event, bounded=self.fold > 1)
            elif kind in _BELIEF_EVENTS:
                self.beliefs.apply(event)
                key = payload.key  # type: ignore[union-attr]
                if key:
                    # The beliefs executor's idempotency record, beside the memory executor's.
                    self.memory.written[key] = event.seq
                    self.memory.pending.pop(key, None)
            elif isinstance(payload, TriggerFired):
                for key, value in payload.facts.items():
                    self.state[key] = Fact(
                        value=value,
                        source=payload.source or payload.topic,
                        seq=event.seq,
                        ts=event.ts,
                    )
            elif isinstance(payload, ResourceReserved | ResourceReleased):
                self._reserve(event.dfid or "", payload)
            elif isinstance(payload, AgentRegistered):
                manifest = payload.manifest
                previous = self.agents.get(manifest.agent_id)
                if previous is not None:
                    self.sessions.pop(previous.session_hash, None)
                # A new handshake never lifts a demotion: only an operator does.
                self.agents[manifest.agent_id] = AgentView(
                    manifest=manifest,
                    status=previous.status if previous else AgentStatus.ACTIVE,
                    session_hash=payload.session_hash,
                    registered_seq=event.seq,
                )
                self.sessions[payload.session_hash] = manifest.agent_id
            elif isinstance(payload, AgentStatusChanged):
                agent = self.agents.get(event.agent_id or "")
                if agent is not None:
                    self.agents[agent.manifest.agent_id] = msgspec.structs.replace(
                        agent, status=AgentStatus(payload.status)
                    )
                    if payload.status == AgentStatus.ACTIVE:
                        # Restored by an operator: a full escalation budget again.
                        self.escalations.pop(agent.manifest.agent_id, None)
            elif isinstance(payload, KernelStarted):
                self.packs = {pack.name: pack for pack in payload.packs}
                self.fold = max(self.fold, payload.fold)
            elif isinstance(payload, PackLoaded):
                self.packs[payload.pack.name] = payload.pack
            elif isinstance(payload, CredentialIssued):
                self.credentials[event.agent_id or ""] = payload.verifier
            elif isinstance(payload, LimitAmended):
                limits = self.amendments.setdefault(event.agent_id or "", {})
                limits[payload.limit] = folded(payload, event.seq)
            if kind in _INBOX_EVENTS:
                inbox_id = payload.inbox_id  # type: ignore[union-attr]
                if inbox_id is not None:
                    self.inbox_taken.setdefault(inbox_id, event.seq)
            self.last_seq = event.seq
        if committing:
            for state in committing.values():
                if state.dfid in self._were_ended:
                    # Only notes reach a finished flow: the index sees them, if it kept it.
                    if state.dfid in self.ended:
                        self.flows[state.dfid] = state
                    continue
                self._set_flow(state)

    def _flow_ended(self, dfid: str, committing: dict[str, FlowState] | None) -> None:
        """Let the memory forget what flow ``dfid`` (which just ended) kept in it.

        Asked at the ending event itself, live and in replay alike: what the memory keeps
        may not depend on how events were batched into commits.
        """
        memory = self.memory
        if not (memory.pending or memory.queried):
            return
        state = (committing and committing.get(dfid)) or self.flows.get(dfid)
        if state is None:
            return
        root = state.root_dfid
        tree = (committing and committing.get(root)) or self.flows.get(root)
        memory.flow_ended(dfid, root, root_open=tree is not None and not tree.terminal)

    def _memory_started(self, event: Event, payload: ExecutionStarted) -> None:
        flow_state = self.flows.get(event.dfid or "")
        self.memory.started(
            payload.intent.key,
            Pending(
                dfid=event.dfid or "",
                root_dfid=flow_state.root_dfid if flow_state else event.dfid or "",
                agent_id=event.agent_id or "",
                started_seq=event.seq,
            ),
        )

    def _set_flow(self, state: FlowState) -> None:
        dfid = state.dfid
        status = state.status
        self.flows[dfid] = state
        if status in TERMINAL and dfid not in self.ended:
            self._finish(state)
        if status in MOVING:
            self.moving.add(dfid)
        else:
            self.moving.discard(dfid)
        if status is FlowStatus.ESCALATED:
            self.waiting.add(dfid)
        elif self.waiting:
            self.waiting.discard(dfid)
        if state.done:
            if status in _UNSETTLED:
                self.unsettled.setdefault(state.agent_id, set()).add(dfid)
            elif state.agent_id in self.unsettled:
                self.unsettled[state.agent_id].discard(dfid)

    def _finish(self, state: FlowState) -> None:
        """Move a flow that just ended out of the canonical state, into the index."""
        dfid = state.dfid
        self.memory.rulebook.shown.pop(dfid, None)
        self.finished[state.status] = self.finished.get(state.status, 0) + 1
        total = self._finished_sum
        if total is None:
            total = int(self._finished_hex, 16) if self._finished_hex else 0
        self._finished_sum = (total + _flow_hash(state)) % _MODULUS
        self._finished_hex = None
        self._index(dfid)

    @property
    def finished_hash(self) -> str:
        """The rolling hash of every finished flow's final state (canonical; see
        :func:`_flow_hash`), "" before any flow ended."""
        if self._finished_hex is None:
            self._finished_hex = f"{self._finished_sum:064x}"
        return self._finished_hex

    @finished_hash.setter
    def finished_hash(self, value: str) -> None:
        self._finished_sum, self._finished_hex = None, value

    def _index(self, dfid: str, at_least: int = 0) -> None:
        """Note ``dfid`` as a finished flow in ``flows``; forget the oldest past the limit."""
        self.ended[dfid] = None
        keep = self.keep_finished
        if keep is not None and len(self.ended) > max(keep, at_least):
            oldest = next(iter(self.ended))
            del self.ended[oldest]
            self.flows.pop(oldest, None)
            self.approvals.pop(oldest, None)

    def recall(self, state: FlowState, approval: Approval | None = None) -> None:
        """Put a finished flow read back from the journal into the index (not the digest).

        The kernel calls it before answering a request about a flow the index
        forgot (a repeated submission, a late decision), so the actors answer it
        from the record exactly as they did while the flow was kept.
        """
        if not state.terminal or state.dfid in self.flows:
            return
        self.flows[state.dfid] = state
        if approval is not None:
            self.approvals[state.dfid] = approval
        self._index(state.dfid, at_least=1)  # even keep_finished=0 holds it for the request

    def open_flows(self) -> dict[str, FlowState]:
        """Return the flows that have not ended, by DFID."""
        ended = self.ended
        return {dfid: state for dfid, state in self.flows.items() if dfid not in ended}

    def unsettled_flows(self, agent_id: str) -> list[str]:
        """Return the agent's flows whose effects have not converged.

        Those are flows DIRTY (a saga unwinding) or escalated after a failed compensation.
        """
        return sorted(self.unsettled.get(agent_id, ()))

    def _reserve(self, dfid: str, payload: ResourceReserved | ResourceReleased) -> None:
        holds = self.reservations.setdefault(dfid, {})
        before = holds.pop(payload.pool, 0)
        after = payload.amount if isinstance(payload, ResourceReserved) else 0
        if after:
            holds[payload.pool] = after
        elif not holds:
            del self.reservations[dfid]
        total = self.held.get(payload.pool, 0) - before + after
        if total:
            self.held[payload.pool] = total
        else:
            self.held.pop(payload.pool, None)

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
                    if current is None and type(event.payload) in _NOTES:
                        continue  # a note on a finished flow the index forgot
                    if current is not None and current.terminal:
                        were_ended.add(dfid)  # it had ended before this transaction
                mine[dfid] = flow.apply(current, event)
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

    def snapshot(self) -> dict[str, Any]:
        """Return the canonical state as plain data (for digests, time travel and the CLI).

        Finished flows appear only as counts by status and their rolling hash;
        the index of them (``flows``, ``approvals``) is left out.
        """
        ended = self.ended
        return (
            {
                "last_seq": self.last_seq,
                "flows": self.open_flows(),
                "finished": dict(sorted(self.finished.items())),
                "finished_hash": self.finished_hash,
                "agents": self.agents,
                "sessions": self.sessions,
                "state": self.state,
                "reservations": self.reservations,
                "approvals": {d: a for d, a in self.approvals.items() if d not in ended},
                "escalations": self.escalations,
                "inbox_taken": sorted(self.inbox_taken.items()),
                # Constraints and rule proposals are keyed by seq: canonical JSON keys are strings.
                "memory": msgspec.to_builtins(self.memory, str_keys=True),
                "packs": self.packs,
                "amendments": self.amendments,
            }
            | ({"credentials": self.credentials} if self.credentials else {})
            | ({"fold": self.fold} if self.fold > 1 else {})
            | ({} if self.beliefs.empty() else {"beliefs": msgspec.to_builtins(self.beliefs)})
        )

    def digest(self) -> str:
        """Return the hash of the canonical projected state."""
        return digest(self.snapshot())


def fold(events: Iterable[Event], keep_finished: int | None = None) -> Projections:
    """Rebuild projections from scratch (keeping every finished flow unless told otherwise)."""
    projections = Projections(keep_finished)
    projections.apply(events)
    return projections
