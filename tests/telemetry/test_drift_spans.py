"""A drift breach is a span of its own: no flow's trace, the evidence window its duration,
whom it was about named as flows name their principals (pseudonymised under a key)."""

from __future__ import annotations

from kernel.core.events import DriftBreached, Event
from kernel.telemetry import SpanProjector
from kernel.telemetry._drift import breach_trace
from kernel.telemetry._principal import PrincipalSpans, pseudonym

MINUTE = 60 * 10**9


def breach(by: str, subject: str) -> Event:
    payload = DriftBreached(
        pack="desk@0.3.0",
        monitor="refusals",
        metric="refusal_rate",
        by=by,
        subject=subject,
        value=0.42,
        bound=0.4,
        window_start_ns=10 * MINUTE,
        window_end_ns=30 * MINUTE,
        samples=12,
        action="demote",
        first_seq=97,
        last_seq=350,
    )
    return Event(seq=352, ts=30 * MINUTE + 5, payload=payload)


def test_a_breach_about_an_agent_is_a_root_span_over_its_window() -> None:
    [record] = SpanProjector().feed([breach("agent", "hedger")])
    assert record.parent is None and record.final
    assert record.dfid == breach_trace(breach("agent", "hedger").payload)  # type: ignore[arg-type]
    assert (record.start, record.end) == (10 * MINUTE, 30 * MINUTE + 5)
    assert record.attrs["gen_ai.agent.id"] == "hedger"
    assert record.attrs["dir.drift.value"] == 0.42 and record.attrs["dir.drift.bound"] == 0.4
    assert record.error == "refusal_rate 0.42 crossed 0.4"


def test_a_breach_about_a_principal_names_it_as_a_flow_would() -> None:
    [plain] = PrincipalSpans().feed([breach("principal", "acme/ann")])
    assert (plain.attrs["dirk.tenant"], plain.attrs["user.id"]) == ("acme", "ann")
    key = b"span key"
    [hidden] = PrincipalSpans(key).feed([breach("principal", "acme/ann")])
    assert hidden.attrs["user.id"] == pseudonym(key, "acme", "ann") != "ann"
    assert "ann" not in str(sorted(hidden.attrs.items()))
