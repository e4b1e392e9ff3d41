"""Malformed, oversized and wrongly typed proposals: refused clearly, nothing crashes or stalls."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agents_sdk import Manifest, Proposal, WorkingContext
from kernel import (
    AmendmentInvalid,
    FlowStatus,
    HandshakeRefused,
    InputInvalid,
    Kernel,
    Outcome,
    ReasonCode,
    Verdict,
)
from kernel.audit import open_journal, payload_of, payloads, verify_journal
from kernel.core import events as ev
from kernel.core.events import Draft, canonical
from kernel.journal.codec import unpack
from kernel.journal.store import EventUnreadable
from kernel.registry import check_version
from kernel.testing import ManualClock, Step, action_of
from tests.support.helpers import ScriptedAgent, flow_of, kernel_for, transfer

GOOD = {"kind": "test.transfer", "account": "acc-1", "amount_cents": 10}


def wire(policy: dict[str, Any], **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": policy.get("kind", ""),
        "params": {k: v for k, v in policy.items() if k != "kind"},
        "confidence": 0.9,
        "valid_until_ns": 2**62,
    }
    base.update(fields)
    return base


Make = Callable[[str], object]
"""What an agent submits, made from its context's ref: anything at all, a proposal or not."""

CASES: list[tuple[str, Make, str]] = [
    # (name, what the agent submits, expected field)
    (
        "wrong type",
        lambda ref: Proposal(
            policy={**GOOD, "amount_cents": "ten"}, valid_until_ns=2**62, context_ref=ref
        ),
        "params.amount_cents",
    ),
    (
        "unknown kind",
        lambda ref: Proposal(
            policy={**GOOD, "kind": "bank.drain"}, valid_until_ns=2**62, context_ref=ref
        ),
        "kind",
    ),
    (
        "unknown field",
        lambda ref: Proposal(policy={**GOOD, "memo": "x"}, valid_until_ns=2**62, context_ref=ref),
        "params.memo",
    ),
    (
        "missing field",
        lambda ref: Proposal(
            policy={"kind": "test.transfer", "account": "a"}, valid_until_ns=2**62, context_ref=ref
        ),
        "params.amount_cents",
    ),
    (
        "float money",
        lambda ref: Proposal(
            policy={**GOOD, "amount_cents": 10.5}, valid_until_ns=2**62, context_ref=ref
        ),
        "params.amount_cents",
    ),
    (
        "confidence as text",
        lambda ref: Proposal(
            policy=GOOD,
            confidence="high",  # type: ignore[arg-type]
            valid_until_ns=2**62,
            context_ref=ref,
        ),
        "confidence",
    ),
    (
        "confidence out of range",
        lambda ref: Proposal(policy=GOOD, confidence=7.0, valid_until_ns=2**62, context_ref=ref),
        "confidence",
    ),
    ("no validity window", lambda ref: Proposal(policy=GOOD, context_ref=ref), "valid_until_ns"),
    ("policy of no shape", lambda ref: Proposal(policy=42, context_ref=ref), "policy"),
    (
        "oversized",
        lambda ref: Proposal(
            policy=GOOD, explain="x" * 200_000, valid_until_ns=2**62, context_ref=ref
        ),
        "$",
    ),
    ("not json", lambda ref: b"{not json", "$"),
    ("json of the wrong shape", lambda ref: b'["kind", 1]', "$"),
    (
        "wire form, wrong params type",
        lambda ref: wire(GOOD, params=[1, 2], context_ref=ref),
        "params",
    ),
    (
        "wire form, nested garbage",
        lambda ref: wire({**GOOD, "amount_cents": {"$gt": 0}}, context_ref=ref),
        "params.amount_cents",
    ),
    ("not a proposal at all", lambda ref: object(), "$"),
]


async def submit_anything(kernel: Kernel, token: str, dfid: str, body: object) -> Verdict:
    """Submit what an agent may send, typed or not: the wall takes anything and judges it."""
    return await kernel.submit(token, dfid, body)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "make", "field"), CASES, ids=[c[0] for c in CASES])
async def test_bad_proposals_get_schema_invalid_naming_the_field(
    tmp_path: Path, name: str, make: Make, field: str
) -> None:
    hold = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(hold=hold, max_attempts=5)
        session = await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()

        made = make(agent.contexts[0].context_ref)
        verdict = await submit_anything(kernel, session.token, dfid, made)
        assert verdict.outcome is Outcome.REJECTED, verdict
        assert verdict.reason_code is ReasonCode.SCHEMA_INVALID
        assert verdict.feedback is not None and verdict.feedback.field == field

        # The kernel is unharmed: the agent's own proposal on the next attempt goes through.
        hold.set()
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED
        assert kernel.journal.statistics().events > 0
        submitted = await kernel.journal.read(dfid=dfid, types=["ProposalSubmitted"])
        body_sizes = [len(p.proposal.explain) for p in payloads(submitted, ev.ProposalSubmitted)]
        assert max(body_sizes) < 100_000


