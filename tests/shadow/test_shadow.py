"""Shadow packs: a candidate judged live beside the enforced pack, its report, its promotion."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agents_sdk import Proposal, WorkingContext
from kernel import Clock, FlowStatus, Kernel, open_kernel
from kernel.audit import fold
from kernel.audit.shadow import ShadowReport, digest, history_report, live_report, shadows_of
from kernel.config import KernelConfig, Ports
from kernel.core.events import (
    FlowEscalated,
    PackLoaded,
    ProposalAccepted,
    ProposalRejected,
    ShadowDiffered,
    ShadowPromoted,
    ShadowRetired,
)
from kernel.core.reasons import ReasonCode
from kernel.dim import ShadowRefused
from kernel.memory import MEMORY_PACK
from kernel.policy import LimitSpec, PolicyKind, Threshold
from kernel.state.shadows import Shadows
from kernel.state.snapshots import capture, decode_snapshot, encode_snapshot
from kernel.testing import ManualClock, SeededIds
from tests.dim.test_amendments import PACK, Desk, Order
from tests.support.helpers import ScriptedAgent, configured
from tests.support.principals import LOCAL

CANDIDATE = dataclasses.replace(
    PACK,
    version="1.1.0",
    limits={**PACK.limits, "max_qty": LimitSpec(default=3, floor=1, ceiling=10)},
    thresholds=(Threshold(Order, amount=lambda o: o.qty, above=2),),
)
"""Tighter: at most 3 (the enforced pack allows 5), and above 2 a human decides."""

QTYS = (1, 4, 2, 8, 3, 5, 1, 6)


class Note(PolicyKind, tag="desk.note"):
    """A second kind a later enforced version adds (the candidate does not define it)."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "desk"

    text: str


def trader(qtys: Sequence[int] = QTYS) -> ScriptedAgent:
    """Proposes the next quantity of ``qtys`` in each flow it is handed."""
    played: list[int] = []

    def step(ctx: WorkingContext) -> Proposal:
        qty = qtys[len(played) % len(qtys)]
        played.append(qty)
        return ctx.propose(Order(qty=qty), confidence=0.9)

    return ScriptedAgent(
        "trader",
        [step],
        capabilities=["desk.order"],
        subscriptions=["desk.tick"],
        max_attempts=1,
    )


def kernel(
    path: Path, seed: int = 5, *, clock: Clock | None = None, poll_s: float | None = None
) -> AbstractAsyncContextManager[Kernel]:
    ports = Ports(clock=clock or ManualClock(), ids=SeededIds(seed))
    return open_kernel(
        path,
        packs=[PACK],
        adapters={"desk": Desk()},
        allow=["trader"],
        config=configured(KernelConfig(principal=LOCAL, ports=ports), inbox_poll_s=poll_s),
    )


async def run_flows(k: Kernel, n: int) -> list[str]:
    dfids = []
    for _ in range(n):
        [dfid] = await k.trigger("desk.tick")
        await k.wait_flow(dfid)
        dfids.append(dfid)
    return dfids


def enforced(events: Sequence[Any]) -> list[tuple[str, str]]:
    """Each flow's enforced verdict: (type, reason)."""
    out = []
    for e in events:
        p = e.payload
        if isinstance(p, ProposalAccepted):
            out.append(("accepted", ""))
        elif isinstance(p, ProposalRejected):
            out.append(("rejected", str(p.feedback.reason_code)))
        elif isinstance(p, FlowEscalated):
            out.append(("escalated", str(p.reason_code)))
    return out


VERDICTS = ["ProposalAccepted", "ProposalRejected", "FlowEscalated"]


