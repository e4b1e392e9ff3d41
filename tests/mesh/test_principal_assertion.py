"""A mesh host's signed principal assertion, as an attacker tries it against a real server.

The kernel opens its flows for alice of acme (its default principal). The clerk's host
proposes with ``Dirk-Principal``: its own signed assertion for alice is judged; one
signed by another key, lifted from another proposal, or naming another tenant's user is
refused on record (PRINCIPAL_INVALID, CROSS_TENANT), and the kernel runs on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agents_sdk.serve import handshake
from kernel import Outcome, Verdict
from kernel.audit import verify_journal
from kernel.core.events import Principal
from kernel.identity import AssertionSigner
from kernel.mesh import (
    PRINCIPAL_HEADER,
    SIGNATURE_HEADER,
    proposal_body,
    proposal_id,
    proposal_signature,
    verdict_subject,
)
from kernel.policy.contracts import WorkingContext
from kernel.registry import agent_key
from tests.mesh.test_attacks import refusals
from tests.support.helpers import transfer
from tests.support.mesh_agents import Clerk
from tests.support.mesh_helpers import STEP_S, as_clerk, meshed, provision
from tests.support.nats import (  # noqa: F401
    NatsServer,
    nats_server_fixture,
    principals_fixture,
)

ALICE = Principal(tenant="acme", user="alice", vouched_by="host")
EVE = Principal(tenant="globex", user="eve", vouched_by="host")
CAROL = Principal(tenant="acme", user="carol", vouched_by="host")


async def test_a_hosts_assertion_is_judged_only_when_it_verifies_and_names_the_flows_principal(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    path = tmp_path / "j.db"
    async with meshed(path, nats_server, principal=ALICE) as kernel:
        secret = await provision(kernel, nats_server)
        journal = kernel.journal.journal_id
        signer = AssertionSigner("clerk", agent_key(secret), journal)
        stranger = AssertionSigner("clerk", Ed25519PrivateKey.generate(), journal)
        nc = await as_clerk(nats_server)
        try:
            welcome = await handshake(nc, Clerk(), secret)
            work = await nc.jetstream().pull_subscribe_bind(
                durable=welcome.consumer, stream="DIRK_WORK"
            )
            await kernel.trigger("bank.invoice")
            [msg] = await work.fetch(1, timeout=STEP_S)
            ctx = msgspec.json.decode(msg.data, type=WorkingContext)
            msg_id = f"{journal}:{ctx.dfid}:{ctx.attempt}"
            body = proposal_body(transfer()(ctx))
            forged: list[tuple[Callable[[bytes], str], str]] = [
                (lambda b: stranger.sign(ALICE, msg_id, b), "PRINCIPAL_INVALID"),  # not its key
                (lambda b: signer.sign(ALICE, msg_id, b + b" "), "PRINCIPAL_INVALID"),  # lifted
                (lambda b: signer.sign(EVE, msg_id, b), "CROSS_TENANT"),  # another tenant's
                (lambda b: signer.sign(CAROL, msg_id, b), "PRINCIPAL_INVALID"),  # another user
                (lambda b: "not.a.jws", "PRINCIPAL_INVALID"),
            ]
            for n, (assertion, _) in enumerate(forged):
                signed = body + b" " * (n + 2)  # each its own message: none deduplicated
                signature = proposal_signature(agent_key(secret), msg_id, signed)
                headers = {
                    "Nats-Msg-Id": proposal_id(msg_id, signature),
                    SIGNATURE_HEADER: signature,
                    PRINCIPAL_HEADER: assertion(signed),
                }
                await nc.jetstream().publish("dirk.proposals.clerk", signed, headers=headers)
            found = await refusals(kernel, len(forged), lambda r: r.field == PRINCIPAL_HEADER)
            assert sorted(str(r.reason_code) for r in found) == sorted(c for _, c in forged)
            # The host's own assertion for the flow's principal: judged, and accepted.
            answers = await nc.subscribe(verdict_subject("clerk", journal, ctx.dfid, 1))
            signature = proposal_signature(agent_key(secret), msg_id, body)
            headers = {
                "Nats-Msg-Id": proposal_id(msg_id, signature),
                SIGNATURE_HEADER: signature,
                PRINCIPAL_HEADER: signer.sign(ALICE, msg_id, body),
            }
            await nc.jetstream().publish("dirk.proposals.clerk", body, headers=headers)
            raw = await answers.next_msg(timeout=STEP_S)
            verdict = msgspec.json.decode(raw.data, type=Verdict)
            assert verdict.outcome is Outcome.ACCEPTED, verdict
            await msg.ack()
        finally:
            await nc.close()
        assert kernel.stopped is None
    assert (await verify_journal(path)).ok
