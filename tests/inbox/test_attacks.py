"""Attacks on the operator inbox, as the attacker: whoever can write the table, with no key.

The attacker holds a raw ``sqlite3`` connection to the journal file, or a PostgreSQL
role with the operator grants (read everything, insert inbox rows), and no key in the
kernel's keyring. Each attack is a row inserted with that connection into the inbox
of a running kernel: an approval naming any operator, a forged signature, a replayed
signed row, a row signed for another journal, a credential rotation, a ``propose``
for a hosted agent, and rows with a lone surrogate (or bytes that are not UTF-8) in
every field. Each must be refused and the refusal recorded, naming the row, with the
kernel still running (a genuine decision posted after them is applied), the journal
verifying, and the next start taking none of them again (trust-and-edges D1, D5).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from kernel import FlowStatus, Kernel, ReasonCode, SystemClock
from kernel.audit import payload_of, payloads
from kernel.core import events as ev
from kernel.core import keys as keyfns
from kernel.core.events import InputRefused, OperatorKeyRevoked, OperatorKeyTrusted
from kernel.inbox import (
    AgentStatusRequest,
    CredentialRequest,
    DecideRequest,
    ProposeRequest,
)
from kernel.inbox.proof import CONTEXT, new_request_id, sign, signed_bytes
from kernel.inbox.requests import Signed, encode
from kernel.journal.verify import verify_journal
from kernel.registry import credential_verifier
from kernel.runtime.messages import Decision
from kernel.state.projections import AgentStatus
from kernel.testing import action_of
from tests.support.helpers import ScriptedAgent, kernel_for, transfer
from tests.support.operators import Keys, journal_id_of, post, provision, wait_taken, wait_until
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

BOUND_S = 60


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    """ana and bob operate; the console is a door; clerk (hosted) and ide propose as agents."""
    return provision(tmp_path / "keys", ("ana", "bob"), doors=("console",), agents=("clerk", "ide"))


@contextmanager
def attacker(store: str, location: str, pg: PostgresServer | None) -> Iterator[Callable[..., Any]]:
    """The attacker's own connection: raw sqlite3 on the file, or the operator role."""
    if store == "sqlite":
        with closing(sqlite3.connect(location, isolation_level=None)) as conn:

            def run(sql: str, *params: Any) -> list[Any]:
                return conn.execute(sql, params).fetchall()

            yield run
        return
    import psycopg

    from kernel.journal._postgres import OPERATOR_GRANTS

    assert pg is not None
    database = location.rsplit("/", 1)[1]
    pg.admin("DO $$ BEGIN CREATE ROLE operator LOGIN; EXCEPTION WHEN duplicate_object THEN END $$")
    pg.admin(OPERATOR_GRANTS.format(schema="public", role="operator"), database)
    with psycopg.connect(pg.url(database, user="operator"), autocommit=True) as role:

        def run_pg(sql: str, *params: Any) -> list[Any]:
            cur = role.execute(sql.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

        yield run_pg


def insert_as(run: Callable[..., Any], body: bytes) -> int:
    [(row_id,)] = run(
        "INSERT INTO operator_inbox (request, created_ts) VALUES (?, 0) RETURNING id", body
    )
    return int(row_id)


@asynccontextmanager
async def live(location: str, keys: Keys) -> AsyncIterator[Kernel]:
    """A kernel polling its inbox every 50 ms, trusting ``keys``' keyring, hosting clerk."""
    async with kernel_for(
        location,  # type: ignore[arg-type]
        clock=SystemClock(),
        inbox_poll_s=0.05,
        keyring=str(keys.keyring),
        allow=("clerk", "ide"),
    ) as kernel:
        with anyio.fail_after(BOUND_S):
            await kernel.register(ScriptedAgent(steps=[transfer(250_000, confidence=0.2)] * 4))
        yield kernel


def envelope(journal_id: str, request: dict[str, Any], **fields: Any) -> bytes:
    """A row as the attacker writes it by hand: any request, any signer, any signature."""
    body = {
        "journal_id": journal_id,
        "request": request,
        "request_id": "attacker-request-0001",
        "signer": "ana",
        "signature": "",
    } | fields
    return json.dumps(body, ensure_ascii=True).encode()


SURROGATE = "\udcff"  # what the byte 0xff becomes under surrogateescape


def attacks(journal_id: str, dfid: str, action: str, keys: Keys) -> dict[str, tuple[bytes, str]]:
    """Every attack's row, with the reason code its refusal must carry."""
    mallory = keyfns.generate()
    now = time.time_ns()
    approve = DecideRequest(
        dfid=dfid, decision=Decision.APPROVE, operator="ana", reason="ok", action_hash=action
    )
    approve_fields = {
        "type": "decide",
        "dfid": dfid,
        "decision": "approve",
        "operator": "dana",
        "reason": "ok",
        "action_hash": action,
    }
    rotate = CredentialRequest(
        agent_id="clerk", verifier=credential_verifier("mallory's"), operator="ana", reason="r"
    )
    hijack = ProposeRequest(agent_id="clerk", policy={"kind": "test.transfer"})
    everywhere = {
        "type": "decide" + SURROGATE,
        "dfid": SURROGATE,
        "decision": SURROGATE,
        "operator": SURROGATE,
        "reason": SURROGATE,
        "action_hash": SURROGATE,
        SURROGATE: SURROGATE,
    }
    return {
        "an approval naming any operator": (
            envelope(journal_id, approve_fields),
            "SIGNATURE_INVALID",
        ),
        "a forged signature": (
            sign(approve, key=mallory, signer="ana", journal_id=journal_id, signed_ns=now),
            "SIGNATURE_INVALID",
        ),
        "a row signed for another journal": (
            keys.row(approve, "other-journal", "ana"),
            "SIGNATURE_INVALID",
        ),
        "a credential rotation": (
            sign(rotate, key=mallory, signer="ana", journal_id=journal_id, signed_ns=now),
            "SIGNATURE_INVALID",
        ),
        "a propose for a hosted agent": (
            sign(hijack, key=mallory, signer="clerk", journal_id=journal_id, signed_ns=now),
            "SIGNATURE_INVALID",
        ),
        "a lone surrogate in every field": (
            envelope(
                SURROGATE,
                everywhere,
                request_id=SURROGATE,
                signer=SURROGATE,
                signature=SURROGATE,
            ),
            "SCHEMA_INVALID",
        ),
        "bytes that are not UTF-8 in every field": (
            envelope(journal_id, approve_fields)
            .replace(b'"ana"', b'"\xff"')
            .replace(b'"dana"', b'"\xff\xfe"'),
            "SCHEMA_INVALID",
        ),
        "not JSON at all": (b"\xff" * 64, "SCHEMA_INVALID"),
        # Signed by ana's own key, genuinely, but held back (or dated ahead) by whoever
        # can delay rows: taken only within the window its signing time opens.
        "a request signed days ago": (
            keys.row(approve, journal_id, "ana", signed_ns=now - 3 * DAY_NS),
            "REQUEST_EXPIRED",
        ),
        "a request that names a window of years, signed days ago": (
            sign(
                approve,
                key=keys.key("ana"),
                signer="ana",
                journal_id=journal_id,
                signed_ns=now - 2 * DAY_NS,
                valid_s=10 * 365 * 86_400,
            ),
            "REQUEST_EXPIRED",
        ),
        "a request signed days ahead": (
            keys.row(approve, journal_id, "ana", signed_ns=now + 3 * DAY_NS),
            "REQUEST_NOT_YET_VALID",
        ),
        "a request signed with no time (as rows were once)": (
            unstamped(keys, approve, journal_id, "ana"),
            "REQUEST_EXPIRED",
        ),
    }


DAY_NS = 86_400 * 1_000_000_000


def unstamped(keys: Keys, request: DecideRequest, journal_id: str, name: str) -> bytes:
    """A row signed by ``name``'s own key as rows were before they carried a time."""
    body = Signed(request=request, journal_id=journal_id, request_id=new_request_id(), signer=name)
    signature = keyfns.sign(keys.key(name), CONTEXT, signed_bytes(body))
    return encode(msgspec.structs.replace(body, signature=signature))


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, PostgresServer | None]:
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "j.db"), None
    pg: PostgresServer = request.getfixturevalue("postgres_server")
    return "postgres", pg.new_url(), pg


