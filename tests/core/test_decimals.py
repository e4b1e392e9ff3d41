"""Money and quantities parsed once, strictly: what the DIM judged is what the adapter gets.

A decimal string that ``Decimal()`` would read but that is not in the one accepted
spelling (``"1_0_0.00"``, full-width digits, ``" 100.00 "``, ``"NaN"``) is refused by
the DIM's schema layer as SCHEMA_INVALID naming the field, so it can neither be judged
as one value and executed as another nor make a rule raise (KERNEL_FAULT). Every flow
here runs through a real kernel on a SQLite file with the trading pack and a bank that
records each adapter call.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from examples.desk import DESK
from kernel import Kernel, PackError, ReasonCode, open_kernel
from kernel.adapters import Quote
from kernel.adapters.constraints import check
from kernel.audit import open_journal, rejudge
from kernel.config import KernelConfig, Ports
from kernel.core.events import (
    ExecutionStarted,
    FlowAborted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.dim import Inputs, judge
from kernel.policy import DecimalStr, PolicyKind, PolicyPack, Range, StateMatch
from kernel.policy.packs import PolicyCatalog
from kernel.policy.rules import decimal_of, is_decimal
from kernel.state.projections import AgentStatus, AgentView
from kernel.testing import ManualClock, SeededIds
from policies.trading import TRADING, PlaceOrder
from policies.trading_0_3 import TRADING_0_3
from tests.support import GOLDEN
from tests.support.helpers import Bank
from tests.support.principals import LOCAL

PRICES = {"market.ACME.price": "100.00", "market.GLOBEX.price": "50.00"}
DIGITS = frozenset("0123456789")


def canonical(text: str) -> bool:
    """The accepted spelling, written apart from the kernel's regex: the test's oracle."""
    body = text.removeprefix("-")
    whole, dot, frac = body.partition(".")
    return (
        bool(whole)
        and set(whole) <= DIGITS
        and set(frac) <= DIGITS
        and (not dot or bool(frac))
        and (whole == "0" or not whole.startswith("0"))
        and len(whole) <= 18
        and len(frac) <= 9
        and not (text.startswith("-") and Decimal(body) == 0)
    )


class Trader(Agent):
    """Proposes the next order of its plan, one attempt per flow."""

    def __init__(self) -> None:
        self.manifest = Manifest(
            agent_id="trader",
            version="1.0.0",
            capabilities=["trading.place_order"],
            subscriptions=["market"],
            max_attempts=1,
        )
        self.plan: list[dict[str, Any]] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        params = self.plan.pop(0)
        return ctx.propose({"kind": "trading.place_order", **params}, explain="", confidence=0.9)


def order(price: Any = "100.00", quantity: Any = 10) -> dict[str, Any]:
    return {"symbol": "ACME", "side": "buy", "quantity": quantity, "limit_price": price}


class Outcome(msgspec.Struct, kw_only=True):
    """One flow as the journal and the bank saw it."""

    submitted: dict[str, Any]
    code: str = ""
    field: str = ""
    started: dict[str, Any] | None = None
    called: dict[str, Any] | None = None


async def run_orders(path: Path, orders: list[dict[str, Any]]) -> list[Outcome]:
    """Run each order as its own flow through one kernel; return what became of each."""
    bank = Bank()
    async with open_kernel(
        path,
        packs=[TRADING],
        adapters={"broker": bank, "ledger": Bank()},
        allow=["trader"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(5))),
    ) as kernel:
        trader = Trader()
        await kernel.register(trader)
        dfids = []
        for params in orders:
            trader.plan.append(params)
            [dfid] = await kernel.trigger("market.tick", PRICES)
            await kernel.wait_flow(dfid)
            dfids.append(dfid)
        await kernel.wait_quiet()
        return [await outcome_of(kernel, dfid, bank) for dfid in dfids]


async def outcome_of(kernel: Kernel, dfid: str, bank: Bank) -> Outcome:
    events = await kernel.journal.flow_events(dfid)
    [submitted] = [e.payload for e in events if isinstance(e.payload, ProposalSubmitted)]
    result = Outcome(submitted=submitted.proposal.params)
    for event in events:
        match event.payload:
            case ProposalRejected(feedback=feedback):
                result.code, result.field = str(feedback.reason_code), feedback.field
            case FlowAborted(reason_code=code) if not result.code:
                result.code = str(code)
            case ExecutionStarted(intent=intent):
                result.started = intent.params
    keys = {e.payload.intent.key for e in events if isinstance(e.payload, ExecutionStarted)}
    calls = [c for c in bank.calls if c.key in keys]
    result.called = calls[0].params if calls else None
    return result


# --- the reproductions of the issue --------------------------------------------------


@pytest.mark.parametrize(
    "price",
    [
        "1_0_0.00",
        "\uff11\uff10\uff10.\uff10\uff10",  # full-width digits: Decimal() reads 100.00
        " 100.00 ",
        "100.00\n",
        "+100.00",
        "0100.00",
        "100.",
        ".5",
        "1e2",
        "NaN",
        "-Infinity",
        "1e999999",
        "-0.00",
        "100.0000000001",  # ten places: past the bound
    ],
)
async def test_a_malformed_price_is_schema_invalid_and_never_reaches_the_adapter(
    tmp_path: Path, price: str
) -> None:
    [result] = await run_orders(tmp_path / "k.db", [order(price)])
    assert result.submitted["limit_price"] == price  # recorded as the agent sent it
    assert (result.code, result.field) == ("SCHEMA_INVALID", "params.limit_price")
    assert result.started is None and result.called is None


async def test_well_formed_prices_reach_the_adapter_byte_for_byte(tmp_path: Path) -> None:
    prices = ["100.00", "100.0", "100", "99.995", "100.004999999"]
    results = await run_orders(tmp_path / "k.db", [order(p) for p in prices])
    for price, result in zip(prices, results, strict=True):
        assert result.code == "", (price, result)
        assert result.started is not None and result.called is not None
        judged = msgspec.convert(
            {"kind": "trading.place_order", **result.submitted}, TRADING.kinds[0]
        )
        assert isinstance(judged, PlaceOrder)
        # Recorded (the proposal), judged (its typed form), minted and executed: one string.
        assert (
            result.submitted["limit_price"]
            == judged.limit_price
            == result.started["limit_price"]
            == result.called["limit_price"]
            == price
        )
        assert msgspec.json.encode(result.called["limit_price"]) == msgspec.json.encode(price)


async def test_a_quantity_in_words_or_as_a_float_is_schema_invalid(tmp_path: Path) -> None:
    results = await run_orders(
        tmp_path / "k.db", [order(quantity="10"), order(quantity=10.0), order(quantity=True)]
    )
    for result in results:
        assert (result.code, result.field) == ("SCHEMA_INVALID", "params.quantity")
        assert result.called is None


# --- the property: SCHEMA_INVALID, or canonical and exactly that string executed ---------

NEAR = st.builds(
    "".join,
    st.tuples(
        st.sampled_from(["", "", "", "", " ", "+", "-", "0", "\n", "\uff11", "\u0661"]),
        st.sampled_from(
            ["100", "100.0", "100.00", "100.004", "99.9", "100.00000000001", "1_00.00", "1e2"]
        ),
        st.sampled_from(["", "", "", "", "", " ", "\n", "0", ".", "\u0660", "e0"]),
    ),
)
PRICE = st.one_of(NEAR, st.text(max_size=12), st.from_regex(r"\A-?[0-9]{1,20}(\.[0-9]{0,11})?\Z"))
QUANTITY = st.one_of(
    # Beyond what the journal can encode (int64/uint64) is the boundary's concern, not ours.
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(min_value=1, max_value=20),
    st.text(max_size=6),
)
# Near the market price with a sane quantity half the time, so that many are accepted.
ORDER = st.one_of(
    st.tuples(NEAR, st.integers(min_value=1, max_value=20)), st.tuples(PRICE, QUANTITY)
)
_paths = itertools.count()


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(orders=st.lists(ORDER, min_size=1, max_size=6))
@example(orders=[("100.00", 10), ("100.0", 1), ("1_0_0.00", 1), ("99.9\n", 1)])
def test_any_price_or_quantity_is_refused_as_schema_or_executed_verbatim(
    orders: list[tuple[str, int]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"k{next(_paths)}.db"
        results = anyio.run(run_orders, path, [order(p, q) for p, q in orders])
    for (price, quantity), result in zip(orders, results, strict=True):
        assert result.code != "KERNEL_FAULT", (price, quantity, result)
        if not isinstance(quantity, int):
            assert (result.code, result.field) == ("SCHEMA_INVALID", "params.quantity")
        elif not canonical(price):
            assert (result.code, result.field) == ("SCHEMA_INVALID", "params.limit_price")
        else:  # canonical: whatever else refuses it (a negative cash need), never its spelling
            assert result.field != "params.limit_price" or result.code != "SCHEMA_INVALID"
        if result.called is not None:
            assert canonical(price)
            assert result.started is not None
            assert result.called["limit_price"] == result.started["limit_price"] == price


# --- the parser and the type, without a kernel ------------------------------------------


@settings(max_examples=300, derandomize=True, deadline=None)
@given(text=st.one_of(st.text(max_size=25), st.from_regex(r"\A-?[0-9]{1,20}(\.[0-9]{0,11})?\Z")))
def test_one_spelling_is_accepted_and_the_type_agrees_with_the_parser(text: str) -> None:
    class Priced(msgspec.Struct):
        price: DecimalStr

    assert is_decimal(text) == canonical(text)
    value = decimal_of(text)
    assert (value is not None) == canonical(text)
    if value is not None:
        assert value.is_finite() and Decimal(text) == value
    try:
        msgspec.convert({"price": text}, Priced)
    except msgspec.ValidationError:
        assert not canonical(text)
    else:
        assert canonical(text)


def test_decimal_of_takes_ints_and_finite_decimals_never_floats() -> None:
    assert decimal_of(7) == 7 and decimal_of(Decimal("1.5")) == Decimal("1.5")
    assert decimal_of(1.5) is None and decimal_of(True) is None
    assert decimal_of(Decimal("NaN")) is None and decimal_of(Decimal("-Infinity")) is None
    assert decimal_of(None) is None and decimal_of(b"1") is None


class Loose(PolicyKind, tag="test.loose"):
    """A kind of an older pack: its price is a plain string its invariants read as a number."""

    adapter: ClassVar[str] = "bank"

    price: str
    quantity: int = 1


def test_a_pack_may_not_type_money_as_decimal() -> None:
    class Lenient(PolicyKind, tag="test.lenient"):
        adapter: ClassVar[str] = "bank"

        price: Decimal

    with pytest.raises(PackError, match=r"'price' as Decimal.*DecimalStr"):
        PolicyCatalog([PolicyPack(name="lenient", version="1", kinds=(Lenient,))])


@pytest.mark.parametrize("price", ["1_0_0", " 100", "NaN", "\uff11"])
def test_a_plain_string_read_as_a_number_is_held_to_the_same_spelling(price: str) -> None:
    pack = PolicyPack(
        name="loose",
        version="1",
        kinds=(Loose,),
        invariants=(
            Range(Loose, "quantity", min=1),
            StateMatch(Loose, "price", "price", max_drift_bps=10),
        ),
    )
    agent = AgentView(
        manifest=Manifest(agent_id="a", version="1", capabilities=["test.loose"]),
        status=AgentStatus.ACTIVE,
        session_hash="",
        registered_seq=1,
    )

    def verdict(value: str) -> Any:
        proposal = ProposalRecord(
            kind="test.loose", params={"price": value}, confidence=0.9, valid_until_ns=1
        )
        return judge(proposal, agent, PolicyCatalog([pack]), 0, Inputs(state={"price": "100"}))

    refused = verdict(price).rejection
    assert refused is not None
    assert (refused.reason_code, refused.field) == (ReasonCode.SCHEMA_INVALID, "params.price")
    assert verdict("100").rejection is None


@pytest.mark.parametrize(
    ("bounds", "bound"),
    [
        ({"limit_price": "1_0_0", "side": "buy"}, "limit_price"),
        ({"limit_price": "NaN", "side": "buy"}, "limit_price"),
        ({"max_slippage_bps": "lots", "reference_price": "100"}, "max_slippage_bps"),
        ({"max_slippage_bps": 50, "reference_price": "Infinity"}, "reference_price"),
    ],
)
def test_an_unparsable_execution_bound_fails_closed(bounds: dict[str, Any], bound: str) -> None:
    violation = check(bounds, None, Quote(price="100.00", market_state="open"), 0)
    assert violation is not None and violation.bound == bound


@pytest.mark.parametrize("price", ["NaN", " 100.00", "1_00", 100.0])
def test_a_quote_price_that_is_not_a_decimal_string_is_no_price(price: Any) -> None:
    violation = check({"limit_price": "101.00", "side": "buy"}, None, Quote(price=price), 0)
    assert violation is not None and violation.bound == "price"


@pytest.mark.parametrize(
    ("declared", "code"),
    [
        ("1_000_000", "RISK_LIMIT_EXCEEDED"),  # unreadable: the pack's floor (0), not ignored
        (" 2000000", "RISK_LIMIT_EXCEEDED"),
        (1.5e6, "RISK_LIMIT_EXCEEDED"),
        ("100000.5", ""),  # a readable fraction reaches the rule parsed: int() cannot raise
        ("99999.99", "RISK_LIMIT_EXCEEDED"),
    ],
)
def test_a_manifest_limit_is_read_strictly_and_fails_closed(declared: Any, code: str) -> None:
    agent = AgentView(
        manifest=Manifest(
            agent_id="trader",
            version="1",
            capabilities=["trading.place_order"],
            limits={"max_order_notional": declared},
        ),
        status=AgentStatus.ACTIVE,
        session_hash="",
        registered_seq=1,
    )
    proposal = ProposalRecord(
        kind="trading.place_order", params=order("100.00", 10), confidence=0.9, valid_until_ns=1
    )
    judgement = judge(proposal, agent, PolicyCatalog([TRADING]), 0, Inputs(state=PRICES))
    found = judgement.rejection
    assert (str(found.reason_code) if found else "") == code, found


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        ("trading.set_mandate", {"symbols": ["ACME"], "max_notional": "8_000"}, "max_notional"),
        (
            "desk.rebalance",
            {
                "sell_symbol": "ACME",
                "sell_quantity": 1,
                "sell_limit": "100.00",
                "buy_symbol": "GLOBEX",
                "buy_quantity": 1,
                "buy_limit": "\uff15\uff10",
            },
            "buy_limit",
        ),
    ],
)
def test_every_money_field_of_the_shipped_packs_is_held_to_the_spelling(
    kind: str, params: dict[str, Any], field: str
) -> None:
    agent = AgentView(
        manifest=Manifest(agent_id="a", version="1", capabilities=[kind]),
        status=AgentStatus.ACTIVE,
        session_hash="",
        registered_seq=1,
    )
    catalog = PolicyCatalog([TRADING, DESK])
    proposal = ProposalRecord(kind=kind, params=params, confidence=0.9, valid_until_ns=1)
    refused = judge(proposal, agent, catalog, 0, Inputs(state=PRICES)).rejection
    assert refused is not None
    assert (refused.reason_code, refused.field) == (ReasonCode.SCHEMA_INVALID, f"params.{field}")
    assert "decimal string" in refused.detail


async def test_the_golden_journal_is_judged_the_same_by_the_strict_packs(tmp_path: Path) -> None:
    # Its agents only ever spelled prices canonically: the new versions change no verdict.
    db = tmp_path / "trading.db"
    shutil.copyfile(GOLDEN / "trading.db", db)
    async with open_journal(db, readonly=True) as journal:
        # 0.3.0 typed the prices (0.4.0 adds money and a quorum, which change escalations).
        result = await rejudge(journal, [TRADING_0_3, DESK], check_hash=False)
    assert result.changes == [] and result.judged > 0 and result.skipped == 0
