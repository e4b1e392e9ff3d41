"""Artifacts as a domain: the references the journal holds, and who may fetch what.

The bytes of an artifact live in the artifact store (:mod:`kernel.artifacts`); the
journal records its reference (``ArtifactStored``: ``sha256:<hex>``, size, media type,
summary, who put it) and, in each ``ContextCompiled``, the artifacts that context
referenced. This module folds both (:class:`ArtifactState`, saved as ``artifacts``)
and decides every fetch with one rule, whichever way the agent asks (the SDK in
process, the bus, MCP):

    an agent may fetch an artifact only if a context the kernel compiled for one of
    its flows referenced it, and the bytes the store returns still hash to the
    reference.

A context references an artifact when a state fact its agent is entitled to see holds
the artifact's reference (``{"hotel.granvia.accessibility": "sha256:..."}``), or holds
a value too large to inline (its reference is the hash of the value's canonical JSON,
and the bytes are the fact itself, served from the state while it is unchanged).

Retention (:func:`collectable`): an artifact stays while an open flow's context
referenced it, or a state or memory fact names it; the others may be collected by an
operator (``dirk artifacts gc``), which records ``ArtifactsCollected`` before the bytes go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import msgspec

from kernel.artifacts import ArtifactStore, ArtifactStoreError, is_ref, ref_of
from kernel.core.events import (
    ArtifactsCollected,
    ArtifactStored,
    ContextCompiled,
    Event,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowCreated,
    Payload,
    canonical,
)
from kernel.core.fetching import ArtifactSlice, FetchRefused
from kernel.core.flow import FlowState
from kernel.core.reasons import ReasonCode
from kernel.journal.store import Journal
from kernel.state.domain import OMIT, Domain, Fold, Saved, State

MAX_FETCH_BYTES = 256 * 1024
"""The most bytes one fetch returns (ask again from ``start + len(data)`` for more)."""
JSON = "application/json"
"""The media type of a state value served as an artifact (its canonical JSON)."""


class ArtifactRecord(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A stored artifact as the journal recorded it (the bytes are in the store)."""

    seq: int
    size: int
    media_type: str
    summary: str = ""
    by: str = ""
    name: str = ""


class ArtifactState(msgspec.Struct, kw_only=True):
    """The artifacts projection: plain data, stored as is in snapshots.

    ``stored`` the artifacts put and not collected, by reference; ``collected`` the
    references collected, with the seq of the ``ArtifactsCollected``; ``shown`` what
    the contexts of each open flow referenced (flow -> reference -> state key).
    """

    stored: dict[str, ArtifactRecord] = {}
    collected: dict[str, int] = {}
    shown: dict[str, dict[str, str]] = {}

    def copy(self) -> ArtifactState:
        """Return a copy that later folds do not change (records are immutable)."""
        return ArtifactState(
            stored=dict(self.stored),
            collected=dict(self.collected),
            shown={dfid: dict(refs) for dfid, refs in self.shown.items()},
        )

    def empty(self) -> bool:
        """Whether nothing was ever recorded here (the digest then leaves it out)."""
        return not (self.stored or self.collected or self.shown)

    def info(self, ref: str) -> dict[str, Any]:
        """What a context shows beside a stored artifact's reference."""
        record = self.stored[ref]
        shown: dict[str, Any] = {"size": record.size, "media_type": record.media_type}
        if record.summary:
            shown["summary"] = record.summary
        if record.name:
            shown["name"] = record.name
        return shown


