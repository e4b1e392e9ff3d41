"""Drift monitors: a scripted agent drifts mid-day and is demoted, and replay agrees.

Evaluation is a pure function of recorded events and a recorded time, so these tests
build the journal's events directly (Event with seq, ts, agent and payload) and run the
evaluator where a live kernel would: after each verdict, on the verdict's own time.
"""

from __future__ import annotations

import dataclasses
import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.core._principal_events import OnBehalf, Principal
from kernel.core.events import (
    AgentStatusChanged,
    DriftBreached,
    Event,
    Feedback,
    FlowCreated,
    Payload,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
    ReasoningCharged,
)
from kernel.core.reasons import ReasonCode
from kernel.policy.monitors import Monitor
from kernel.policy.packs import PackError
from kernel.state.drift import (
    NS,
    OPERATOR,
    Drift,
    Subjects,
    action_of,
    evaluate,
    reevaluate,
    unproven,
    watch,
)
from kernel.state.records import AgentStatus
from kernel.webhooks._notices import notice_of
from policies.booking import BOOKING

MINUTE = 60 * NS
NOON = 12 * 60  # minutes into the day

REFUSALS = Monitor(
    name="refusals",
    metric="refusal_rate",
    window_s=3600,
    baseline_s=3600,
    factor=3.0,
    bound=0.1,
    min_samples=20,
    action="demote",
)


