"""The DIM's pipeline, layer by layer: each reason code, the order, determinism, fail closed."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.gate import run_gate
from kernel import AgentStatus, ReasonCode
from kernel.core.events import Feedback, ProposalRecord
from kernel.dim import LAYERS, Inputs, Judgement, judge
from kernel.dim._judgement import Behalf
from kernel.policy import NeedsHuman, PolicyPack, Rule
from kernel.policy.packs import PolicyCatalog
from kernel.policy.rules import ALLOW, Overrun, RuleVerdict, Stopwatch, View, deny, rule, run_rule
from kernel.state.projections import AgentView
from policies.trading import TRADING, PlaceOrder
from tests.support.gate_domain import NOW, SHOP, STATE, Buy, agent, proposal

CATALOG = PolicyCatalog([SHOP])
R = ReasonCode


def inputs(**changes: Any) -> Inputs:
    return Inputs(**{"context_ref": "ref", "state": dict(STATE), **changes})


MemoryCheck = Callable[[ProposalRecord, View], Feedback | None]
"""The DIM's memory port (kernel.dim's ``memory=``)."""


def run(
    prop: ProposalRecord | None = None,
    who: AgentView | None = None,
    snap: Inputs | None = None,
    now: int = NOW,
    catalog: PolicyCatalog = CATALOG,
    *,
    by_human: bool = False,
    memory: MemoryCheck | None = None,
    stopwatch: Stopwatch | None = None,
) -> Judgement:
    return judge(
        prop or proposal(),
        who or agent(),
        catalog,
        now,
        snap or inputs(),
        by_human=by_human,
        memory=memory,
        stopwatch=stopwatch,
    )


# (id, proposal changes, agent, inputs changes, now) -> (layer, code, field, rule, limit)
CASES = [
    ("unknown-kind", {"kind": "shop.sell"}, {}, {}, NOW, ("schema", R.SCHEMA_INVALID, "kind")),
    ("major-version", {"version": "2.0"}, {}, {}, NOW, ("schema", R.SCHEMA_INVALID, "version")),
    (
        "bad-param",
        {"params": {"qty": "two"}},
        {},
        {},
        NOW,
        ("schema", R.SCHEMA_INVALID, "params.qty"),
    ),
    ("confidence", {"confidence": 1.5}, {}, {}, NOW, ("schema", R.SCHEMA_INVALID, "confidence")),
    ("no-window", {"valid_until_ns": None}, {}, {}, NOW, ("schema", R.SCHEMA_INVALID)),
    (
        "no-principal",
        {},
        {"status": AgentStatus.PASSIVE},  # the principal layer runs before the status layer
        {"principal": Behalf(on_behalf=None, agent_id="buyer", tenants={}, delegations={})},
        NOW,
        ("principal", R.PRINCIPAL_MISSING, "on_behalf"),
    ),
    ("passive", {}, {"status": AgentStatus.PASSIVE}, {}, NOW, ("status", R.AGENT_PASSIVE)),
    ("suspended", {}, {"status": AgentStatus.SUSPENDED}, {}, NOW, ("status", R.AGENT_SUSPENDED)),
    ("retired", {}, {"status": AgentStatus.RETIRED}, {}, NOW, ("status", R.AGENT_RETIRED)),
    ("capability", {}, {"capabilities": ()}, {}, NOW, ("authority", R.UNAUTHORIZED, "kind")),
    (
        "scope",
        {},
        {"limits": {"sku": ["B"]}},
        {},
        NOW,
        ("authority", R.UNAUTHORIZED, "params.sku", "manifest.limits", "B"),
    ),
    (
        "manifest-max",
        {},
        {"limits": {"qty": 1}},
        {},
        NOW,
        ("authority", R.UNAUTHORIZED, "params.qty", "manifest.limits", "1"),
    ),
    ("expired", {}, {}, {}, 3_000, ("time", R.EXPIRED, "valid_until_ns")),
    ("stale", {}, {}, {"context_ref": "other"}, NOW, ("state", R.STALE_CONTEXT, "context_ref")),
    (
        "capacity",
        {"params": {"qty": 11}},
        {},
        {},
        NOW,
        ("resources", R.INSUFFICIENT_RESOURCES, "", "inventory:A", "10"),
    ),
    (
        "capacity-fact",
        {},
        {},
        {"capacities": {"inventory:A": 1}},
        NOW,
        ("resources", R.INSUFFICIENT_RESOURCES, "", "inventory:A", "1"),
    ),
    (
        "contention",
        {},
        {},
        {"held": {"inventory:A": 9}},
        NOW,
        ("resources", R.RESOURCE_CONTENTION, "", "inventory:A", "1"),
    ),
    (
        "one-of",
        {"params": {"sku": "D", "price": "1.00"}},
        {},
        {},
        NOW,
        ("rules", R.CONSTRAINT_VIOLATION, "params.sku", "one_of(sku)", "A,B,C"),
    ),
    (
        "drift",
        {"params": {"price": "10.10"}},
        {},
        {},
        NOW,
        ("rules", R.RISK_LIMIT_EXCEEDED, "params.price", "state_match(price)", "50 bps"),
    ),
    (
        "no-reference",
        {"params": {"sku": "C"}},
        {},
        {},
        NOW,
        ("rules", R.RISK_LIMIT_EXCEEDED, "params.price", "state_match(price)"),
    ),
    (
        "rule",
        {"params": {"qty": 10}},
        {},
        {},
        NOW,
        ("rules", R.RISK_LIMIT_EXCEEDED, "params.qty", "qty_cap", "9"),
    ),
    (
        "manifest-cannot-raise",
        {"params": {"qty": 10}},
        {"limits": {"max_qty": 20}},
        {},
        NOW,
        ("rules", R.RISK_LIMIT_EXCEEDED, "params.qty", "qty_cap", "9"),
    ),
    (
        "low-confidence",
        {"confidence": 0.4},
        {},
        {},
        NOW,
        ("escalation", R.LOW_CONFIDENCE, "confidence"),
    ),
    (
        "threshold",
        {"params": {"qty": 9}},
        {},
        {},
        NOW,
        ("escalation", R.APPROVAL_REQUIRED, "params.qty", "threshold shop.buy", "8"),
    ),
    (
        "amended",
        {"params": {"qty": 10}},
        {},
        {"amendments": {"max_qty": 12}},
        NOW,
        ("escalation", R.APPROVAL_REQUIRED, "params.qty"),
    ),
    # Ordering: a proposal failing several layers reports the first.
    (
        "schema-before-status",
        {"params": {"qty": "two"}},
        {"status": AgentStatus.PASSIVE},
        {},
        NOW,
        ("schema", R.SCHEMA_INVALID),
    ),
    (
        "authority-before-time-and-state",
        {},
        {"capabilities": ()},
        {"context_ref": "other"},
        3_000,
        ("authority", R.UNAUTHORIZED),
    ),
    ("time-before-state", {}, {}, {"context_ref": "other"}, 3_000, ("time", R.EXPIRED)),
    (
        "state-before-resources",
        {"params": {"qty": 11}},
        {},
        {"context_ref": "other"},
        NOW,
        ("state", R.STALE_CONTEXT),
    ),
    (
        "resources-before-rules",
        {"params": {"qty": 11, "price": "99"}},
        {},
        {},
        NOW,
        ("resources", R.INSUFFICIENT_RESOURCES),
    ),
    ("unsettled", {}, {}, {"unsettled": ("f-1",)}, NOW, ("status", R.AGENT_PASSIVE)),
    (
        "schema-before-unsettled",
        {"params": {"qty": "two"}},
        {},
        {"unsettled": ("f-1",)},
        NOW,
        ("schema", R.SCHEMA_INVALID),
    ),
    (
        "agent-status-before-unsettled",
        {},
        {"status": AgentStatus.SUSPENDED},
        {"unsettled": ("f-1",)},
        NOW,
        ("status", R.AGENT_SUSPENDED),
    ),
    (
        "unsettled-before-authority",
        {},
        {"capabilities": ()},
        {"unsettled": ("f-1",)},
        NOW,
        ("status", R.AGENT_PASSIVE),
    ),
    (
        "rules-before-escalation",
        {"params": {"qty": 10}, "confidence": 0.1},
        {},
        {},
        NOW,
        ("rules", R.RISK_LIMIT_EXCEEDED),
    ),
]


@pytest.mark.parametrize(
    ("changes", "who", "snap", "now", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_each_layer_and_reason_code(
    changes: dict[str, Any],
    who: dict[str, Any],
    snap: dict[str, Any],
    now: int,
    expected: tuple[Any, ...],
) -> None:
    judgement = run(proposal(**changes), agent(**who), inputs(**snap), now)
    feedback = judgement.rejection or judgement.escalation
    assert feedback is not None
    got = (feedback.layer, feedback.reason_code, feedback.field, feedback.rule, feedback.limit)
    assert got[: len(expected)] == expected
    if feedback.layer == "escalation":
        assert judgement.rejection is None and judgement.reserve  # escalated flows hold
    if changes.get("kind") != "shop.sell":
        assert judgement.pack == SHOP.hash


def test_every_layer_is_covered_by_the_table() -> None:
    layers = {c[5][0] for c in CASES}
    # Memory's layer is every domain's check (tests/state); budgets': tests/dim/test_money.py.
    assert layers == set(LAYERS) - {"memory", "budgets"}


def test_an_acceptable_proposal_is_accepted_and_reserves() -> None:
    judgement = run()
    assert judgement.rejection is None and judgement.escalation is None
    assert dict(judgement.reserve) == {"inventory:A": 2}
    assert judgement.pack == SHOP.hash


def test_a_flow_does_not_contend_with_what_it_already_holds() -> None:
    snap = inputs(held={"inventory:A": 10}, own={"inventory:A": 8})
    assert run(proposal(params={"qty": 2}), snap=snap).rejection is None


def test_a_human_modification_skips_state_and_escalation() -> None:
    judgement = run(
        proposal(params={"qty": 9}, confidence=0.1),
        snap=inputs(context_ref="moved"),
        by_human=True,
    )
    assert judgement.rejection is None and judgement.escalation is None


def test_the_unsettled_check_names_the_flows_and_skips_human_modifications() -> None:
    snap = inputs(unsettled=("f-1", "f-2"))
    feedback = run(snap=snap).rejection
    assert feedback is not None
    assert feedback.detail == "agent buyer has flow(s) f-1, f-2 with effects not yet converged"
    assert run(snap=snap, by_human=True).rejection is None


class Ask(Buy, tag="shop.ask"):
    """A kind whose own rule escalates (needs_human), or raises, on some quantities."""

    def needs_human(self) -> NeedsHuman | None:
        if self.qty == 7:
            raise ZeroDivisionError("the rule broke")
        if self.qty > 4:
            return NeedsHuman(reason_code=R.AMBIGUOUS, detail=f"{self.qty} of what?")
        return None


ASK = dataclasses.replace(SHOP, kinds=(Ask,), rules=(), consumes=(), invariants=(), thresholds=())


def ask(qty: int, confidence: float = 0.9) -> Judgement:
    record = proposal(kind="shop.ask", params={"qty": qty}, confidence=confidence)
    return run(record, agent(capabilities=("shop.ask",)), catalog=PolicyCatalog([ASK]))


def test_needs_human_is_the_escalation_layer_after_the_thresholds() -> None:
    assert ask(2).escalation is None and ask(2).rejection is None
    escalated = ask(5).escalation
    assert escalated is not None
    assert (escalated.layer, escalated.reason_code, escalated.detail) == (
        "escalation",
        R.AMBIGUOUS,
        "5 of what?",
    )
    # The thresholds come first: the pack's confidence threshold decides.
    low = ask(5, confidence=0.1).escalation
    assert low is not None and low.reason_code is R.LOW_CONFIDENCE
    # A human who modifies skips it.
    record = proposal(kind="shop.ask", params={"qty": 5})
    human = run(
        record, agent(capabilities=("shop.ask",)), catalog=PolicyCatalog([ASK]), by_human=True
    )
    assert human.escalation is None and human.rejection is None


def test_a_needs_human_rule_that_raises_rejects_with_kernel_fault() -> None:
    judgement = ask(7)
    assert judgement.escalation is None and judgement.rejection is not None
    feedback = judgement.rejection
    assert (feedback.layer, feedback.reason_code, feedback.rule) == (
        "rules",
        R.KERNEL_FAULT,
        "needs_human",
    )
    assert "ZeroDivisionError: the rule broke" in feedback.detail


def test_the_memory_hook_runs_after_the_rules() -> None:
    from kernel.dim import reject

    seen: list[Any] = []

    def memory(prop: ProposalRecord, view: View) -> Feedback | None:
        seen.append(view.params)
        return reject("memory", R.CONSTRAINT_VIOLATION, "remembered constraint", rule="no-A")

    feedback = run(memory=memory).rejection
    assert feedback is not None
    assert (feedback.layer, feedback.reason_code, feedback.rule) == (
        "memory",
        R.CONSTRAINT_VIOLATION,
        "no-A",
    )
    over = run(proposal(params={"qty": 10}), memory=memory).rejection
    assert over is not None and over.layer == "rules"
    assert len(seen) == 1


# --- fail closed -----------------------------------------------------------------


def _pack_with(r: Rule) -> PolicyCatalog:
    return PolicyCatalog([PolicyPack(name="shop", version="1.0.0", kinds=(Buy,), rules=(r,))])


@rule(Buy)
def raises(view: View) -> RuleVerdict:
    raise ZeroDivisionError("bug")


@rule(Buy)
def returns_none(view: View) -> RuleVerdict:
    return None  # type: ignore[return-value]


@rule(Buy)
def denies_without_code(view: View) -> RuleVerdict:
    return RuleVerdict(ok=False)


@rule(Buy, budget_us=500)
def slow(view: View) -> RuleVerdict:
    return ALLOW


@pytest.mark.parametrize(
    ("r", "words"),
    [
        (raises, "raised ZeroDivisionError"),
        (returns_none, "returned NoneType"),
        (denies_without_code, "without a reason code"),
    ],
    ids=["raises", "returns-none", "no-code"],
)
def test_a_broken_rule_rejects_with_kernel_fault(r: Rule, words: str) -> None:
    feedback = run(catalog=_pack_with(r)).rejection
    assert feedback is not None
    assert (feedback.layer, feedback.reason_code, feedback.rule) == (
        "rules",
        R.KERNEL_FAULT,
        r.name,
    )
    assert words in feedback.detail


def test_a_rule_over_its_budget_keeps_its_verdict_and_the_stopwatch_notes_it() -> None:
    # A stopwatch whose clock moves 1 ms per reading: the rule "took" 1000 us, over its 500.
    ticks = itertools.count()
    stopwatch = Stopwatch(lambda: next(ticks) * 1_000_000)
    timed = run(catalog=_pack_with(slow), stopwatch=stopwatch)
    assert timed == run(catalog=_pack_with(slow)) and timed.rejection is None
    assert stopwatch.overruns == [Overrun(rule="slow", budget_us=500, took_us=1_000)]
    within = Stopwatch(lambda: 0)
    assert run(catalog=_pack_with(slow), stopwatch=within) == timed and within.overruns == []


def _dawdle() -> None:
    time.sleep(0.002)  # a helper: the purity check reads the rule's own body only


@rule(Buy, budget_us=1)
def sleeps(view: View) -> RuleVerdict:
    _dawdle()
    return ALLOW


@rule(Buy, budget_us=1)
def sleeps_then_denies(view: View) -> RuleVerdict:
    _dawdle()
    return deny("never", field="qty", limit=0)


@pytest.mark.parametrize("r", [sleeps, sleeps_then_denies], ids=["allows", "denies"])
def test_a_rule_sleeping_past_its_budget_gives_the_verdict_it_returns(r: Rule) -> None:
    stopwatch = Stopwatch()
    timed = run(catalog=_pack_with(r), stopwatch=stopwatch)
    assert timed == run(catalog=_pack_with(r))
    if r is sleeps:
        assert timed.rejection is None
    else:
        assert timed.rejection is not None
        assert (timed.rejection.reason_code, timed.rejection.rule) == (
            R.RISK_LIMIT_EXCEEDED,
            r.name,
        )
    [overrun] = stopwatch.overruns
    # A sleep lasts at least as long as asked: a lower bound, not a timing assertion.
    assert (overrun.rule, overrun.budget_us) == (r.name, 1) and overrun.took_us >= 2_000


def test_the_gate_reads_no_clock() -> None:
    # The verdict is a function of its arguments: nothing in judge() takes a timer.
    assert "timer" not in inspect.signature(judge).parameters
    assert "timer" not in inspect.signature(run_rule).parameters


def test_the_p4_cross_check_cannot_disagree_because_a_rule_is_slow() -> None:
    # Each judgement's rules overrun their budget, as on a loaded machine: same verdicts.
    slowed = dataclasses.replace(TRADING, rules=(*TRADING.rules, sleeps_on_orders))
    quick, loaded = run_gate(10), run_gate(10, pack=slowed)
    assert loaded.accepted == quick.accepted > 0
    assert loaded.overruns >= loaded.accepted


@rule(PlaceOrder, budget_us=1)
def sleeps_on_orders(view: View) -> RuleVerdict:
    _dawdle()
    return ALLOW


# --- determinism -------------------------------------------------------------------

proposals = st.builds(
    lambda sku, qty, price, confidence, valid: proposal(
        params={"sku": sku, "qty": qty, "price": price},
        confidence=confidence,
        valid_until_ns=valid,
    ),
    st.sampled_from(["A", "B", "C", "D"]),
    st.one_of(st.integers(-5, 15), st.text(max_size=3)),
    st.sampled_from(["10.00", "10.04", "10.10", "20.00", "x", "1e400"]),
    st.floats(0, 1),
    st.integers(0, 3_000),
)
inputs_cases = st.builds(
    lambda held, ref, amend: inputs(held={"inventory:A": held}, context_ref=ref, amendments=amend),
    st.integers(0, 10),
    st.sampled_from(["ref", "old"]),
    st.sampled_from([{}, {"max_qty": 12}]),
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    prop=proposals,
    snap=inputs_cases,
    now=st.integers(0, 3_000),
    readings=st.lists(st.integers(0, 10**9), min_size=2, max_size=8),
)
def test_the_same_inputs_give_the_same_verdict(
    prop: ProposalRecord, snap: Inputs, now: int, readings: list[int]
) -> None:
    # Whatever the stopwatch reads (a quick machine, a loaded one), the verdict is the same.
    ticks = itertools.accumulate(itertools.cycle(readings))
    first = run(prop, snap=snap, now=now)
    again = judge(
        prop, agent(), PolicyCatalog([SHOP]), now, snap, stopwatch=Stopwatch(lambda: next(ticks))
    )
    assert first == again
    assert (first.rejection is None) or first.rejection.reason_code in set(ReasonCode)
