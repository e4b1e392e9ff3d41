"""The agent mesh against a real nats-server with the shipped permissions: hosts, executors, faults.

Hosts and executors are real processes (``python -m agents_sdk.serve``, ``python -m
kernel.mesh.executor``) logged in as their principals; a crash is a SIGKILL. The attacks
on the bus are in test_attacks.py.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import nats.js.errors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from agents_sdk.serve import handshake
from kernel import FlowStatus, HandshakeRefused, Kernel, Outcome, ReasonCode, Verdict
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import payload_of, payloads
from kernel.core import keys
from kernel.core.events import (
    AgentRefused,
    ExecutionStarted,
    ExecutionSucceeded,
    SubmissionRefused,
    is_derived,
)
from kernel.mesh import (
    SIGNATURE_HEADER,
    Challenge,
    Refused,
    Result,
    handshake_subject,
    open_mesh,
    proposal_id,
    proposal_signature,
    recorded_result_holds,
    result_subject,
    serve_executor,
    sign_result,
    verdict_subject,
)
from kernel.policy.contracts import WorkingContext, to_record
from kernel.registry import agent_key, new_credential
from tests.support.helpers import ScriptedAgent, flow_of, kernel_for, transfer
from tests.support.mesh_agents import Clerk
from tests.support.mesh_helpers import (
    EXECUTOR_ACK_WAIT_S,
    FAST,
    STEP_S,
    as_admin,
    as_clerk,
    as_reader,
    executor,
    host,
    meshed,
    principals_of,
    provision,
    relay_of,
    remote_bank,
)
from tests.support.nats import (  # noqa: F401
    NatsServer,
    nats_server_fixture,
    principals_fixture,
    reset_bus,
)


async def submitted(kernel: Kernel, dfid: str) -> int:
    return len(await kernel.journal.read(dfid=dfid, types=["ProposalSubmitted"]))


async def test_a_remote_agent_and_an_in_process_one_close_their_flows(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        await kernel.register(ScriptedAgent("auditor"))  # in process, beside the remote clerk
        async with host(nats_server, secret) as remote:
            dfids = await kernel.trigger("bank.invoice")
            assert len(dfids) == 2
            with anyio.fail_after(STEP_S):
                flows = [await kernel.wait_flow(dfid) for dfid in dfids]
            assert {f.status for f in flows} == {FlowStatus.CLOSED}
            [clerk_flow] = [f for f in flows if f.agent_id == "clerk"]
            assert (await remote.line("DECIDED")).split()[1] == clerk_flow.dfid
            assert await submitted(kernel, clerk_flow.dfid) == 1


async def test_no_handshake_without_the_credential_and_the_live_session_survives(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server) as kernel:
        # Logged in as clerk's hosts, but nothing provisioned: the kernel refuses even the
        # right credential.
        nc = await as_clerk(nats_server)
        try:
            with pytest.raises(HandshakeRefused) as refused:
                await handshake(nc, Clerk(), principals_of(nats_server).clerk)
            assert refused.value.reason_code is ReasonCode.CREDENTIAL_INVALID
            secret = await provision(kernel, nats_server)
            async with host(nats_server, secret) as remote:
                for shown in (None, new_credential(), secret + "x"):
                    with pytest.raises(HandshakeRefused) as refused:
                        await handshake(nc, Clerk(), shown)
                    assert refused.value.reason_code is ReasonCode.CREDENTIAL_INVALID
                refusals = await kernel.journal.read(types=["AgentRefused"])
                assert len(refusals) == 4
                assert {p.reason_code for p in payloads(refusals, AgentRefused)} == {
                    ReasonCode.CREDENTIAL_INVALID
                }
                # The live host's session was not displaced: its next flow closes.
                [dfid] = await kernel.trigger("bank.invoice")
                with anyio.fail_after(STEP_S):
                    assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                await remote.line(f"DECIDED {dfid}")
        finally:
            await nc.close()


async def test_a_host_killed_mid_decide_costs_a_redelivery_to_another(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        async with host(nats_server, secret, mode="hang") as stuck:
            [dfid] = await kernel.trigger("bank.invoice")
            assert await stuck.line("DECIDING") == f"DECIDING {dfid}"
            async with host(nats_server, secret) as spare:
                stuck.kill()  # SIGKILL in the middle of decide()
                assert await spare.line("DECIDED") == f"DECIDED {dfid} 1"
                with anyio.fail_after(STEP_S):
                    assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert await submitted(kernel, dfid) == 1
        assert len(await kernel.journal.read(dfid=dfid, types=["ProposalAccepted"])) == 1


async def test_a_recorded_proposal_is_answered_from_the_record_never_judged_twice(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        nc = await as_clerk(nats_server)
        js = nc.jetstream()
        # A host by hand: it takes the context, publishes its proposal twice, and dies
        # before it acks (the connection closes without an ack).
        welcome = await handshake(nc, Clerk(), secret)
        work = await js.pull_subscribe_bind(durable=welcome.consumer, stream="DIRK_WORK")
        [dfid] = await kernel.trigger("bank.invoice")
        with anyio.fail_after(STEP_S):
            [msg] = await work.fetch(1, timeout=STEP_S)
        ctx = msgspec.json.decode(msg.data, type=WorkingContext)
        assert (ctx.dfid, ctx.attempt) == (dfid, 1)
        body = json.dumps({"proposal": msgspec.to_builtins(to_record(transfer()(ctx)))}).encode()
        journal = kernel.journal.journal_id
        work_id = f"{journal}:{dfid}:1"
        signature = proposal_signature(agent_key(secret), work_id, body)
        headers = {"Nats-Msg-Id": proposal_id(work_id, signature), SIGNATURE_HEADER: signature}
        answers = await nc.subscribe(verdict_subject("clerk", journal, dfid, 1), max_msgs=1)
        first = await js.publish("dirk.proposals.clerk", body, headers=headers)
        again = await js.publish("dirk.proposals.clerk", body, headers=headers)
        assert not first.duplicate and again.duplicate  # the duplicate publish is absorbed
        verdict = msgspec.json.decode((await answers.next_msg(timeout=STEP_S)).data, type=Verdict)
        assert verdict.outcome is Outcome.ACCEPTED
        await nc.close()

        async with host(nats_server, secret) as spare:
            await spare.line("agents_sdk.serve: flow " + dfid)  # judged already: not decided
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            assert not any(line.startswith("DECIDED") for line in spare.lines)
        assert await submitted(kernel, dfid) == 1


async def test_a_forged_proposal_is_refused_on_record(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        nc = await as_clerk(nats_server)
        try:
            js = nc.jetstream()
            welcome = await handshake(nc, Clerk(), secret)
            work = await js.pull_subscribe_bind(durable=welcome.consumer, stream="DIRK_WORK")
            [dfid] = await kernel.trigger("bank.invoice")
            [msg] = await work.fetch(1, timeout=STEP_S)
            ctx = msgspec.json.decode(msg.data, type=WorkingContext)
            body = json.dumps({"proposal": msgspec.to_builtins(to_record(transfer()(ctx)))})
            journal = kernel.journal.journal_id
            msg_id = f"{journal}:{dfid}:1"
            # Signed, but by another key than the one the session was proven with.
            forged = proposal_signature(keys.generate(), msg_id, body.encode())
            headers = {"Nats-Msg-Id": msg_id, SIGNATURE_HEADER: forged}
            answers = await nc.subscribe(verdict_subject("clerk", journal, dfid, 1), max_msgs=1)
            await js.publish("dirk.proposals.clerk", body.encode(), headers=headers)
            raw = await answers.next_msg(timeout=STEP_S)
            verdict = msgspec.json.decode(raw.data, type=Verdict)
            assert verdict.outcome is Outcome.REFUSED
            assert verdict.reason_code is ReasonCode.INVALID_SESSION
            [refused] = await kernel.journal.read(dfid=dfid, types=["SubmissionRefused"])
            assert payload_of(refused, SubmissionRefused).reason_code is ReasonCode.INVALID_SESSION
            assert flow_of(kernel, dfid).attempts == 0
        finally:
            await nc.close()


junk = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda v: json.dumps(v).encode(),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=10), inner, max_size=3)
            ),
            max_leaves=10,
        ),
    ),
    st.builds(
        lambda agent, cred: json.dumps(
            {"manifest": {"agent_id": agent, "version": "1.0.0"}, "credential": cred}
        ).encode(),
        st.sampled_from(["clerk", "mallory", "a.b", "*", ""]),
        st.none() | st.text(max_size=40),
    ),
)


@settings(
    max_examples=4,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    handshakes=st.lists(junk, min_size=1, max_size=8),
    proposals=st.lists(st.tuples(st.text(max_size=30), junk), max_size=8),
)
def test_whatever_reaches_the_bus_is_refused_and_the_kernel_goes_on(
    tmp_path_factory: pytest.TempPathFactory,
    nats_server: NatsServer,
    handshakes: list[bytes],
    proposals: list[tuple[str, bytes]],
) -> None:
    async def main() -> None:
        async with meshed(tmp_path_factory.mktemp("mesh") / "j.db", nats_server) as kernel:
            secret = await provision(kernel, nats_server)
            nc = await as_clerk(nats_server)
            try:
                js = nc.jetstream()
                for data in handshakes:
                    reply = await nc.request(handshake_subject("clerk"), data, timeout=STEP_S)
                    answer = msgspec.json.decode(reply.data, type=Refused | Challenge)
                    assert isinstance(answer, Refused)
                for msg_id, data in proposals:
                    headers = {"Nats-Msg-Id": msg_id or "x"}
                    await js.publish("dirk.proposals.clerk", data, headers=headers)
                # The kernel is still up and serves the real host.
                await handshake(nc, Clerk(), secret)
                assert kernel.stopped is None
            finally:
                await nc.close()

    anyio.run(main)


async def test_after_a_nats_server_restart_hosts_and_kernel_reconnect(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server) as kernel:
        secret = await provision(kernel, nats_server)
        async with host(nats_server, secret) as remote:
            [before] = await kernel.trigger("bank.invoice")
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(before)).status is FlowStatus.CLOSED
            await anyio.to_thread.run_sync(nats_server.restart)
            # Triggered while the clients may still be reconnecting: nothing is lost.
            dfids = [d for _ in range(3) for d in await kernel.trigger("bank.invoice")]
            with anyio.fail_after(STEP_S):
                for dfid in dfids:
                    assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                    await remote.line(f"DECIDED {dfid}")
            assert kernel.stopped is None


async def test_a_stuck_agent_pool_holds_triggers_back_instead_of_queueing(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    async with meshed(tmp_path / "j.db", nats_server, max_in_flight=2) as kernel:
        secret = await provision(kernel, nats_server)
        async with host(nats_server, secret, mode="hang") as stuck:
            first = [d for _ in range(2) for d in await kernel.trigger("bank.invoice")]
            await stuck.line("DECIDING")
            later: list[str] = []

            async def third() -> None:
                later.extend(await kernel.trigger("bank.invoice"))

            async with host(nats_server, secret) as spare:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(third)  # waits for room: two flows are already moving
                    stuck.kill()
                    with anyio.fail_after(STEP_S):
                        for dfid in first:
                            assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                [dfid] = later
                with anyio.fail_after(STEP_S):
                    assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                await spare.line(f"DECIDED {dfid}")
        # The third flow opened only once the first two had made room: the queue is bounded.
        created = await kernel.journal.read(dfid=dfid, types=["FlowCreated"])
        closed = [e for d in first for e in await kernel.journal.read(dfid=d, types=["FlowClosed"])]
        assert created[0].seq > min(e.seq for e in closed)


async def relayed(server: NatsServer) -> list[tuple[str | None, dict[str, Any], str]]:
    """Every message in DIRK_EVENTS, as the relay's reader reads it: (subject, event, id)."""
    nc = await as_reader(server)
    try:
        js = nc.jetstream()
        info = await js.stream_info("DIRK_EVENTS")
        out: list[tuple[str | None, dict[str, Any], str]] = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg("DIRK_EVENTS", seq)
            out.append(
                (msg.subject, json.loads(msg.data or b""), (msg.headers or {})["Nats-Msg-Id"])
            )
        return out
    finally:
        await nc.close()