class Journal:
    """Events as the kernel would record them: consecutive seqs, times as given."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, payload: Payload, ts: int, agent: str = "a1", dfid: str = "") -> Event:
        event = Event(
            seq=len(self.events) + 1,
            ts=ts,
            payload=payload,  # type: ignore[arg-type]  # every Payload here is of AnyPayload
            agent_id=agent,
            dfid=dfid or None,
        )
        self.events.append(event)
        return event


def verdict(refused: bool) -> Payload:
    if refused:
        return ProposalRejected(attempt=1, feedback=Feedback(reason_code=ReasonCode.POLICY_DENIED))
    return ProposalAccepted(attempt=1)


def drifting_day(journal: Journal, drift: Drift) -> list[Payload]:
    """A scripted agent: one verdict a minute, 1 in 50 refused until noon, 2 in 5 after.

    After each verdict the monitors run on its time, as a live kernel would; what they
    return is recorded, and the first demotion ends the agent's day (it is PASSIVE).
    """
    status = {"a1": AgentStatus.ACTIVE}
    recorded: list[Payload] = []
    for minute in range(6 * 60, 18 * 60):
        refused = minute % 50 == 0 if minute < NOON else minute % 5 < 2
        ts = minute * MINUTE
        journal.add(verdict(refused), ts)
        for payload in watch([("ops@1.0.0", REFUSALS)], journal.events, ts, drift, status):
            event = journal.add(payload, ts)
            recorded.append(payload)
            if isinstance(payload, DriftBreached):
                drift.folds()[DriftBreached](event)
            if isinstance(payload, AgentStatusChanged):
                status["a1"] = AgentStatus(payload.status)
        if status["a1"] != AgentStatus.ACTIVE:
            break
    return recorded


def test_refusals_climbing_mid_day_demote_the_agent_at_the_breach() -> None:
    journal, drift = Journal(), Drift(None)  # type: ignore[arg-type]
    recorded = drifting_day(journal, drift)
    breach, change = recorded
    assert isinstance(breach, DriftBreached) and isinstance(change, AgentStatusChanged)
    assert change.status == AgentStatus.PASSIVE and change.operator == OPERATOR
    # Breached after noon, once the hour's refusal rate passed 3x the morning's.
    assert breach.window_end_ns > NOON * MINUTE
    assert breach.baseline is not None and breach.value > 3 * breach.baseline
    assert breach.samples >= REFUSALS.min_samples
    assert breach.first_seq < breach.last_seq <= len(journal.events)
    assert str(breach.first_seq) in change.reason
    assert drift.breaches["a1"]["refusals"].value == breach.value


def test_the_breach_replays_identically() -> None:
    journal, drift = Journal(), Drift(None)  # type: ignore[arg-type]
    breach = drifting_day(journal, drift)[0]
    assert isinstance(breach, DriftBreached)
    # The whole journal read again, with the breach in it, gives the same breach.
    assert reevaluate(breach, REFUSALS, journal.events)
    # A second day run from scratch records the same events.
    again = Journal()
    drifting_day(again, Drift(None))  # type: ignore[arg-type]
    assert again.events == journal.events
    # A recorded breach whose value was tampered with does not re-derive.
    assert not reevaluate(msgspec.structs.replace(breach, value=0.99), REFUSALS, journal.events)


def test_a_breach_is_recorded_once_per_window() -> None:
    journal, drift = Journal(), Drift(None)  # type: ignore[arg-type]
    notify = dataclasses.replace(REFUSALS, action="notify")
    status = {"a1": AgentStatus.ACTIVE}
    breaches: list[int] = []
    for minute in range(6 * 60, 15 * 60):
        ts = minute * MINUTE
        journal.add(verdict((minute >= NOON and minute % 5 < 2) or minute % 50 == 0), ts)
        for payload in watch([("ops@1.0.0", notify)], journal.events, ts, drift, status):
            assert isinstance(payload, DriftBreached)  # notify: no status change
            drift.folds()[DriftBreached](journal.add(payload, ts))
            breaches.append(minute)
    assert breaches
    assert all(b - a >= 60 for a, b in itertools.pairwise(breaches))


def test_an_operator_restores_the_demoted_agent_and_the_monitor_never_lifts_a_demotion() -> None:
    journal, drift = Journal(), Drift(None)  # type: ignore[arg-type]
    breach = drifting_day(journal, drift)[0]
    assert isinstance(breach, DriftBreached)
    # Demoted, the agent is not demoted again, nor restored, by a monitor.
    assert action_of(breach, AgentStatus.PASSIVE) is None
    # The operator restores it (as kernel.registry records it): ACTIVE again, and the
    # monitor stays quiet for a window, then judges the agent's new behaviour afresh.
    restored = AgentStatusChanged(status="ACTIVE", reason="model rolled back", operator="ops")
    journal.add(restored, breach.window_end_ns + MINUTE)
    quiet = drift.quiet("refusals")
    assert evaluate("ops@1.0.0", REFUSALS, journal.events, breach.window_end_ns + MINUTE,
                    quiet=quiet) == []  # fmt: skip


def test_a_fixed_bound_on_spend() -> None:
    journal = Journal()
    budget = Monitor(name="spend", metric="spend", window_s=600, bound=1_000, action="suspend")
    for minute in range(10):
        journal.add(ReasoningCharged(tokens={"m": 1}, amount=100, currency="EUR"), minute * MINUTE)
    # 10 charges of 100 in the window ending at minute 9: exactly 1000, not a breach.
    assert evaluate("p@1", budget, journal.events, 9 * MINUTE) == []
    journal.add(ReasoningCharged(tokens={"m": 1}, amount=1, currency="EUR"), 9 * MINUTE)
    (breach,) = evaluate("p@1", budget, journal.events, 9 * MINUTE)
    assert breach.value == 1001 and breach.bound == 1000 and breach.samples == 11
    change = action_of(breach, AgentStatus.ACTIVE)
    assert change is not None and change.status == AgentStatus.SUSPENDED
    # Ten minutes on, the first charges left the window.
    assert evaluate("p@1", budget, journal.events, 19 * MINUTE) == []


def test_no_monitor_no_events() -> None:
    journal, drift = Journal(), Drift(None)  # type: ignore[arg-type]
    for minute in range(120):
        journal.add(verdict(True), minute * MINUTE)
    assert watch([], journal.events, 120 * MINUTE, drift, {"a1": AgentStatus.ACTIVE}) == []
    # A pack without monitors keeps its hash; one with a monitor hashes it.
    assert dataclasses.replace(BOOKING, monitors=()).hash == BOOKING.hash
    watched = dataclasses.replace(BOOKING, monitors=(REFUSALS,))
    assert watched.hash != BOOKING.hash
    other = dataclasses.replace(BOOKING, monitors=(dataclasses.replace(REFUSALS, factor=4.0),))
    assert other.hash != watched.hash


def test_monitors_by_principal_group_by_the_flow_s_principal() -> None:
    journal = Journal()
    for i, user in enumerate(["ann", "bob"]):
        who = OnBehalf(principal=Principal(tenant="t", user=user))
        journal.add(FlowCreated(root_dfid=f"f{i}", on_behalf=who), 0, dfid=f"f{i}")
    low = Monitor(
        name="conf", metric="mean_confidence", window_s=60, bound=0.5, by="principal",
        action="demote",
    )  # fmt: skip
    for i, confidence in enumerate([0.9, 0.2]):
        proposal = ProposalRecord(kind="k", confidence=confidence)
        journal.add(ProposalSubmitted(attempt=1, proposal=proposal), NS, dfid=f"f{i}")
    (breach,) = evaluate("p@1", low, journal.events, 2 * NS, Subjects())
    assert breach.subject == "t/bob" and breach.value == 0.2
    # A principal is not an agent: the breach is told, no agent's status changes.
    assert breach.action == "demote" and action_of(breach, AgentStatus.ACTIVE) is None


def test_a_breach_makes_a_webhook_notice() -> None:
    journal = Journal()
    breach = DriftBreached(
        pack="p@1", monitor="m", metric="spend", by="agent", subject="a1", value=2.0,
        bound=1.0, window_start_ns=0, window_end_ns=NS, samples=2, action="notify",
    )  # fmt: skip
    notice = notice_of(journal.add(breach, NS))
    assert notice is not None and notice.target == "a1" and notice.fields["monitor"] == "m"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"metric": "nonsense", "bound": 1.0},
        {"metric": "spend"},
        {"metric": "spend", "baseline_s": 60, "factor": 0},
        {"metric": "spend", "bound": 1.0, "action": "delete"},
        {"metric": "spend", "bound": 1.0, "window_s": 0},
        {"metric": "refusal_rate", "bound": 0.5, "reasons": ("NO_SUCH_CODE",)},
        {"metric": "spend", "bound": 1.0, "reasons": ("SCHEMA_INVALID",)},
    ],
)
def test_a_broken_monitor_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(PackError):
        Monitor(**{"name": "m", "window_s": 60, **kwargs})  # type: ignore[arg-type]


@given(
    amounts=st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=30),
    over=st.integers(min_value=0, max_value=5),
)
def test_exactly_at_the_bound_is_no_breach_above_it_is(amounts: list[int], over: int) -> None:
    journal = Journal()
    for i, amount in enumerate(amounts):
        journal.add(ReasoningCharged(tokens={}, amount=amount, currency="EUR"), (i + 1) * NS)
    now = len(amounts) * NS
    bound = sum(amounts) - over
    monitor = Monitor(name="s", metric="spend", window_s=len(amounts), bound=bound)
    breaches = evaluate("p@1", monitor, journal.events, now)
    assert bool(breaches) == (over > 0)


@given(
    window=st.integers(min_value=1, max_value=100),
    offset=st.integers(min_value=-3, max_value=3),
)
def test_the_window_holds_its_end_and_not_its_start(window: int, offset: int) -> None:
    journal = Journal()
    now = 1_000 * NS
    ts = now - window * NS + offset * NS
    journal.add(ReasoningCharged(tokens={}, amount=5, currency="EUR"), ts)
    monitor = Monitor(name="s", metric="spend", window_s=window, bound=0)
    inside = now - window * NS < ts <= now
    assert bool(evaluate("p@1", monitor, journal.events, now)) == inside


def test_every_recorded_breach_re_derives_and_a_forged_one_does_not() -> None:
    journal, drift = Journal(), Drift(None)  # type: ignore[arg-type]
    drifting_day(journal, drift)
    monitors = [("ops@1.0.0", REFUSALS)]
    assert unproven(journal.events, monitors) == []
    # A breach nobody's window gives, written into the journal by hand, is found out.
    forged = DriftBreached(
        pack="ops@1.0.0", monitor="refusals", metric="refusal_rate", by="agent", subject="a1",
        value=0.9, bound=0.1, window_start_ns=0, window_end_ns=7 * 60 * MINUTE, samples=60,
        action="demote",
    )  # fmt: skip
    at = journal.add(forged, 7 * 60 * MINUTE)
    assert [seq for seq, _ in unproven(journal.events, monitors)] == [at.seq]
    assert unproven(journal.events, [])[0][1].startswith("no monitor refusals")


def test_a_monitor_of_some_reasons_counts_only_their_refusals() -> None:
    """Malformed proposals climb; refusals for contention the agent does not cause do not count."""
    malformed = dataclasses.replace(
        REFUSALS, baseline_s=None, bound=0.4, min_samples=8, reasons=("SCHEMA_INVALID",)
    )
    journal = Journal()
    for minute in range(10):  # every verdict refused, but for contention: no breach
        code = ReasonCode.RESOURCE_CONTENTION
        journal.add(
            ProposalRejected(attempt=1, feedback=Feedback(reason_code=code)), minute * MINUTE
        )
    now = 10 * MINUTE
    assert evaluate("ops@1.0.0", malformed, journal.events, now) == []
    assert evaluate("ops@1.0.0", dataclasses.replace(malformed, reasons=()), journal.events, now)
    for minute in range(10, 18):  # now malformed ones: 8 of 18 verdicts, 44%
        code = ReasonCode.SCHEMA_INVALID
        journal.add(
            ProposalRejected(attempt=1, feedback=Feedback(reason_code=code)), minute * MINUTE
        )
    [breach] = evaluate("ops@1.0.0", malformed, journal.events, 18 * MINUTE)
    assert (breach.value, breach.samples) == (8 / 18, 18)
    # Without reasons a monitor hashes as before; with them, they enter the pack's hash.
    assert len(malformed.hashed()) == len(REFUSALS.hashed()) + 1
    assert dataclasses.replace(malformed, reasons=()).hashed()[-1] == "agent"
