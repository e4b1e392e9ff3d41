"""Drift: a pack's monitors evaluated over rolling windows of the journal, and their breaches.

Evaluation (:func:`evaluate`) is a pure function of the recorded events and a recorded
time: it reads the events in the window ``(now - window, now]`` on the kernel's clock
(``Event.ts``), groups them by agent (``Event.agent_id``, or the agent that opened the
flow) or by principal (``FlowCreated.on_behalf``), and measures:

- ``refusal_rate``, ``escalation_rate``, ``exhaustion_rate``: the share of verdicts
  (ProposalAccepted, ProposalRejected, FlowEscalated) that refused, escalated, or
  refused or escalated for REASONING_EXHAUSTION; the samples are the verdicts.
- ``mean_confidence``: the mean confidence of the proposals submitted.
- ``spend``, ``spend_per_minute``: the reasoning charged (ReasoningCharged, minor units),
  in the window and per minute of it.
- ``effects_per_minute``: effects carried out (ExecutionSucceeded) per minute.

The bound is the monitor's fixed one, or ``factor`` times the baseline window's value
(never under the fixed one when both are given). A value strictly above the bound
breaches (strictly below it for ``mean_confidence``); exactly at the bound does not.
A breach is recorded once per window: a monitor that breached for a subject is quiet
until a whole window has passed since. The action a breach leads to
(:func:`action_of`) is an ``AgentStatusChanged`` by operator ``drift``,
as the registry records an operator's; an operator restores the agent as ever.

Nothing here is folded per event: a kernel whose packs declare no monitor does no work
for drift. The domain (:class:`Drift`) folds only the breaches, so ``dirk agents`` can
show an agent's last one. :func:`reevaluate` evaluates a recorded breach's window
again from the journal, which is how replay checks a breach (the same value, bound and
samples, or a mismatch).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from kernel.core.events import (
    AgentStatusChanged,
    DriftBreached,
    Event,
    ExecutionSucceeded,
    FlowCreated,
    FlowEscalated,
    Payload,
    ProposalAccepted,
    ProposalRejected,
    ProposalSubmitted,
    ReasoningCharged,
)
from kernel.core.reasons import ReasonCode
from kernel.policy.monitors import LOW_IS_BAD, Monitor
from kernel.policy.packs import PolicyPack
from kernel.state.domain import OMIT, Domain, Fold, Saved, State
from kernel.state.records import AgentStatus

NS = 1_000_000_000
OPERATOR = "drift"
"""The operator name a monitor's status change records."""

_STATUS = {"demote": AgentStatus.PASSIVE, "suspend": AgentStatus.SUSPENDED}
_RATES = {"refusal_rate", "escalation_rate", "exhaustion_rate"}
_VERDICTS = (ProposalAccepted, ProposalRejected, FlowEscalated)


