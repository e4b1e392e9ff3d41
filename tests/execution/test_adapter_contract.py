"""The adapter contract suite (kernel.testing.AdapterContract), run against the shipped adapters.

The simulated system (deduplicating or not), the trading example's broker and the
travel example's hotel, as the examples configure them, keep the contract; adapters
that break one rule each are caught by the suite, naming the rule.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from examples.clock import SimClock
from examples.desk import Broker
from examples.market import SYMBOLS, Market
from examples.trading import BROKER_FAULTS
from kernel.adapters import Adapter, AdapterError, ExecutionIntent, Receipt
from kernel.testing import AdapterContract, ContractBroken, Faults, SimulatedSystem
from tests.support.helpers import Bank


def count(system: SimulatedSystem, key: str) -> int:
    return sum(1 for k, _ in system.effects() if k == key)


class TestSimulatedSystem(AdapterContract):
    dedupe = True

    def make_adapter(self, path: Path) -> SimulatedSystem:
        return SimulatedSystem(path / "system.db", dedupe=self.dedupe)

    def effects_of(self, adapter: Adapter, key: str) -> int:
        assert isinstance(adapter, SimulatedSystem)
        return count(adapter, key)

    def make_refusing_adapter(self, path: Path) -> SimulatedSystem:
        return SimulatedSystem(path / "refusing.db", dedupe=self.dedupe, faults=Faults(terminal=1))

    def make_flaky_adapter(self, path: Path) -> SimulatedSystem:
        faults = Faults(transient=0.3, lost_answer=0.3, duplicate=0.5)
        return SimulatedSystem(path / "flaky.db", seed=5, faults=faults, dedupe=self.dedupe)


class TestSimulatedSystemWithoutDedupe(TestSimulatedSystem):
    """A system that does not deduplicate: the contract holds through its lookup."""

    dedupe = False
    honours_keys = False


class TestTradingBroker(AdapterContract):
    """examples.desk.Broker: the simulated ledger behind a live market, with quotes and halts."""

    symbol = SYMBOLS[0]

    def intent(self, key: str) -> ExecutionIntent:
        params = {"symbol": self.symbol, "side": "buy", "quantity": 1, "limit_price": "100.00"}
        return ExecutionIntent(key=key, kind="trading.place_order", adapter="broker", params=params)

    def make_adapter(self, path: Path) -> Broker:
        return Broker(SimulatedSystem(path / "broker.db"), Market(1))

    def effects_of(self, adapter: Adapter, key: str) -> int:
        assert isinstance(adapter, Broker)
        return count(adapter.system, key)

    def make_refusing_adapter(self, path: Path) -> Broker:
        market = Market(1)
        market.halt(self.symbol, 5)
        return Broker(SimulatedSystem(path / "halted.db"), market)

    def make_flaky_adapter(self, path: Path) -> Broker:
        # The trading example's own broker faults, its latency passing on a jumping clock.
        system = SimulatedSystem(
            path / "flaky.db", seed=1, faults=BROKER_FAULTS, sleep=SimClock().sleep
        )
        return Broker(system, Market(1))

    def close(self, adapter: Adapter) -> None:
        assert isinstance(adapter, Broker)
        adapter.system.close()


class TestTravelHotel(AdapterContract):
    """The travel example's hotel: the simulated system with the example's faults."""

    def make_adapter(self, path: Path) -> SimulatedSystem:
        return SimulatedSystem(path / "hotel.db")

    def effects_of(self, adapter: Adapter, key: str) -> int:
        assert isinstance(adapter, SimulatedSystem)
        return count(adapter, key)

    def make_flaky_adapter(self, path: Path) -> SimulatedSystem:
        faults = Faults(latency_s=(0.1, 0.5), transient=0.2, duplicate=0.3)
        return SimulatedSystem(path / "hotel.db", seed=1, faults=faults, sleep=SimClock().sleep)


class TestSuiteBank(AdapterContract):
    """The in-memory bank the suite's scenarios use."""

    def make_adapter(self, path: Path) -> Bank:
        return Bank()

    def effects_of(self, adapter: Adapter, key: str) -> int:
        assert isinstance(adapter, Bank)
        return 1 if key in adapter.effects else 0


# --- adapters that break the contract: the suite must say so -------------------------------


class Doubling:
    """Ignores the key: every call is a new effect with a new receipt."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.effects: list[str] = []

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.effects.append(intent.key)
        return Receipt(external_id=f"d-{next(self.ids)}")


class Unclassified(Doubling):
    """Fails with a bare exception the first time each key is called."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        if intent.key not in self.effects:
            self.effects.append(intent.key)
            raise ConnectionError("reset by peer")
        return Receipt(external_id=intent.key)


class SoftRefusal(Doubling):
    """Refuses with a transient error: a retry could never succeed, but it says one could."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        raise AdapterError("400 bad request", transient=True)


class EffectThenNotDone(Doubling):
    """Has the effect, then says it certainly did not happen."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.effects.append(intent.key)
        raise AdapterError("503", transient=True, outcome_unknown=False)


class Contract(AdapterContract):
    """Not collected (no Test prefix): each test below calls one check by hand."""

    def __init__(self, adapter: Doubling) -> None:
        self.adapter = adapter

    def make_adapter(self, path: Path) -> Doubling:
        return self.adapter

    make_refusing_adapter = make_flaky_adapter = make_adapter

    def effects_of(self, adapter: Adapter, key: str) -> int:
        assert isinstance(adapter, Doubling)
        return adapter.effects.count(key)


class KeylessContract(Contract):
    """A contract for a system that says it does not deduplicate on the key."""

    honours_keys = False


def test_an_adapter_that_ignores_keys_breaks_the_contract(tmp_path: Path) -> None:
    with pytest.raises(ContractBroken, match="first call's receipt"):
        Contract(Doubling()).test_contract_a_repeated_key_is_one_effect_with_one_receipt(tmp_path)


def test_an_adapter_without_dedupe_must_offer_lookup(tmp_path: Path) -> None:
    contract = KeylessContract(Doubling())
    with pytest.raises(ContractBroken, match="offers lookup"):
        contract.test_contract_keys_honoured_or_lookup_offered(tmp_path)


def test_an_unclassified_failure_breaks_the_contract(tmp_path: Path) -> None:
    with pytest.raises(ContractBroken, match="must be an AdapterError; execute raised Connection"):
        Contract(Unclassified()).test_contract_under_faults_a_key_retried_has_one_effect(tmp_path)


def test_a_refusal_said_to_be_transient_breaks_the_contract(tmp_path: Path) -> None:
    with pytest.raises(ContractBroken, match="a refusal is terminal"):
        Contract(SoftRefusal()).test_contract_a_refusal_is_terminal_and_leaves_no_effect(tmp_path)


def test_an_effect_reported_as_not_done_breaks_the_contract(tmp_path: Path) -> None:
    with pytest.raises(ContractBroken, match="known not done left no effect"):
        Contract(EffectThenNotDone()).test_contract_under_faults_a_key_retried_has_one_effect(
            tmp_path
        )