async def test_every_attack_on_the_inbox_is_refused_on_record_and_the_kernel_goes_on(
    store: tuple[str, str, PostgresServer | None], keys: Keys
) -> None:
    kind, location, pg = store
    async with live(location, keys) as kernel:
        [target, other] = [(await kernel.trigger("bank.invoice"))[0] for _ in range(2)]
        for dfid in (target, other):
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
        action = action_of(kernel, target)
        assert action is not None
        credentials = dict(kernel.projections.credentials)
        journal_id = journal_id_of(location)
        # A genuine request by ana, applied: the row the attacker will replay.
        genuine = DecideRequest(
            dfid=other,
            decision=Decision.REJECT,
            operator="ana",
            reason="dup",
            action_hash=action_of(kernel, other),
        )
        first = await anyio.to_thread.run_sync(post, keys, location, genuine, "ana")
        with anyio.fail_after(BOUND_S):
            await kernel.wait_flow(other, until={FlowStatus.ABORTED})
        planned = attacks(journal_id, target, action, keys)
        rows: dict[str, tuple[int, str]] = {}
        with attacker(kind, location, pg) as run:
            [(copied,)] = run("SELECT request FROM operator_inbox WHERE id = ?", first)
            rows["a replayed signed row"] = (insert_as(run, bytes(copied)), "REQUEST_REPLAYED")
            for name, (body, code) in planned.items():
                rows[name] = (insert_as(run, body), code)
        # Then the operator decides, genuinely: once it is applied, every row before it was taken.
        approve = DecideRequest(
            dfid=target, decision=Decision.APPROVE, operator="bob", reason="ok", action_hash=action
        )
        last = await anyio.to_thread.run_sync(post, keys, location, approve, "bob")
        with anyio.fail_after(BOUND_S):
            flow = await kernel.wait_flow(target, until={FlowStatus.CLOSED})
        assert flow.status is FlowStatus.CLOSED and kernel.stopped is None
        refusals = {
            e.payload.inbox_id: e.payload
            for e in await kernel.journal.read(types=["InputRefused"])
            if isinstance(e.payload, ev.InputRefused)
        }
        decided = [
            e.payload
            for e in await kernel.journal.read(types=["HumanDecided"])
            if isinstance(e.payload, ev.HumanDecided)
        ]
        assert kernel.projections.credentials == credentials  # no rotation
        assert "clerk" in kernel.projections.agents  # its own session, not the inbox's
        taken = dict(kernel.projections.inbox_taken)
    for name, (row_id, code) in rows.items():
        refused = refusals.get(row_id)
        assert refused is not None, name
        assert str(refused.reason_code) == code, (name, refused)
        assert taken[row_id] > 0, name
    # Only the genuine decisions were recorded, each by the operator who signed it.
    assert [(d.operator, d.decision, d.via, d.signer) for d in decided] == [
        ("ana", "reject", "inbox", "ana"),
        ("bob", "approve", "inbox", "bob"),
    ]
    assert max(taken) == last
    assert (await verify_journal(location)).ok
    # The next start takes none of them again and runs.
    async with live(location, keys) as kernel:
        assert dict(kernel.projections.inbox_taken) == taken
        # A new request is taken; none of the old rows is looked at again on the way.
        suspend = AgentStatusRequest(
            agent_id="clerk", status=AgentStatus.PASSIVE, operator="ana", reason="pause"
        )
        after = kernel.journal.head_seq
        row = await anyio.to_thread.run_sync(post, keys, location, suspend, "ana")
        await wait_taken(kernel, row)
        again = await kernel.journal.read(after + 1, types=["InputRefused", "HumanDecided"])
        assert again == [] and kernel.stopped is None
        assert {r: s for r, s in kernel.projections.inbox_taken.items() if r != row} == taken
    assert (await verify_journal(location)).ok


