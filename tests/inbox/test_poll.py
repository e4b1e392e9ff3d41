"""The poll, over anything a row can hold: hostile requests signed by a trusted key, and bytes.

A key holder with a broken client (or a careless script) signs whatever it is given;
anyone who can write the table inserts whatever bytes. Each row is taken once, by a
recorded event (applied, or refused with a code); the kernel never stops, and the
journal verifies and reopens. Hypothesis draws the strings from tests/support/hostile.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.core import events as ev
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid
from kernel.inbox import Intake, Keyring, read_keyring
from kernel.inbox.proof import sign
from kernel.inbox.requests import InboxRequest, normalized
from kernel.journal.inbox_store import StoredRow
from kernel.journal.verify import verify_journal
from tests.support.helpers import ScriptedAgent, kernel_for, transfer
from tests.support.hostile import hostile_text, hostile_values
from tests.support.operators import Keys, journal_id_of, provision

KINDS = ["decide", "amend", "agent_status", "credential", "rule", "rule_change", "propose"]

requests = st.fixed_dictionaries(
    {"type": st.sampled_from(KINDS)},
    optional={
        "dfid": hostile_text(),
        "decision": st.sampled_from(["approve", "reject", "modify", "retry"]),
        "operator": st.just("ana") | hostile_text(),
        "reason": hostile_text(min_size=1),
        "params": hostile_values(),
        "action_hash": hostile_text(),
        "agent_id": st.sampled_from(["clerk", "ide", "ghost"]) | hostile_text(),
        "limit": hostile_text(),
        "value": hostile_values(),
        "ttl_s": hostile_values(),
        "status": st.sampled_from(["ACTIVE", "PASSIVE", "SUSPENDED"]),
        "verifier": hostile_text(),
        "proposal_seq": hostile_values(),
        "action": st.sampled_from(["add", "edit", "retract"]),
        "rule": hostile_text(),
        "title": hostile_text(),
        "content": hostile_text(),
        "labels": st.lists(hostile_text(), max_size=3),
        "policy": hostile_values(),
        "explain": hostile_text(),
        "confidence": hostile_values(),
    },
)


def signed(keys: Keys, journal_id: str, fields: dict[str, Any]) -> bytes | None:
    """The row ana's key makes of ``fields`` if they form a request the wall admits, else None."""
    try:
        request: InboxRequest = msgspec.convert(fields, InboxRequest)
        request = normalized(request)
    except (msgspec.ValidationError, InputInvalid, TypeError, ValueError):
        return None
    signer = "ide" if fields["type"] == "propose" else "ana"
    return sign(
        request,
        key=keys.key(signer),
        signer=signer,
        journal_id=journal_id,
        signed_ns=time.time_ns(),
    )


@pytest.fixture(scope="module")
def module_keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return provision(tmp_path_factory.mktemp("keys"), ("ana",), doors=(), agents=("ide",))


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=st.lists(
        st.one_of(
            requests.map(lambda r: ("signed", r)),
            st.binary(max_size=120).map(lambda b: ("bytes", b)),
        ),
        min_size=1,
        max_size=5,
    )
)
async def test_any_row_is_taken_once_on_record_and_never_stops_the_kernel(
    tmp_path_factory: pytest.TempPathFactory,
    module_keys: Keys,
    rows: list[tuple[str, Any]],
) -> None:
    path = tmp_path_factory.mktemp("poll") / "j.db"
    keyring: Keyring = read_keyring(module_keys.keyring)
    async with kernel_for(path, inbox_poll_s=None, allow=("clerk", "ide")) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2, valid_for_s=600)]))
        await kernel.trigger("bank.invoice")
        journal_id = journal_id_of(path)

        intake = Intake(
            kernel.journal,
            kernel.projections,
            keyring,
            str(module_keys.keyring),
            kernel.apply,
        )
        assert await intake.remember()
        taken = {}
        for row_id, (kind, value) in enumerate(rows, 1):
            body = signed(module_keys, journal_id, value) if kind == "signed" else value
            if body is None:
                body = repr(value).encode("utf-8", "surrogatepass")
            taken[row_id] = await intake.take(StoredRow(id=row_id, body=body))
            assert kernel.stopped is None
        # Taken again (the kernel died before marking them): never applied twice.
        before = kernel.journal.head_seq
        for row_id, seq in taken.items():
            if row_id in kernel.projections.inbox_taken:
                assert await intake.take(StoredRow(id=row_id, body=b"")) == seq
        assert kernel.journal.head_seq == before
        refused = await kernel.journal.read(types=["InputRefused"])
    for event in refused:
        assert isinstance(event.payload, ev.InputRefused)
        assert event.payload.reason_code in set(ReasonCode)
    assert all(isinstance(seq, int) for seq in taken.values())
    report = await verify_journal(path)
    assert report.ok, report.problem
    async with kernel_for(path, inbox_poll_s=None, allow=("clerk", "ide")) as kernel:
        assert kernel.stopped is None


def test_a_row_the_wall_refuses_before_signing_is_never_signed(tmp_path: Path) -> None:
    keys = provision(tmp_path, ("ana",), doors=(), agents=())
    fields = {"type": "decide", "dfid": "f", "decision": "reject", "operator": "ana"}
    assert signed(keys, "j", fields | {"reason": "\ud800"}) is None
    assert signed(keys, "j", fields | {"reason": "ok", "params": {"x": float("nan")}}) is None
    assert signed(keys, "j", fields | {"reason": "ok"}) is not None


class Crash(BaseException):
    """The process dies here (nothing catches it)."""


async def test_a_request_verified_before_a_crash_is_applied_once_and_a_copy_never(
    tmp_path: Path,
) -> None:
    keys = provision(tmp_path / "keys", ("ana",), doors=(), agents=())
    path = tmp_path / "j.db"
    keyring = read_keyring(keys.keyring)
    status = {"type": "agent_status", "agent_id": "clerk", "status": "PASSIVE"}
    async with kernel_for(path, inbox_poll_s=None) as kernel:
        await kernel.register(ScriptedAgent())
        body = signed(keys, journal_id_of(path), status | {"operator": "ana", "reason": "r"})
        assert body is not None

        async def dies(request: InboxRequest, proof: object) -> None:
            raise Crash

        before = Intake(kernel.journal, kernel.projections, keyring, None, dies)
        assert await before.remember()
        with pytest.raises(Crash):
            await before.take(StoredRow(id=1, body=body))
        # The next start: the same row is applied, once; a copy in another row never.
        after = Intake(kernel.journal, kernel.projections, keyring, None, kernel.apply)
        assert await after.remember()
        seq = await after.take(StoredRow(id=1, body=body))
        assert await after.take(StoredRow(id=1, body=body)) == seq
        copy = await after.take(StoredRow(id=2, body=body))
        verified = await kernel.journal.read(types=["RequestVerified"])
        changed = await kernel.journal.read(types=["AgentStatusChanged"])
        [refused] = await kernel.journal.read(types=["InputRefused"])
    assert [e.payload.inbox_id for e in verified] == [1]  # type: ignore[union-attr]
    assert [(e.seq, e.payload.inbox_id) for e in changed] == [(seq, 1)]  # type: ignore[union-attr]
    assert isinstance(refused.payload, ev.InputRefused) and refused.seq == copy
    assert refused.payload.reason_code is ReasonCode.REQUEST_REPLAYED
