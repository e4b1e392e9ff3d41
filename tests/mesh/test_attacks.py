"""Attacks on the bus, written as the attacker: real clients against a real nats-server.

The server runs the configuration the kernel ships (tests.support.nats): one nkey user
per principal with publish and subscribe allow lists. Each test plays one attacker (no
credential at all, another principal's credential, or the principal allowed to publish
where it attacks, with the real journal id), and then checks: refused (by the server, or
by the kernel and recorded), the kernel still running, the next real flow closing, the
journal verifying. ``admin`` plays a server that grants too much: what the signatures
must still stop when permissions do not.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
import nats
import nats.errors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.client import JetStreamContext

from agents_sdk.serve import handshake
from kernel import FlowStatus, HandshakeRefused, Kernel, Outcome, ReasonCode, Verdict
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import payloads, verify_journal
from kernel.core import keys
from kernel.core.events import (
    ExecutionStarted,
    ExecutionSucceeded,
    InputRefused,
    SubmissionRefused,
)
from kernel.mesh import (
    SIGNATURE_HEADER,
    BusAuth,
    Challenge,
    Hello,
    Refused,
    Result,
    Welcome,
    agent_inbox,
    connect,
    handshake_subject,
    proposal_id,
    proposal_signature,
    recorded_result_holds,
    result_subject,
    serve_executor,
    sign_result,
    verdict_subject,
)
from kernel.policy.contracts import WorkingContext
from kernel.registry import agent_key
from tests.support.helpers import ScriptedAgent, flow_of
from tests.support.hostile import LONE_SURROGATES, hostile_text, hostile_values
from tests.support.mesh_agents import Clerk
from tests.support.mesh_helpers import (
    STEP_S,
    as_admin,
    as_clerk,
    as_executor,
    as_mallory,
    executor,
    host,
    mesh_of,
    meshed,
    principals_of,
    provision,
    relay_of,
    remote_bank,
)
from tests.support.nats import (  # noqa: F401
    NatsServer,
    nats_server_fixture,
    nats_tls_server_fixture,
    principals_fixture,
    raw_send,
)


async def refusals(
    kernel: Any, count: int, match: Callable[[InputRefused], bool] = lambda _: True
) -> list[InputRefused]:
    """Wait until the journal holds ``count`` bus refusals that ``match``; return them.

    Event-driven: the journal's own subscription wakes the wait, never a sleep.
    """
    found: list[InputRefused] = []
    with anyio.fail_after(STEP_S):
        async with kernel.journal.subscribe(1) as batches:
            async for batch in batches:
                found += [
                    e.payload
                    for e in batch
                    if isinstance(e.payload, InputRefused)
                    and e.payload.entry.startswith("bus")
                    and match(e.payload)
                ]
                if len(found) >= count:
                    return found
    raise AssertionError("the journal's subscription ended")  # pragma: no cover


async def refused_submission(kernel: Kernel, code: ReasonCode) -> SubmissionRefused:
    """Wait until the journal holds a SubmissionRefused with ``code``; return it.

    The bus judges proposals concurrently: a proposal's refusal by the DIM may commit
    after the bus refusals of messages sent later. Event-driven, as :func:`refusals`.
    """
    with anyio.fail_after(STEP_S):
        async with kernel.journal.subscribe(1) as batches:
            async for batch in batches:
                for event in batch:
                    payload = event.payload
                    if isinstance(payload, SubmissionRefused) and payload.reason_code is code:
                        return payload
    raise AssertionError("the journal's subscription ended")  # pragma: no cover


async def closes_a_real_flow(kernel: Kernel, server: NatsServer, secret: str) -> None:
    """The next real flow through a real host process closes."""
    async with host(server, secret) as remote:
        [dfid] = await kernel.trigger("bank.invoice")
        with anyio.fail_after(STEP_S):
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        await remote.line(f"DECIDED {dfid}")
    assert kernel.stopped is None


async def verifies(path: Path) -> None:
    report = await verify_journal(path)
    assert report.ok, report


def answer_of(data: bytes) -> Challenge | Welcome | Refused:
    return msgspec.json.decode(data, type=Challenge | Welcome | Refused)


# --- no credential, or another principal's -----------------------------------------


async def test_a_client_without_a_credential_is_refused_by_the_server(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    async with meshed(path, nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        # No credential at all: the server answers the login, and closes.
        handshake_line = b"PUB dirk.mesh.handshake.clerk _INBOX.agent.clerk.x 2\r\nhi\r\n"
        got = await anyio.to_thread.run_sync(raw_send, nats_server, None, handshake_line)
        assert b"Authorization Violation" in got
        # A key the server does not list (a client that made itself one).
        stranger = BusAuth(key=keys.generate(), inbox=agent_inbox("clerk"))
        with pytest.raises(nats.errors.Error):
            await connect(nats_server.url, name="stranger", auth=stranger, reconnect=False)
        # The server recorded both refusals; the kernel runs on.
        assert nats_server.server_log().count("authentication error") >= 2
        await closes_a_real_flow(kernel, nats_server, secret)
    await verifies(path)


SNOOPED = (
    ">",
    "_INBOX.>",
    f"{agent_inbox('clerk')}.>",
    "dirk.mesh.handshake.*",
    "dirk.mesh.handshake.clerk",
    "dirk.evt.>",
    "dirk.work.clerk",
    "dirk.proposals.>",
    "dirk.verdicts.clerk.>",
    "dirk.results.>",
)


async def test_another_principal_reads_no_handshake_inbox_work_verdict_or_relay(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    async with meshed(path, nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        mallory = await as_mallory(nats_server)  # a real principal, with its own grants
        seen: list[str] = []

        async def record(msg: Any) -> None:
            seen.append(msg.subject)

        try:
            for subject in SNOOPED:
                await mallory.subscribe(subject, cb=record)
            with anyio.fail_after(STEP_S):
                refused = await mallory.wait_violations(len(SNOOPED))
            assert all("subscription" in r for r in refused)
            # Stored copies are out of reach too: the relay, other agents' verdicts, its pool.
            js = mallory.jetstream(timeout=1)
            for read in (
                lambda: js.stream_info("DIRK_EVENTS"),
                lambda: js.get_last_msg("DIRK_VERDICTS", "dirk.verdicts.clerk.>", direct=True),
                lambda: js.pull_subscribe_bind(durable="pool-clerk", stream="DIRK_WORK"),
            ):
                with pytest.raises(nats.errors.Error):
                    got = await read()
                    if isinstance(got, JetStreamContext.PullSubscription):
                        await got.fetch(1, timeout=1)  # bind itself asks nothing: the fetch does
            await closes_a_real_flow(kernel, nats_server, secret)
            await relay_of(mesh_of(kernel)).wait_for(kernel.journal.head_seq - 1)
        finally:
            await mallory.close()
        assert seen == []
        assert "Subscription Violation" in nats_server.server_log()
    await verifies(path)


async def test_another_principal_publishes_no_proposal_or_result(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    ledger = tmp_path / "ledger.db"
    principals = principals_of(nats_server)
    remote = remote_bank(nats_server)
    try:
        async with (
            executor(nats_server, ledger, "hold") as slow,
            meshed(path, nats_server, bank=remote) as kernel,
        ):
            await kernel.register(ScriptedAgent())
            [dfid] = await kernel.trigger("bank.invoice")
            key = (await slow.line("HOLDING")).split()[1]
            mallory = await as_mallory(nats_server)
            other = await as_executor(nats_server, "ledger", principals.ledger_key)
            try:
                forged = Result(key=key, receipt=Receipt(external_id="forged"))
                body = msgspec.json.encode(forged)
                # Another agent's host proposes for clerk, another adapter's executor answers
                # for bank (with its own valid signature): the server refuses both.
                await mallory.publish("dirk.proposals.clerk", b"{}", headers={"Nats-Msg-Id": "x"})
                signed = {
                    SIGNATURE_HEADER: sign_result(
                        principals.key(principals.ledger_key), "bank", forged
                    )
                }
                await other.publish(result_subject("bank", key), body, headers=signed)
                await mallory.publish(result_subject("bank", key), body)
                with anyio.fail_after(STEP_S):
                    assert len(await mallory.wait_violations(2)) == 2
                    assert len(await other.wait_violations(1)) == 1
            finally:
                await mallory.close()
                await other.close()
            assert slow.process.stdin is not None
            await slow.process.stdin.send(b"go\n")
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            [done] = payloads(
                await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"]),
                ExecutionSucceeded,
            )
            assert done.external_id == f"ledger-{key}"
            assert remote.refused == 0  # nothing forged ever reached the kernel
            assert "Publish Violation" in nats_server.server_log()
    finally:
        await remote.close()
    await verifies(path)


async def test_another_agent_cannot_have_a_real_proposal_dropped_as_a_duplicate(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    async with meshed(path, nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        journal = kernel.journal.journal_id
        principals = principals_of(nats_server)
        clerk = await as_clerk(nats_server)
        mallory = await as_mallory(nats_server)
        try:
            await handshake(clerk, Clerk(), secret)  # clerk's session, no host taking work
            [dfid] = await kernel.trigger("bank.invoice")
            # Mallory learnt the flow's id and publishes first, where its grants allow (its
            # own subject), every id a host of clerk could be expected to use: the stream
            # is one for every agent and deduplicates ids across all of them.
            work = f"{journal}:{dfid}:1"
            body = b'{"withdraw": {"reason_code": "AGENT_DECLINED", "detail": "no action"}}'
            mine = proposal_signature(agent_key(principals.mallory), work, body)
            stolen = proposal_id(work, "x")
            for msg_id in (work, stolen):
                headers = {"Nats-Msg-Id": msg_id, SIGNATURE_HEADER: mine}
                ack = await mallory.jetstream().publish(
                    "dirk.proposals.mallory", body, headers=headers
                )
                assert not ack.duplicate
            # Not clerk's session, and a digest that is not its Dirk-Sig's: both refused.
            [digest] = await refusals(kernel, 1, lambda r: "digest" in r.detail)
            assert digest.entry == "bus.proposal" and digest.target == stolen
            await refused_submission(kernel, ReasonCode.INVALID_SESSION)
        finally:
            await clerk.close()
            await mallory.close()
        # Clerk's real host decides and publishes: taken, never dropped as a duplicate.
        async with host(nats_server, secret) as remote:
            assert await remote.line("DECIDED") == f"DECIDED {dfid} 1"
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert len(await kernel.journal.read(dfid=dfid, types=["ProposalAccepted"])) == 1
        assert kernel.stopped is None
    await verifies(path)


# --- D2: one message must not stop the kernel ------------------------------------------


def hpub(subject: bytes, header_block: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    """One raw HPUB line: what any client allowed to publish on ``subject`` can send."""
    head = b"NATS/1.0" + header_block + b"\r\n\r\n"
    sizes = f"{len(head)} {len(head) + len(payload)}".encode()
    middle = b" " + reply if reply else b""
    return b"HPUB " + subject + middle + b" " + sizes + b"\r\n" + head + payload + b"\r\n"


async def test_d2_messages_with_the_real_journal_id_are_refused_on_record(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    async with meshed(path, nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        journal = kernel.journal.journal_id
        principals = principals_of(nats_server)
        clerk = await as_clerk(nats_server)  # the attacker may publish exactly here
        try:
            subject = handshake_subject("clerk")
            # A lone surrogate in a manifest (the JSON escape) and in a hello.
            hello = await clerk.request(subject, msgspec.json.encode(Hello()), timeout=STEP_S)
            challenge = answer_of(hello.data)
            assert isinstance(challenge, Challenge) and challenge.journal == journal
            manifest = b'{"agent_id": "clerk", "version": "1.0.0\\ud800"}'
            prove = b'{"type": "prove", "nonce": "%s", "manifest": %s}' % (
                challenge.nonce.encode(),
                manifest,
            )
            for data in (prove, b'{"type": "hello", "x": "\\udcff"}', b"\xff\xfe"):
                refused = answer_of((await clerk.request(subject, data, timeout=STEP_S)).data)
                assert isinstance(refused, Refused)
                assert refused.reason_code is ReasonCode.SCHEMA_INVALID
            # Attempt ids that are digits to str.isdigit() but not to int(), and a non-ASCII
            # Dirk-Sig that made hmac.compare_digest raise, all with the real journal id.
            js = clerk.jetstream()
            for attempt in ("\u00b2", "\u0661", "9" * 5000, "0", "01", "-1"):
                headers = {"Nats-Msg-Id": f"{journal}:abc:{attempt}"}
                await js.publish("dirk.proposals.clerk", b"{}", headers=headers)
            wrong_sig = {"Nats-Msg-Id": f"{journal}:nosuchflow:1", SIGNATURE_HEADER: "\u00b2"}
            await js.publish("dirk.proposals.clerk", b"{}", headers=wrong_sig)
        finally:
            await clerk.close()
        # Bytes nats.py cannot build (a reply subject, a status line that is not UTF-8) on
        # the handshake; status lines into the proposals stream (JetStream stores them
        # without the status: the first arrives with no id, the second as an unsigned 1).
        inbox = b"_INBOX.agent.clerk.y"
        lines = b"PUB dirk.mesh.handshake.clerk _INBOX.agent.clerk.\xff 2\r\nhi\r\n"
        # An answer asked for on an inbox others read: never sent, refused on record.
        lines += b'PUB dirk.mesh.handshake.clerk _INBOX.stolen.1 16\r\n{"type":"hello"}\r\n'
        lines += hpub(b"dirk.mesh.handshake.clerk", b" \xff\xff", b"{}", reply=inbox)
        lines += hpub(b"dirk.proposals.clerk", b" \xff\xff", b"{}")
        lines += hpub(
            b"dirk.proposals.clerk", b" 503\r\nNats-Msg-Id: " + journal.encode() + b":abc:1", b"{}"
        )
        got = raw_send(nats_server, agent_key(principals.clerk), lines)
        assert b"-ERR" not in got  # the server passed every one of them on
        # Each refused on record: 4 handshakes, 6 ids, 2 drops, 1 stored without an id.
        found = await refusals(kernel, 13)
        assert any(r.field == "reply" and r.reason_code is ReasonCode.UNAUTHORIZED for r in found)
        entries = sorted({r.entry for r in found})
        assert entries == ["bus", "bus.handshake", "bus.proposal"]
        assert any("²" in r.target for r in found) and all(r.detail for r in found)
        # The forged signature was judged as no session's: refused by the DIM, on record.
        await refused_submission(kernel, ReasonCode.INVALID_SESSION)
        assert kernel.stopped is None
        assert mesh_of(kernel).nc.is_connected and mesh_of(kernel).nc.dropped == 2
        await closes_a_real_flow(kernel, nats_server, secret)
    await verifies(path)


async def test_a_withdrawal_with_hostile_text_is_recorded_readably(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    async with meshed(path, nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        nc = await as_clerk(nats_server)
        try:
            welcome = await handshake(nc, Clerk(), secret)
            work = await nc.jetstream().pull_subscribe_bind(
                durable=welcome.consumer, stream="DIRK_WORK"
            )
            dfids = [d for _ in range(2) for d in await kernel.trigger("bank.invoice")]
            journal = kernel.journal.journal_id
            for n, detail in enumerate((b'"\\ud800 \\u001b]0;pwned\\u0007"', b'"ok \\u009b31m"')):
                [msg] = await work.fetch(1, timeout=STEP_S)
                ctx = msgspec.json.decode(msg.data, type=WorkingContext)
                body = b'{"withdraw": {"reason_code": ["AGENT_ERROR"], "detail": %s}}' % detail
                msg_id = f"{journal}:{ctx.dfid}:{ctx.attempt}"
                signature = proposal_signature(agent_key(secret), msg_id, body)
                answers = await nc.subscribe(verdict_subject("clerk", journal, ctx.dfid, 1))
                headers = {"Nats-Msg-Id": msg_id, SIGNATURE_HEADER: signature}
                await nc.jetstream().publish("dirk.proposals.clerk", body, headers=headers)
                raw = await answers.next_msg(timeout=STEP_S)
                verdict = msgspec.json.decode(raw.data, type=Verdict)
                # The first is not JSON msgspec takes (a lone surrogate): judged invalid; the
                # second withdraws, its odd reason code read as AGENT_ERROR.
                if n == 0:
                    assert verdict.outcome is Outcome.REJECTED
                    assert verdict.reason_code is ReasonCode.SCHEMA_INVALID
                else:
                    assert verdict.outcome is Outcome.ABORTED
                    assert verdict.reason_code is ReasonCode.AGENT_ERROR
                await msg.ack()
            assert set(dfids) >= {ctx.dfid}
        finally:
            await nc.close()
        assert kernel.stopped is None
        await closes_a_real_flow(kernel, nats_server, secret)
    await verifies(path)


# --- D3: forged executor results ---------------------------------------------------------


async def test_d3_forged_results_are_refused_on_record_and_the_real_one_is_taken(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    ledger = tmp_path / "ledger.db"
    principals = principals_of(nats_server)
    remote = remote_bank(nats_server)
    try:
        async with (
            executor(nats_server, ledger, "hold") as slow,
            meshed(path, nats_server, bank=remote) as kernel,
        ):
            await kernel.register(ScriptedAgent())
            [dfid] = await kernel.trigger("bank.invoice")
            key = (await slow.line("HOLDING")).split()[1]  # the effect is made, no answer yet
            forger = await as_admin(nats_server)  # a grant too wide: only signatures stop it
            try:
                subject = result_subject("bank", key)
                receipt = Result(key=key, receipt=Receipt(external_id="forged-by-bystander"))
                failure = Result(key=key, error="declined by the bank")
                wrong = principals.key(principals.ledger_key)
                for body, headers in (
                    (msgspec.json.encode(receipt), {}),  # a success with the real id lost
                    (msgspec.json.encode(failure), {}),  # a failure while the effect happened
                    (b"\x00junk", {}),  # junk: outcome unknown
                    (
                        msgspec.json.encode(receipt),  # signed, by another executor's key
                        {SIGNATURE_HEADER: sign_result(wrong, "bank", receipt)},
                    ),
                ):
                    await forger.publish(subject, body, headers=headers)
            finally:
                await forger.close()
            found = await refusals(kernel, 4, lambda r: r.entry == "bus.result")
            assert {r.reason_code for r in found} == {ReasonCode.UNAUTHORIZED}
            # Nothing forged was recorded: the flow still waits on its real executor.
            assert flow_of(kernel, dfid).status is FlowStatus.EXECUTING
            assert slow.process.stdin is not None
            await slow.process.stdin.send(b"go\n")
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            [done] = payloads(
                await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"]),
                ExecutionSucceeded,
            )
            assert done.external_id == f"ledger-{key}"
            assert recorded_result_holds(done, "bank", principals.bank_public)
            assert not await kernel.journal.read(dfid=dfid, types=["ExecutionFailed"])
            assert kernel.stopped is None
    finally:
        await remote.close()
    await verifies(path)


async def test_d3_a_phantom_result_stored_before_any_executor_runs_is_not_taken(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    ledger = tmp_path / "ledger.db"
    principals = principals_of(nats_server)
    remote = remote_bank(nats_server)
    try:
        async with meshed(path, nats_server, bank=remote) as kernel:
            await remote.connect()
            forger = await as_admin(nats_server)
            try:
                intents = await forger.subscribe("dirk.intents.bank")
                await kernel.register(ScriptedAgent())
                [dfid] = await kernel.trigger("bank.invoice")
                intent = await intents.next_msg(timeout=STEP_S)  # no executor is running
                key = json.loads(intent.data)["key"]
                phantom = Result(key=key, receipt=Receipt(external_id="phantom"))
                await forger.jetstream().publish(  # stored, where executors read results
                    result_subject("bank", key), msgspec.json.encode(phantom)
                )
            finally:
                await forger.close()
            await refusals(kernel, 1, lambda r: r.entry == "bus.result")
            # The executor that starts now finds the phantom stored, refuses it, and does
            # the work itself: the journal records the real effect, never the phantom.
            async with executor(nats_server, ledger):
                with anyio.fail_after(STEP_S):
                    assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            [done] = payloads(
                await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"]),
                ExecutionSucceeded,
            )
            assert done.external_id == f"ledger-{key}"
            assert recorded_result_holds(done, "bank", principals.bank_public)
    finally:
        await remote.close()
    from tests.mesh.test_mesh import ledger_counts

    assert ledger_counts(ledger) == (1, 1)
    await verifies(path)


# --- D4: what a reader of everything learns -----------------------------------------------


async def test_d4_a_reader_of_everything_sees_no_credential_and_no_session_token(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    async with meshed(path, nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        sniffer = await as_admin(nats_server)  # a grant too wide: it reads every subject
        heard: list[bytes] = []

        async def listen(msg: Any) -> None:
            heard.append(msg.subject.encode() + repr(msg.headers).encode() + msg.data)

        try:
            await sniffer.subscribe(">", cb=listen)
            await sniffer.flush()
            await closes_a_real_flow(kernel, nats_server, secret)
            await sniffer.flush()
        finally:
            await sniffer.close()
        token = mesh_of(kernel).sessions["clerk"].session.token
        wire = b"\n".join(heard)
        assert b"dirk.mesh.handshake.clerk" in wire and b"dirk.proposals.clerk" in wire
        assert secret.encode() not in wire
        assert token.encode() not in wire
        # Replaying what it heard gains nothing: a proposal signed for one id, sent again,
        # is a duplicate; a challenge's proof cannot answer another challenge.
    await verifies(path)


# --- every subject the kernel listens on, hostile bytes -----------------------------------


def _header_bytes(text: str) -> bytes:
    # A header line cannot carry CR or LF (they frame the protocol), anything else goes.
    return text.encode("utf-8", "surrogatepass").replace(b"\r", b"").replace(b"\n", b"")


hostile_payload = st.one_of(
    st.binary(max_size=120),
    hostile_values(max_leaves=8).map(
        lambda v: json.dumps(v, ensure_ascii=True, default=repr).encode()
    ),
    hostile_text(max_size=30).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
hostile_attempt = st.one_of(
    st.sampled_from(["\u00b2", "\u0661", "9" * 5000, "0", "1", "-1", "1e3", " 1"]),
    hostile_text(max_size=12),
)


@st.composite
def hostile_messages(draw: st.DrawFn, journal: str) -> bytes:
    """Raw protocol lines, as the clerk's host may send them, with the real journal id."""
    lines = b""
    for _ in range(draw(st.integers(1, 4))):
        payload = draw(hostile_payload)
        reply = b"_INBOX.agent.clerk." + _header_bytes(draw(hostile_text(max_size=8))).replace(
            b" ", b""
        )
        lines += b"PUB dirk.mesh.handshake.clerk " + (reply if reply.strip() else b"x") + b" "
        lines += str(len(payload)).encode() + b"\r\n" + payload + b"\r\n"
    for _ in range(draw(st.integers(1, 4))):
        dfid = _header_bytes(draw(hostile_text(max_size=20)))
        attempt = _header_bytes(draw(hostile_attempt))
        block = b"\r\nNats-Msg-Id: " + journal.encode() + b":" + dfid + b":" + attempt
        block += b"\r\n" + SIGNATURE_HEADER.encode() + b": "
        block += _header_bytes(draw(hostile_text(max_size=90)))
        if draw(st.booleans()):
            block = b" " + _header_bytes(draw(hostile_text(max_size=6))) + block
        lines += hpub(b"dirk.proposals.clerk", block, draw(hostile_payload))
    return lines