class Artifacts(Domain):
    """The artifacts domain (saved as ``artifacts``): references, and what contexts showed."""

    name = "artifacts"

    def __init__(self, projections: State) -> None:
        self._projections = projections
        self.state = ArtifactState()

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {
            ArtifactStored: self._stored,
            ArtifactsCollected: self._collected,
            ContextCompiled: self._shown,
            FlowClosed: self._ended,
            FlowAborted: self._ended,
            FlowCompensated: self._ended,
        }

    def saved(self) -> Sequence[Saved]:
        def load(state: ArtifactState) -> None:
            self.state = state

        return (
            Saved(
                name="artifacts",
                type=ArtifactState,
                get=lambda: self.state,
                load=load,
                copy=ArtifactState.copy,
                # Journals that never stored an artifact hashed the state without it.
                canonical=lambda s: OMIT if s.empty() else msgspec.to_builtins(s),
                default=msgspec.field(default_factory=ArtifactState),
            ),
        )

    def _stored(self, event: Event) -> None:
        payload = cast(ArtifactStored, event.payload)
        self.state.collected.pop(payload.ref, None)
        self.state.stored[payload.ref] = ArtifactRecord(
            seq=event.seq,
            size=payload.size,
            media_type=payload.media_type,
            summary=payload.summary,
            by=payload.by,
            name=payload.name,
        )

    def _collected(self, event: Event) -> None:
        for ref in cast(ArtifactsCollected, event.payload).refs:
            self.state.stored.pop(ref, None)
            self.state.collected[ref] = event.seq

    def _shown(self, event: Event) -> None:
        refs = cast(ContextCompiled, event.payload).artifacts
        if refs:
            # Every attempt's context counts: what was shown once may be fetched.
            shown = self.state.shown.setdefault(event.dfid or "", {})
            shown.update((ref, key) for key, ref in refs.items())

    def _ended(self, event: Event) -> None:
        if self.state.shown:
            self.state.shown.pop(event.dfid or "", None)


# --- what a context references ------------------------------------------------------


def stored_ref(state: ArtifactState, value: Any) -> str | None:
    """Return the reference a state value names, if it names a stored artifact."""
    return value if is_ref(value) and value in state.stored else None


def inline_ref(body: bytes) -> str:
    """Return the reference of a state value too large to inline (its canonical JSON)."""
    return ref_of(body)


def named(values: Iterable[Any]) -> set[str]:
    """Return the references among ``values`` (state or memory facts that name artifacts)."""
    return {value for value in values if is_ref(value)}


def live(state: ArtifactState, facts: Iterable[Any]) -> set[str]:
    """Return the stored artifacts something live references: an open flow, a fact."""
    kept = {ref for refs in state.shown.values() for ref in refs}
    kept |= named(facts)
    return kept & set(state.stored)


def collectable(state: ArtifactState, facts: Iterable[Any], held: Iterable[str]) -> list[str]:
    """Return the artifacts in the store (``held``) nothing live references, sorted.

    ``facts`` are the values of the state and memory facts now. An artifact the store
    holds that the journal never recorded is collectable too (a put whose reference was
    never recorded: the application stopped in between).
    """
    keep = live(state, facts)
    return sorted(ref for ref in held if ref not in keep)


# --- fetching ---------------------------------------------------------------------


def fetch_range(start: Any, length: Any, limit: int = MAX_FETCH_BYTES) -> tuple[int, int]:
    """Return (start, length) of a fetch, checked; ``length`` None asks for up to ``limit``.

    Raises:
        FetchRefused: SCHEMA_INVALID, a start or length that is not a whole number in range.
    """
    for name, value in (("start", start), ("length", length)):
        if value is None and name == "length":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 2**53:
            raise FetchRefused(
                ReasonCode.SCHEMA_INVALID, f"{name} is a whole number of bytes", name
            )
    wanted = limit if length is None else length
    if wanted > limit:
        raise FetchRefused(
            ReasonCode.SCHEMA_INVALID,
            f"at most {limit} bytes per fetch ({wanted} asked); fetch again from start + length",
            "length",
        )
    return start, wanted


def shown_to(
    state: ArtifactState, dfid: str, contexts: Sequence[ContextCompiled]
) -> dict[str, str]:
    """Return what the contexts of flow ``dfid`` referenced (reference -> state key).

    An open flow's is folded (``shown``); an ended flow's is read from its recorded
    ``contexts`` (the caller reads them from the journal).
    """
    found = dict(state.shown.get(dfid, {}))
    for context in contexts:
        found.update((ref, key) for key, ref in context.artifacts.items())
    return found