@dataclass
class Tally:
    """What one subject's events in one window add up to."""

    verdicts: int = 0
    refused: int = 0
    escalated: int = 0
    exhausted: int = 0
    confidences: list[float] = field(default_factory=list)
    codes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Refusals and escalations by (``refused`` or ``escalated``, reason code)."""
    charges: int = 0
    spent: int = 0
    effects: int = 0
    first_seq: int = 0
    last_seq: int = 0

    def add(self, event: Event) -> None:
        """Count one event (one the window holds, of the subject)."""
        p = event.payload
        if isinstance(p, _VERDICTS):
            self.verdicts += 1
            self.refused += isinstance(p, ProposalRejected)
            self.escalated += isinstance(p, FlowEscalated)
            code = p.reason_code if isinstance(p, FlowEscalated) else None
            if isinstance(p, ProposalRejected):
                code = p.feedback.reason_code
            self.exhausted += code == ReasonCode.REASONING_EXHAUSTION
            self._code(p, code)
        elif isinstance(p, ProposalSubmitted):
            self.confidences.append(p.proposal.confidence)
        elif isinstance(p, ReasoningCharged):
            self.charges += 1
            self.spent += p.amount
        elif isinstance(p, ExecutionSucceeded):
            self.effects += 1
        else:
            return
        self.first_seq = self.first_seq or event.seq
        self.last_seq = event.seq

    def _code(self, p: Payload, code: ReasonCode | None) -> None:
        """Count a refusal's or an escalation's reason code (a monitor's ``reasons``)."""
        if code is not None:
            which = "refused" if isinstance(p, ProposalRejected) else "escalated"
            self.codes[which, str(code)] += 1

    def measure(
        self, metric: str, window_s: int, reasons: tuple[str, ...] = ()
    ) -> tuple[float, int]:
        """The metric's value and the samples it rests on (a value of 0 with no sample).

        ``reasons``: a rate counts only the refusals (or escalations) of these codes.
        """
        minutes = window_s / 60
        if metric in _RATES:
            top = {"refusal_rate": self.refused, "escalation_rate": self.escalated}
            count = top.get(metric, self.exhausted)
            if reasons:
                which = "refused" if metric == "refusal_rate" else "escalated"
                count = sum(self.codes[which, r] for r in reasons)
            return (count / self.verdicts if self.verdicts else 0.0), self.verdicts
        if metric == "mean_confidence":
            n = len(self.confidences)
            return (sum(self.confidences) / n if n else 0.0), n
        if metric == "spend":
            return float(self.spent), self.charges
        if metric == "spend_per_minute":
            return self.spent / minutes, self.charges
        return self.effects / minutes, self.effects


class Subjects:
    """Whom each event is about: its agent, or its flow's principal (``tenant/user``).

    Fed every FlowCreated it sees (and seeded with flows opened before the events read),
    so an event of a flow is attributed even when only the flow's opening names it.
    """

    def __init__(self, agents: Mapping[str, str] = {}, principals: Mapping[str, str] = {}):
        self.agents = dict(agents)
        self.principals = dict(principals)

    def see(self, event: Event) -> None:
        """Learn the flow an opening event names."""
        p = event.payload
        if isinstance(p, FlowCreated) and event.dfid:
            if event.agent_id:
                self.agents[event.dfid] = event.agent_id
            if p.on_behalf is not None:
                who = p.on_behalf.principal
                self.principals[event.dfid] = f"{who.tenant}/{who.user}"

    def of(self, event: Event, by: str) -> str | None:
        """The subject of the event for a monitor grouped ``by`` agent or principal."""
        dfid = event.dfid or ""
        if by == "principal":
            return self.principals.get(dfid)
        return event.agent_id or self.agents.get(dfid)


def tally(
    events: Iterable[Event], start_ns: int, end_ns: int, by: str, subjects: Subjects
) -> dict[str, Tally]:
    """Each subject's tally of the events with ``start_ns < ts <= end_ns``."""
    out: dict[str, Tally] = {}
    for event in events:
        subjects.see(event)
        if not start_ns < event.ts <= end_ns:
            continue
        who = subjects.of(event, by)
        if who is not None:
            out.setdefault(who, Tally()).add(event)
    return out


def crossed(metric: str, value: float, bound: float) -> bool:
    """Whether a value breaches its bound: strictly past it, never at it."""
    return value < bound if metric in LOW_IS_BAD else value > bound


def _floored(monitor: Monitor, relative: float) -> float:
    """A baseline's bound, kept past the monitor's fixed one when it has one."""
    if monitor.bound is None:
        return relative
    pick = min if monitor.metric in LOW_IS_BAD else max
    return pick(monitor.bound, relative)


def _windows(
    monitor: Monitor, events: Sequence[Event], now_ns: int, subjects: Subjects, as_of_seq: int
) -> tuple[dict[str, Tally], dict[str, Tally]]:
    """Each subject's tally of the window, and of the baseline window before it (or none)."""
    start = now_ns - monitor.window_s * NS
    seen = [e for e in events if not as_of_seq or e.seq <= as_of_seq]
    current = tally(seen, start, now_ns, monitor.by, subjects)
    if not monitor.baseline_s:
        return current, {}
    return current, tally(seen, start - monitor.baseline_s * NS, start, monitor.by, subjects)


def _breach(
    monitor: Monitor, current: Tally, baseline: Tally | None
) -> tuple[float, int, float, float | None] | None:
    """The value, samples, bound and baseline of a subject's breach, or None (no breach)."""
    value, samples = current.measure(monitor.metric, monitor.window_s, monitor.reasons)
    if samples < monitor.min_samples:
        return None
    bound, base_value = monitor.bound, None
    if monitor.baseline_s:
        if baseline is None:
            return None
        base_value, base_samples = baseline.measure(
            monitor.metric, monitor.baseline_s, monitor.reasons
        )
        if base_samples < monitor.min_samples:
            return None
        bound = _floored(monitor, base_value * monitor.factor)
    assert bound is not None  # a Monitor has a bound or a baseline
    if not crossed(monitor.metric, value, bound):
        return None
    return value, samples, bound, base_value


def evaluate(
    pack: str,
    monitor: Monitor,
    events: Sequence[Event],
    now_ns: int,
    subjects: Subjects | None = None,
    quiet: Mapping[str, int] = {},
    as_of_seq: int = 0,
) -> list[DriftBreached]:
    """The breaches of one monitor at ``now_ns``, one per subject, in subject order.

    ``events`` must hold every event since the baseline window's start (or the window's);
    ``quiet`` maps a subject to the end of its last breach of this monitor: a subject is
    not breached again until a whole window has passed since. ``as_of_seq``, when set,
    leaves out every event after it (what a live evaluation had not yet seen).
    """
    start = now_ns - monitor.window_s * NS
    current, baseline = _windows(monitor, events, now_ns, subjects or Subjects(), as_of_seq)
    out: list[DriftBreached] = []
    for who in sorted(current):
        if now_ns - quiet.get(who, start) < monitor.window_s * NS:
            continue  # breached within the window: quiet
        t = current[who]
        found = _breach(monitor, t, baseline.get(who))
        if found is not None:
            value, samples, bound, base_value = found
            out.append(
                DriftBreached(
                    pack=pack, monitor=monitor.name, metric=monitor.metric, by=monitor.by,
                    subject=who, value=value, bound=bound, baseline=base_value,
                    window_start_ns=start, window_end_ns=now_ns,
                    samples=samples,
                    action=monitor.action, first_seq=t.first_seq, last_seq=t.last_seq,
                    as_of_seq=as_of_seq,
                )
            )  # fmt: skip
    return out


def action_of(breach: DriftBreached, status: AgentStatus | None) -> AgentStatusChanged | None:
    """The status change a breach leads to: none to notify, nor for a principal, nor twice."""
    target = _STATUS.get(breach.action)
    if target is None or breach.by != "agent" or status is None:
        return None
    if status != AgentStatus.ACTIVE:
        return None  # already demoted, suspended or retired: a monitor never lifts one
    reason = (
        f"drift monitor {breach.monitor}: {breach.metric} {breach.value:g} crossed "
        f"{breach.bound:g} over seq {breach.first_seq}..{breach.last_seq}"
    )
    return AgentStatusChanged(status=str(target), reason=reason, operator=OPERATOR)


def reevaluate(
    breach: DriftBreached,
    monitor: Monitor,
    events: Sequence[Event],
    subjects: Subjects | None = None,
) -> bool:
    """Whether the recorded breach is what its window, read again, gives (replay's check)."""
    again = evaluate(
        breach.pack, monitor, events, breach.window_end_ns, subjects, as_of_seq=breach.as_of_seq
    )
    return any(b == breach for b in again)


class Breach(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The last breach of one monitor for one subject, as ``dirk agents`` shows it."""

    seq: int
    monitor: str
    metric: str
    value: float
    bound: float
    action: str
    at_ns: int


class Drift(Domain):
    """The drift domain: the last breach per subject and monitor (``breaches``)."""

    name = "drift"

    def __init__(self, projections: State) -> None:
        self.breaches: dict[str, dict[str, Breach]] = {}
        """By subject (agent id, or ``tenant/user``), by monitor: the last breach."""

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {DriftBreached: self._breached}

    def saved(self) -> Sequence[Saved]:
        return (
            Saved(
                name="drift",
                type=dict[str, dict[str, Breach]],
                get=lambda: self.breaches,
                load=self._load,
                copy=lambda b: {who: dict(by) for who, by in b.items()},
                canonical=lambda b: b if b else OMIT,  # older journals hashed none
                default={},
            ),
        )

    def _load(self, breaches: dict[str, dict[str, Breach]]) -> None:
        self.breaches = breaches

    def quiet(self, monitor: str) -> dict[str, int]:
        """Each subject's last breach time of a monitor (``evaluate``'s ``quiet``)."""
        return {who: by[monitor].at_ns for who, by in self.breaches.items() if monitor in by}

    def _breached(self, event: Event) -> None:
        p: DriftBreached = event.payload  # type: ignore[assignment]
        self.breaches.setdefault(p.subject, {})[p.monitor] = Breach(
            seq=event.seq, monitor=p.monitor, metric=p.metric, value=p.value,
            bound=p.bound, action=p.action, at_ns=p.window_end_ns,
        )  # fmt: skip


def watch(
    monitors: Sequence[tuple[str, Monitor]],
    events: Sequence[Event],
    now_ns: int,
    drift: Drift,
    status_of: Mapping[str, AgentStatus],
    subjects: Subjects | None = None,
    as_of_seq: int = 0,
) -> list[DriftBreached | AgentStatusChanged]:
    """What every monitor records at ``now_ns``: each breach, then the action it leads to.

    ``monitors`` pairs each monitor with its pack's ref (``name@version``); with none,
    nothing is read and nothing is returned. A demoted agent is not demoted twice in one
    call (``status_of`` is updated as the actions are decided).
    """
    out: list[DriftBreached | AgentStatusChanged] = []
    status = dict(status_of)
    for pack, monitor in monitors:
        quiet = drift.quiet(monitor.name)
        for breach in evaluate(pack, monitor, events, now_ns, subjects, quiet, as_of_seq):
            out.append(breach)
            change = action_of(breach, status.get(breach.subject))
            if change is not None:
                status[breach.subject] = AgentStatus(change.status)
                out.append(change)
    return out


OBSERVED: tuple[type[Payload], ...] = (
    *_VERDICTS,
    ProposalSubmitted,
    ReasoningCharged,
    ExecutionSucceeded,
)
"""The payload types a monitor counts: a batch holding none leaves every metric as it was."""


def unproven(
    events: Sequence[Event], monitors: Sequence[tuple[str, Monitor]]
) -> list[tuple[int, str]]:
    """The recorded breaches a journal's events do not re-derive: (seq, why) each.

    Every ``DriftBreached`` is evaluated again from the events before it under the
    monitor of the same pack (``name@version``) and name in ``monitors``; a breach whose
    monitor is not given, or whose window gives another value, bound or count, is listed.
    """
    by_name = {(pack, m.name): m for pack, m in monitors}
    out: list[tuple[int, str]] = []
    for i, event in enumerate(events):
        p = event.payload
        if not isinstance(p, DriftBreached):
            continue
        monitor = by_name.get((p.pack, p.monitor))
        if monitor is None:
            out.append((event.seq, f"no monitor {p.monitor} in {p.pack} was given"))
        elif not reevaluate(p, monitor, events[:i]):
            out.append((event.seq, f"{p.monitor}: its window does not give what was recorded"))
    return out


def monitors_of(packs: Sequence[PolicyPack]) -> list[tuple[str, Monitor]]:
    """Every pack's monitors, each with its pack's ``name@version``."""
    return [(f"{p.name}@{p.version}", m) for p in packs for m in p.monitors]
