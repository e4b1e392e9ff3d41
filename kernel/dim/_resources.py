"""The gate's resources and budgets layers: what a proposal holds, costs and may spend.

Layer 6 (``resources``) and 6b (``budgets``) of :func:`kernel.dim._gate.judge`: the pools
a proposal's kind consumes against their capacities and what other open flows hold, and
its money cost against each budget's ceiling less what was spent in its window.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.core.events import Feedback
from kernel.core.reasons import ReasonCode
from kernel.dim._judgement import Inputs, reject
from kernel.policy.money import Budget, format_money
from kernel.policy.packs import PolicyCatalog, PolicyPack, amount_of
from kernel.state.budgets import session_key
from kernel.state.projections import AgentView


def cost_of(kind: str, params: Any, catalog: PolicyCatalog) -> dict[str, int] | Feedback:
    """What the proposal costs, by currency: whole minor units, or why it cannot say."""
    costs: dict[str, int] = {}
    for cost in catalog.costs_of.get(kind, ()):
        try:
            amount = amount_of(cost.amount, params)
        except Exception as exc:
            detail = f"cost in {cost.currency}: {type(exc).__name__}: {exc}"[:300]
            return reject("budgets", ReasonCode.KERNEL_FAULT, detail, rule=f"cost {kind}")
        if amount is None or amount < 0 or amount != amount.to_integral_value():
            return reject(
                "budgets",
                ReasonCode.SCHEMA_INVALID,
                f"the cost in {cost.currency} must be whole minor units >= 0, not {amount}",
                rule=f"cost {kind}",
            )
        costs[cost.currency] = int(amount)
    return costs


def budget_pool(budget: Budget, agent: AgentView, tree: str) -> str | None:
    """The pool a proposal's cost is held in for ``budget`` (None: a per-decision ceiling)."""
    match budget.per:
        case "decision":
            return None
        case "tree":
            return budget.pool(tree)
        case "agent":
            return budget.pool(agent.manifest.agent_id)
        case "session":
            return budget.pool(session_key(agent.manifest.agent_id, agent.session_hash))
        case _:
            return budget.pool("")


def money_held(
    kind: str, costs: Mapping[str, int], catalog: PolicyCatalog, agent: AgentView, inputs: Inputs
) -> tuple[dict[str, int], Feedback | None] | Feedback:
    """Layer 6b: the money pools to hold, and the first ceiling that escalates, or a refusal."""
    need: dict[str, int] = {}
    escalation: Feedback | None = None
    for budget in catalog.budgets_of.get(kind, ()):
        amount = costs.get(budget.currency, 0)
        if not amount and not budget.reasoning:
            continue
        pool = budget_pool(budget, agent, inputs.tree)
        room = _room(budget, pool, inputs)
        if pool is not None and amount:
            need[pool] = need.get(pool, 0) + amount
        if _fits(amount, room):
            continue
        over = _over_budget(budget, amount, room)
        if budget.over == "refuse":
            return over
        escalation = escalation or over
    return need, escalation


def _fits(amount: int, room: int) -> bool:
    """The amount fits the room left (nothing to spend fits unless the budget is overspent)."""
    return amount <= room and (amount != 0 or room >= 0)


def _room(budget: Budget, pool: str | None, inputs: Inputs) -> int:
    """What is left of the budget: its ceiling less what its pool spent and open flows hold."""
    if pool is None:
        return budget.ceiling
    others = inputs.held.get(pool, 0) - inputs.own.get(pool, 0)
    return budget.ceiling - (inputs.spent.get(pool, 0) + others)


def _over_budget(budget: Budget, amount: int, room: int) -> Feedback:
    """Why ``amount`` does not fit the budget's ``room``: refused or escalated, as it says."""
    window = f", {budget.window_s:g} s window" if budget.window_s else ""
    return reject(
        "budgets" if budget.over == "refuse" else "escalation",
        ReasonCode.BUDGET_EXHAUSTED,
        f"budget {budget.name} ({budget.per}{window}"
        f"): {format_money(amount, budget.currency)} wanted,"
        f" {format_money(max(room, 0), budget.currency)} of"
        f" {format_money(budget.ceiling, budget.currency)} left",
        rule=f"budget {budget.name}",
        limit=format_money(budget.ceiling, budget.currency),
    )


def capacity_of(pool: str, pack: PolicyPack, overrides: Mapping[str, int]) -> int | None:
    """Return a pool's capacity: a fact first, then the pack (exact, then ``prefix:*``)."""
    for source in (overrides, pack.capacities):
        if pool in source:
            return int(source[pool])
        family = pool.split(":", 1)[0] + ":*"
        if family in source:
            return int(source[family])
    return None


def pools_held(
    kind: str, params: Any, catalog: PolicyCatalog, pack: PolicyPack, inputs: Inputs
) -> dict[str, int] | Feedback:
    """Layer 6: what the proposal would hold, or why it cannot."""
    need = _needed(kind, params, catalog)
    if isinstance(need, Feedback):
        return need
    for pool, units in need.items():
        refused = _no_room(pool, units, pack, inputs)
        if refused is not None:
            return refused
    return need


def _needed(kind: str, params: Any, catalog: PolicyCatalog) -> dict[str, int] | Feedback:
    """The units of each pool the proposal consumes, or why they cannot be counted."""
    need: dict[str, int] = {}
    for consume in catalog.consumes_of.get(kind, ()):
        try:
            pool = consume.pool.format_map(
                {f: getattr(params, f) for f in params.__struct_fields__}
            )
            amount = amount_of(consume.amount, params)
        except Exception as exc:
            detail = f"resource {consume.pool}: {type(exc).__name__}: {exc}"[:300]
            return reject("resources", ReasonCode.KERNEL_FAULT, detail, rule=consume.pool)
        if amount is None or amount < 0 or amount != amount.to_integral_value():
            return reject(
                "resources",
                ReasonCode.SCHEMA_INVALID,
                f"{pool}: the amount must be a whole number of units, not {amount}",
                rule=consume.pool,
            )
        if amount:
            need[pool] = need.get(pool, 0) + int(amount)
    return need


def _no_room(pool: str, units: int, pack: PolicyPack, inputs: Inputs) -> Feedback | None:
    """Why ``units`` of ``pool`` cannot be held: over its capacity, or held by open flows."""
    capacity = capacity_of(pool, pack, inputs.capacities)
    if capacity is None or units > capacity:
        return reject(
            "resources",
            ReasonCode.INSUFFICIENT_RESOURCES,
            f"{pool}: {units} wanted, capacity {capacity or 0}",
            rule=pool,
            limit=capacity or 0,
        )
    others = inputs.held.get(pool, 0) - inputs.own.get(pool, 0)
    if units > capacity - others:
        return reject(
            "resources",
            ReasonCode.RESOURCE_CONTENTION,
            f"{pool}: {units} wanted, {capacity - others} of {capacity} free"
            " (the rest is held by open flows)",
            rule=pool,
            limit=capacity - others,
        )
    return None