async def read_artifact(
    state: ArtifactState,
    store: ArtifactStore | None,
    ref: str,
    key: str,
    value: Any,
) -> tuple[bytes, str]:
    """Return the bytes of ``ref`` and their media type, checked against the reference.

    A stored artifact is read from the store; a state value too large to inline is the
    canonical JSON of ``value`` (the fact under ``key`` now), while it still hashes to
    the reference.

    Raises:
        FetchRefused: ARTIFACT_MISSING: collected, not in the store, or bytes that no
            longer hash to the reference (never served).
    """
    if ref in state.stored:
        if store is None:
            raise FetchRefused(ReasonCode.ARTIFACT_MISSING, "this kernel has no artifact store")
        try:
            data = await store.get(ref)
        except ArtifactStoreError as exc:
            raise FetchRefused(ReasonCode.ARTIFACT_MISSING, exc.detail) from None
        if data is None:
            raise FetchRefused(ReasonCode.ARTIFACT_MISSING, f"{ref} is not in the artifact store")
        if ref_of(data) != ref:
            raise FetchRefused(
                ReasonCode.ARTIFACT_MISSING, f"the stored bytes of {ref} no longer hash to it"
            )
        return data, state.stored[ref].media_type
    if ref in state.collected:
        raise FetchRefused(
            ReasonCode.ARTIFACT_MISSING, f"{ref} was collected (#{state.collected[ref]})"
        )
    body = canonical(value) if value is not None else b""
    if value is None or ref_of(body) != ref:
        raise FetchRefused(
            ReasonCode.ARTIFACT_MISSING, f"state {key!r} no longer holds the value {ref} named"
        )
    return body, JSON


def sliced(ref: str, data: bytes, media_type: str, start: int, length: int) -> ArtifactSlice:
    """Return the range ``[start, start + length)`` of an artifact's bytes."""
    return ArtifactSlice(
        ref=ref,
        start=start,
        data=data[start : start + length],
        size=len(data),
        media_type=media_type,
    )


async def _flow_of(
    state: ArtifactState, flows: Mapping[str, FlowState], journal: Journal, dfid: str
) -> tuple[str | None, list[ContextCompiled]]:
    """Return whose flow ``dfid`` is, and its recorded contexts when the fold has not them."""
    flow = flows.get(dfid)
    owner = flow.agent_id if flow is not None else None
    contexts: list[ContextCompiled] = []
    if flow is not None and dfid in state.shown:
        return owner, contexts
    # An ended flow (or one the index forgot): what it was shown is in the journal.
    for event in await journal.flow_events(dfid):
        if isinstance(event.payload, ContextCompiled):
            contexts.append(event.payload)
        elif isinstance(event.payload, FlowCreated) and owner is None:
            owner = event.agent_id
    return owner, contexts


async def fetch(
    state: ArtifactState,
    flows: Mapping[str, FlowState],
    facts: Mapping[str, Any],
    journal: Journal,
    store: ArtifactStore | None,
    *,
    agent_id: str,
    dfid: str,
    ref: Any,
    start: Any = 0,
    length: Any = None,
    limit: int = MAX_FETCH_BYTES,
) -> ArtifactSlice:
    """Fetch a range of artifact ``ref`` for ``agent_id``'s flow ``dfid``, or refuse.

    The one rule of every way in (module docstring): the flow is the agent's, one of its
    contexts referenced ``ref``, and the bytes still hash to it. ``facts`` are the state
    facts now (``Projections.state``: each with its ``value``).

    Raises:
        FetchRefused: SCHEMA_INVALID (not a reference, a bad range), UNAUTHORIZED (not the
            agent's flow, or no context of it referenced the artifact), ARTIFACT_MISSING.
    """
    if not is_ref(ref):
        raise FetchRefused(ReasonCode.SCHEMA_INVALID, "a reference is sha256: and 64 hex digits")
    begin, wanted = fetch_range(start, length, limit)
    owner, contexts = await _flow_of(state, flows, journal, dfid)
    if owner is None or owner != agent_id:
        raise FetchRefused(ReasonCode.UNAUTHORIZED, f"flow {dfid!r} is not {agent_id}'s", "dfid")
    key = shown_to(state, dfid, contexts).get(ref)
    if key is None:
        raise FetchRefused(ReasonCode.UNAUTHORIZED, f"no context of flow {dfid} referenced {ref}")
    fact = facts.get(key)
    data, media_type = await read_artifact(state, store, ref, key, getattr(fact, "value", None))
    if begin > len(data):
        raise FetchRefused(
            ReasonCode.SCHEMA_INVALID, f"start {begin} is past the end ({len(data)} bytes)", "start"
        )
    return sliced(ref, data, media_type, begin, wanted)