async def test_live_differences_equal_the_replay_and_enforced_verdicts_do_not_move(
    tmp_path: Path,
) -> None:
    async with kernel(tmp_path / "plain.db") as k:
        await k.register(trader())
        await run_flows(k, 2 * len(QTYS))
        plain = enforced(await k.journal.read(types=VERDICTS))
        plain_journal = await k.journal.read()

    async with kernel(tmp_path / "j.db") as k:
        await k.register(trader())
        ref = await k.load_shadow(CANDIDATE, operator="ana", reason="try the tighter limit")
        assert (ref.version, ref.hash) == ("1.1.0", CANDIDATE.hash)
        [count] = k.projections.domain(Shadows).judging()
        await run_flows(k, 2 * len(QTYS))
        shadowed = enforced(await k.journal.read(types=VERDICTS))
        differed = await k.journal.read(types=["ShadowDiffered"])
        live = await live_report(k.journal)
        history = await history_report(
            k.journal, [CANDIDATE], [PACK, MEMORY_PACK], start=count.loaded, stop=live.stop
        )
        shadowed_journal = await k.journal.read()
        # The live projections (the shadows' counters included) are the fold of the record.
        assert fold(shadowed_journal).digest() == k.projections.digest()
        [counted] = k.projections.domain(Shadows).judging()
        assert counted.differed == len(differed) and sum(counted.by_reason.values()) == len(
            differed
        )

    # The shadow never changes an enforced outcome: apart from its own events, the journal
    # is the one the same run without it records, event for event.
    def unshadowed(events: Sequence[Any]) -> list[tuple[str, str | None, Any]]:
        return [(e.type, e.dfid, e.payload) for e in events if not e.type.startswith("Shadow")]

    assert unshadowed(shadowed_journal) == unshadowed(plain_journal)
    # The shadow never changes an enforced outcome.
    assert shadowed == plain
    # 4, 5, 6 accepted then (<= 5) or refused alike; 3 escalates now; 4/5 refused now.
    assert live.differed == len(differed) > 0
    assert live.judged == 2 * len(QTYS)
    assert live.differences == history.differences
    assert digest(live) == digest(history)
    assert {d.kind for d in live.differences} == {"desk.order"}
    assert set(live.by_reason) >= {str(ReasonCode.RISK_LIMIT_EXCEEDED)}
    assert live.by_principal == {f"{LOCAL.tenant}/{LOCAL.user}": live.differed}
    for event in differed:
        payload = event.payload
        assert isinstance(payload, ShadowDiffered)
        assert payload.shadow == CANDIDATE.hash and event.dfid


async def test_promotion_records_the_report_digest_and_enforces_the_shadow(tmp_path: Path) -> None:
    async with kernel(tmp_path / "j.db") as k:
        await k.register(trader([4]))
        await k.load_shadow(CANDIDATE, operator="ana", reason="try it")
        await run_flows(k, 3)
        reviewed = await live_report(k.journal)
        assert reviewed.differed == 3
        with pytest.raises(ShadowRefused) as stale:
            await k.promote_shadow("desk", operator="ana", reason="go", report="0" * 64)
        assert stale.value.code is ReasonCode.SHADOW_REPORT_CHANGED
        ref = await k.promote_shadow("desk", operator="ana", reason="go", report=digest(reviewed))
        assert ref == CANDIDATE.ref
        [promoted] = await k.journal.read(types=["ShadowPromoted"])
        p = promoted.payload
        assert isinstance(p, ShadowPromoted)
        assert (p.report, p.as_of_seq, p.differed) == (digest(reviewed), reviewed.stop, 3)
        [loaded] = await k.journal.read(types=["PackLoaded"])
        assert isinstance(loaded.payload, PackLoaded) and loaded.payload.pack == CANDIDATE.ref
        assert loaded.seq == promoted.seq + 1 and loaded.caused_by == promoted.seq
        assert k.projections.packs["desk"] == CANDIDATE.ref
        assert k.projections.domain(Shadows).judging() == []
        # Anyone holding the journal computes the same report through the recorded seq.
        again = await live_report(k.journal, stop=p.as_of_seq)
        assert digest(again) == p.report
        # Enforced now: 4 is above the candidate's max_qty; no shadow records anything.
        [dfid] = await run_flows(k, 1)
        assert (await k.wait_flow(dfid)).status is FlowStatus.ABORTED
        assert len(await k.journal.read(types=["ShadowDiffered"])) == 3


async def test_refused_shadow_acts_name_a_reason_and_change_nothing(tmp_path: Path) -> None:
    other = dataclasses.replace(CANDIDATE, name="elsewhere")
    async with kernel(tmp_path / "j.db") as k:
        for bad, code in (
            (PACK, ReasonCode.SHADOW_INVALID),  # the version in force
            (other, ReasonCode.SHADOW_INVALID),  # shadows no enforced pack
            ("not a pack", ReasonCode.SHADOW_INVALID),
        ):
            with pytest.raises(ShadowRefused) as refused:
                await k.load_shadow(bad, operator="ana", reason="x")  # type: ignore[arg-type]
            assert refused.value.code is code
        for act in (k.retire_shadow, k.promote_shadow):
            with pytest.raises(ShadowRefused) as refused:
                await act("desk", operator="ana", reason="x")
            assert refused.value.code is ReasonCode.SHADOW_NOT_LOADED
        assert not await k.journal.read(types=["ShadowLoaded", "ShadowRetired", "PackLoaded"])


