"""Soft guards flag flows NEEDS_REVIEW off the blocking path; only an emergency rule blocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel import FlowStatus, Kernel, PackError, ProposalRecord, ReasonCode, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import Event, fold, payload_of, payloads
from kernel.cli import main as dirk_main
from kernel.config import KernelConfig, Ports, Supervision
from kernel.core.events import FlowFlagged
from kernel.dim import Inputs, Judgement, judge
from kernel.policy import Guard, GuardFinding, PolicyKind, PolicyPack
from kernel.policy.packs import PolicyCatalog
from kernel.testing import ManualClock, SeededIds
from policies.trading import TRADING, PlaceOrder, direction_mismatch
from tests.support.gate_domain import agent
from tests.support.helpers import ScriptedAgent, configured
from tests.support.principals import LOCAL

NOW = 1_000


def order(
    side: str = "buy", quantity: int = 10, explain: str = ""
) -> tuple[ProposalRecord, PlaceOrder]:
    params: dict[str, Any] = {
        "symbol": "ACME",
        "side": side,
        "quantity": quantity,
        "limit_price": "100.00",
    }
    record = ProposalRecord(
        kind="trading.place_order",
        params=params,
        version="1.0",
        explain=explain,
        confidence=0.9,
        valid_until_ns=2_000,
        context_ref="ref",
    )
    return record, PlaceOrder(**params)


@pytest.mark.parametrize(
    ("side", "held", "explain", "expected"),
    [
        ("buy", 0, "", None),
        ("buy", 0, "momentum is strong, buy", None),
        ("buy", 0, "a hedge for the book", 0.75),
        ("buy", 0, "hedge, de-risk and reduce exposure", 0.99),
        ("buy", 0, "buy to hedge, de-risk and reduce exposure", 0.89),
        ("buy", -500, "buy back the short to hedge", None),  # reduces exposure: honest
        ("sell", 0, "time to accumulate and go long", 0.9),
        ("sell", 200, "de-risk: trim the position", None),
        ("sell", 0, "de-risk: trim the position", 0.9),
    ],
)
def test_direction_mismatch_scores_explanations_against_the_order(
    side: str, held: int, explain: str, expected: float | None
) -> None:
    record, params = order(side, explain=explain)
    finding = direction_mismatch(record, params, {"position.ACME": held})
    if expected is None:
        assert finding is None
    else:
        assert finding is not None and finding.confidence == pytest.approx(expected)
        assert side in finding.reason and "ACME" in finding.reason


def trading_judge(explain: str, quantity: int = 10) -> Judgement:
    record, _ = order(explain=explain, quantity=quantity)
    view = agent(capabilities=("trading.place_order",))
    state = {"market.ACME.price": "100.00"}
    snapshot = Inputs(context_ref="ref", state=state)
    return judge(record, view, PolicyCatalog([TRADING]), NOW, snapshot)


def test_only_the_emergency_threshold_blocks_in_the_gate() -> None:
    flagged_only = trading_judge("a hedge for the book")
    assert flagged_only.rejection is None and flagged_only.escalation is None
    blocked = trading_judge("hedge, de-risk and reduce exposure").rejection
    assert blocked is not None
    assert (blocked.reason_code, blocked.layer, blocked.rule, blocked.field, blocked.limit) == (
        ReasonCode.GUARD_EMERGENCY,
        "rules",
        "guard direction_mismatch",
        "explain",
        "0.95",
    )
    # The rules come first: an order over its limit reports the limit, not the guard.
    over = trading_judge("hedge, de-risk and reduce exposure", quantity=900).rejection
    assert over is not None and over.reason_code is ReasonCode.RISK_LIMIT_EXCEEDED


# --- in a kernel ------------------------------------------------------------------


class Note(PolicyKind, tag="desk.note"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "desk"

    text: str


def says_urgent(
    proposal: ProposalRecord, note: Any, state: Mapping[str, Any]
) -> GuardFinding | None:
    """Flags notes whose explanation shouts."""
    if "urgent" in proposal.explain:
        return GuardFinding(confidence=0.8, reason="the explanation says urgent")
    return None


def explodes(proposal: ProposalRecord, note: Any, state: Mapping[str, Any]) -> None:
    """A deterministic guard with a bug: it fails, and the flow is flagged."""
    if "boom" in proposal.explain:
        raise ValueError("boom")
    return None


class Oracle:
    """A simulated LLM-backed guard (the SoftGuard port): answers when told to."""

    __name__ = "oracle"

    def __init__(self, finding: GuardFinding | None = None, hang: bool = False) -> None:
        self.finding = finding
        self.hang = hang
        self.release = anyio.Event()
        self.asked = anyio.Event()

    async def __call__(
        self, proposal: ProposalRecord, params: Any, state: Mapping[str, Any]
    ) -> GuardFinding | None:
        self.asked.set()
        if self.hang:
            await anyio.sleep_forever()
        await self.release.wait()
        return self.finding


class Desk:
    async def execute(self, intent: ExecutionIntent) -> Receipt:
        return Receipt(external_id="n-1")


def pack(*guards: Guard) -> PolicyPack:
    return PolicyPack(name="notes", version="1.0.0", kinds=(Note,), guards=guards)


def writer(explain: str) -> ScriptedAgent:
    return ScriptedAgent(
        "writer",
        [lambda ctx: ctx.propose(Note(text="hi"), explain=explain, confidence=0.9)],
        capabilities=["desk.note"],
        subscriptions=["desk"],
    )


def kernel(path: Path, guards: Sequence[Guard], **kw: Any) -> AbstractAsyncContextManager[Kernel]:
    return open_kernel(
        path,
        packs=[pack(*guards)],
        adapters={"desk": Desk()},
        allow=["writer"],
        config=configured(
            KernelConfig(
                principal=LOCAL,
                ports=Ports(clock=ManualClock(), ids=SeededIds(2)),
                supervision=Supervision(inbox_poll_s=None),
            ),
            **kw,
        ),
    )


def flags_of(k: Kernel, count: int = 1) -> anyio.Event:
    """An event set once ``count`` FlowFlagged events have committed."""
    seen = anyio.Event()
    flags: list[Event] = []

    def listen(batch: Sequence[Event]) -> None:
        flags.extend(e for e in batch if e.type == "FlowFlagged")
        if len(flags) >= count:
            seen.set()

    k.journal.add_listener(listen)
    return seen


async def test_a_flag_comes_after_the_verdict_and_changes_nothing(tmp_path: Path) -> None:
    oracle = Oracle(GuardFinding(confidence=0.9, reason="the note contradicts itself"))
    guards = (Guard(Note, says_urgent, flag_above=0.5), Guard(Note, oracle, flag_above=0.6))
    async with kernel(tmp_path / "j.db", guards) as k:
        both = flags_of(k, 2)
        await k.register(writer("urgent: say hi"))
        [dfid] = await k.trigger("desk.note")
        await oracle.asked.wait()
        # The LLM guard has not answered: the flow went on without it.
        assert (await k.wait_flow(dfid)).status is FlowStatus.CLOSED
        oracle.release.set()
        await both.wait()
        flags = await k.journal.read(dfid=dfid, types=["FlowFlagged"])
        assert {(f.guard, f.confidence) for f in payloads(flags, FlowFlagged)} == {
            ("says_urgent", "0.8"),
            ("oracle", "0.9"),
        }
        [accepted] = await k.journal.read(dfid=dfid, types=["ProposalAccepted"])
        [closed] = await k.journal.read(dfid=dfid, types=["FlowClosed"])
        assert all(f.seq > accepted.seq for f in flags)
        oracle_flag = next(f for f in flags if payload_of(f, FlowFlagged).guard == "oracle")
        assert oracle_flag.seq > closed.seq
        flow = k.flow(dfid)
        assert flow is not None and flow.status is FlowStatus.CLOSED and flow.needs_review
        assert fold(await k.journal.read()).flows[dfid].needs_review


async def test_a_finding_below_its_threshold_flags_nothing(tmp_path: Path) -> None:
    # Both run in order in one message: once the second's flag is recorded, the
    # first (the same finding, a higher bar) has been judged and recorded nothing.
    guards = (Guard(Note, says_urgent, flag_above=0.9), Guard(Note, says_urgent, flag_above=0.8))
    async with kernel(tmp_path / "j.db", guards) as k:
        flagged = flags_of(k)
        await k.register(writer("urgent"))
        [dfid] = await k.trigger("desk.note")
        await k.wait_flow(dfid)
        await flagged.wait()
        assert len(await k.journal.read(dfid=dfid, types=["FlowFlagged"])) == 1


@pytest.mark.parametrize("case", ["raises", "hangs", "nonsense"])
async def test_a_guard_that_cannot_judge_flags_the_flow(tmp_path: Path, case: str) -> None:
    guards = {
        "raises": (Guard(Note, explodes),),
        "hangs": (Guard(Note, Oracle(hang=True)),),
        "nonsense": (Guard(Note, Oracle(GuardFinding(confidence=float("nan"), reason="?"))),),
    }[case]
    for g in guards:
        if isinstance(g.check, Oracle):
            g.check.release.set()
    async with kernel(tmp_path / "j.db", guards, guard_timeout_s=0.05) as k:
        flagged = flags_of(k)
        await k.register(writer("boom"))
        [dfid] = await k.trigger("desk.note")
        assert (await k.wait_flow(dfid)).status is FlowStatus.CLOSED
        await flagged.wait()
        [flag] = await k.journal.read(dfid=dfid, types=["FlowFlagged"])
        flagged_by = payload_of(flag, FlowFlagged)
        assert flagged_by.failed and "could not judge" in flagged_by.reason


async def test_dirk_shows_needs_review(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with kernel(tmp_path / "j.db", (Guard(Note, says_urgent),)) as k:
        flagged = flags_of(k)
        await k.register(writer("urgent"))
        [dfid] = await k.trigger("desk.note")
        await k.wait_flow(dfid)
        await flagged.wait()
    async with kernel(tmp_path / "j.db", ()) as k:
        await k.register(writer("calm"))
        [calm] = await k.trigger("desk.note")
        await k.wait_flow(calm)
    assert await anyio.to_thread.run_sync(dirk_main, ["flows", "--db", str(tmp_path / "j.db")]) == 0
    out = capsys.readouterr().out
    # The table shows each DFID by its short id (a unique prefix of 8 or more).
    assert "NEEDS_REVIEW" in out and calm[:8] in out
    assert await anyio.to_thread.run_sync(
        dirk_main, ["flows", "--needs-review", "--db", str(tmp_path / "j.db")]
    ) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert dfid[:8] in out and calm[:8] not in out
    assert await anyio.to_thread.run_sync(
        dirk_main, ["show", dfid, "--db", str(tmp_path / "j.db")]
    ) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "NEEDS_REVIEW by guard says_urgent (confidence 0.8)" in out
    assert "NEEDS_REVIEW (see the flags above)" in out


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        (Guard(Note, Oracle(), emergency_above=0.95), "must be a pure function"),
        (Guard(Note, says_urgent, flag_above=1.5), "flag_above must lie in"),
        (Guard(Note, says_urgent, flag_above=0.9, emergency_above=0.5), "emergency_above"),
        (Guard(PlaceOrder, says_urgent), "not a kind of this pack"),
        ("not a guard", "is not a Guard"),
    ],
)
def test_a_badly_declared_guard_is_refused(guard: Guard, message: str) -> None:
    with pytest.raises(PackError, match=message):
        PolicyCatalog([pack(guard)])


def test_guards_change_the_hash_and_a_pack_without_guards_keeps_its_own() -> None:
    assert pack().hash != pack(Guard(Note, says_urgent)).hash
    assert pack(Guard(Note, says_urgent)).hash != pack(Guard(Note, says_urgent, 0.6)).hash


def bad_emergency(
    proposal: ProposalRecord, note: Any, state: Mapping[str, Any]
) -> GuardFinding | None:
    """An emergency rule with a bug."""
    if proposal.explain == "raise":
        raise RuntimeError("bug")
    return GuardFinding(confidence=2.0, reason="nonsense") if proposal.explain == "junk" else None


@pytest.mark.parametrize("explain", ["raise", "junk"])
def test_an_emergency_rule_that_cannot_judge_rejects_with_kernel_fault(explain: str) -> None:
    catalog = PolicyCatalog([pack(Guard(Note, bad_emergency, emergency_above=0.95))])
    record = ProposalRecord(
        kind="desk.note",
        params={"text": "hi"},
        explain=explain,
        valid_until_ns=2_000,
        context_ref="ref",
    )
    memory_calls: list[ProposalRecord] = []
    judgement = judge(
        record,
        agent(capabilities=("desk.note",)),
        catalog,
        NOW,
        Inputs(context_ref="ref"),
        memory=lambda p, v: memory_calls.append(p),
    )
    feedback = judgement.rejection
    assert feedback is not None and feedback.reason_code is ReasonCode.KERNEL_FAULT
    assert (feedback.layer, feedback.rule) == ("rules", "guard bad_emergency")
    assert memory_calls == []  # the memory layer comes after


@given(
    explain=st.lists(
        st.sampled_from(["buy", "sell", "hedge", "de-risk", "trim", "go long", "ok", "exit"]),
        max_size=6,
    ).map(" ".join),
    side=st.sampled_from(["buy", "sell"]),
    held=st.integers(-50, 50),
)
def test_the_trading_pack_with_its_guard_gives_the_same_verdict_twice(
    explain: str, side: str, held: int
) -> None:
    record, _ = order(side, explain=explain)
    view = agent(capabilities=("trading.place_order",))
    state = {"market.ACME.price": "100.00", "position.ACME": held}
    catalog = PolicyCatalog([TRADING])
    first = judge(record, view, catalog, NOW, Inputs(context_ref="ref", state=state))
    again = judge(record, view, catalog, NOW, Inputs(context_ref="ref", state=dict(state)))
    assert first == again
    finding = direction_mismatch(record, PlaceOrder(**record.params), state)
    blocked = finding is not None and finding.confidence >= 0.95
    assert (first.rejection is not None) == blocked
