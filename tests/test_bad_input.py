"""Malformed, oversized and wrongly typed proposals: refused clearly, nothing crashes or stalls."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from agents_sdk import Proposal
from kernel import FlowStatus, Outcome, ReasonCode
from tests.helpers import ScriptedAgent, kernel_for, transfer

GOOD = {"kind": "test.transfer", "account": "acc-1", "amount_cents": 10}


def wire(policy, **fields):
    base = {
        "kind": policy.get("kind", ""),
        "params": {k: v for k, v in policy.items() if k != "kind"},
        "confidence": 0.9,
        "valid_until_ns": 2**62,
    }
    base.update(fields)
    return base


CASES = [
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
        lambda ref: Proposal(policy=GOOD, confidence="high", valid_until_ns=2**62, context_ref=ref),
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


@pytest.mark.parametrize(("name", "make", "field"), CASES, ids=[c[0] for c in CASES])
async def test_bad_proposals_get_schema_invalid_naming_the_field(tmp_path, name, make, field):
    gate = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(gate=gate, max_attempts=5)
        session = await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()

        verdict = await kernel.submit(session.token, dfid, make(agent.contexts[0].context_ref))
        assert verdict.outcome is Outcome.REJECTED, verdict
        assert verdict.reason_code is ReasonCode.SCHEMA_INVALID
        assert verdict.feedback.field == field

        # The kernel is unharmed: the agent's own proposal on the next attempt goes through.
        gate.set()
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED
        assert kernel.journal.statistics().events > 0
        body_sizes = [
            len(e.payload.proposal.explain)
            for e in await kernel.journal.read(dfid=dfid, types=["ProposalSubmitted"])
        ]
        assert max(body_sizes) < 100_000


async def test_a_burst_of_garbage_does_not_stall_the_kernel(tmp_path):
    gate = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(gate=gate, max_attempts=1000, steps=[transfer()])
        session = await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()
        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(kernel.submit, session.token, dfid, CASES[i % len(CASES)][1](""))
        gate.set()
        with anyio.fail_after(30):
            await kernel.wait_quiet()
        assert kernel.flow(dfid).status is FlowStatus.CLOSED
