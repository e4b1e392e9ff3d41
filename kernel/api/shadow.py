"""The operator's shadow acts: load a candidate pack as a shadow, retire it, promote it.

Loading takes the candidate's code, so the embedding program either loads it
(``Kernel.load_shadow``, trusted as code, as ``Kernel.load_pack``) or offers it
(``Kernel.offer_shadow``: held in memory, recorded by nobody) for an operator to load
through any door: a signed inbox request names the offered candidate by pack and
version, and by the content hash reviewed (``dirk shadow load``). Retiring and
promoting name the shadow by its pack, so every door does them: the API, and a signed
inbox request (:class:`kernel.inbox.ShadowRequest`, ``dirk shadow retire|promote``),
all applied here. Each is admitted at the wall first (an operator and a reason; a
refusal recorded), then handed to the DIM, which owns the shadows (kernel.dim._shadow).

A promotion computes the shadow's live report over the journal as it stands
(kernel.audit.shadow) and records its digest and last seq with the promotion; when the
operator names the digest they reviewed (``report``), a report that has changed since
refuses the promotion (SHADOW_REPORT_CHANGED), so what the journal says was known when
the change was made is what was reviewed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kernel.api.admission import Admission
from kernel.api.calls import Calls
from kernel.api.wiring import Actors
from kernel.audit.shadow import digest, live_report
from kernel.core import wall
from kernel.core.events import PackRef
from kernel.core.reasons import ReasonCode
from kernel.dim import ShadowRefused
from kernel.inbox import ShadowRequest
from kernel.journal.store import Journal
from kernel.policy.packs import PolicyPack
from kernel.runtime.actors import Reply
from kernel.runtime.messages import LoadShadow, PromoteShadow, RetireShadow
from kernel.state.projections import Projections
from kernel.state.shadows import Shadows


class ShadowActs:
    """Load, retire and promote shadow packs (a part of :class:`kernel.api.acts.OperatorActs`).

    Args:
        journal: what a promotion's report is read from.
        projections: which shadows judge now.
        admission: admits each act at the wall (and records a refusal).
        calls: sends an act to the DIM and waits for its durable answer.
        actors: the DIM's mailbox.
        adapters: the adapters registered (a shadow may need no other).
    """

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        admission: Admission,
        calls: Calls,
        actors: Actors,
        adapters: Collection[str],
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._admission = admission
        self._calls = calls
        self._actors = actors
        self._adapters = frozenset(adapters)
        self._offered: dict[tuple[str, str], PolicyPack] = {}

    def offer(self, pack: PolicyPack) -> None:
        """Let an operator load ``pack`` as a shadow through a signed request (its code, here).

        Raises:
            ShadowRefused: SHADOW_INVALID: ``pack`` is not a policy pack.
        """
        if not isinstance(pack, PolicyPack):
            raise ShadowRefused(ReasonCode.SHADOW_INVALID, "only a PolicyPack can be offered")
        self._offered[pack.name, pack.version] = pack

    async def load(self, pack: PolicyPack, *, operator: str, reason: str) -> PackRef:
        """Judge by ``pack`` beside the enforced version of its name; record ShadowLoaded.

        Raises:
            InputInvalid: no operator or reason, or one too long (recorded).
            ShadowRefused: SHADOW_INVALID (not a valid pack, no enforced pack of its
                name, a dropped kind, or the very version in force): nothing changes.
        """
        self._calls.raise_if_stopped()
        act = await self._admission.admit_act(
            wall.fields(operator=operator, reason=reason),
            wall.HumanActSpec,
            "load_shadow",
            operator,
            target=getattr(pack, "name", ""),
        )
        reply: Reply[Any] = Reply()
        msg = LoadShadow(
            pack=pack,
            adapters=self._adapters,
            operator=act.operator,
            reason=act.reason,
            reply=reply,
        )
        return _answer(await self._calls.call(self._actors.dim, msg, reply))

    async def apply(self, request: ShadowRequest, inbox_id: int | None = None) -> PackRef:
        """Retire or promote a shadow as ``request`` says (its fields checked at the wall).

        Raises:
            ShadowRefused: SHADOW_NOT_LOADED, SHADOW_INVALID, SHADOW_REPORT_CHANGED.
        """
        self._calls.raise_if_stopped()
        reply: Reply[Any] = Reply()
        msg: RetireShadow | PromoteShadow | LoadShadow
        if request.action == "load":
            msg = LoadShadow(
                pack=self._candidate(request),
                adapters=self._adapters,
                operator=request.operator,
                reason=request.reason,
                inbox_id=inbox_id,
                reply=reply,
            )
        elif request.action == "retire":
            msg = RetireShadow(
                name=request.pack,
                version=request.version,
                operator=request.operator,
                reason=request.reason,
                inbox_id=inbox_id,
                reply=reply,
            )
        else:
            msg = await self._promotion(request, reply, inbox_id)
        return _answer(await self._calls.call(self._actors.dim, msg, reply))

    def _candidate(self, request: ShadowRequest) -> PolicyPack:
        """The offered candidate a load names, as reviewed (its hash), or SHADOW_INVALID."""
        pack = self._offered.get((request.pack, request.version))
        if pack is None:
            what = f"{request.pack} {request.version}".strip()
            raise ShadowRefused(ReasonCode.SHADOW_INVALID, f"no candidate {what} was offered")
        if request.candidate and request.candidate != pack.hash:
            raise ShadowRefused(
                ReasonCode.SHADOW_INVALID,
                f"the candidate reviewed was {request.candidate[:16]},"
                f" the one offered is {pack.hash[:16]}",
            )
        return pack

    async def _promotion(
        self, request: ShadowRequest, reply: Reply[Any], inbox_id: int | None
    ) -> PromoteShadow:
        """The promotion, with the digest of the shadow's report as the journal stands."""
        judging = [s for s in self._projections.domain(Shadows).judging() if s.name == request.pack]
        if not judging or (request.version and judging[-1].version != request.version):
            what = f"{request.pack} {request.version}".strip()
            raise ShadowRefused(ReasonCode.SHADOW_NOT_LOADED, f"no shadow {what} judges")
        report = await live_report(self._journal, shadow=judging[-1].loaded)
        found = digest(report)
        if request.report and request.report != found:
            raise ShadowRefused(
                ReasonCode.SHADOW_REPORT_CHANGED,
                f"the report reviewed was {request.report[:16]}, it is now {found[:16]}"
                f" ({report.differed} difference(s) through #{report.stop})",
            )
        return PromoteShadow(
            name=request.pack,
            version=request.version,
            report=found,
            as_of_seq=report.stop,
            judged=report.judged,
            differed=report.differed,
            operator=request.operator,
            reason=request.reason,
            inbox_id=inbox_id,
            reply=reply,
        )


def _answer(answer: Any) -> PackRef:
    if isinstance(answer, ShadowRefused):
        raise answer
    assert isinstance(answer, PackRef)
    return answer
