"""The simulated external system: durable, seeded, and misbehaving like a real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel import FlowStatus, SystemClock
from kernel.adapters import AdapterError, ExecutionIntent, Receipt, idempotency_key
from kernel.testing import Faults, SimulatedSystem
from tests.support.helpers import ScriptedAgent, kernel_for


def intent(n: int) -> ExecutionIntent:
    key = idempotency_key(f"flow-{n}", "test.transfer")
    return ExecutionIntent(key=key, kind="test.transfer", adapter="bank", params={"n": n})


async def call(system: SimulatedSystem, it: ExecutionIntent) -> Receipt | AdapterError:
    try:
        return await system.execute(it)
    except AdapterError as exc:
        return exc


async def test_the_ledger_is_durable_and_answers_lookups(tmp_path: Path) -> None:
    system = SimulatedSystem(tmp_path / "bank.db", dedupe=False)
    receipt = await system.execute(intent(1))
    system.close()
    reopened = SimulatedSystem(tmp_path / "bank.db", dedupe=False)
    assert await reopened.lookup(intent(1).key) == receipt
    assert await reopened.lookup(intent(2).key) is None
    reopened.close()


async def test_a_deduplicating_system_has_one_effect_per_key_whatever_it_is_sent(
    tmp_path: Path,
) -> None:
    faults = Faults(duplicate=0.5, lost_answer=0.5)
    system = SimulatedSystem(tmp_path / "bank.db", seed=3, faults=faults)
    for _ in range(5):
        for n in range(20):
            await call(system, intent(n))
    keys = [key for key, _ in system.effects()]
    assert sorted(keys) == sorted(intent(n).key for n in range(20))
    assert system.duplicates_absorbed > 0
    system.close()


async def test_misbehaviour_is_a_function_of_the_seed(tmp_path: Path) -> None:
    faults = Faults(transient=0.3, lost_answer=0.3, terminal=0.1)
    outcomes = []
    for run in range(2):
        system = SimulatedSystem(tmp_path / f"bank-{run}.db", seed=11, faults=faults)
        outcomes.append([type(await call(system, intent(n))).__name__ for n in range(40)])
        system.close()
    assert outcomes[0] == outcomes[1]
    assert {"Receipt", "AdapterError"} <= set(outcomes[0])


async def test_terminal_refusals_are_per_key_and_leave_no_effect(tmp_path: Path) -> None:
    system = SimulatedSystem(tmp_path / "bank.db", seed=5, faults=Faults(terminal=0.5))
    refused = [n for n in range(20) if isinstance(await call(system, intent(n)), AdapterError)]
    assert refused
    for n in refused:
        again = await call(system, intent(n))
        assert isinstance(again, AdapterError) and not again.transient
        assert await system._lookup(intent(n).key) is None
    system.close()


@pytest.mark.parametrize("dedupe", [True, False], ids=["dedupe", "lookup"])
async def test_through_the_kernel_every_closed_flow_has_exactly_one_effect(
    tmp_path: Path, dedupe: bool
) -> None:
    faults = Faults(transient=0.2, lost_answer=0.2, duplicate=0.2)
    system = SimulatedSystem(tmp_path / "bank.db", seed=2, faults=faults, dedupe=dedupe)
    async with kernel_for(tmp_path / "j.db", bank=system, clock=SystemClock()) as kernel:
        await kernel.register(ScriptedAgent())
        for _ in range(30):
            await kernel.trigger("bank.invoice")
        await kernel.wait_quiet()
        closed = {f.intent_key for f in kernel.flows(FlowStatus.CLOSED)}
        retried = await kernel.journal.read(types=["ExecutionRetried"])
    effects = [key for key, _ in system.effects()]
    assert sorted(effects) == sorted(closed)
    assert len(closed) == 30
    assert retried, "the faults were exercised"
    system.close()
