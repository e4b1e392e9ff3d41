"""A small payments domain for the approvals suite: quorums, grants, money budgets, re-judging.

One kind, ``pay.send`` (an amount in cents to a payee), costs its amount in EUR.
Sends above 1,000.00 EUR escalate (APPROVAL_REQUIRED); :func:`pack` builds versions of
the pack with a quorum, grant quorum, budgets or a stricter cap, so each test says
exactly what it judges with. Agents are scripted: each flow proposes the amount the
trigger's topic names (``pay.<cents>``), so many concurrent flows can propose
different amounts.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from kernel import Clock, EscalationPolicy, Kernel, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.config import KernelConfig, Ports
from kernel.policy import (
    Budget,
    Cost,
    PolicyKind,
    PolicyPack,
    Quorum,
    Range,
    Threshold,
)
from kernel.policy.contracts import WorkingContext
from kernel.testing import ManualClock, ScriptedAgent, SeededIds
from tests.support.helpers import configured
from tests.support.principals import LOCAL

THRESHOLD = 100_000
"""Sends above 1,000.00 EUR need a human."""


class Send(PolicyKind, tag="pay.send"):
    """Send ``amount_cents`` to ``payee``."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "payments"

    payee: str
    amount_cents: int


def pack(version: str = "1.0.0", **changes: Any) -> PolicyPack:
    """The payments pack at ``version``, with ``changes`` (quorums, budgets...)."""
    base = PolicyPack(
        name="pay",
        version=version,
        kinds=(Send,),
        escalate_below_confidence=0.5,
        invariants=(Range(Send, "amount_cents", min=1),),
        thresholds=(Threshold(Send, amount="amount_cents", above=THRESHOLD),),
        costs=(Cost(Send, "amount_cents", "EUR"),),
    )
    return replace(base, **changes)


TWO_ROLES = Quorum(required=2, roles=("risk", "desk-head"), kind=Send, name="two-person rule")
"""Approvals take a risk officer and a desk head, two people."""

DAILY = Budget(name="daily", ceiling=500_000, currency="EUR", per="desk", window_s=86_400)
"""5,000.00 EUR a rolling day for the whole desk."""


class Payments:
    """The payment system at the edge: it records each send once per idempotency key."""

    def __init__(self) -> None:
        self.calls: list[ExecutionIntent] = []
        self.effects: dict[str, Receipt] = {}
        self._ids = itertools.count(1)
        self.fail: set[int] = set()
        """Amounts the system refuses (a terminal failure, no effect)."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        from kernel.adapters import AdapterError

        self.calls.append(intent)
        if int(intent.params.get("amount_cents", 0)) in self.fail:
            raise AdapterError("400 payee refused", transient=False)
        if intent.key not in self.effects:
            self.effects[intent.key] = Receipt(external_id=f"pay-{next(self._ids)}")
        return self.effects[intent.key]

    def sent(self) -> int:
        """The total actually sent, in cents (each key once)."""
        amounts = {
            c.key: int(c.params["amount_cents"]) for c in self.calls if c.key in self.effects
        }
        return sum(amounts.values())


def amount_of_topic(ctx: WorkingContext) -> int:
    """The amount a flow's topic names: ``pay.<cents>`` (``pay.<cents>.<anything>`` too)."""
    return int(ctx.topic.split(".")[1])


def sender(agent_id: str = "clerk", payee: str = "acme", confidence: float = 0.9) -> ScriptedAgent:
    """An agent that sends what its flow's topic names."""
    return ScriptedAgent(
        agent_id,
        [
            lambda ctx: ctx.propose(
                Send(payee=payee, amount_cents=amount_of_topic(ctx)),
                explain="pay the invoice",
                confidence=confidence,
                valid_for_s=2 * 86_400,  # humans take their time
            )
        ],
        capabilities=["pay.send"],
        subscriptions=["pay"],
        max_attempts=1,
    )


@asynccontextmanager
async def pay_kernel(
    path: Path,
    packs: Sequence[PolicyPack] | None = None,
    *,
    payments: Payments | None = None,
    clock: Clock | None = None,
    allow: Sequence[str] = ("clerk", "other", "third"),
    **settings: Any,
) -> AsyncIterator[Kernel]:
    """Open a kernel on a real journal file with the payments pack (or ``packs``)."""
    # No escalation budget: these tests escalate on purpose, many times.
    settings.setdefault("escalation", EscalationPolicy(budget=None))
    settings.setdefault("inbox_poll_s", None)
    config = configured(
        KernelConfig(principal=LOCAL, ports=Ports(clock=clock or ManualClock(), ids=SeededIds(11))),
        **settings,
    )
    async with open_kernel(
        path,
        packs=list(packs or [pack()]),
        adapters={"payments": payments or Payments()},
        allow=allow,
        config=config,
    ) as kernel:
        yield kernel


ROOMY = Budget(name="day", ceiling=1_000_000, currency="EUR", window_s=86_400)
PAY = pack(budgets=(ROOMY,))
"""The payments pack with a 10,000.00 EUR day (``--pack tests.support.approvals_domain:PAY``)."""
PAY_FOUR_EYES = pack(budgets=(ROOMY,), quorums=(Quorum(required=2, kind=Send, name="four eyes"),))
"""The same, asking two operators for every approval."""
PAY_TIGHT = pack(budgets=(replace(ROOMY, ceiling=300_000),))
"""The same, with a 3,000.00 EUR day."""