async def test_a_proposal_for_a_hosted_agent_is_refused_even_with_its_key(
    tmp_path: Path, keys: Keys
) -> None:
    db = str(tmp_path / "j.db")
    async with live(db, keys) as kernel:
        hijack = ProposeRequest(agent_id="clerk", policy={"kind": "test.transfer"})
        row = await anyio.to_thread.run_sync(post, keys, db, hijack, "clerk")
        await wait_taken(kernel, row)
        [refused] = await kernel.journal.read(types=["InputRefused"])
        assert isinstance(refused.payload, ev.InputRefused)
        assert refused.payload.reason_code is ReasonCode.AGENT_IN_SESSION
        # The hosted agent keeps its manifest and its flows.
        manifest = kernel.projections.agents["clerk"].manifest
        assert manifest.capabilities == ["test.transfer"] and manifest.subscriptions == ["bank"]
        assert len(await kernel.trigger("bank.invoice")) == 1


async def test_an_agents_key_proposes_but_never_decides_and_never_widens(
    tmp_path: Path, keys: Keys
) -> None:
    db = str(tmp_path / "j.db")
    async with live(db, keys) as kernel:
        policy = {"kind": "test.note", "text": "hello"}
        proposed = await anyio.to_thread.run_sync(
            post, keys, db, ProposeRequest(agent_id="ide", policy=policy), "ide"
        )
        [dfid] = [(await kernel.trigger("bank.invoice"))[0]]
        await kernel.wait_flow(dfid)
        decide = DecideRequest(
            dfid=dfid,
            decision=Decision.APPROVE,
            operator="ide",
            reason="mine",
            action_hash=action_of(kernel, dfid),
        )
        decided = await anyio.to_thread.run_sync(post, keys, db, decide, "ide")
        await wait_taken(kernel, decided)
        flows = [f for f in kernel.projections.flows.values() if f.topic == f"inbox.ide.{proposed}"]
        assert [f.agent_id for f in flows] == ["ide"]
        refusals = await kernel.journal.read(types=["InputRefused"])
        assert [(p.inbox_id, str(p.reason_code)) for p in payloads(refusals, InputRefused)] == [
            (decided, "UNAUTHORIZED")
        ]
        kinds = sorted(kernel.catalog.kinds)
        assert kernel.projections.agents["ide"].manifest.capabilities == kinds
    # A pack loaded later adds nothing to what the inbox agent may propose.
    from kernel.policy import PolicyKind, PolicyPack

    class Extra(PolicyKind, tag="extra.thing"):
        adapter = "bank"

    async with kernel_for(
        db,  # type: ignore[arg-type]
        clock=SystemClock(),
        inbox_poll_s=0.05,
        keyring=str(keys.keyring),
        allow=("clerk", "ide"),
    ) as kernel:
        await kernel.load_pack(
            PolicyPack(name="extra", version="1.0.0", kinds=(Extra,)), operator="o", reason="r"
        )
        again = await anyio.to_thread.run_sync(
            post, keys, db, ProposeRequest(agent_id="ide", policy=policy), "ide"
        )
        opened = f"inbox.ide.{again}"
        await wait_until(
            kernel, lambda: any(f.topic == opened for f in kernel.projections.flows.values())
        )
        assert "extra.thing" not in kernel.projections.agents["ide"].manifest.capabilities


