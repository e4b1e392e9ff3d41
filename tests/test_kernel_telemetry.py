"""Spans a running kernel emits as its flows end: the tree in memory, and over real OTLP."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kernel import Decision, FlowStatus
from kernel.audit import open_journal
from kernel.telemetry import (
    Telemetry,
    configure_exporter,
    resource_from_env,
    span_id_for,
    spans_for_events,
)
from kernel.testing import action_of
from tests.support.helpers import ScriptedAgent, kernel_for, transfer

RECEIVER = Path(__file__).parent / "support" / "otlp_receiver.py"
AGENTS = ("clerk", "other", "auditor")


def schema_invalid(ctx: Any) -> Any:
    return ctx.propose({"kind": "test.transfer", "account": "a", "amount_cents": "ten"})


@dataclass(frozen=True)
class Flows:
    accepted: str
    retried: str  # rejected once, then accepted
    child: str  # a child flow of ``accepted``
    overridden: str  # escalated, then overridden by a human
    aborted: str  # escalated, then aborted by a human


async def run_flows(path: Path, telemetry: Telemetry) -> Flows:
    """Drive one of each kind of flow through a kernel, which is closed on return."""
    async with kernel_for(path, allow=AGENTS, telemetry=telemetry) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250)], subscriptions=["bank"]))
        await kernel.register(
            ScriptedAgent("other", [schema_invalid, transfer(10)], subscriptions=["retry"])
        )
        await kernel.register(
            ScriptedAgent("auditor", [transfer(9_000, confidence=0.2)], subscriptions=["audit"])
        )
        [accepted] = await kernel.trigger("bank.invoice", {"bank.invoice.amount": 250})
        [retried] = await kernel.trigger("retry.invoice")
        [overridden] = await kernel.trigger("audit.check")
        [aborted] = await kernel.trigger("audit.check")
        await kernel.wait_quiet()
        [child] = await kernel.trigger("bank.refund", parent=accepted)
        await kernel.decide(
            overridden,
            Decision.OVERRIDE,
            operator="ana",
            reason="known vendor",
            action_hash=action_of(kernel, overridden),
        )
        await kernel.decide(aborted, Decision.ABORT, operator="bob", reason="looks wrong")
        await kernel.wait_quiet()
        for dfid in (accepted, retried, child, overridden):
            assert kernel.flow(dfid).status is FlowStatus.CLOSED
        assert kernel.flow(aborted).status is FlowStatus.ABORTED
    return Flows(accepted, retried, child, overridden, aborted)


def trace_of(dfid: str) -> int:
    return uuid.UUID(dfid).int


def root_id(dfid: str) -> int:
    return span_id_for(dfid, "flow", 0)


def ctx(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


class Tree:
    """The finished spans, indexed the way the assertions ask for them."""

    def __init__(self, spans: Sequence[ReadableSpan]) -> None:
        self.spans = list(spans)
        self.by_id = {ctx(s)[1]: s for s in self.spans}
        assert len(self.by_id) == len(self.spans), "a span was exported twice"

    def root(self, dfid: str) -> ReadableSpan:
        (root,) = [s for s in self.spans if s.attributes and s.attributes.get("dir.dfid") == dfid]
        assert ctx(root)[1] == root_id(dfid)
        return root

    def stages(self, dfid: str) -> list[ReadableSpan]:
        """The stage spans of a flow (its children that are not child flows), oldest first."""
        children = [s for s in self.spans if parent_of(s) == root_id(dfid)]
        stages = [s for s in children if "dir.dfid" not in (s.attributes or {})]
        return sorted(stages, key=lambda s: (s.start_time or 0, s.end_time or 0, s.name))

    def names(self, dfid: str) -> list[str]:
        return sorted(s.name for s in self.stages(dfid))


@pytest.fixture
async def tree(tmp_path: Path) -> tuple[Tree, Flows]:
    exporter = InMemorySpanExporter()
    flows = await run_flows(tmp_path / "j.db", Telemetry(SimpleSpanProcessor(exporter)))
    return Tree(exporter.get_finished_spans()), flows


async def test_each_root_flow_is_one_trace_and_its_child_joins_the_parents(
    tree: tuple[Tree, Flows],
) -> None:
    spans, flows = tree

    roots = [flows.accepted, flows.retried, flows.overridden, flows.aborted]
    assert {ctx(s)[0] for s in spans.spans} == {trace_of(d) for d in roots}
    for dfid in roots:
        assert ctx(spans.root(dfid))[0] == trace_of(dfid)
        assert spans.root(dfid).parent is None
        for stage in spans.stages(dfid):
            assert ctx(stage)[0] == trace_of(dfid)

    child = spans.root(flows.child)
    assert ctx(child)[0] == trace_of(flows.accepted)
    assert parent_of(child) == root_id(flows.accepted)
    assert child.attributes is not None
    assert child.attributes["dir.parent_dfid"] == flows.accepted
    assert all(ctx(s)[0] == trace_of(flows.accepted) for s in spans.stages(flows.child))
    # Every span is a flow's root or hangs under one: nothing is orphaned.
    every_root = {root_id(d) for d in [*roots, flows.child]}
    assert all(parent_of(s) in every_root for s in spans.spans if parent_of(s) is not None)


async def test_root_spans_name_the_flow_agent_and_policy_kind(tree: tuple[Tree, Flows]) -> None:
    spans, flows = tree

    agents = {
        flows.accepted: "clerk",
        flows.child: "clerk",
        flows.retried: "other",
        flows.overridden: "auditor",
        flows.aborted: "auditor",
    }
    for dfid, agent in agents.items():
        root = spans.root(dfid)
        assert root.attributes is not None
        assert root.attributes["dir.dfid"] == dfid
        assert root.attributes["dir.agent_id"] == agent
        assert root.attributes["dir.policy_kind"] == "test.transfer"
        assert root.name == "flow test.transfer"
        if dfid == flows.aborted:
            assert root.status.status_code is StatusCode.ERROR
            assert root.status.description == "HUMAN_REJECTED"
            assert root.attributes["dir.status"] == "ABORTED"
            assert root.attributes["dir.reason_code"] == "HUMAN_REJECTED"
        else:
            assert root.status.status_code is StatusCode.OK
            assert root.attributes["dir.status"] == "CLOSED"
    assert spans.root(flows.retried).attributes["dir.attempts"] == 2  # type: ignore[index]


async def test_stage_spans_hang_under_their_flows_root(tree: tuple[Tree, Flows]) -> None:
    spans, flows = tree

    assert spans.names(flows.accepted) == ["context", "execute", "reason", "validate"]
    assert spans.names(flows.child) == ["context", "execute", "reason", "validate"]
    assert spans.names(flows.retried) == [
        "context",
        "context",
        "execute",
        "reason",
        "reason",
        "validate",
        "validate",
    ]
    assert spans.names(flows.overridden) == [
        "context",
        "escalation",
        "execute",
        "reason",
        "validate",
    ]
    assert spans.names(flows.aborted) == ["context", "escalation", "reason", "validate"]
    for stage in spans.stages(flows.accepted):
        root = spans.root(flows.accepted)
        assert root.start_time is not None and root.end_time is not None
        assert stage.start_time is not None and stage.end_time is not None
        assert root.start_time <= stage.start_time <= stage.end_time <= root.end_time
    (execute,) = [s for s in spans.stages(flows.accepted) if s.name == "execute"]
    assert execute.attributes is not None
    assert execute.attributes["dir.adapter"] == "bank"
    assert str(execute.attributes["dir.external_id"]).startswith("tx-")


async def test_the_rejected_attempt_is_an_error_validate_span(tree: tuple[Tree, Flows]) -> None:
    spans, flows = tree

    validates = [s for s in spans.stages(flows.retried) if s.name == "validate"]
    first, second = sorted(validates, key=lambda s: s.attributes["dir.attempt"])  # type: ignore[index]
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "SCHEMA_INVALID"
    assert first.attributes is not None
    assert first.attributes["dir.reason_code"] == "SCHEMA_INVALID"
    assert first.attributes["dir.verdict"] == "REJECTED"
    (feedback,) = first.events
    assert feedback.attributes is not None
    assert feedback.attributes["dir.field"] == "params.amount_cents"
    assert second.status.status_code is StatusCode.UNSET
    assert second.attributes is not None
    assert second.attributes["dir.verdict"] == "ACCEPTED"
    assert second.attributes["dir.attempt"] == 2


async def test_escalation_spans_carry_the_human_decision(tree: tuple[Tree, Flows]) -> None:
    spans, flows = tree

    for dfid, decision, operator in [
        (flows.overridden, "override", "ana"),
        (flows.aborted, "abort", "bob"),
    ]:
        (validate,) = [s for s in spans.stages(dfid) if s.name == "validate"]
        assert validate.attributes is not None
        assert validate.attributes["dir.verdict"] == "ESCALATED"
        (escalation,) = [s for s in spans.stages(dfid) if s.name == "escalation"]
        assert escalation.attributes is not None
        assert escalation.attributes["dir.reason_code"] == "LOW_CONFIDENCE"
        assert escalation.attributes["dir.decision"] == decision
        assert escalation.attributes["dir.operator"] == operator


async def test_a_flow_escalated_before_a_restart_is_exported_when_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    first = InMemorySpanExporter()
    async with kernel_for(path, telemetry=Telemetry(SimpleSpanProcessor(first))) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
    assert first.get_finished_spans() == ()  # not ended: nothing to export yet

    second = InMemorySpanExporter()
    async with kernel_for(path, telemetry=Telemetry(SimpleSpanProcessor(second))) as kernel:
        await kernel.decide(
            dfid,
            "override",
            operator="ana",
            reason="checked by phone",
            action_hash=action_of(kernel, dfid),
        )
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED

    spans = Tree(second.get_finished_spans())
    assert spans.root(dfid).status.status_code is StatusCode.OK
    assert spans.names(dfid) == ["context", "escalation", "execute", "reason", "validate"]


async def test_a_flow_left_open_is_exported_even_if_the_kernel_closes_before_catching_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)

    exporter = InMemorySpanExporter()
    async with kernel_for(path, telemetry=Telemetry(SimpleSpanProcessor(exporter))) as kernel:
        # Telemetry catches up on the flows an earlier run left open by reading the
        # journal's past. Hold its first such read back, as a slow disk (or a few
        # hundred open flows) would, until the kernel closes.
        read, held, reads = kernel.journal.read, anyio.Event(), []

        async def slow_read(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("stop") is not None and not reads:
                reads.append(kwargs)
                await held.wait()
            return await read(*args, **kwargs)

        monkeypatch.setattr(kernel.journal, "read", slow_read)
        await kernel.decide(
            dfid,
            "override",
            operator="ana",
            reason="checked by phone",
            action_hash=action_of(kernel, dfid),
        )
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED

    roots = [s for s in exporter.get_finished_spans() if parent_of(s) is None]
    assert [ctx(s)[1] for s in roots] == [root_id(dfid)], "the flow ended without spans"


# --- through a real OTLP receiver -----------------------------------------------


async def read_line(stdout: BufferedByteReceiveStream) -> str:
    return (await stdout.receive_until(b"\n", 1 << 20)).decode()


async def test_a_flow_reaches_a_real_otlp_receiver(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with anyio.fail_after(60):
        async with await anyio.open_process([sys.executable, str(RECEIVER)]) as receiver:
            assert receiver.stdout is not None
            stdout = BufferedByteReceiveStream(receiver.stdout)
            port = int((await read_line(stdout)).removeprefix("PORT "))
            processor = configure_exporter(
                {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
            )
            resource = resource_from_env({"OTEL_SERVICE_NAME": "kernel-test"})
            telemetry = Telemetry(processor, resource=resource)
            async with kernel_for(path, telemetry=telemetry) as kernel:
                await kernel.register(ScriptedAgent(steps=[transfer(250)]))
                [dfid] = await kernel.trigger("bank.invoice")
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED

            async with open_journal(path, readonly=True) as journal:
                expected = {
                    f"{ctx(s)[1]:016x}": s
                    for s in spans_for_events(await journal.read())
                    if ctx(s)[0] == trace_of(dfid)
                }
            trace_hex = f"{trace_of(dfid):032x}"
            received: dict[str, dict[str, Any]] = {}
            while received.keys() != expected.keys():
                span = json.loads(await read_line(stdout))
                if span["trace_id"] == trace_hex:
                    assert span["span_id"] not in received, "a span arrived twice"
                    received[span["span_id"]] = span

    assert len(expected) == 5
    for sid, span in received.items():
        want = expected[sid]
        assert span["name"] == want.name
        assert span["parent_span_id"] == (f"{parent_of(want):016x}" if want.parent else "")
        assert span["service_name"] == "kernel-test"
    root = received[f"{root_id(dfid):016x}"]
    assert root["attributes"]["dir.dfid"] == dfid
    assert root["attributes"]["dir.agent_id"] == "clerk"
    assert root["status_code"] == StatusCode.OK.value