async def test_the_relay_publishes_each_committed_event_once_across_restarts(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    await reset_bus(nats_server)
    nc = await as_admin(nats_server)
    with contextlib.suppress(Exception):
        await nc.jetstream().delete_stream("DIRK_EVENTS")
    await nc.close()
    path = tmp_path / "j.db"
    for _ in range(2):  # the second run resumes from the stored position
        async with (
            kernel_for(path) as kernel,
            open_mesh(kernel, nats_server.url, FAST, auth=nats_server.kernel) as mesh,
        ):
            await kernel.register(ScriptedAgent())
            [dfid] = await kernel.trigger("bank.invoice")
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                await relay_of(mesh).wait_for(kernel.journal.head_seq)
            journal_id = kernel.journal.journal_id
    async with kernel_for(path) as kernel:
        events = await kernel.journal.read()
        head = kernel.journal.head_seq
    published = await relayed(nats_server)
    # The last run's KernelStopped (and this reader's start) came after its relay stopped.
    seqs = [event["seq"] for _, event, _ in published]
    ids = [msg_id for _, _, msg_id in published]
    assert len(set(ids)) == len(ids)  # none twice (a derived event has an id of its own)
    assert sorted(set(seqs)) == list(range(1, max(seqs) + 1)) and max(seqs) < head  # none lost
    # The first run's last events (its KernelStopped) were published by the second run.
    assert [e["payload"]["type"] for _, e, _ in published].count("KernelStopped") == 1
    nth = 0  # the second event a row stands for (an acceptance's start) is "++"
    for (subject, event, msg_id), recorded in zip(published, events, strict=False):
        nth = nth + 1 if is_derived(recorded) else 0
        assert msg_id == f"{journal_id}:{recorded.seq}" + "+" * nth
        assert event["payload"]["type"] == type(recorded.payload).__name__
        assert subject == f"dirk.evt.{event['payload']['type']}.{recorded.dfid or '_'}"


async def test_an_executor_killed_after_its_effect_duplicates_nothing(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    await reset_bus(nats_server)
    ledger = tmp_path / "ledger.db"
    remote = remote_bank(nats_server)
    try:
        async with executor(nats_server, ledger, mode="die_after_effect") as dying:
            async with kernel_for(tmp_path / "j.db", bank=remote) as kernel:
                await kernel.register(ScriptedAgent())
                [dfid] = await kernel.trigger("bank.invoice")
                key = (await dying.line("EFFECT")).split()[1]
                with anyio.fail_after(STEP_S):
                    await dying.process.wait()  # SIGKILLed after the effect, before its result
                async with executor(nats_server, ledger):
                    with anyio.fail_after(STEP_S):
                        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                [started] = await kernel.journal.read(dfid=dfid, types=["ExecutionStarted"])
                [done] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
                succeeded = payload_of(done, ExecutionSucceeded)
                assert started.seq < done.seq
                assert payload_of(started, ExecutionStarted).intent.key == key
                assert succeeded.external_id == f"ledger-{key}"
                # The record keeps the executors' signature: it checks with their public key.
                bank = principals_of(nats_server).bank_public
                assert recorded_result_holds(succeeded, "bank", bank)
    finally:
        await remote.close()
    assert ledger_counts(ledger) == (2, 1)  # redelivered once, deduplicated by key: one effect


def ledger_counts(ledger: Path) -> tuple[int, int]:
    """The executors' ledger: (adapter calls, effects carried out)."""
    with closing(sqlite3.connect(ledger)) as conn:
        calls = conn.execute("SELECT count(*) FROM calls").fetchone()[0]
        effects = conn.execute("SELECT count(*) FROM effects").fetchone()[0]
    return calls, effects


async def ack_wait_passes(server: NatsServer, ack_wait_s: float, times: int) -> None:
    """Return once the server's clock has run ``times`` of ``ack_wait_s`` from now.

    A probe message is delivered and never acked: each time the server hands it out
    again, one ``ack_wait_s`` has passed on its clock (the wait is the server's
    redelivery, not a sleep).
    """
    nc = await as_admin(server)
    js = nc.jetstream()
    try:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream("TEST_CLOCK")
        await js.add_stream(StreamConfig(name="TEST_CLOCK", subjects=["test.clock"]))
        consumer = ConsumerConfig(
            durable_name="clock", ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait_s
        )
        await js.add_consumer("TEST_CLOCK", consumer)
        probe = await js.pull_subscribe_bind(durable="clock", stream="TEST_CLOCK")
        await js.publish("test.clock", b"tick")
        for delivery in range(1, times + 2):
            with anyio.fail_after(STEP_S):
                [msg] = await probe.fetch(1, timeout=STEP_S)
            assert msg.metadata.num_delivered == delivery
    finally:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream("TEST_CLOCK")
        await nc.close()


async def test_a_slow_executor_keeps_its_intent_and_no_other_executor_runs_it(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    await reset_bus(nats_server)
    ledger = tmp_path / "ledger.db"
    ack_wait_s = 3.0  # in-progress acks every 0.75 s: a loaded machine has 2.25 s to spare
    remote = remote_bank(nats_server, ack_wait_s=ack_wait_s)
    try:
        async with executor(nats_server, ledger, "hold", ack_wait_s) as slow:
            async with kernel_for(tmp_path / "j.db", bank=remote) as kernel:
                await kernel.register(ScriptedAgent())
                [dfid] = await kernel.trigger("bank.invoice")
                key = (await slow.line("HOLDING")).split()[1]
                # An idle executor pulls beside the slow one, which holds the intent
                # for two of its ack_waits: in-progress acks keep it there.
                async with executor(nats_server, ledger, "", ack_wait_s):
                    await ack_wait_passes(nats_server, ack_wait_s, 2)
                    nc = await as_admin(nats_server)
                    try:
                        info = await nc.jetstream().consumer_info("DIRK_INTENTS", "exec-bank")
                    finally:
                        await nc.close()
                    assert (info.delivered.consumer_seq, info.num_redelivered) == (1, 0)
                    assert slow.process.stdin is not None
                    await slow.process.stdin.send(b"go\n")
                    with anyio.fail_after(STEP_S):
                        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                [done] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
                assert payload_of(done, ExecutionSucceeded).external_id == f"ledger-{key}"
    finally:
        await remote.close()
    assert ledger_counts(ledger) == (1, 1)  # carried out once, by the slow executor alone


async def test_a_result_is_taken_from_its_notification_even_before_the_stream_has_it(
    nats_server: NatsServer,
) -> None:
    await reset_bus(nats_server)
    # ack_wait as long as the step: the stream is not read again within the test.
    remote = remote_bank(nats_server, ack_wait_s=STEP_S)
    intent = ExecutionIntent(key="flow-1:0", kind="transfer", adapter="bank")
    nc = await as_admin(nats_server)  # watches the intents: an executor by hand
    bank = principals_of(nats_server).key(principals_of(nats_server).bank_key)
    receipts: list[Receipt] = []

    async def call() -> None:
        receipts.append(await remote.execute(intent))

    try:
        intents = await nc.subscribe("dirk.intents.bank")
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(STEP_S):
                await intents.next_msg(timeout=STEP_S)  # an executor by hand took it
            # The stream stores a result a moment after its subscribers got it (here:
            # never, it is gone); the notification alone answers the call.
            await nc.jetstream().delete_stream("DIRK_RESULTS")
            result = Result(key=intent.key, receipt=Receipt(external_id="by-hand"))
            subject = result_subject("bank", intent.key)
            await nc.publish(subject, b"not a result")
            headers = {SIGNATURE_HEADER: sign_result(bank, "bank", result)}
            await nc.publish(subject, msgspec.json.encode(result), headers=headers)
        assert [r.external_id for r in receipts] == ["by-hand"]
        assert remote.refused == 1  # the junk before it was refused, not taken
    finally:
        await nc.close()
        await remote.close()


class Echo:
    """An adapter in the test's own process: its receipt names the intent."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        return Receipt(external_id=f"echo-{intent.key}")


@settings(
    max_examples=4,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(intents=st.lists(junk, min_size=1, max_size=6))
def test_whatever_reaches_an_executor_is_terminated_and_it_goes_on(
    nats_server: NatsServer, intents: list[bytes]
) -> None:
    async def main() -> None:
        await reset_bus(nats_server)
        remote = remote_bank(nats_server)
        await remote.connect()  # the kernel's side makes the streams and the consumer
        nc = await as_admin(nats_server)  # only the kernel may publish intents: a wide grant
        principals = principals_of(nats_server)
        try:
            async with anyio.create_task_group() as tg:
                ready = anyio.Event()
                serve = serve_executor(
                    nats_server.url,
                    "bank",
                    Echo(),
                    key=principals.key(principals.bank_key),
                    ack_wait_s=EXECUTOR_ACK_WAIT_S,
                    ready=ready,
                )
                tg.start_soon(lambda: serve)
                with anyio.fail_after(STEP_S):
                    await ready.wait()
                js = nc.jetstream()
                for data in intents:
                    await js.publish("dirk.intents.bank", data)
                # The executor is still up and carries out the next real intent.
                intent = ExecutionIntent(key="flow-1:0", kind="transfer", adapter="bank")
                with anyio.fail_after(STEP_S):
                    receipt = await remote.execute(intent)
                assert receipt.external_id == "echo-flow-1:0"
                tg.cancel_scope.cancel()
        finally:
            await nc.close()
            await remote.close()

    anyio.run(main)


async def test_a_restarted_kernel_gets_its_running_hosts_back(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    await reset_bus(nats_server)
    path = tmp_path / "j.db"
    first = kernel_for(path)
    kernel = await first.__aenter__()
    first_open = True
    first_mesh = open_mesh(kernel, nats_server.url, FAST, auth=nats_server.kernel)
    await first_mesh.__aenter__()
    try:
        secret = await provision(kernel, nats_server)
        async with host(nats_server, secret) as remote:
            [before] = await kernel.trigger("bank.invoice")
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(before)).status is FlowStatus.CLOSED
            await first_mesh.__aexit__(None, None, None)
            await first.__aexit__(None, None, None)
            first_open = False  # the host keeps running across the kernel's restart
            async with (
                kernel_for(path) as kernel,
                open_mesh(kernel, nats_server.url, FAST, auth=nats_server.kernel),
            ):
                await remote.line("agents_sdk.serve: agent clerk handshook again")
                [after] = await kernel.trigger("bank.invoice")
                with anyio.fail_after(STEP_S):
                    assert (await kernel.wait_flow(after)).status is FlowStatus.CLOSED
                await remote.line(f"DECIDED {after}")
    finally:
        if first_open:
            await first_mesh.__aexit__(None, None, None)
            await first.__aexit__(None, None, None)


async def test_the_bus_is_one_setting_of_the_kernel(
    tmp_path: Path, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    await reset_bus(nats_server)
    monkeypatch.setenv("DIRK_BUS", nats_server.url)  # KernelConfig(bus=...) or the environment
    monkeypatch.setenv("DIRK_BUS_KEY", str(principals_of(nats_server).kernel_key))
    async with kernel_for(tmp_path / "j.db") as kernel:
        secret = await provision(kernel, nats_server)
        async with host(nats_server, secret) as remote:
            [dfid] = await kernel.trigger("bank.invoice")
            with anyio.fail_after(STEP_S):
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            await remote.line(f"DECIDED {dfid}")
