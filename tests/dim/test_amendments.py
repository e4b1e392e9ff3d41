"""Human-approved limit amendments: within the pack's bounds, recorded, in force until expiry."""

from __future__ import annotations

import subprocess
from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from kernel import (
    AmendmentInvalid,
    Clock,
    FlowStatus,
    Kernel,
    ReasonCode,
    SystemClock,
    open_kernel,
)
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import fold, payload_of, payloads
from kernel.config import KernelConfig, Ports
from kernel.core.events import AmendmentRefused, ProposalRejected
from kernel.policy import ALLOW, LimitSpec, PolicyKind, PolicyPack, RuleVerdict, View, deny, rule
from kernel.state.snapshots import capture, decode_snapshot, encode_snapshot
from kernel.testing import ManualClock, SeededIds
from tests.cli.test_cli import dirk, one_error_line
from tests.support.helpers import ScriptedAgent, configured
from tests.support.operators import Keys
from tests.support.principals import LOCAL


class Order(PolicyKind, tag="desk.order"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "desk"

    qty: int
    price: str = "1.00"


@rule(Order, fields=("qty", "price"))
def within_limits(view: View) -> RuleVerdict:
    """The quantity under ``max_qty``, the price under ``max_price``."""
    if view.params.qty > int(view.limits["max_qty"]):
        return deny("qty too high", field="qty", limit=view.limits["max_qty"])
    if Decimal(view.params.price) > Decimal(view.limits["max_price"]):
        return deny("price too high", field="price", limit=view.limits["max_price"])
    return ALLOW


PACK = PolicyPack(
    name="desk",
    version="1.0.0",
    kinds=(Order,),
    rules=(within_limits,),
    limits={
        "max_qty": LimitSpec(default=5, floor=1, ceiling=10),
        "max_price": LimitSpec(default="2.50", floor="0", ceiling="9.99"),
    },
)


class Desk:
    async def execute(self, intent: ExecutionIntent) -> Receipt:
        return Receipt(external_id=intent.key[:8])


def kernel(path: Path, clock: Clock, **kw: Any) -> AbstractAsyncContextManager[Kernel]:
    return open_kernel(
        path,
        packs=[PACK],
        adapters={"desk": Desk()},
        allow=["trader", "other"],
        config=configured(
            KernelConfig(principal=LOCAL, ports=Ports(clock=clock, ids=SeededIds(5))),
            **{"inbox_poll_s": None, **kw},
        ),
    )


def trader(
    qty: int = 8, price: str = "1.00", name: str = "trader", topic: str = "desk.tick"
) -> ScriptedAgent:
    return ScriptedAgent(
        name,
        [lambda ctx: ctx.propose(Order(qty=qty, price=price), confidence=0.9)],
        capabilities=["desk.order"],
        subscriptions=[topic],
        max_attempts=1,
    )


async def verdict(k: Kernel, topic: str = "desk.tick") -> tuple[FlowStatus, ReasonCode | None]:
    """Trigger one flow and return (status, reason code of its rejection or None)."""
    [dfid] = await k.trigger(topic)
    flow = await k.wait_flow(dfid)
    rejected = payloads(
        await k.journal.read(dfid=dfid, types=["ProposalRejected"]), ProposalRejected
    )
    return flow.status, rejected[0].feedback.reason_code if rejected else None


async def test_an_amendment_raises_a_limit_until_it_expires(tmp_path: Path) -> None:
    clock = ManualClock()
    async with kernel(tmp_path / "j.db", clock) as k:
        await k.register(trader(qty=8))
        await k.register(trader(qty=8, name="other", topic="desk.other"))
        assert await verdict(k) == (FlowStatus.ABORTED, ReasonCode.RISK_LIMIT_EXCEEDED)

        event = await k.amend_limit(
            "trader", "max_qty", 8, ttl_s=60, operator="ana", reason="month end"
        )
        assert (event.value, event.floor, event.ceiling) == (8, "1", "10")
        assert event.expires_at_ns == clock.now_ns() + 60 * 10**9
        [recorded] = await k.journal.read(types=["LimitAmended"])
        assert recorded.agent_id == "trader" and recorded.payload == event

        assert await verdict(k) == (FlowStatus.CLOSED, None)
        # Only that agent: the other keeps the pack's default.
        assert await verdict(k, "desk.other") == (
            FlowStatus.ABORTED,
            ReasonCode.RISK_LIMIT_EXCEEDED,
        )

        clock.advance(59)
        assert await verdict(k) == (FlowStatus.CLOSED, None)
        clock.advance(1)  # expiry is judged on the kernel's clock
        assert await verdict(k) == (FlowStatus.ABORTED, ReasonCode.RISK_LIMIT_EXCEEDED)


async def test_an_amendment_can_lower_a_limit_and_decimal_limits_stay_decimal(
    tmp_path: Path,
) -> None:
    async with kernel(tmp_path / "j.db", ManualClock()) as k:
        await k.register(trader(qty=3, price="2.00"))
        assert await verdict(k) == (FlowStatus.CLOSED, None)
        await k.amend_limit("trader", "max_qty", "2", ttl_s=60, operator="ana", reason="calm")
        assert await verdict(k) == (FlowStatus.ABORTED, ReasonCode.RISK_LIMIT_EXCEEDED)
        event = await k.amend_limit(
            "trader", "max_price", Decimal("1.50"), ttl_s=60, operator="ana", reason="calm"
        )
        assert event.value == "1.50"
        await k.amend_limit("trader", "max_qty", 5, ttl_s=60, operator="ana", reason="back")
        [dfid] = await k.trigger("desk.tick")
        await k.wait_flow(dfid)
        [rejected] = await k.journal.read(dfid=dfid, types=["ProposalRejected"])
        feedback = payload_of(rejected, ProposalRejected).feedback
        assert (feedback.field, feedback.limit) == (
            "params.price",
            "1.50",
        )


@pytest.mark.parametrize(
    ("agent_id", "limit", "value", "ttl", "code"),
    [
        ("trader", "max_qty", 11, 60, ReasonCode.LIMIT_OUT_OF_BOUNDS),
        ("trader", "max_qty", 0, 60, ReasonCode.LIMIT_OUT_OF_BOUNDS),
        ("trader", "max_price", "10.00", 60, ReasonCode.LIMIT_OUT_OF_BOUNDS),
        ("trader", "max_notional", 5, 60, ReasonCode.UNKNOWN_LIMIT),
        ("nobody", "max_qty", 5, 60, ReasonCode.UNKNOWN_AGENT),
        ("trader", "max_qty", 5.0, 60, ReasonCode.SCHEMA_INVALID),
        ("trader", "max_qty", "7.5", 60, ReasonCode.SCHEMA_INVALID),
        ("trader", "max_qty", "lots", 60, ReasonCode.SCHEMA_INVALID),
        ("trader", "max_qty", 5, 0, ReasonCode.SCHEMA_INVALID),
    ],
)
async def test_a_bad_amendment_is_refused_with_a_reason_and_recorded(
    tmp_path: Path, agent_id: str, limit: str, value: object, ttl: int, code: ReasonCode
) -> None:
    async with kernel(tmp_path / "j.db", ManualClock()) as k:
        await k.register(trader())
        with pytest.raises(AmendmentInvalid) as caught:
            # value is any of the parameters, a float among them: refused, as typed callers cannot.
            await k.amend_limit(
                agent_id,
                limit,
                value,  # type: ignore[arg-type]
                ttl_s=ttl,
                operator="ana",
                reason="r",
            )
        assert caught.value.reason_code is code and caught.value.detail
        [refused] = payloads(await k.journal.read(types=["AmendmentRefused"]), AmendmentRefused)
        assert refused.reason_code is code and refused.operator == "ana"
        assert k.projections.amendments == {}
        assert await verdict(k) == (FlowStatus.ABORTED, ReasonCode.RISK_LIMIT_EXCEEDED)


async def test_amendments_survive_a_restart_and_a_snapshot(tmp_path: Path) -> None:
    clock = ManualClock()
    async with kernel(tmp_path / "j.db", clock) as k:
        await k.register(trader(qty=8))
        await k.amend_limit("trader", "max_qty", 9, ttl_s=60, operator="ana", reason="r")
        captured = capture(k.projections)
    restored = decode_snapshot(encode_snapshot(captured)[1])
    assert restored is not None and restored.amendments["trader"]["max_qty"].value == 9
    async with kernel(tmp_path / "j.db", clock) as k:
        assert k.projections.amendments["trader"]["max_qty"].value == 9
        await k.register(trader(qty=8))
        assert await verdict(k) == (FlowStatus.CLOSED, None)
        assert fold(await k.journal.read()).digest() == k.projections.digest()
        assert restored.digest() != fold([]).digest()


async def test_dirk_amend_goes_through_the_inbox_of_a_running_kernel(
    tmp_path: Path, operator_keys: Keys
) -> None:
    db = tmp_path / "j.db"

    def amend(*args: str) -> subprocess.CompletedProcess[str]:
        return dirk(
            "amend", "--agent", "trader", "--operator", "ana", "--reason", "desk call",
            "--db", db, "--wait", "30", *args,
        )  # fmt: skip

    async with kernel(db, SystemClock(), inbox_poll_s=0.02) as k:
        await k.register(trader(qty=8))
        done = await anyio.to_thread.run_sync(
            amend, "--limit", "max_qty", "--value", "8", "--ttl", "3600"
        )
        assert done.returncode == 0, done.stderr
        assert "applied: max_qty = 8 for trader by ana" in done.stdout
        assert await verdict(k) == (FlowStatus.CLOSED, None)

        high = await anyio.to_thread.run_sync(
            amend, "--limit", "max_qty", "--value", "50", "--ttl", "60"
        )
        assert one_error_line(high) == "LIMIT_OUT_OF_BOUNDS"
        unknown = await anyio.to_thread.run_sync(
            amend, "--limit", "max_gamma", "--value", "1", "--ttl", "60"
        )
        assert one_error_line(unknown) == "UNKNOWN_LIMIT"
        # Each row was taken once, by the event that recorded what became of it.
        taken = k.projections.inbox_taken
        assert len(taken) == 3
        amended = await k.journal.read(types=["LimitAmended", "AmendmentRefused"])
        assert sorted(taken.values()) == [e.seq for e in amended]
        assert k.projections.amendments["trader"]["max_qty"].value == 8

    bad = dirk("amend", "--agent", "nobody", "--limit", "max_qty", "--value", "1", "--ttl", "1",
               "--operator", "ana", "--reason", "r", "--db", db)  # fmt: skip
    assert one_error_line(bad) == "UNKNOWN_AGENT"
    floaty = dirk("amend", "--agent", "trader", "--limit", "max_qty", "--value", "x",
                  "--ttl", "1", "--operator", "ana", "--reason", "r", "--db", db)  # fmt: skip
    assert one_error_line(floaty) == "SCHEMA_INVALID"
