"""The wall, tried as an adversary would: generated input at every public entry point.

Whatever goes in (wrong types, nan and inf, integers past 64 bits, deep nesting,
huge strings), the kernel keeps running, the input is accepted or refused with a
reason code, and the journal opens again and verifies from genesis. Hypothesis
runs bounded and seeded; each example opens one real kernel on a real file and
feeds it a handful of inputs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_sdk import Manifest, Proposal
from kernel import (
    AmendmentInvalid,
    FlowStatus,
    HandshakeRefused,
    InputInvalid,
    Outcome,
    ReasonCode,
    Session,
)
from kernel.audit import payload_of, verify_journal
from kernel.core.events import AgentStatusChanged, InputRefused
from kernel.core.reasoning import UsageMeter
from kernel.core.wall import INT_MAX
from kernel.inbox import DecideRequest
from kernel.journal.inbox_store import open_inbox
from kernel.policy.contracts import Verdict
from kernel.runtime.messages import Decision
from kernel.testing import ManualClock, action_of
from tests.support.helpers import ScriptedAgent, kernel_for, transfer
from tests.support.operators import Keys, insert, journal_id_of, post, raw_row

SETTINGS = settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Values an adversary would try: every JSON type, and what JSON or msgpack cannot keep.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["", " ", "x" * 300, "\x00", "\ud800"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=6) | st.integers(0, 3), inner, max_size=3)
    ),
    max_leaves=10,
)
texts = st.text(max_size=12) | st.sampled_from(["", "   ", "x" * 5000]) | values


async def reopens(path: Path) -> None:
    """The journal verifies from genesis and a kernel opens on it again."""
    report = await verify_journal(path)
    assert report.ok, report
    async with kernel_for(path, inbox_poll_s=None) as again:
        assert again.stopped is None


def fresh(tmp_path: Path) -> Path:
    """A new journal path per example (function-scoped tmp_path is shared by examples)."""
    directory = Path(tmp_path) / f"ex-{len(list(Path(tmp_path).iterdir()))}"
    directory.mkdir()
    return directory / "j.db"


def answered(verdict: Any) -> None:
    """A verdict came back; a refusal names a reason code."""
    assert isinstance(verdict, Verdict)
    if verdict.outcome in (Outcome.REJECTED, Outcome.REFUSED, Outcome.ABORTED):
        assert isinstance(verdict.reason_code, ReasonCode)


proposals = st.one_of(
    st.builds(
        lambda account, amount, explain, confidence, until, ref: Proposal(
            policy={"kind": "test.transfer", "account": account, "amount_cents": amount},
            explain=explain,
            confidence=confidence,
            valid_until_ns=until,
            context_ref=ref,
        ),
        values,
        values,
        texts,
        values,
        values,
        texts,
    ),
    st.dictionaries(st.sampled_from(["kind", "params", "confidence", "explain"]), values),
    values,
    st.binary(max_size=40),
)


@SETTINGS
@given(batch=st.lists(proposals, min_size=1, max_size=6))
async def test_no_proposal_stops_the_kernel_or_poisons_the_journal(
    tmp_path: Path, batch: list[Any]
) -> None:
    path = fresh(tmp_path)
    gate = anyio.Event()
    async with kernel_for(path) as kernel:
        agent = ScriptedAgent(hold=gate, max_attempts=1000, steps=[transfer()])
        session = await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()
        for proposal in batch:
            answered(await kernel.submit(session.token, dfid, proposal))
            assert kernel.stopped is None
        gate.set()
        await kernel.wait_quiet()
        assert kernel.stopped is None
    await reopens(path)


manifests = st.builds(
    Manifest,
    agent_id=st.sampled_from(["clerk", "other"]) | texts,
    version=st.sampled_from(["1.0", "1.2.3"]) | texts,
    capabilities=st.just(["test.transfer"]) | values,
    subscriptions=st.just(["bank"]) | values,
    limits=st.just({}) | values,
    max_attempts=st.just(3) | values,
)


@SETTINGS
@given(batch=st.lists(manifests, min_size=1, max_size=6))
async def test_no_manifest_stops_the_kernel_or_poisons_the_journal(
    tmp_path: Path, batch: list[Any]
) -> None:
    path = fresh(tmp_path)
    async with kernel_for(path) as kernel:
        for manifest in batch:
            try:
                assert isinstance(await kernel.handshake(manifest), Session)
            except HandshakeRefused as exc:
                assert isinstance(exc.reason_code, ReasonCode)
            assert kernel.stopped is None
        await kernel.register(ScriptedAgent("other"))
    await reopens(path)


@SETTINGS
@given(
    batch=st.lists(
        st.tuples(
            st.sampled_from(["bank.invoice", "bank"]) | texts,
            st.dictionaries(st.text(max_size=8), values, max_size=3) | values,
        ),
        min_size=1,
        max_size=6,
    )
)
async def test_no_trigger_stops_the_kernel_or_poisons_the_journal(
    tmp_path: Path, batch: list[Any]
) -> None:
    path = fresh(tmp_path)
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent())
        for topic, facts in batch:
            try:
                dfids = await kernel.trigger(topic, facts)
            except InputInvalid as exc:
                assert exc.reason_code is ReasonCode.SCHEMA_INVALID
            else:
                assert all(isinstance(d, str) for d in dfids)
            assert kernel.stopped is None
        await kernel.wait_quiet()
    await reopens(path)


human_acts = st.fixed_dictionaries(
    {
        "operator": st.just("ana") | texts,
        "reason": st.just("checked") | texts,
    }
)


@SETTINGS
@given(
    batch=st.lists(
        st.tuples(
            st.sampled_from(["approve", "reject", "modify", "override"]) | texts,
            human_acts,
            st.none() | values,
            st.booleans() | texts,
            st.none() | texts,
        ),
        min_size=1,
        max_size=5,
    )
)
async def test_no_decision_stops_the_kernel_or_poisons_the_journal(
    tmp_path: Path, batch: list[Any]
) -> None:
    path = fresh(tmp_path)
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2, valid_for_s=600)]))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
        for decision, who, params, action, target in batch:
            action_hash = action_of(kernel, dfid) if action is True else action
            action_hash = None if action is False else action_hash
            verdict = await kernel.decide(
                dfid if target is None else target,
                decision,
                params=params,
                action_hash=action_hash,
                **who,
            )
            answered(verdict)
            assert kernel.stopped is None
        await kernel.wait_quiet()
    await reopens(path)


@SETTINGS
@given(
    batch=st.lists(
        st.tuples(
            st.sampled_from(["clerk"]) | texts,
            st.sampled_from(["PASSIVE", "ACTIVE", "RETIRED"]) | texts,
            human_acts,
        ),
        min_size=1,
        max_size=6,
    )
)
async def test_no_agent_status_change_stops_the_kernel(tmp_path: Path, batch: list[Any]) -> None:
    path = fresh(tmp_path)
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent())
        for agent_id, status, who in batch:
            try:
                await kernel.set_agent_status(agent_id, status, **who)
            except (InputInvalid, HandshakeRefused) as exc:
                assert isinstance(exc.reason_code, ReasonCode)
                # A refused act changed nothing: an operator and a reason are on every change.
            assert kernel.stopped is None
        for event in await kernel.journal.read(types=["AgentStatusChanged"]):
            changed = payload_of(event, AgentStatusChanged)
            assert changed.operator.strip() and changed.reason.strip()
    await reopens(path)


@SETTINGS
@given(
    batch=st.lists(
        st.tuples(
            st.sampled_from(["trader"]) | texts,
            st.sampled_from(["max_qty"]) | texts,
            st.integers(0, 12) | values,
            st.sampled_from([60, 3600.5]) | values,
            human_acts,
        ),
        min_size=1,
        max_size=6,
    )
)
async def test_no_amendment_stops_the_kernel_or_poisons_the_journal(
    tmp_path: Path, batch: list[Any]
) -> None:
    from tests.dim.test_amendments import kernel as desk_kernel
    from tests.dim.test_amendments import trader

    path = fresh(tmp_path)
    async with desk_kernel(path, ManualClock()) as kernel:
        await kernel.register(trader())
        for agent_id, limit, value, ttl, who in batch:
            try:
                await kernel.amend_limit(agent_id, limit, value, ttl_s=ttl, **who)
            except AmendmentInvalid as exc:
                assert isinstance(exc.reason_code, ReasonCode)
            assert kernel.stopped is None
    assert (await verify_journal(path)).ok


@settings(max_examples=200, derandomize=True, deadline=None)
@given(reports=st.lists(values, min_size=1, max_size=5))
def test_a_usage_report_is_counted_or_stops_the_reasoning(reports: list[Any]) -> None:
    meter = UsageMeter("f", cap_tokens=1000)
    for tokens in reports:
        before = meter.stopped
        try:
            meter.add(tokens)
        except InputInvalid:
            # Stopped SCHEMA_INVALID, unless it had already stopped: the first reason wins.
            assert meter.stopped is not None
            assert meter.stopped == before or meter.stopped[0] is ReasonCode.SCHEMA_INVALID
        assert isinstance(meter.tokens, int) and 0 <= meter.tokens
        if meter.tokens > 1000:
            assert meter.stopped is not None
    assert meter.tokens <= len(reports) * INT_MAX


# --- the operator inbox: rows anyone could have written into the file ----------------

row_bodies = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("amend"), "agent_id": st.just("clerk") | texts, "limit": texts},
        optional={"value": values, "ttl_s": values, "operator": texts, "reason": texts},
    ),
    st.fixed_dictionaries(
        {"type": st.just("agent_status"), "agent_id": st.just("clerk") | texts},
        optional={"status": texts, "operator": texts, "reason": texts, "extra": values},
    ),
    st.fixed_dictionaries(
        {"type": st.just("rule")},
        optional={"proposal_seq": values, "decision": texts, "operator": texts, "reason": texts},
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "decision": st.sampled_from(["approve", "reject"]) | texts,
            "operator": texts,
            "reason": texts,
            "params": values,
            "action_hash": texts,
            "type": texts,
        },
    ),
    st.dictionaries(st.text(max_size=6), values, max_size=4),
)


def raw_rows(path: Path, bodies: list[bytes]) -> None:
    """Write rows whose bytes are not what dirk would ever write (not JSON, not a request...)."""
    for body in bodies:
        insert(path, body)


def signed_or_not(keys: Keys, journal_id: str, body: dict[str, Any]) -> bytes:
    """The row a key holder with a broken client writes: signed if it encodes, else as text.

    Text keeps what json writes for a float that is not finite (NaN, Infinity) and lone
    surrogates as the bytes ``surrogatepass`` makes of them: not UTF-8.
    """
    try:
        text = json.dumps(body, default=repr)
        if "NaN" not in text and "Infinity" not in text:  # msgspec would write null for them
            return raw_row(keys, "ana", journal_id, body)
    except (TypeError, ValueError, OverflowError):
        pass
    envelope = {"journal_id": journal_id, "request": body, "request_id": "r" * 22}
    envelope |= {"signer": "ana", "signature": "x" * 86}
    return json.dumps(envelope, default=repr).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def escalated_journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A journal with one flow waiting for a human, made once and copied per example."""
    path = tmp_path_factory.mktemp("inbox") / "template.db"

    async def make() -> str:
        async with kernel_for(path, inbox_poll_s=None) as kernel:
            await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2, valid_for_s=600)]))
            [dfid] = await kernel.trigger("bank.invoice")
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
            return dfid

    return path, anyio.run(make)


