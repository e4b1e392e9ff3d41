"""Pack validation: each kind of broken pack is refused, naming the problem and the line."""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import os
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from random import random as rand
from typing import Any

import pytest

from examples.desk import DESK
from examples.desk_0_1 import DESK_0_1
from examples.desk_0_2 import DESK_0_2
from kernel import PackError, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import payload_of
from kernel.config import KernelConfig, Ports
from kernel.core.events import PackLoaded
from kernel.policy import PolicyKind, PolicyPack
from kernel.policy.packs import Consume, LimitSpec, PolicyCatalog, Threshold
from kernel.policy.rules import (
    ALLOW,
    OneOf,
    Range,
    Rule,
    RuleVerdict,
    StateMatch,
    View,
    deny,
    rule,
)
from kernel.testing import ManualClock, SeededIds
from policies.booking import BOOKING
from policies.trading import TRADING
from policies.trading_0_2 import TRADING_0_2
from tests.support.gate_domain import SHOP, Buy, qty_cap
from tests.support.helpers import LOCAL

HERE = __file__


def pack(**parts: Any) -> PolicyPack:
    return PolicyPack(name="broken", version="1.0.0", kinds=parts.pop("kinds", (Buy,)), **parts)


@rule(Buy, fields=("weight",))
def declares_missing(view: View) -> RuleVerdict:
    return ALLOW


@rule(Buy)
def reads_missing(view: View) -> RuleVerdict:
    if view.params.colour == "red":
        return ALLOW
    return ALLOW


@rule(Buy)
def reads_missing_via_alias(view: View) -> RuleVerdict:
    order = view.params
    return ALLOW if order.size else deny("no")


@rule(Buy)
def reads_the_clock(view: View) -> RuleVerdict:
    return ALLOW if time.time() > 0 else deny("no")


@rule(Buy)
def reads_datetime(view: View) -> RuleVerdict:
    return ALLOW if datetime.datetime.now() else deny("no")


@rule(Buy)
def draws_random(view: View) -> RuleVerdict:
    return ALLOW if random.random() < 2 else deny("no")


@rule(Buy)
def draws_imported_random(view: View) -> RuleVerdict:
    return ALLOW if rand() < 2 else deny("no")


@rule(Buy)
def mints_uuid(view: View) -> RuleVerdict:
    return ALLOW if uuid.uuid4() else deny("no")


@rule(Buy)
def reads_urandom(view: View) -> RuleVerdict:
    return ALLOW if os.urandom(1) else deny("no")


