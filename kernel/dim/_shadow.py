"""Shadow packs in the DIM: a candidate version judged beside the enforced one.

An operator loads a candidate version of an enforced pack as its shadow
(``Kernel.load_shadow``). From then on, every proposal of the pack's kinds that the DIM
judges is judged by the shadow too: by :func:`kernel.dim.verdict.verdict`, the function
the enforced judgement and ``dirk whatif --pack`` both call, with the same proposal,
flow, agent, time, projections and staged batch as the enforced judgement, before the
enforced verdict stages anything. The catalog it judges with is the enforced catalog
with the candidate in its pack's place (:func:`kernel.dim._packs.replaced`), so what the
shadow decides is what replaying the journal with the candidate and the other packs in
force decides (``dirk shadow report --pack``; a test compares the two).

Only a difference is recorded: one ``ShadowDiffered`` on the flow, after the enforced
verdict and caused by the submission. The shadow's judgement is data: it reserves
nothing, escalates nothing, executes nothing, and the enforced verdict is computed and
recorded exactly as without it. A kernel with no shadow loaded does one truth test per
judged proposal and nothing more.

The shadows live beside the DIM (built once by kernel.api.wiring), so a restarted DIM
keeps them; a kernel that stops ends them (the next runs none until one is loaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel.core.events import (
    PackLoaded,
    PackRef,
    ProposalRecord,
    ShadowDiffered,
    ShadowLoaded,
    ShadowPromoted,
    ShadowRetired,
)
from kernel.core.flow import FlowState
from kernel.core.reasons import ReasonCode
from kernel.dim._judgement import Inputs, Judgement
from kernel.dim._packs import replaced
from kernel.dim.verdict import money_of, outcome_of, verdict
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack
from kernel.runtime.actors import Outbox
from kernel.runtime.messages import LoadShadow, PromoteShadow, RetireShadow
from kernel.state.projections import AgentView, Projections


class ShadowRefused(Exception):
    """A shadow act the DIM refused: ``code`` says why (a reason code), nothing changed."""

    def __init__(self, code: ReasonCode, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.reason_code = code  # what the inbox's poller records a refused row with
        self.detail = detail


@dataclass
class Shadow:
    """One shadow: the candidate pack and the catalog it judges with."""

    pack: PolicyPack
    catalog: PolicyCatalog
    adapters: frozenset[str]


class Shadows:
    """The shadows in force, by the name of the pack each shadows (one per pack)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Shadow] = {}
        self._by_kind: dict[str, Shadow] = {}

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def _index(self) -> None:
        self._by_kind = {
            kind: shadow for shadow in self.by_name.values() for kind in shadow.pack.by_name
        }

    # --- judging ----------------------------------------------------------------------

    def judge(
        self,
        proposal: ProposalRecord,
        flow: FlowState,
        agent: AgentView,
        now_ns: int,
        projections: Projections,
        *,
        by_human: bool,
        inputs: Inputs,
    ) -> tuple[Shadow, Judgement] | None:
        """Judge ``proposal`` by its kind's shadow, if one is loaded; as the DIM judges it.

        ``inputs`` are the enforced verdict's (kernel.dim.verdict.inputs_of): the very
        state, staged batch included, it was judged against.
        """
        shadow = self._by_kind.get(proposal.kind)
        if shadow is None:
            return None
        judged = verdict(
            proposal,
            flow,
            agent,
            shadow.catalog,
            now_ns,
            projections,
            by_human=by_human,
            inputs=inputs,
        )
        return shadow, judged

    @staticmethod
    def record(
        found: tuple[Shadow, Judgement],
        enforced: Judgement,
        proposal: ProposalRecord,
        dfid: str,
        agent_id: str,
        submitted: int,
        out: Outbox,
    ) -> None:
        """Stage a ShadowDiffered when the shadow's verdict differs from the enforced one."""
        shadow, judged = found
        then, now = outcome_of(enforced), outcome_of(judged)
        if then.key() == now.key():
            return
        out.emit(
            ShadowDiffered(
                shadow=shadow.pack.hash,
                kind=proposal.kind,
                enforced=then,
                judged=now,
                costs=money_of(proposal, shadow.catalog),
            ),
            dfid=dfid,
            agent_id=agent_id,
            after=submitted,
        )

    # --- the operator's acts ------------------------------------------------------------

    def load(self, msg: LoadShadow, catalog: PolicyCatalog, out: Outbox) -> None:
        """Stage ShadowLoaded and judge by the candidate from the next proposal on."""
        pack = msg.pack
        try:
            enforced = _enforced(catalog, pack)
            fitted = replaced(catalog, pack, msg.adapters)
        except (PackError, ShadowRefused) as exc:
            out.reply(msg.reply, _refusal(exc))
            return
        previous = self.by_name.get(pack.name)
        self.by_name[pack.name] = Shadow(pack=pack, catalog=fitted, adapters=msg.adapters)
        self._index()
        out.emit(
            ShadowLoaded(
                pack=pack.ref,
                enforced=enforced.ref,
                kinds=sorted(pack.by_name),
                previous=previous.pack.hash if previous is not None else "",
                operator=msg.operator,
                reason=msg.reason,
                inbox_id=msg.inbox_id,
            )
        )
        out.reply(msg.reply, pack.ref)

    def retire(self, msg: RetireShadow, out: Outbox) -> None:
        """Stage ShadowRetired: the shadow of ``msg.name`` judges no more."""
        shadow = self._named(msg.name, msg.version, msg.reply, out)
        if shadow is None:
            return
        del self.by_name[msg.name]
        self._index()
        out.emit(
            ShadowRetired(
                pack=shadow.pack.ref,
                operator=msg.operator,
                reason=msg.reason,
                inbox_id=msg.inbox_id,
            )
        )
        out.reply(msg.reply, shadow.pack.ref)

    def promote(
        self, msg: PromoteShadow, catalog: PolicyCatalog, active: Mapping[str, PackRef], out: Outbox
    ) -> None:
        """Stage ShadowPromoted then PackLoaded: the shadow becomes the enforced version."""
        shadow = self._named(msg.name, msg.version, msg.reply, out)
        if shadow is None:
            return
        try:
            fresh = replaced(catalog, shadow.pack, shadow.adapters)
        except PackError as exc:  # the enforced catalog moved since it was loaded
            out.reply(msg.reply, _refusal(exc))
            return
        ref = shadow.pack.ref
        staged: dict[str, PackRef] = out.scratch.setdefault("packs", {})
        current = staged.get(ref.name) or active.get(ref.name)
        del self.by_name[msg.name]
        self._index()
        promoted = out.emit(
            ShadowPromoted(
                pack=ref,
                report=msg.report,
                as_of_seq=msg.as_of_seq,
                judged=msg.judged,
                differed=msg.differed,
                operator=msg.operator,
                reason=msg.reason,
                inbox_id=msg.inbox_id,
            )
        )
        catalog.adopt(fresh)
        out.emit(
            PackLoaded(
                pack=ref,
                previous=current.hash if current is not None else "",
                operator=msg.operator,
                reason=f"promoted from shadow (report {msg.report[:16]}): {msg.reason}"[:1000],
            ),
            after=promoted,
        )
        staged[ref.name] = ref
        self.refit(catalog, out)
        out.reply(msg.reply, ref)

    def refit(self, catalog: PolicyCatalog, out: Outbox) -> None:
        """Fit every shadow to the enforced catalog again (a pack was loaded or promoted).

        A shadow that no longer fits beside it (the new enforced version defines a kind
        the shadow drops) is retired by the kernel, on the record.
        """
        for name, shadow in list(self.by_name.items()):
            try:
                shadow.catalog = replaced(catalog, shadow.pack, shadow.adapters)
            except PackError as exc:
                del self.by_name[name]
                out.emit(ShadowRetired(pack=shadow.pack.ref, operator="kernel", reason=str(exc)))
        self._index()

    def _named(self, name: str, version: str, reply: Any, out: Outbox) -> Shadow | None:
        shadow = self.by_name.get(name)
        if shadow is None or (version and shadow.pack.version != version):
            what = f"{name} {version}".strip()
            out.reply(reply, ShadowRefused(ReasonCode.SHADOW_NOT_LOADED, f"no shadow {what}"))
            return None
        return shadow


def _enforced(catalog: PolicyCatalog, pack: Any) -> PolicyPack:
    """The enforced version ``pack`` would shadow.

    Raises:
        ShadowRefused: not a pack, no enforced pack of its name, or the very version in force.
    """
    if not isinstance(pack, PolicyPack):
        raise ShadowRefused(ReasonCode.SHADOW_INVALID, f"{pack!r:.200} is not a PolicyPack")
    enforced = next((p for p in catalog.packs if p.name == pack.name), None)
    if enforced is None:
        raise ShadowRefused(
            ReasonCode.SHADOW_INVALID, f"no enforced pack {pack.name} for {pack.version} to shadow"
        )
    if enforced.hash == pack.hash:
        raise ShadowRefused(
            ReasonCode.SHADOW_INVALID, f"{pack.name} {pack.version} is the version in force"
        )
    return enforced


def _refusal(exc: PackError | ShadowRefused) -> ShadowRefused:
    if isinstance(exc, ShadowRefused):
        return exc
    return ShadowRefused(ReasonCode.SHADOW_INVALID, str(exc))