@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_hostile_bytes_on_every_subject_the_kernel_hears_never_stop_it(
    tmp_path_factory: pytest.TempPathFactory, nats_server: NatsServer, data: st.DataObject
) -> None:
    principals = principals_of(nats_server)

    async def main() -> None:
        path = tmp_path_factory.mktemp("hostile") / "j.db"
        async with meshed(path, nats_server) as kernel:
            secret = await provision(kernel, nats_server)
            journal = kernel.journal.journal_id
            lines = data.draw(hostile_messages(journal))
            await anyio.to_thread.run_sync(
                raw_send, nats_server, agent_key(principals.clerk), lines
            )
            clerk = await as_clerk(nats_server)
            try:
                # A sentinel after them all: once it is refused, the kernel has taken them.
                headers = {"Nats-Msg-Id": f"{journal}:sentinel:\u00b2"}
                await clerk.jetstream().publish("dirk.proposals.clerk", b"{}", headers=headers)
                await refusals(kernel, 1, lambda r: "sentinel" in r.target)
                # Still running, and the real host's handshake is still answered.
                assert isinstance(await handshake(clerk, Clerk(), secret), Welcome)
                assert kernel.stopped is None and mesh_of(kernel).nc.is_connected
            finally:
                await clerk.close()
        await verifies(path)

    anyio.run(main)