async def test_a_burst_of_garbage_does_not_stall_the_kernel(tmp_path: Path) -> None:
    hold = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(hold=hold, max_attempts=1000, steps=[transfer()])
        session = await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()
        async with anyio.create_task_group() as tg:
            for i in range(200):
                body = CASES[i % len(CASES)][1]("")
                tg.start_soon(submit_anything, kernel, session.token, dfid, body)
        hold.set()
        with anyio.fail_after(30):
            await kernel.wait_quiet()
        assert flow_of(kernel, dfid).status is FlowStatus.CLOSED


# --- issue 12: nothing that enters can poison the journal ---------------------------
#
# Each reproduction below stopped the kernel on the main branch before the wall, and
# several left a journal that would never open again. Now each is refused with a reason
# code, the kernel keeps running, and the journal opens again and verifies.


async def sound(path: Path, kernel: Kernel | None = None) -> None:
    """The kernel (if given) still runs; the journal opens again and verifies from genesis."""
    if kernel is not None:
        assert kernel.stopped is None
        return
    report = await verify_journal(path)
    assert report.ok, report
    async with kernel_for(path, inbox_poll_s=None) as again:
        assert again.stopped is None


async def first_rejection(kernel: Kernel, dfid: str) -> ev.Feedback:
    [rejected, *_] = await kernel.journal.read(dfid=dfid, types=["ProposalRejected"])
    return payload_of(rejected, ev.ProposalRejected).feedback


@pytest.mark.parametrize(
    ("step", "field"),
    [
        (transfer(amount=2**64), "params.amount_cents"),
        (transfer(amount=-(2**63) - 1), "params.amount_cents"),
        (transfer(valid_for_s=1e12), "valid_until_ns"),
        (transfer(confidence=float("nan")), "confidence"),
        (transfer(confidence=float("inf")), "confidence"),
        (
            lambda ctx: ctx.propose({"kind": "test.transfer", "account": [1.5e308 * 10]}),
            "params.account[0]",
        ),
    ],
    ids=["int over 64 bits", "int under 64 bits", "valid_for_s 1e12", "nan", "inf", "inf inside"],
)
async def test_a_value_json_or_msgpack_cannot_keep_is_schema_invalid(
    tmp_path: Path, step: Step, field: str
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent(steps=[step, transfer()]))
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED  # the agent's second attempt went through
        feedback = await first_rejection(kernel, dfid)
        assert feedback.reason_code is ReasonCode.SCHEMA_INVALID
        assert feedback.field == field
        await sound(path, kernel)
    await sound(path)


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


async def test_values_nested_past_any_recursion_limit_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    deep = nested(100_000)
    steps = [lambda ctx: ctx.propose({"kind": "test.transfer", "account": deep}), transfer()]
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent(steps=steps))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        feedback = await first_rejection(kernel, dfid)
        assert feedback.reason_code is ReasonCode.SCHEMA_INVALID
        for facts in ({"bank.deep": deep}, {"bank.deep": nested(40)}):
            with pytest.raises(InputInvalid):
                await kernel.trigger("bank.invoice", facts)
        with pytest.raises(InputInvalid):
            await kernel.trigger("bank.invoice", {f"bank.{i}": i for i in range(20_000)})
        await sound(path, kernel)
    await sound(path)


async def test_a_trigger_fact_outside_64_bits_is_refused_and_the_kernel_goes_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent())
        cases: list[tuple[dict[str, Any], str]] = [
            ({"bank.balance": 2**64}, "facts.bank.balance"),
            ({"bank.rate": float("nan")}, "facts.bank.rate"),
            ({"bank.nested": [[[{"x": float("-inf")}]]]}, "facts.bank.nested[0][0][0].x"),
        ]
        for facts, field in cases:
            with pytest.raises(InputInvalid) as caught:
                await kernel.trigger("bank.invoice", facts)
            assert caught.value.reason_code is ReasonCode.SCHEMA_INVALID
            assert caught.value.field == field
        with pytest.raises(InputInvalid):
            await kernel.trigger(None)  # type: ignore[arg-type]
        [dfid] = await kernel.trigger("bank.invoice", {"bank.balance": 2**63 - 1})
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        await sound(path, kernel)
    await sound(path)


