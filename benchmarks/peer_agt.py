"""The Agent Governance Toolkit peer of P14 (see benchmarks.peers): a governed decision.

Microsoft's ``agent-governance-toolkit-core`` checks an action against a YAML
policy before the action runs. The decision is the one every peer makes: a
proposal (place an order of ``quantity``) is checked against the policy (a
positive quantity up to the limit, as ``benchmarks.peers.valid``), allowed or
denied, then executed when allowed. Two ways, as its documentation shows them:

- ``govern``: ``agentmesh.governance.govern(fn, policy=...)``, its two-line
  integration: the policy engine, an entry in its in-memory ``AuditLog`` (a
  Merkle chain), then the wrapped function. Nothing reaches a disk.
- ``file``: the same steps with public classes, since ``govern()`` has no way
  to pass an audit sink: ``PolicyEngine.evaluate``, a decision entry, the
  execution, an outcome entry, both in an ``AuditLog(sink=FileAuditSink(...))``
  (a JSON line per entry, hash-chained and HMAC-signed, appended through a
  file opened per line and never fsynced).

Before the clock starts, each checks that the policy and the shared rule agree
on the limits (0, 1, the limit and one above), so the figure is about the
same decision.
"""

from __future__ import annotations

import logging
import secrets
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

AGENT = "agent-0"
ACTION = "place_order"


def policy_yaml(limit: int) -> str:
    """The shared rule as the toolkit's policy: deny outside (0, limit], allow orders."""
    return f"""
apiVersion: governance.toolkit/v1
name: bench-orders
agents: ["{AGENT}"]
default_action: deny
rules:
  - name: quantity-not-positive
    condition: "order.quantity < 1"
    action: deny
  - name: quantity-over-limit
    condition: "order.quantity > {limit}"
    action: deny
  - name: place-order
    condition: "action.type == '{ACTION}'"
    action: allow
"""


def _quiet() -> None:
    # Its package warns on import (deprecation of an alias) and logs each denial.
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)


def run_govern(n: int, limit: int, rule: Callable[[int], bool]) -> tuple[int, float]:
    """Return (executed, seconds) for ``n`` decisions through ``govern()``."""
    _quiet()
    from agentmesh.governance import govern

    executed: list[int] = []

    def place_order(action: str, order: dict[str, int]) -> str:
        executed.append(order["quantity"])
        return f"receipt-{len(executed)}"

    governed = govern(
        place_order, policy=policy_yaml(limit), agent_id=AGENT, on_deny=lambda d: "rejected"
    )
    for quantity in _limits(limit):
        outcome = governed(action=ACTION, order={"quantity": quantity})
        _agree(quantity, outcome != "rejected", rule)
    executed.clear()

    start = time.perf_counter()
    for i in range(n):
        governed(action=ACTION, order={"quantity": 1 + i % 100})
    seconds = time.perf_counter() - start
    return len(executed), seconds


def run_file(n: int, limit: int, rule: Callable[[int], bool], tmp: Path) -> tuple[int, float]:
    """Return (executed, seconds) for ``n`` decisions with decision and outcome entries on file."""
    _quiet()
    from agentmesh.governance import AuditLog, FileAuditSink, PolicyEngine

    engine = PolicyEngine()
    engine.load_yaml(policy_yaml(limit))
    for quantity in _limits(limit):
        context = {"action": {"type": ACTION}, "order": {"quantity": quantity}}
        _agree(quantity, engine.evaluate(AGENT, context).allowed, rule)

    path = tmp / "audit.jsonl"
    key = secrets.token_bytes(32)
    sink = FileAuditSink(path, key)
    audit = AuditLog(sink=sink)
    executed: list[int] = []

    def decide(quantity: int) -> str:
        context: dict[str, Any] = {"action": {"type": ACTION}, "order": {"quantity": quantity}}
        decision = engine.evaluate(AGENT, context)
        audit.log(
            event_type="policy_evaluation",
            agent_did=AGENT,
            action=ACTION,
            outcome=decision.action,
            policy_decision=decision.action,
            data={"rule": decision.matched_rule or "", "reason": decision.reason or ""},
        )
        if not decision.allowed:
            return "rejected"
        executed.append(quantity)
        receipt = f"receipt-{len(executed)}"
        audit.log(
            event_type="tool_execution",
            agent_did=AGENT,
            action=ACTION,
            outcome="success",
            data={"receipt": receipt},
        )
        return receipt

    start = time.perf_counter()
    for i in range(n):
        decide(1 + i % 100)
    seconds = time.perf_counter() - start
    sink.close()
    entries = sum(1 for line in path.open() if line.strip())
    if entries != 2 * len(executed):
        raise RuntimeError(f"{entries} audit lines for {len(executed)} executed decisions")
    return len(executed), seconds


def _limits(limit: int) -> tuple[int, ...]:
    return (0, 1, limit, limit + 1)


def _agree(quantity: int, allowed: bool, rule: Callable[[int], bool]) -> None:
    if allowed != rule(quantity):
        raise RuntimeError(f"the toolkit's policy and the shared rule disagree on {quantity}")