def _line_of(fn: Rule, text: str) -> int:
    lines, first = inspect.getsourcelines(fn.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize(
    ("parts", "words"),
    [
        ({"rules": (declares_missing,)}, ["rule declares_missing", "'weight'", "does not have"]),
        ({"rules": (reads_missing,)}, ["rule reads_missing", "'colour'", HERE]),
        ({"rules": (reads_missing_via_alias,)}, ["'size'"]),
        ({"kinds": (Buy, Buy)}, ["'shop.buy'", "defined by both"]),
        ({"invariants": (Range(Buy, "weight", max=3),)}, ["range(weight)", "'weight'"]),
        ({"invariants": (OneOf(Buy, "colour", frozenset()),)}, ["one_of(colour)"]),
        (
            {"invariants": (StateMatch(Buy, "price", "shop.{colour}.price", 50),)},
            ["state_match(price)", "'colour'"],
        ),
        ({"invariants": (Range(Buy, "qty", max="lots"),)}, ["bad bound"]),
        ({"consumes": (Consume(Buy, "inventory:{sku}", "weight"),)}, ["resource", "'weight'"]),
        ({"consumes": (Consume(Buy, "bin:{colour}", "qty"),)}, ["'colour'"]),
        ({"thresholds": (Threshold(Buy, amount="weight", above=3),)}, ["threshold", "'weight'"]),
        ({"limits": {"max_qty": LimitSpec(default=30, floor=0, ceiling=20)}}, ["floor <= default"]),
        ({"rules": (qty_cap.fn,)}, ["is not a Rule"]),
        ({"rules": (dataclasses.replace(qty_cap, budget_us=0),)}, ["rule qty_cap", "budget_us"]),
        ({"rules": (dataclasses.replace(qty_cap, budget_us=-5),)}, ["not -5"]),
        ({"rules": (dataclasses.replace(qty_cap, budget_us=2.5),)}, ["not 2.5"]),  # type: ignore[arg-type]
        ({"rules": (dataclasses.replace(qty_cap, budget_us=True),)}, ["not True"]),
        ({"rules": (dataclasses.replace(qty_cap, budget_us=10**6 + 1),)}, ["[1, 1000000]"]),
        ({"rules": qty_cap}, ["rules must be a sequence"]),
        ({"limits": [("max_qty", 3)]}, ["limits must be a mapping"]),
    ],
    ids=[
        "declared-field",
        "read-field",
        "aliased-field",
        "duplicate-kind",
        "range-path",
        "one-of-path",
        "state-match-template",
        "range-bound",
        "consume-amount",
        "consume-pool",
        "threshold-amount",
        "limit-order",
        "bare-function",
        "zero-budget",
        "negative-budget",
        "fractional-budget",
        "boolean-budget",
        "budget-over-a-second",
        "rules-not-a-sequence",
        "limits-not-a-mapping",
    ],
)
def test_a_broken_pack_is_refused_naming_the_problem(
    parts: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(PackError) as refused:
        PolicyCatalog([pack(**parts)])
    for word in words:
        assert word in str(refused.value)


@pytest.mark.parametrize(
    ("r", "call"),
    [
        (reads_the_clock, "time.time"),
        (reads_datetime, "datetime.datetime.now"),
        (draws_random, "random.random"),
        (draws_imported_random, "rand"),
        (mints_uuid, "uuid.uuid4"),
        (reads_urandom, "os.urandom"),
    ],
    ids=["time", "datetime", "random", "imported-random", "uuid", "urandom"],
)
def test_a_non_deterministic_rule_is_refused_with_its_line(r: Rule, call: str) -> None:
    with pytest.raises(PackError) as refused:
        PolicyCatalog([pack(rules=(r,))])
    message = str(refused.value)
    assert "not deterministic" in message and f"calls {call}()" in message
    assert f"{HERE}:{_line_of(r, call + '(')}" in message


def test_a_kind_in_two_packs_is_refused() -> None:
    with pytest.raises(PackError, match="defined by both"):
        PolicyCatalog([SHOP, PolicyPack(name="other", version="1.0.0", kinds=(Buy,))])


def test_a_rule_about_a_kind_of_another_pack_is_refused() -> None:
    from policies.trading import PlaceOrder

    @rule(PlaceOrder)
    def elsewhere(view: View) -> RuleVerdict:
        return ALLOW

    with pytest.raises(PackError, match="not a kind of this pack"):
        PolicyCatalog([pack(rules=(elsewhere,))])


async def test_the_kernel_refuses_to_start_on_a_broken_pack(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="'colour'"):
        async with open_kernel(
            tmp_path / "j.db", packs=[pack(rules=(reads_missing,))], adapters={}, allow=[]
        ):
            pass
    assert not (tmp_path / "j.db").exists()


def test_the_shipped_packs_load_and_their_hash_covers_the_rules() -> None:
    catalog = PolicyCatalog([TRADING, BOOKING, SHOP])
    assert len({p.hash for p in catalog.packs}) == 3

    @rule(Buy, fields=("qty",))
    def qty_cap(view: View) -> RuleVerdict:  # same name, different body
        return ALLOW

    changed = dataclasses.replace(SHOP, rules=(qty_cap,))
    assert changed.hash != SHOP.hash


def test_every_policy_kind_is_frozen_without_declaring_it() -> None:
    # PolicyKind tells type checkers its subclasses are frozen (dataclass_transform), and the
    # shipped kinds do not say frozen=True: that holds only while msgspec inherits frozen.
    class Bare(PolicyKind, tag="test.bare"):
        n: int

    kinds: list[type[PolicyKind]] = [
        Bare,
        *(k for p in (TRADING, TRADING_0_2, DESK, DESK_0_1, BOOKING, SHOP) for k in p.kinds),
    ]
    assert all(k.__struct_config__.frozen for k in kinds)
    with pytest.raises(AttributeError):
        Bare(n=1).n = 2  # type: ignore[misc]  # the assignment that must fail


# --- a pack is immutable once built: what judges is what its hash covers -----------


@rule(Buy)
def denies_all(view: View) -> RuleVerdict:
    return deny("no")


# The pack and catalog are Any here: each is a change their types forbid, tried at run time.
def tries_to_change(pack: Any, catalog: Any) -> list[Callable[[], object]]:
    """Every plain way to swap or edit what judges, as zero-argument callables."""
    limit = LimitSpec(default=99, floor=0, ceiling=100)
    return [
        lambda: setattr(pack, "rules", (denies_all,)),
        lambda: pack.rules.append(denies_all),
        lambda: pack.rules.__setitem__(0, denies_all),
        lambda: pack.kinds.__setitem__(0, Buy),
        lambda: pack.invariants.__setitem__(0, None),
        lambda: pack.limits.__setitem__("max_qty", limit),
        lambda: pack.capacities.__setitem__("inventory:*", 10**6),
        lambda: pack.extra.__setitem__("x", 1),
        lambda: pack.by_name.__setitem__("shop.buy", Buy),
        lambda: delattr(pack, "hash"),
        lambda: setattr(pack.rules[0], "fn", denies_all.fn),
        lambda: setattr(pack.rules[0], "budget_us", 10**9),
        lambda: pack.rules[0].fields.append("sku"),
        lambda: pack.invariants[0].values.add("Z"),
        lambda: setattr(catalog, "packs", ()),
        lambda: catalog.packs.append(pack),
        lambda: catalog.rules_of.__setitem__("shop.buy", (denies_all,)),
        lambda: catalog.rules_of["shop.buy"].__setitem__(0, denies_all),
        lambda: catalog.invariants_of.clear(),
        lambda: catalog.pack_of.__setitem__("shop.buy", pack),
        lambda: catalog.kinds.pop("shop.buy"),
    ]


def test_a_pack_and_its_catalog_refuse_every_change() -> None:
    rules, limits = [qty_cap], {"max_qty": LimitSpec(default=9, floor=0, ceiling=20)}
    built = pack(
        rules=rules,
        limits=limits,
        capacities={"inventory:*": 10},
        invariants=[OneOf(Buy, "sku", {"A", "B"})],  # type: ignore[arg-type]  # a set: copied
    )
    catalog = PolicyCatalog([built])
    before = built.hash
    # What the caller handed in is copied: changing it later changes nothing.
    rules.append(denies_all)
    limits["max_qty"] = LimitSpec(default=99, floor=0, ceiling=100)
    for attempt in tries_to_change(built, catalog):
        with pytest.raises((TypeError, AttributeError)):
            attempt()
    assert built.rules == (qty_cap,) and built.limits["max_qty"].default == 9
    [one_of] = built.invariants
    assert isinstance(one_of, OneOf)
    assert catalog.rules_of["shop.buy"] == (qty_cap,) and one_of.values == {"A", "B"}
    twin = pack(
        rules=(qty_cap,),
        limits={"max_qty": LimitSpec(default=9, floor=0, ceiling=20)},
        capacities={"inventory:*": 10},
        invariants=(OneOf(Buy, "sku", frozenset({"A", "B"})),),
    )
    assert built.hash == before == twin.hash


class Shop:
    async def execute(self, intent: ExecutionIntent) -> Receipt:
        return Receipt(external_id="s-1")


async def test_the_rules_of_a_running_kernel_change_only_through_load_pack(tmp_path: Path) -> None:
    async with open_kernel(
        tmp_path / "j.db",
        packs=[SHOP],
        adapters={"shop": Shop()},
        allow=[],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(1))),
    ) as k:
        for attempt in tries_to_change(SHOP, k.catalog):
            with pytest.raises((TypeError, AttributeError)):
                attempt()
        assert k.catalog.rules_of["shop.buy"] == SHOP.rules == (qty_cap,)
        assert await k.journal.read(types=["PackLoaded"]) == []

        strict = dataclasses.replace(SHOP, version="1.1.0", rules=(qty_cap, denies_all))
        ref = await k.load_pack(strict, operator="ana", reason="stricter")
        [loaded] = await k.journal.read(types=["PackLoaded"])
        recorded = payload_of(loaded, PackLoaded)
        assert (recorded.pack, recorded.previous) == (ref, SHOP.hash)
        # The hash recorded is the hash of what now judges.
        # mypy kept the narrowing of the assertion above; load_pack changed the catalog since.
        assert k.catalog.rules_of["shop.buy"] == (qty_cap, denies_all)  # type: ignore[comparison-overlap]
        assert k.catalog.pack_of["shop.buy"].hash == ref.hash == strict.hash
        assert SHOP.rules == (qty_cap,)  # the old version is untouched


def test_the_desks_kept_versions_hash_as_the_journals_they_judged_recorded() -> None:
    """A kept version re-judges old journals only while its hash is the one they recorded
    (desk 0.2.0's, as the example shipped it before 0.3.0 added the drift monitor)."""
    assert DESK_0_2.version == "0.2.0"
    assert DESK_0_2.hash == "8c2366e79f955c5e877222fa57cdccb5b369448827ec5a04c69fda0f77bd5d27"
    assert DESK.hash != DESK_0_2.hash  # 0.3.0 is another pack
