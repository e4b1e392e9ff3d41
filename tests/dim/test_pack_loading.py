"""Loading a pack version at runtime: an event, judged with from then on, refused when invalid."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kernel import FlowStatus, InputInvalid, Kernel, PackError, ReasonCode, open_kernel
from kernel.audit import Event, fold, payload_of, payloads, state_at
from kernel.config import KernelConfig, Ports, Supervision
from kernel.core.events import (
    ApprovalSuperseded,
    FlowEscalated,
    InputRefused,
    KernelStarted,
    PackLoaded,
    ProposalAccepted,
    ProposalRejected,
)
from kernel.policy import LimitSpec, PolicyKind, PolicyPack
from kernel.policy.packs import PolicyCatalog
from kernel.policy.rules import ALLOW, RuleVerdict, View, rule
from kernel.testing import ManualClock, SeededIds, action_of
from tests.dim.test_amendments import PACK, Desk, Order, trader, verdict
from tests.support.helpers import ScriptedAgent, configured
from tests.support.principals import LOCAL

V2 = dataclasses.replace(
    PACK,
    version="1.1.0",
    limits={**PACK.limits, "max_qty": LimitSpec(default=3, floor=1, ceiling=10)},
)


class Other(PolicyKind, tag="desk.other"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "desk"

    note: str


@rule(Order, fields=("ghost",))
def reads_a_ghost(view: View) -> RuleVerdict:
    return ALLOW


def pack_of(verdict: Event) -> str:
    """The pack hash a verdict (an acceptance or a rejection) was judged under."""
    payload = verdict.payload
    assert isinstance(payload, ProposalAccepted | ProposalRejected), verdict.type
    return payload.pack


def kernel(path: Path, **kw: Any) -> AbstractAsyncContextManager[Kernel]:
    return open_kernel(
        path,
        packs=[PACK],
        adapters={"desk": Desk()},
        allow=["trader"],
        config=configured(
            KernelConfig(
                principal=LOCAL,
                ports=Ports(clock=ManualClock(), ids=SeededIds(5)),
                supervision=Supervision(inbox_poll_s=None),
            ),
            **kw,
        ),
    )


async def test_a_new_version_is_recorded_and_judges_what_comes_after(tmp_path: Path) -> None:
    async with kernel(tmp_path / "j.db") as k:
        await k.register(trader(qty=4))
        [started] = await k.journal.read(types=["KernelStarted"])
        assert [p.hash for p in payload_of(started, KernelStarted).packs] == [PACK.hash]
        assert await verdict(k) == (FlowStatus.CLOSED, None)

        ref = await k.load_pack(V2, operator="ana", reason="tighter")
        assert (ref.name, ref.version, ref.hash) == ("desk", "1.1.0", V2.hash)
        [loaded] = payloads(await k.journal.read(types=["PackLoaded"]), PackLoaded)
        assert loaded.pack == V2.ref and loaded.previous == PACK.hash
        assert loaded.operator == "ana"
        assert k.projections.packs["desk"] == V2.ref

        assert await verdict(k) == (FlowStatus.ABORTED, ReasonCode.RISK_LIMIT_EXCEEDED)
        verdicts = await k.journal.read(types=["ProposalAccepted", "ProposalRejected"])
        assert [pack_of(v) for v in verdicts] == [PACK.hash, V2.hash]
        # Loading the version in force changes nothing and records nothing.
        assert await k.load_pack(V2, operator="ana", reason="again") == V2.ref
        assert len(await k.journal.read(types=["PackLoaded"])) == 1

        # What a re-judge needs: the projection at each proposal's seq names the pack
        # hash its verdict recorded.
        for v in verdicts:
            [submitted] = await k.journal.read(dfid=v.dfid, types=["ProposalSubmitted"])
            at = await state_at(k.journal, submitted.seq)
            assert at.packs["desk"].hash == pack_of(v)
        assert fold(await k.journal.read()).digest() == k.projections.digest()

    # A restart judges with the packs it is opened with, and says so.
    async with kernel(tmp_path / "j.db") as k:
        assert k.projections.packs["desk"] == PACK.ref


async def test_an_approval_under_one_version_is_judged_again_under_the_next(tmp_path: Path) -> None:
    async with kernel(tmp_path / "j.db") as k:
        unsure = ScriptedAgent(
            "trader",
            [lambda ctx: ctx.propose(Order(qty=4), confidence=0.1)],
            capabilities=["desk.order"],
            subscriptions=["desk.tick"],
        )
        await k.register(unsure)
        [dfid] = await k.trigger("desk.tick")
        assert (await k.wait_flow(dfid)).status is FlowStatus.ESCALATED
        await k.load_pack(V2, operator="ana", reason="v2")
        [escalated] = await k.journal.read(dfid=dfid, types=["FlowEscalated"])
        assert payload_of(escalated, FlowEscalated).pack == PACK.hash
        verdict = await k.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=action_of(k, dfid)
        )
        # V2 caps the quantity below 4: approved under PACK, refused before it executes.
        assert verdict.reason_code is ReasonCode.APPROVAL_SUPERSEDED
        flow = await k.wait_flow(dfid)
        assert (flow.status, flow.reason_code) == (
            FlowStatus.ABORTED,
            ReasonCode.APPROVAL_SUPERSEDED,
        )
        [superseded] = await k.journal.read(dfid=dfid, types=["ApprovalSuperseded"])
        assert isinstance(superseded.payload, ApprovalSuperseded)
        assert superseded.payload.approved == PACK.ref
        assert superseded.payload.current == V2.ref
        assert superseded.payload.reason_code is ReasonCode.RISK_LIMIT_EXCEEDED
        assert await k.journal.read(dfid=dfid, types=["ExecutionStarted"]) == []


@pytest.mark.parametrize(
    "bad",
    [
        dataclasses.replace(PACK, version="2.0.0", rules=(reads_a_ghost,)),
        dataclasses.replace(PACK, version="2.0.0", kinds=(Order, Order)),
        dataclasses.replace(PACK, version=""),
        dataclasses.replace(
            PACK,
            version="2.0.0",
            limits={"max_qty": LimitSpec(default=30, floor=1, ceiling=10)},
        ),
    ],
    ids=["missing-field", "duplicate-kind", "no-version", "limit-bounds"],
)
async def test_an_invalid_pack_is_refused_as_at_start_and_nothing_changes(
    tmp_path: Path, bad: PolicyPack
) -> None:
    with pytest.raises(PackError) as at_start:
        PolicyCatalog([bad])
    async with kernel(tmp_path / "j.db") as k:
        await k.register(trader(qty=4))
        with pytest.raises(PackError) as at_runtime:
            await k.load_pack(bad, operator="ana", reason="bad")
        assert str(at_runtime.value) == str(at_start.value)
        assert await k.journal.read(types=["PackLoaded"]) == []
        assert k.catalog.pack_of["desk.order"] is PACK
        assert await verdict(k) == (FlowStatus.CLOSED, None)


async def test_a_version_may_add_kinds_but_not_drop_them_nor_need_a_missing_adapter(
    tmp_path: Path,
) -> None:
    class Elsewhere(PolicyKind, tag="desk.elsewhere"):
        version: ClassVar[str] = "1.0"
        adapter: ClassVar[str] = "nowhere"

        note: str

    async with kernel(tmp_path / "j.db") as k:
        dropped = dataclasses.replace(PACK, version="2.0.0", kinds=(Other,), rules=())
        with pytest.raises(PackError, match="drops policy kind"):
            await k.load_pack(dropped, operator="ana", reason="drop")
        with pytest.raises(PackError, match="no adapter registered for nowhere"):
            await k.load_pack(
                dataclasses.replace(PACK, version="2.0.0", kinds=(Order, Elsewhere)),
                operator="ana",
                reason="swap",
            )
        grown = dataclasses.replace(PACK, version="2.0.0", kinds=(Order, Other))
        await k.load_pack(grown, operator="ana", reason="grow")
        assert "desk.other" in k.catalog.kinds and "desk.other" in k.catalog.schemas
        # A new pack altogether is loaded beside the others.
        extra = PolicyPack(name="extra", version="1.0.0", kinds=())
        ref = await k.load_pack(extra, operator="ana", reason="extra")
        [_, added] = payloads(await k.journal.read(types=["PackLoaded"]), PackLoaded)
        assert added.pack == ref and added.previous == ""
        assert set(k.projections.packs) == {"desk", "extra"}


@pytest.mark.parametrize(("operator", "reason"), [("", "tighter"), ("ana", "  "), (None, "x")])
async def test_loading_a_pack_is_an_operator_act_that_names_who_and_why(
    tmp_path: Path, operator: str | None, reason: str
) -> None:
    async with kernel(tmp_path / "j.db") as k:
        with pytest.raises(InputInvalid):
            # None among the operators: refused, as typed callers cannot send it.
            await k.load_pack(V2, operator=operator, reason=reason)  # type: ignore[arg-type]
        assert await k.journal.read(types=["PackLoaded"]) == []
        [refused] = payloads(await k.journal.read(types=["InputRefused"]), InputRefused)
        assert refused.entry == "load_pack" and refused.target == "desk"
        assert k.projections.packs["desk"] == PACK.ref
