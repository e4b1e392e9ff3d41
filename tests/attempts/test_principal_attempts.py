"""Attempts of a real kernel judging principals: one row per call, whichever layer refused it.

Driven through ``Kernel.propose`` with principals, a declared tenant, a delegation and a
rate limit: the audit shows each call once, with the reason and layer that decided it,
whom it was for, and the chain it acted under; a tenant's audit shows nothing of another.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from kernel import KernelConfig, Manifest, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.config import Ports
from kernel.core.events import Layer, Member, Principal, TenantPolicy, TenantSpec
from kernel.journal.opening import open_journal
from kernel.policy import PolicyKind, PolicyPack
from kernel.testing import ManualClock, SeededIds
from tests.attempts.test_attempts import rows

pytestmark = pytest.mark.anyio


class ReadMail(PolicyKind, tag="mail.read"):
    adapter: ClassVar[str] = "mail"
    scopes: ClassVar[tuple[str, ...]] = ("mail.read",)
    read_only: ClassVar[bool] = True

    box: str


class SendMail(PolicyKind, tag="mail.send"):
    adapter: ClassVar[str] = "mail"
    scopes: ClassVar[tuple[str, ...]] = ("mail.send",)

    to: str


class Mail:
    async def execute(self, intent: ExecutionIntent) -> Receipt:
        return Receipt(external_id=intent.key)


PACK = PolicyPack(name="mail", version="1.0.0", kinds=(ReadMail, SendMail))
AGENTS = ["assistant", "orchestrator", "worker"]
TENANTS = [
    TenantSpec(
        id="t-a",
        members={
            "alice": Member(email="alice@a.example", scopes=["mail.read", "mail.send"]),
            "carol": Member(email="carol@a.example", scopes=["mail.read"]),
        },
        policy=TenantPolicy(
            tiers={"interactive": Layer(rate_per_minute=3)},
            user_kinds={"alice": {"mail.send": {"*": Layer(permission="deny")}}},
        ),
    ),
    TenantSpec(id="t-b", members={"bob": Member(scopes=["mail.read"])}),
]


def who(tenant: str, user: str) -> Principal:
    return Principal(tenant=tenant, user=user)


async def test_every_layers_refusal_is_one_row_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    config = KernelConfig(ports=Ports(clock=ManualClock(), ids=SeededIds(3)))
    async with open_kernel(
        path, packs=[PACK], adapters={"mail": Mail()}, allow=AGENTS, config=config
    ) as kernel:
        for agent in AGENTS:
            await kernel.handshake(
                Manifest(agent_id=agent, version="1.0.0", capabilities=["mail.read", "mail.send"])
            )
        for spec in TENANTS:
            await kernel.declare_tenant(spec)

        async def call(
            agent: str,
            kind: str,
            params: dict[str, str],
            principal: Principal | None = None,
            tier: str = "interactive",
        ) -> None:
            await kernel.propose(
                agent, kind, params, explain="x", confidence=1.0, principal=principal, tier=tier
            )

        alice, carol = who("t-a", "alice"), who("t-a", "carol")
        await call("assistant", "mail.read", {"box": "in"}, principal=alice)  # allowed
        await call("assistant", "mail.send", {"to": "x"}, principal=carol)  # SCOPE_MISSING
        await call("assistant", "mail.send", {"to": "x"}, principal=alice)  # POLICY_DENIED
        await call("assistant", "mail.read", {"box": "in"}, principal=who("t-a", "mallory"))
        await call("assistant", "mail.read", {"box": "in"})  # PRINCIPAL_MISSING
        await call("assistant", "mail.read", {"nope": "in"}, principal=alice)  # schema
        await call("assistant", "mail.read", {"box": "in"}, principal=who("t-b", "bob"))
        await call("assistant", "mail.read", {"box": "in"}, principal=alice)  # 2nd allowed
        await call("assistant", "mail.read", {"box": "in"}, principal=alice)  # 3rd allowed
        await call("assistant", "mail.read", {"box": "in"}, principal=alice)  # RATE_LIMITED
        await kernel.delegate(
            carol, from_agent="orchestrator", to_agent="worker", task="read", scopes=["mail.read"]
        )
        await call("worker", "mail.read", {"box": "in"}, principal=carol, tier="subagent")
        await call("worker", "mail.send", {"to": "x"}, principal=carol, tier="subagent")

    in_a = await rows(path, tenant="t-a")

    assert [(r.user, r.kind, r.decision, r.reason_code, r.layer) for r in in_a] == [
        ("alice", "mail.read", "allow", "", ""),
        ("carol", "mail.send", "deny", "SCOPE_MISSING", "principal"),
        ("alice", "mail.send", "deny", "POLICY_DENIED", "principal"),
        ("mallory", "mail.read", "deny", "TENANT_NOT_MEMBER", "principal"),
        ("alice", "mail.read", "deny", "SCHEMA_INVALID", "schema"),
        ("alice", "mail.read", "allow", "", ""),
        ("alice", "mail.read", "allow", "", ""),
        ("alice", "mail.read", "deny", "RATE_LIMITED", "principal"),
        ("carol", "mail.read", "allow", "", ""),
        ("carol", "mail.send", "deny", "SCOPE_MISSING", "principal"),
    ]
    assert [(r.chain, r.tier) for r in in_a if r.agent == "worker"] == [
        (["orchestrator", "worker"], "subagent"),
        (["orchestrator", "worker"], "subagent"),
    ]
    assert all(r.chain == [] and r.tier == "interactive" for r in in_a if r.agent == "assistant")
    assert [(r.user, r.decision) for r in await rows(path, tenant="t-b")] == [("bob", "allow")]
    nobody = await rows(path, tenant="")
    assert [(r.principal, r.reason_code) for r in nobody] == [(False, "PRINCIPAL_MISSING")]
    # Every call that opened a flow is one row, in one tenant or none.
    async with open_journal(path, readonly=True) as journal:
        flows = await journal.read(types=["FlowCreated"])
    assert len(await rows(path)) == len(flows) == len(in_a) + 2