async def test_retired_and_restarted_shadows_judge_no_more(tmp_path: Path) -> None:
    async with kernel(tmp_path / "j.db") as k:
        await k.register(trader([4]))
        await k.load_shadow(CANDIDATE, operator="ana", reason="try")
        await run_flows(k, 1)
        await k.retire_shadow("desk", operator="ana", reason="enough", version="1.1.0")
        await run_flows(k, 1)
        assert len(await k.journal.read(types=["ShadowDiffered"])) == 1
        await k.load_shadow(CANDIDATE, operator="ana", reason="again")
    async with kernel(tmp_path / "j.db", seed=6) as k:
        await k.register(trader([4]))
        await run_flows(k, 1)
        found = await shadows_of(k.journal)
        assert [s.how for s in found] == ["retired", "restarted"]
        assert len(await k.journal.read(types=["ShadowDiffered"])) == 1
        report: ShadowReport = await live_report(k.journal, shadow=found[0].loaded)
        assert report.ended == "retired" and report.differed == 1


async def test_one_call_proposals_are_shadowed_and_their_report_is_the_replays(
    tmp_path: Path,
) -> None:
    async with kernel(tmp_path / "j.db") as k:
        await k.register(trader([1]))
        [count] = [await k.load_shadow(CANDIDATE, operator="ana", reason="try")]
        verdicts = [
            (await k.propose("trader", "desk.order", {"qty": qty}, explain="x", confidence=0.9))
            for qty in (1, 4, 9, 3)
        ]
        assert [str(v.verdict) for v in verdicts] == ["EXECUTED", "EXECUTED", "REFUSED", "EXECUTED"]
        [loaded] = k.projections.domain(Shadows).judging()
        live = await live_report(k.journal)
        history = await history_report(
            k.journal, [CANDIDATE], [PACK, MEMORY_PACK], start=loaded.loaded, stop=live.stop
        )
        assert count == CANDIDATE.ref
    # 4: refused now; 9: refused then and now, for the same reason; 3: escalated now.
    assert [d.now.split(":")[0] for d in live.differences] == [
        "would have been rejected",
        "would have been escalated",
    ]
    assert live.differences == history.differences and digest(live) == digest(history)


async def test_a_shadow_follows_the_enforced_pack_and_is_retired_when_it_no_longer_fits(
    tmp_path: Path,
) -> None:
    wider = dataclasses.replace(PACK, version="1.0.1", kinds=(Order, Note))
    async with kernel(tmp_path / "j.db") as k:
        await k.register(trader([4]))
        await k.load_shadow(CANDIDATE, operator="ana", reason="try")
        # A new enforced version the candidate still fits beside: it keeps judging.
        tighter = dataclasses.replace(PACK, version="1.0.2", escalate_below_confidence=0.1)
        await k.load_pack(tighter, operator="ana", reason="v1.0.2")
        await run_flows(k, 1)
        assert len(await k.journal.read(types=["ShadowDiffered"])) == 1
        # One that defines a kind the candidate drops: the kernel retires it, on record.
        await k.load_pack(wider, operator="ana", reason="notes too")
        [retired] = await k.journal.read(types=["ShadowRetired"])
        assert isinstance(retired.payload, ShadowRetired)
        assert retired.payload.operator == "kernel" and "drops" in retired.payload.reason
        await run_flows(k, 1)
        assert len(await k.journal.read(types=["ShadowDiffered"])) == 1
        assert k.projections.domain(Shadows).judging() == []


async def test_the_shadows_state_survives_a_snapshot_and_folds_on_from_it(tmp_path: Path) -> None:
    async with kernel(tmp_path / "j.db") as k:
        await k.register(trader([4]))
        await k.load_shadow(CANDIDATE, operator="ana", reason="try")
        await run_flows(k, 2)
        captured = capture(k.projections)
        digest_then = k.projections.digest()
        head = k.journal.head_seq
        await run_flows(k, 1)  # later folds leave the captured copy alone
        later = await k.journal.read(start=head + 1)
        now = k.projections.digest()
    restored = decode_snapshot(encode_snapshot(captured)[1])
    assert restored is not None and restored.digest() == digest_then
    [count] = restored.domain(Shadows).judging()
    assert count.differed == 2 and count.by_agent == {"trader": 2}
    # Folding the rest of the journal on top of the snapshot gives the live state.
    restored.apply(later)
    assert restored.digest() == now