async def apply_rows_then_reject(path: Path, dfid: str, keys: Keys) -> None:
    """Post a well-formed rejection last, run the kernel until it is applied, and check."""
    async with kernel_for(path, inbox_poll_s=None) as kernel:
        action = action_of(kernel, dfid)
    reject = DecideRequest(
        dfid=dfid, decision=Decision.REJECT, operator="ana", reason="enough", action_hash=action
    )
    # Signed now on this machine's clock: the inbox judges a request's window in real time.
    last = post(keys, path, reject, "ana")
    async with kernel_for(path, inbox_poll_s=1.0) as kernel:
        # Rows are applied in order: once the rejection is, every row before it was looked at.
        with anyio.fail_after(30):
            flow = await kernel.wait_flow(dfid, until={FlowStatus.ABORTED})
        assert flow.reason_code is ReasonCode.HUMAN_REJECTED
        assert kernel.stopped is None
        taken = dict(kernel.projections.inbox_taken)
    with open_inbox(str(path)) as store:
        rows = store.rows(pending=False)
    # Every row was taken by a recorded event: applied, or refused with a reason.
    assert {row.id for row in rows} == set(taken) and max(taken) == last
    async with kernel_for(path, inbox_poll_s=1.0) as kernel:
        assert dict(kernel.projections.inbox_taken) == taken  # never applied again
    await reopens(path)


