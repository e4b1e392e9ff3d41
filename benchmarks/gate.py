"""P4: the DIM's pipeline on the trading pack, against the same rules as a bare function.

Both sides judge the same proposals in the same run: ``judge()`` with every layer
(schema, status with the unsettled-saga check, authority, time, state, resources,
invariants, rules, thresholds and the kind's ``needs_human``), the pipeline
:func:`kernel.dim.verdict.verdict` runs for the DIM and for replay; and a hand-written
function that converts the parameters and applies the same checks inline. The
ratio is what the pipeline's generality costs.

The pipeline runs with a :class:`~kernel.policy.rules.Stopwatch`, as in the DIM, so its
cost is counted; the verdict never depends on what it measures, so a busy
machine cannot make the two sides disagree (a rule past its budget is a finding
the DIM records, never a different verdict).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from decimal import Decimal

import msgspec

from kernel.core.events import Manifest, ProposalRecord
from kernel.dim import Inputs, judge
from kernel.policy.packs import PolicyCatalog, PolicyPack
from kernel.policy.rules import Stopwatch
from kernel.state.projections import AgentStatus, AgentView
from policies.trading import INSTRUMENTS, TRADING, PlaceOrder, notional_minor

P50_GOAL_US = 25.0
"""The issue's goal: at most this per proposal at the median."""


@dataclass(frozen=True)
class GateRun:
    """Per-verdict latencies (ns) of the pipeline and of the bare function."""

    pipeline_ns: list[int]
    bare_ns: list[int]
    accepted: int
    overruns: int = 0
    """Rules the stopwatch saw past their budget (the DIM would flag those flows)."""

    @staticmethod
    def _pct(samples: list[int], q: float) -> float:
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    def p50_us(self, bare: bool = False) -> float:
        return self._pct(self.bare_ns if bare else self.pipeline_ns, 0.5)

    def p99_us(self, bare: bool = False) -> float:
        return self._pct(self.bare_ns if bare else self.pipeline_ns, 0.99)

    def per_s(self, bare: bool = False) -> float:
        samples = self.bare_ns if bare else self.pipeline_ns
        return len(samples) / (sum(samples) / 1e9)


def _bare(record: ProposalRecord, state: dict[str, str], now_ns: int) -> bool:
    """The same checks as the pack, written inline: the floor the pipeline is measured against."""
    order = msgspec.convert({"kind": record.kind, **record.params}, PlaceOrder)
    if record.valid_until_ns is None or now_ns > record.valid_until_ns:
        return False
    if order.symbol not in INSTRUMENTS or not 1 <= order.quantity <= 100_000:
        return False
    if not 0 <= order.max_slippage_bps <= 100:
        return False
    reference = Decimal(state[f"market.{order.symbol}.price"])
    if abs(Decimal(order.limit_price) - reference) * 10_000 / reference > 50:
        return False
    notional = notional_minor(order)
    if notional > 5_000_000 or notional > 100_000_000:
        return False
    position = int(state.get(f"position.{order.symbol}", 0))
    if abs(position + order.quantity) > 10_000:
        return False
    return record.confidence >= 0.6 and notional <= 2_500_000


def run_gate(proposals: int, pack: PolicyPack = TRADING) -> GateRun:
    """Judge ``proposals`` trading orders both ways; return the per-verdict latencies.

    ``pack`` is the trading pack or a variant with the same verdicts (a test slows its rules).
    """
    catalog = PolicyCatalog([pack])
    manifest = Manifest(agent_id="pm", version="1.0", capabilities=["trading.place_order"])
    agent = AgentView(
        manifest=manifest, status=AgentStatus.ACTIVE, session_hash="", registered_seq=1
    )
    state = {"market.ACME.price": "101.25", "position.ACME": 10}
    inputs = Inputs(context_ref="ref", state=state)
    records = [
        ProposalRecord(
            kind="trading.place_order",
            params={
                "symbol": "ACME",
                "side": "buy",
                "quantity": 5 + i % 50,
                "limit_price": "101.40",
            },
            version="1.0",
            confidence=0.9,
            valid_until_ns=10**18,
            context_ref="ref",
        )
        for i in range(proposals)
    ]
    clock = time.perf_counter_ns
    pipeline, bare, accepted, overruns = [], [], 0, 0
    for record in records:
        start = clock()
        stopwatch = Stopwatch()
        judgement = judge(record, agent, catalog, 1, inputs, stopwatch=stopwatch)
        pipeline.append(clock() - start)
        overruns += len(stopwatch.overruns)
        start = clock()
        ok = _bare(record, state, 1)  # type: ignore[arg-type]
        bare.append(clock() - start)
        verdict = judgement.rejection is None and judgement.escalation is None
        if verdict != ok:
            raise AssertionError(f"pipeline and bare function disagree on {record.params}")
        accepted += verdict
    return GateRun(pipeline, bare, accepted, overruns)


def summary(runs: list[GateRun]) -> dict[str, float]:
    """Medians over repeats, for the figure's extra fields."""
    return {
        "p50_us": statistics.median(r.p50_us() for r in runs),
        "p99_us": statistics.median(r.p99_us() for r in runs),
        "bare_p50_us": statistics.median(r.p50_us(bare=True) for r in runs),
        "bare_p99_us": statistics.median(r.p99_us(bare=True) for r in runs),
        "bare_verdicts_per_s": statistics.median(r.per_s(bare=True) for r in runs),
        "p50_goal_us": P50_GOAL_US,
        "accepted_share": statistics.median(r.accepted / len(r.pipeline_ns) for r in runs),
    }