async def test_a_revoked_key_is_refused_and_a_new_one_trusted_without_a_restart(
    tmp_path: Path, keys: Keys
) -> None:
    from kernel.inbox.keyring import remove_principal
    from tests.support.operators import add

    db = str(tmp_path / "j.db")
    status = AgentStatusRequest(
        agent_id="clerk", status=AgentStatus.PASSIVE, operator="ana", reason="r"
    )
    async with live(db, keys) as kernel:
        await wait_taken(kernel, await anyio.to_thread.run_sync(post, keys, db, status, "ana"))
        remove_principal(keys.keyring, "ana")
        old = keys.key("ana")
        refused_row = await anyio.to_thread.run_sync(post, keys, db, status, "ana")
        await wait_taken(kernel, refused_row)
        (keys.keys / "ana.key").unlink()
        add(keys, "ana")  # a new key under the same name
        assert keys.key("ana") != old
        applied_row = await anyio.to_thread.run_sync(post, keys, db, status, "ana")
        await wait_taken(kernel, applied_row)
        trusted = await kernel.journal.read(types=["OperatorKeyTrusted"])
        revoked = await kernel.journal.read(types=["OperatorKeyRevoked"])
        refusals = await kernel.journal.read(types=["InputRefused"])
    trusts = payloads(trusted, OperatorKeyTrusted)
    assert [t.name for t in trusts] == ["ana", "ana"]
    assert [r.fingerprint for r in payloads(revoked, OperatorKeyRevoked)] == [trusts[0].fingerprint]
    assert [(p.inbox_id, str(p.reason_code)) for p in payloads(refusals, InputRefused)] == [
        (refused_row, "SIGNATURE_INVALID")
    ]


async def test_no_keyring_no_act(
    tmp_path: Path, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DIRK_KEYRING", raising=False)
    db = str(tmp_path / "j.db")
    async with kernel_for(tmp_path / "j.db", clock=SystemClock(), inbox_poll_s=0.05) as kernel:
        await kernel.register(ScriptedAgent())
        status = AgentStatusRequest(
            agent_id="clerk", status=AgentStatus.PASSIVE, operator="ana", reason="r"
        )
        row = await anyio.to_thread.run_sync(post, keys, db, status, "ana")
        await wait_taken(kernel, row)
        [refused] = await kernel.journal.read(types=["InputRefused"])
        assert payload_of(refused, InputRefused).reason_code is ReasonCode.SIGNATURE_INVALID
        assert kernel.projections.agents["clerk"].status is AgentStatus.ACTIVE
