"""Domains: the parts of the kernel's state that plug in beside the flows.

A domain is one concern of governed state: governed memory, the rulebook, governed
beliefs, reservations (and the budgets, grants, artifacts and roadmap to come). Each
brings the same things, and no kernel module wires any of them by hand:

1. **Its events and its fold.** :meth:`Domain.folds` maps each payload type the domain
   folds to the function that folds one such event into its state. ``Projections``
   merges every domain's table into one (payload type -> fold), the way
   ``kernel.core.flow`` keeps its transition table: one lookup per event, whatever
   the number of domains.
2. **Its share of the saved state.** :meth:`Domain.saved` names each field it keeps in
   a snapshot and in the digest (:class:`Saved`: its type, how it is read, copied,
   restored, and the form the digest hashes). Snapshots (``ProjectedState``), the
   digest and restoring are built from these lists, so a field is declared once.
3. **Its DIM layer.** :meth:`Domain.check` refuses a proposal (a Feedback with a
   reason code); :meth:`Domain.transform` accepts it in another form (an Applied).
   Both are pure functions of the proposal and the domain's state as committed, so
   ``dirk verify --verdicts`` judges again exactly as the DIM judged
   (``kernel.dim.verdict`` runs every domain's, in registration order), and only for
   the kinds the domain judges (:meth:`Domain.judges`): a flow pays for no domain
   that has nothing to say about its kind.
4. **Its executors.** :meth:`Domain.executors` names the built-in adapters it
   provides: ``kernel.api.wiring`` builds one when a loaded pack needs that adapter and
   none was given. :meth:`Domain.records` names the event types each of them may
   return in its receipt for the execution engine to record with the intent's
   ExecutionSucceeded (anything else fails the call, kernel.execution).

Registering a domain is one line: its class in ``kernel.state.projections.DOMAINS``.
Each ``Projections`` builds its own instance of every registered domain, in order (the
class is called with the projections it belongs to, seen through :class:`State`, so a
domain module never imports ``projections``; it is a weak proxy, so that a dropped
Projections is freed without the cyclic GC), and looks domains up by class
(``State.domain``): a domain may look up one registered before it as it is built.

The rules every domain keeps:

- A fold reads no clock and no network: time enters only as recorded event data, so
  replay equals the live fold. A fold that must know the fold rules in force reads
  ``State.fold`` when it runs (a journal raises them in ``KernelStarted``).
- A fold binds to its domain, never to a state object: restoring a snapshot replaces
  the state (``Saved.load``), and the table of folds is built once.
- A flow event reaches a domain only on its flow (with a DFID), after the flow's own
  fold; ``projections.current_flow(dfid)`` is the flow as folded so far (inside a
  commit, what the transaction holds).
- What a fold keeps is plain data (msgspec Structs, dicts, lists): a snapshot stores
  it as is, and ``copy`` makes a copy that later folds leave alone.
- A field added to the saved state after journals exist gets a ``canonical`` form that
  leaves it out of the digest while it is empty (return :data:`OMIT`): the
  checkpoints those journals recorded hashed the state without it.
- The event types a domain folds are declared with every other event, in
  ``kernel.core`` (the journal's schema is declared in one place, and every event
  must read back): a new domain's new event types join ``AnyPayload`` there.

An executor that lives in a package above this layer (it talks to an actor's mailbox,
as the memory executor does) is named as ``"module:function"`` and imported when a
kernel is wired, the way ``kernel.journal`` imports its backends by name; the
function receives :class:`ExecutorPorts`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Protocol, TypeVar

import msgspec

from kernel.adapters.contract import Adapter, Receipt
from kernel.core.events import Applied, Event, Feedback, Payload, ProposalRecord
from kernel.core.flow import FlowState
from kernel.core.ports import Clock
from kernel.policy.rules import View

Fold = Callable[[Event], None]
"""Folds one event into a domain's state."""

OMIT: Any = object()
"""Returned by a :class:`Saved` field's ``canonical`` to leave the field out of the digest."""


def same(value: Any) -> Any:
    """Return ``value`` itself (a field that needs no copy, or is hashed as it is)."""
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Saved:
    """One field of the saved state: a field of a snapshot, a key of the digest.

    Attributes:
        name: the field's name (unique across the kernel and every domain).
        type: its type, as a snapshot decodes it (msgspec).
        get: returns the value now (the digest reads it; never changed by the caller).
        load: puts a value read back from a snapshot into the state.
        copy: returns a copy of a value that later folds leave alone (a snapshot's).
        canonical: the form the digest hashes, or :data:`OMIT` to leave the field out.
        default: the value of a snapshot that has no such field (none: it is required).
    """

    name: str
    type: Any
    get: Callable[[], Any]
    load: Callable[[Any], None]
    copy: Callable[[Any], Any] = same
    canonical: Callable[[Any], Any] = same
    default: Any = msgspec.NODEFAULT


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorPorts:
    """What a domain's executor is built with (``kernel.api.wiring`` builds one per kernel).

    Attributes:
        projections: the kernel's projections (the executor reads its domain there).
        clock: the kernel's clock (an effect's recorded time).
        dim: the DIM's mailbox, for an executor whose effect the DIM records
            (the rulebook has one writer: the memory executor hands rule proposals over).
        catalog: the policy packs in force (a ``PolicyCatalog``), for an executor whose
            effect records what they say (the memory executor records their synonyms).
    """

    projections: State
    clock: Clock
    dim: Recipient
    catalog: Any = None