@pytest.mark.parametrize(
    ("ttl", "value"),
    [(1e30, 8), (float("inf"), 8), (float("nan"), 8), (3600, 2**64), (3600, "1e999999")],
)
async def test_an_amendment_out_of_range_is_refused_and_recorded(
    tmp_path: Path, ttl: float, value: int | str
) -> None:
    from tests.dim.test_amendments import kernel as desk_kernel
    from tests.dim.test_amendments import trader

    path = tmp_path / "j.db"
    async with desk_kernel(path, ManualClock()) as kernel:
        await kernel.register(trader())
        with pytest.raises(AmendmentInvalid) as caught:
            await kernel.amend_limit(
                "trader", "max_qty", value, ttl_s=ttl, operator="a", reason="r"
            )
        assert caught.value.reason_code is ReasonCode.SCHEMA_INVALID
        [refused] = await kernel.journal.read(types=["AmendmentRefused"])
        assert payload_of(refused, ev.AmendmentRefused).reason_code is ReasonCode.SCHEMA_INVALID
        assert kernel.projections.amendments == {}
        await sound(path, kernel)
    assert (await verify_journal(path)).ok


@pytest.mark.parametrize(
    "manifest",
    [
        Manifest(agent_id="clerk", version="1.0", subscriptions=None),  # type: ignore[arg-type]
        Manifest(agent_id="clerk", version="1.0", capabilities=None),  # type: ignore[arg-type]
        Manifest(agent_id="clerk", version="1.0", limits={"max": float("nan")}),
        Manifest(agent_id="clerk", version="1.0", max_attempts=2**64),
        Manifest(agent_id=None, version="1.0"),  # type: ignore[arg-type]
        Manifest(agent_id="clerk", version=1.0),  # type: ignore[arg-type]
    ],
    ids=["subscriptions None", "capabilities None", "nan limit", "huge attempts", "no id", "float"],
)
async def test_a_wrongly_typed_manifest_is_refused_every_time_never_stopping_the_kernel(
    tmp_path: Path, manifest: Manifest
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        for _ in range(3):  # twice within 5 s used to stop the kernel (restart intensity)
            with pytest.raises(HandshakeRefused) as caught:
                await kernel.handshake(manifest)
            assert caught.value.reason_code is ReasonCode.SCHEMA_INVALID
        refused = await kernel.journal.read(types=["AgentRefused"])
        codes = [p.reason_code for p in payloads(refused, ev.AgentRefused)]
        assert codes == [ReasonCode.SCHEMA_INVALID] * 3
        await kernel.register(ScriptedAgent())  # the registry is unharmed
        await sound(path, kernel)
    await sound(path)


@pytest.mark.parametrize(
    "version", ["\uff11.\uff10", "1.0\n", "01.0", "1.0 ", "v1.0", "1", "1.\uff10"]
)
async def test_the_version_check_is_a_real_semver_parser(tmp_path: Path, version: str) -> None:
    assert check_version(version) is not None
    async with kernel_for(tmp_path / "j.db") as kernel:
        with pytest.raises(HandshakeRefused) as caught:
            await kernel.register(ScriptedAgent(version=version))
        # A control character (the newline) is refused at the wall, before the parser.
        expected = ReasonCode.SCHEMA_INVALID if "\n" in version else ReasonCode.VERSION_MISMATCH
        assert caught.value.reason_code is expected
    for good in ("1.0", "1.2", "1.0.0", "1.1.7-rc.1+build.5"):
        assert check_version(good) is None


async def test_a_5_mb_agent_id_is_refused_with_a_small_record_that_says_it_was_cut(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path, allow=["clerk"]) as kernel:
        with pytest.raises(HandshakeRefused) as caught:
            await kernel.handshake(Manifest(agent_id="a" * 5_000_000, version="1.0"))
        assert caught.value.reason_code is ReasonCode.SCHEMA_INVALID
        assert "cut to 256" in caught.value.detail
        [refused] = await kernel.journal.read(types=["AgentRefused"])
        assert refused.agent_id is not None
        assert len(refused.agent_id) <= 256 and "5000000 chars, cut" in refused.agent_id
        assert len(canonical(refused)) < 4096
    with closing(sqlite3.connect(path)) as conn:
        bodies = conn.execute("SELECT body FROM events").fetchall()
    assert max(len(unpack(body)) for (body,) in bodies) < 4096  # inflated: what was recorded
    await sound(path)


async def escalated(kernel: Kernel) -> str:
    """Open one flow that waits for a human (confidence under the pack's threshold)."""
    await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2, valid_for_s=600)]))
    [dfid] = await kernel.trigger("bank.invoice")
    assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
    return dfid


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"operator": None, "reason": "ok"}, "operator"),
        ({"operator": "", "reason": "ok"}, "operator"),
        ({"operator": "   ", "reason": "ok"}, "operator"),
        ({"operator": "ana", "reason": ""}, "reason"),
        ({"operator": "x" * 300, "reason": "ok"}, "operator"),
        ({"operator": "ana", "reason": "r" * 5000}, "reason"),
        ({"operator": "ana", "reason": "ok", "params": {"n": float("nan")}}, "params.n"),
    ],
)
async def test_a_decision_without_a_proper_operator_or_reason_is_refused_on_record(
    tmp_path: Path, fields: dict[str, Any], field: str
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        dfid = await escalated(kernel)
        verdict = await kernel.decide(
            dfid, "approve", action_hash=action_of(kernel, dfid), **fields
        )
        assert verdict.outcome is Outcome.REFUSED
        assert verdict.reason_code is ReasonCode.SCHEMA_INVALID
        assert verdict.feedback is not None and verdict.feedback.field == field
        [refused] = await kernel.journal.read(dfid=dfid, types=["DecisionRefused"])
        assert payload_of(refused, ev.DecisionRefused).reason_code is ReasonCode.SCHEMA_INVALID
        assert flow_of(kernel, dfid).status is FlowStatus.ESCALATED  # still waits for a human
        await sound(path, kernel)
    await sound(path)


async def test_approving_a_high_impact_action_takes_its_hash_as_the_cli_does(
    kernel: Kernel,
) -> None:
    dfid = await escalated(kernel)
    assert kernel.projections.approvals[dfid].impact == "HIGH_IMPACT"
    blind = await kernel.decide(dfid, "approve", operator="ana", reason="ok")
    assert blind.outcome is Outcome.REFUSED
    assert blind.feedback is not None and blind.feedback.field == "action_hash"
    assert flow_of(kernel, dfid).status is FlowStatus.ESCALATED
    seen = await kernel.decide(
        dfid, "approve", operator="ana", reason="ok", action_hash=action_of(kernel, dfid)
    )
    assert seen.outcome is Outcome.ACCEPTED
    assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


@pytest.mark.parametrize(
    ("operator", "reason", "field"),
    [("", "", "operator"), ("ana", "", "reason"), (None, "r", "operator"), (" ", "r", "operator")],
)
async def test_a_retired_agent_stays_retired_without_an_operator_and_a_reason(
    tmp_path: Path, operator: str | None, reason: str, field: str
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent())
        await kernel.set_agent_status("clerk", "RETIRED", operator="ana", reason="left the desk")
        with pytest.raises(InputInvalid) as caught:
            # None among the operators: refused, as typed callers cannot send it.
            await kernel.set_agent_status(
                "clerk",
                "ACTIVE",
                operator=operator,  # type: ignore[arg-type]
                reason=reason,
            )
        assert caught.value.field == field
        assert kernel.projections.agents["clerk"].status == "RETIRED"
        [refused] = payloads(await kernel.journal.read(types=["InputRefused"]), ev.InputRefused)
        assert refused.entry == "agent_status" and refused.field == field
        with pytest.raises(InputInvalid):
            await kernel.set_agent_status("clerk", "ASLEEP", operator="ana", reason="r")
        await sound(path, kernel)
    await sound(path)


async def test_a_nan_usage_report_ends_the_flow_instead_of_switching_the_budget_off(
    tmp_path: Path,
) -> None:
    def spend(ctx: WorkingContext) -> Proposal | None:
        ctx.report_usage(tokens=float("nan"))  # type: ignore[arg-type]  # as an agent may
        ctx.report_usage(tokens=10_000)  # over the cap: with nan counted, never noticed
        return transfer()(ctx)

    path = tmp_path / "j.db"
    async with kernel_for(path, token_budget=100) as kernel:
        await kernel.register(ScriptedAgent(steps=[spend]))
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.SCHEMA_INVALID
        await sound(path, kernel)
    await sound(path)


async def test_rule_decisions_need_an_operator_and_a_reason(kernel: Kernel) -> None:
    deferred = await kernel.propose_rule(
        "refunds", title="Refunds", content="ask first", operator="ana", reason="policy"
    )
    assert deferred.caused_by is not None
    with pytest.raises(InputInvalid):
        await kernel.decide_rule(deferred.caused_by, "override", operator="", reason="")
    with pytest.raises(InputInvalid):
        await kernel.propose_rule("r", title="t", content="c", operator="ana", reason=" ")
    refused = await kernel.journal.read(types=["InputRefused"])
    assert [p.entry for p in payloads(refused, ev.InputRefused)] == ["rule", "rule"]
    assert kernel.stopped is None


async def test_the_journal_refuses_an_event_that_would_not_read_back(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path, clock=ManualClock()) as journal:
        for value in (float("nan"), float("inf"), 2**64, -(2**63) - 1, (1, 2)):
            bad = Draft(payload=ev.TriggerFired(topic="t", facts={"x": value}))
            with pytest.raises(EventUnreadable):
                await journal.append([bad])
        [good] = await journal.append([Draft(payload=ev.TriggerFired(topic="t", facts={"x": 1}))])
        assert good.seq == 1  # the refused ones took no seq and left nothing behind
    assert (await verify_journal(path)).ok
    async with open_journal(path) as journal:
        assert [e.seq for e in await journal.read()] == [1]