@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    bodies=st.lists(row_bodies, min_size=1, max_size=6),
    garbage=st.lists(
        st.sampled_from(["", "null", "[1, 2]", "{not json", '"text"', "[" * 5000]), max_size=2
    ),
)
async def test_no_inbox_row_stops_the_poller_or_poisons_the_journal(
    tmp_path: Path,
    escalated_journal: tuple[Path, str],
    operator_keys: Keys,
    bodies: list[dict[str, Any]],
    garbage: list[str],
) -> None:
    template, dfid = escalated_journal
    path = fresh(tmp_path)
    shutil.copy(template, path)
    journal_id = journal_id_of(path)
    raw_rows(path, [signed_or_not(operator_keys, journal_id, body) for body in bodies])
    raw_rows(path, [text.encode() for text in garbage])
    await apply_rows_then_reject(path, dfid, operator_keys)


async def test_a_dirk_amend_row_with_ttl_inf_is_refused_on_record_never_a_crash_loop(
    tmp_path: Path, escalated_journal: tuple[Path, str], operator_keys: Keys
) -> None:
    template, dfid = escalated_journal
    path = tmp_path / "j.db"
    shutil.copy(template, path)
    # What `dirk amend ... --ttl inf` wrote before the CLI refused it: json writes Infinity.
    row: dict[str, Any] = {"type": "amend", "agent_id": "clerk", "limit": "max_qty", "value": "8"}
    row |= {"ttl_s": float("inf"), "operator": "ana", "reason": "r"}
    body = signed_or_not(operator_keys, journal_id_of(path), row)
    assert b"Infinity" in body
    insert(path, body)
    await apply_rows_then_reject(path, dfid, operator_keys)
    async with kernel_for(path, inbox_poll_s=None) as kernel:
        [refused] = await kernel.journal.read(types=["InputRefused"])
        refusal = payload_of(refused, InputRefused)
        assert refusal.reason_code is ReasonCode.SCHEMA_INVALID
        assert refusal.inbox_id == 1


async def test_dirk_amend_refuses_a_ttl_that_is_not_finite(
    tmp_path: Path, operator_keys: Keys
) -> None:
    from tests.cli.test_operator_admin import dirk

    path = tmp_path / "j.db"
    async with kernel_for(path, inbox_poll_s=None) as kernel:
        await kernel.register(ScriptedAgent())
    for ttl in ("inf", "nan", "1e30"):
        args = ("--value", "8", "--ttl", ttl, "--operator", "ana", "--reason", "r")
        code, _, err = await dirk(
            "amend", "--agent", "clerk", "--limit", "max_qty", *args, "--db", path
        )
        assert code != 0 and "SCHEMA_INVALID" in err, err
    blank = ("--value", "8", "--ttl", "60", "--operator", " ", "--reason", "r", "--db", path)
    code, _, err = await dirk("amend", "--agent", "clerk", "--limit", "max_qty", *blank)
    assert code != 0 and "SCHEMA_INVALID" in err
    with open_inbox(str(path)) as store:
        assert store.rows(pending=False) == []