class Recipient(Protocol):
    """A mailbox an executor hands work to (``kernel.runtime.actors.Mailbox`` is one)."""

    async def send(self, msg: Any, /) -> None:
        """Deliver ``msg``, waiting while the mailbox is full."""
        ...


ExecutorFactory = Callable[[ExecutorPorts], Adapter]
"""Builds a domain's executor for one kernel."""


class RecordingReceipt(Receipt, frozen=True, gc=False, kw_only=True):
    """A domain executor's receipt: its effect *is* the events in ``records``.

    The execution engine stages ``records`` in the same append as the intent's
    ExecutionSucceeded (caused by its ExecutionStarted), so the effect and the end of
    its execution are recorded together or not at all. Only the executors a domain
    declares (:meth:`Domain.records`) may return records, only of the types declared
    and only under the intent's key (kernel.execution checks; anything else fails the
    call).
    """

    records: tuple[Payload, ...] = ()


class Domain(Protocol):
    """A part of the kernel's state that plugs in (see the module docstring).

    Subclass it: the methods a domain does not need default to nothing. The class
    is what is registered; it is called with the projections the instance belongs to.
    """

    name: str
    """What the domain is called (in docs, errors and ``Projections.domains``)."""

    def folds(self) -> Mapping[type[Payload], Fold]:
        """Return, per payload type, the function that folds one such event."""
        ...

    def saved(self) -> Sequence[Saved]:
        """Return its share of the saved state, field by field, in snapshot order."""
        ...

    def check(self, proposal: ProposalRecord, view: View, flow: FlowState) -> Feedback | None:
        """Return the DIM's refusal of ``proposal`` by this domain, or None.

        Args:
            proposal: the proposal as recorded.
            view: what the rules saw (``view.agent_id`` proposes).
            flow: the proposal's flow (``flow.root_dfid`` names its tree).
        """
        return None

    def transform(self, proposal: ProposalRecord, flow: FlowState) -> Applied | None:
        """Return the form an accepted ``proposal`` of ``flow`` is applied in, if not its own."""
        return None

    def judges(self, kind: str) -> bool:
        """Return whether :meth:`check` or :meth:`transform` may answer for a proposal of ``kind``.

        A pure function of the kind (``Projections`` keeps the answer per kind): the DIM
        calls neither for a kind its domain does not judge (a domain of ``governance.*``
        kinds costs nothing to a flow of other kinds). Default: every kind.
        """
        return True

    def executors(self) -> Mapping[str, ExecutorFactory | str]:
        """Return the built-in executors it provides, by adapter name.

        A factory, or ``"module:function"`` for one in a package above kernel.state.
        """
        return {}

    def records(self) -> Mapping[str, frozenset[type[Payload]]]:
        """Return, per adapter it provides, the event types that executor may return."""
        return {}


D = TypeVar("D", bound=Domain)


class State(Protocol):
    """What a domain (and its executor) sees of the projections it belongs to."""

    @property
    def fold(self) -> int:
        """The fold rules in force (``kernel.state.projections.FOLD``)."""
        ...

    @property
    def domains(self) -> tuple[Domain, ...]:
        """Every domain of these projections, in registration order."""
        ...

    @property
    def last_seq(self) -> int:
        """The seq of the last event folded (0 before any)."""
        ...

    @property
    def records(self) -> Mapping[str, frozenset[type[Payload]]]:
        """The event types each domain executor may return to record, by adapter name."""
        ...

    @property
    def recording(self) -> frozenset[str]:
        """The adapters whose executors return events to record."""
        ...

    def current_flow(self, dfid: str) -> FlowState | None:
        """Return flow ``dfid`` as folded so far (inside a commit: as the transaction has it)."""
        ...

    def domain(self, kind: type[D]) -> D:
        """Return these projections' instance of the domain ``kind`` (LookupError if none)."""
        ...


DomainType = Callable[[State], Domain]
"""What is registered: a domain's class (called with the projections it belongs to)."""


def executor_factory(entry: ExecutorFactory | str) -> ExecutorFactory:
    """Return the factory ``entry`` names (``"module:function"`` is imported now)."""
    if not isinstance(entry, str):
        return entry
    module, _, name = entry.partition(":")
    factory: ExecutorFactory = getattr(import_module(module), name)
    return factory


def compose(folds: Sequence[Fold]) -> Fold:
    """Return one fold that runs ``folds`` in order (the only one, when there is one)."""
    # Spelled out for two and three: replay calls them for every event of their type.
    match folds:
        case [only]:
            return only
        case [first, second]:

            def two(event: Event) -> None:
                first(event)
                second(event)

            return two
        case [first, second, third]:

            def three(event: Event) -> None:
                first(event)
                second(event)
                third(event)

            return three
    chain = tuple(folds)

    def each(event: Event) -> None:
        for fold in chain:
            fold(event)

    return each
