"""The artifacts a Kernel keeps: documents stored once, named by reference, fetched in part.

A document too large for a fact (a statement, a report) goes to the artifact store
(kernel.artifacts); the journal records its reference (``ArtifactStored``), and a
trigger fact holding the reference puts it in the contexts that see the fact. An
agent then fetches ranges of it, as itself, and only what a context of its own flow
referenced (kernel.state.artifacts); a refusal is recorded. The store opens on first
use and closes with the kernel (:mod:`kernel.api.lifetime`). Collecting what nothing live
references is an operator's act (:meth:`kernel.api.Kernel.collect_artifacts`).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from kernel.artifacts import ArtifactStore, checked, connect_artifacts
from kernel.core import wall
from kernel.core.events import ArtifactStored, Draft, InputRefused
from kernel.core.fetching import ArtifactSlice, FetchRefused
from kernel.core.wall import clip
from kernel.journal.store import Journal
from kernel.state.artifacts import fetch as fetch_artifact_for
from kernel.state.projections import Projections


class Artifacts:
    """The kernel's artifact store, what is put in it and what agents fetch from it.

    Args:
        journal: where references and refused fetches are recorded.
        projections: what was stored, and which flow's context referenced what.
        location: the store (a directory, a SQLite file or a PostgreSQL URL).
        raise_if_stopped: raises why the kernel stopped, if it did (nothing opens then).
    """

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        location: str,
        raise_if_stopped: Callable[[], None],
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._location = location
        self._raise_if_stopped = raise_if_stopped
        self._store: ArtifactStore | None = None
        self._lock = anyio.Lock()

    async def store(self) -> ArtifactStore:
        """Return the artifact store, opened on first use (closed with the kernel).

        Raises:
            ArtifactStoreError: the store cannot be opened.
            KernelShutdown: the kernel stopped.
        """
        self._raise_if_stopped()
        if self._store is None:
            async with self._lock:
                if self._store is None:
                    self._store = await connect_artifacts(self._location)
        return self._store

    async def aclose(self) -> None:
        """Close the store, if it was opened."""
        store, self._store = self._store, None
        if store is not None:
            await store.aclose()

    async def put(self, data: bytes, *, media_type: str, summary: str, by: str, name: str) -> str:
        """Keep a document and record its reference (``Kernel.put_artifact``); return it.

        Raises:
            ArtifactTooLarge: not bytes, or over the store's limit.
            InputInvalid: a media type, summary, ``by`` or name the wall refuses.
            ArtifactStoreError: the store cannot be used.
        """
        self._raise_if_stopped()
        info = wall.admit(
            wall.fields(media_type=media_type, summary=summary, by=by, name=name),
            wall.ArtifactSpec,
        )
        raw = checked(data)
        store = await self.store()
        ref = await store.put(raw)
        known = self._projections.artifacts.stored.get(ref)
        if known is None or (known.media_type, known.summary) != (info.media_type, info.summary):
            stored = ArtifactStored(
                ref=ref,
                size=len(raw),
                media_type=info.media_type,
                summary=info.summary,
                by=info.by,
                name=info.name,
            )
            await self._journal.append([Draft(payload=stored, agent_id=info.by or None)])
        return ref

    async def fetch(
        self, agent_id: str, dfid: str, ref: str, start: int = 0, length: int | None = None
    ) -> ArtifactSlice:
        """Return a range of an artifact for ``agent_id`` (``Kernel.fetch_artifact``).

        Raises:
            FetchRefused: UNAUTHORIZED, ARTIFACT_MISSING or SCHEMA_INVALID, recorded.
        """
        self._raise_if_stopped()
        projections = self._projections
        try:
            store = await self.store() if projections.artifacts.stored else None
            return await fetch_artifact_for(
                projections.artifacts,
                projections.flows,
                projections.state,
                self._journal,
                store,
                agent_id=agent_id,
                dfid=dfid,
                ref=ref,
                start=start,
                length=length,
            )
        except FetchRefused as exc:
            refused = InputRefused(
                reason_code=exc.reason_code,
                entry="artifact",
                field=exc.field,
                detail=clip(exc.detail, wall.MAX_DETAIL),
                target=clip(ref) if isinstance(ref, str) else "",
            )
            flow = projections.flows.get(dfid) if isinstance(dfid, str) else None
            await self._journal.append(
                [
                    Draft(
                        payload=refused,
                        dfid=flow.dfid if flow is not None and not flow.terminal else None,
                        agent_id=clip(agent_id) if isinstance(agent_id, str) else None,
                    )
                ]
            )
            raise