# --- TLS -----------------------------------------------------------------------------------


async def test_the_mesh_runs_over_tls_with_certificates_made_here(
    tmp_path: Path, nats_tls_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    assert nats_tls_server.url.startswith("tls://")
    async with meshed(path, nats_tls_server) as kernel:
        secret = await provision(kernel, nats_tls_server)
        await closes_a_real_flow(kernel, nats_tls_server, secret)  # the host trusts the CA
        # A client that does not trust the test CA gets no connection.
        with pytest.raises(ssl.SSLCertVerificationError):
            await nats.connect(nats_tls_server.url, allow_reconnect=False)
    await verifies(path)


def test_lone_surrogates_are_among_what_the_property_test_draws() -> None:
    # The property test above is only as good as its strings: it must draw them.
    assert "\ud800" in LONE_SURROGATES
    with pytest.raises(UnicodeEncodeError):
        "\ud800".encode()
    assert _header_bytes("\ud800") == b"\xed\xa0\x80"


async def test_a_refused_handshake_never_displaces_the_live_session(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    async with meshed(path, nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        async with host(nats_server, secret) as remote:
            clerk = await as_clerk(nats_server)
            try:
                held = mesh_of(kernel).sessions["clerk"]
                # A proof made for one challenge does not answer another (a replay).
                subject = handshake_subject("clerk")
                first = answer_of((await clerk.request(subject, b'{"type":"hello"}')).data)
                assert isinstance(first, Challenge)
                with pytest.raises(HandshakeRefused) as refused:
                    await handshake(clerk, Clerk(), secret + "x")
                assert refused.value.reason_code is ReasonCode.CREDENTIAL_INVALID
                assert mesh_of(kernel).sessions["clerk"] is held
            finally:
                await clerk.close()
            [dfid] = await kernel.trigger("bank.invoice")
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            await remote.line(f"DECIDED {dfid}")
    await verifies(path)


class Echo:
    """An adapter in the test's own process: its receipt names the intent."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        return Receipt(external_id=f"echo-{intent.key}")


async def started_key(kernel: Kernel) -> str:
    """Wait for the first ExecutionStarted; return its intent's key (event-driven)."""
    with anyio.fail_after(STEP_S):
        async with kernel.journal.subscribe(1) as batches:
            async for batch in batches:
                for event in batch:
                    if isinstance(event.payload, ExecutionStarted):
                        return event.payload.intent.key
    raise AssertionError("the journal's subscription ended")  # pragma: no cover


@st.composite
def hostile_results(draw: st.DrawFn, subject: bytes) -> bytes:
    """Raw lines an executor principal may send on the result subject of a waiting intent."""
    lines = b""
    for _ in range(draw(st.integers(1, 5))):
        block = b"\r\n" + SIGNATURE_HEADER.encode() + b": "
        block += _header_bytes(draw(hostile_text(max_size=90)))
        if draw(st.booleans()):
            block = b" " + _header_bytes(draw(hostile_text(max_size=6))) + block
        lines += hpub(subject, block, draw(hostile_payload))
    return lines


@settings(
    max_examples=4,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_hostile_results_never_decide_what_the_journal_records(
    tmp_path_factory: pytest.TempPathFactory, nats_server: NatsServer, data: st.DataObject
) -> None:
    principals = principals_of(nats_server)

    async def main() -> None:
        path = tmp_path_factory.mktemp("results") / "j.db"
        remote = remote_bank(nats_server)
        try:
            async with meshed(path, nats_server, bank=remote) as kernel:
                # The streams exist before anything is published: what comes before the
                # adapter listens is stored, and the adapter reads the store first.
                await remote.connect()
                await kernel.register(ScriptedAgent())
                [dfid] = await kernel.trigger("bank.invoice")
                key = await started_key(kernel)  # no executor yet: the adapter waits
                subject = result_subject("bank", key).encode()
                lines = data.draw(hostile_results(subject))
                bank = principals.key(principals.bank_key)
                await anyio.to_thread.run_sync(raw_send, nats_server, bank, lines)
                # A sentinel after them (on its own connection: the server may have closed
                # the raw one): once it is refused, everything before it was taken.
                sentinel = msgspec.json.encode(Result(key="sentinel", error="x"))
                executor_client = await as_executor(nats_server, "bank", principals.bank_key)
                try:
                    await executor_client.publish(subject.decode(), sentinel)
                    await executor_client.flush()
                finally:
                    await executor_client.close()
                await refusals(kernel, 1, lambda r: "another intent" in r.detail)
                assert flow_of(kernel, dfid).status is FlowStatus.EXECUTING
                # The real executor finds only unsigned junk stored, and does the work.
                async with anyio.create_task_group() as tg:
                    ready = anyio.Event()
                    serve = partial(
                        serve_executor, nats_server.url, "bank", Echo(), key=bank, ready=ready
                    )
                    tg.start_soon(serve)
                    with anyio.fail_after(STEP_S):
                        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                    tg.cancel_scope.cancel()
                [done] = payloads(
                    await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"]),
                    ExecutionSucceeded,
                )
                assert done.external_id == f"echo-{key}"
                assert recorded_result_holds(done, "bank", principals.bank_public)
                assert kernel.stopped is None
        finally:
            await remote.close()
        await verifies(path)

    anyio.run(main)
