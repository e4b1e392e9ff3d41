"""The shadows domain: which shadow packs judge now, and the counters of their differences.

Folded from the shadow events (kernel.core._shadow_events): a ``ShadowLoaded`` opens a
shadow (keyed by the seq that loaded it), ``ShadowDiffered`` counts one difference (by
reason code, kind and agent), ``ShadowRetired`` and ``ShadowPromoted`` end it, and
``KernelStarted`` ends every shadow still open (a kernel that starts runs none). The
report with the differences themselves, their principals and money, is read from the
journal (kernel.audit.shadow); these counters are what ``dirk shadow`` and the console
show at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from kernel.core.events import (
    Event,
    KernelStarted,
    Payload,
    ShadowDiffered,
    ShadowLoaded,
    ShadowPromoted,
    ShadowRetired,
)
from kernel.state.domain import OMIT, Domain, Fold, Saved, State


class ShadowCount(msgspec.Struct, kw_only=True):
    """One shadow's life and counters.

    Attributes:
        loaded: the seq of its ShadowLoaded (the shadow's id in reports).
        name / version / hash: the candidate pack.
        enforced: the version it shadowed when loaded (``version``).
        ended: the seq that ended it (0 while it judges); ``how``: retired, promoted,
            restarted (the kernel stopped), replaced (another shadow of its pack).
        differed: differences recorded; ``by_reason``, ``by_kind``, ``by_agent``.
    """

    loaded: int
    name: str
    version: str
    hash: str
    enforced: str = ""
    ended: int = 0
    how: str = ""
    differed: int = 0
    by_reason: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    by_agent: dict[str, int] = {}


class Shadows(Domain):
    """Every shadow the journal records, by the seq that loaded it (``shadows``)."""

    name = "shadows"

    def __init__(self, projections: State) -> None:
        self.shadows: dict[int, ShadowCount] = {}
        self._open: dict[str, int] = {}  # pack hash -> the loading seq, while it judges

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {
            ShadowLoaded: self._loaded,
            ShadowDiffered: self._differed,
            ShadowRetired: self._retired,
            ShadowPromoted: self._promoted,
            KernelStarted: self._started,
        }

    def saved(self) -> Sequence[Saved]:
        return (
            Saved(
                name="shadows",
                type=list[ShadowCount],
                get=lambda: list(self.shadows.values()),
                load=self._load,
                copy=_copied,
                canonical=lambda s: s if s else OMIT,  # older journals hashed none
                default=[],
            ),
        )

    def _load(self, shadows: list[ShadowCount]) -> None:
        self.shadows = {s.loaded: s for s in shadows}
        self._open = {s.hash: s.loaded for s in shadows if not s.ended}

    def judging(self) -> list[ShadowCount]:
        """The shadows that judge now, in the order they were loaded."""
        return [self.shadows[seq] for seq in sorted(self._open.values())]

    def _end(self, pack_hash: str, seq: int, how: str) -> None:
        loaded = self._open.pop(pack_hash, None)
        if loaded is not None:
            count = self.shadows[loaded]
            count.ended, count.how = seq, how

    def _loaded(self, event: Event) -> None:
        p: ShadowLoaded = event.payload  # type: ignore[assignment]
        for other, loaded in list(self._open.items()):
            if self.shadows[loaded].name == p.pack.name:
                self._end(other, event.seq, "replaced")
        self.shadows[event.seq] = ShadowCount(
            loaded=event.seq,
            name=p.pack.name,
            version=p.pack.version,
            hash=p.pack.hash,
            enforced=p.enforced.version,
        )
        self._open[p.pack.hash] = event.seq

    def _differed(self, event: Event) -> None:
        p: ShadowDiffered = event.payload  # type: ignore[assignment]
        loaded = self._open.get(p.shadow)
        if loaded is None:
            return
        count = self.shadows[loaded]
        count.differed += 1
        for table, key in (
            (count.by_reason, p.judged.reason_code or p.enforced.reason_code or "-"),
            (count.by_kind, p.kind),
            (count.by_agent, event.agent_id or "-"),
        ):
            table[key] = table.get(key, 0) + 1

    def _retired(self, event: Event) -> None:
        p: ShadowRetired = event.payload  # type: ignore[assignment]
        self._end(p.pack.hash, event.seq, "retired")

    def _promoted(self, event: Event) -> None:
        p: ShadowPromoted = event.payload  # type: ignore[assignment]
        self._end(p.pack.hash, event.seq, "promoted")

    def _started(self, event: Event) -> None:
        for pack_hash in list(self._open):
            self._end(pack_hash, event.seq, "restarted")


def _copied(shadows: list[ShadowCount]) -> list[ShadowCount]:
    """A copy later folds leave alone (they count into the tables in place)."""
    return [
        msgspec.structs.replace(
            count,
            by_reason=dict(count.by_reason),
            by_kind=dict(count.by_kind),
            by_agent=dict(count.by_agent),
        )
        for count in shadows
    ]
