"""Spans a running kernel emits as its stages end: the tree in memory, and over real OTLP."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

from kernel import FlowStatus, HumanDecision
from kernel.audit import open_journal
from kernel.cli._main import main as cli_main
from kernel.core.ports import SeededIds
from kernel.telemetry import (
    Telemetry,
    configure_exporter,
    resource_from_env,
    span_id_for,
    spans_for_events,
)
from kernel.telemetry._clock import iso_utc
from kernel.testing import action_of
from tests.support import SUPPORT
from tests.support.helpers import ScriptedAgent, flow_of, kernel_for, transfer
from tests.support.otlp import otlp_receiver
from tests.support.spans import attrs

RECEIVER = SUPPORT / "otlp_receiver.py"
MS = 1_000_000
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
            HumanDecision.OVERRIDE,
            operator="ana",
            reason="known vendor",
            action_hash=action_of(kernel, overridden),
        )
        await kernel.decide(aborted, HumanDecision.ABORT, operator="bob", reason="looks wrong")
        await kernel.wait_quiet()
        for dfid in (accepted, retried, child, overridden):
            assert flow_of(kernel, dfid).status is FlowStatus.CLOSED
        assert flow_of(kernel, aborted).status is FlowStatus.ABORTED
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

    def __init__(self, spans: Sequence[ReadableSpan], *, repeats: bool = False) -> None:
        self.by_id: dict[int, ReadableSpan] = {}
        for span in spans:
            if (seen := self.by_id.get(ctx(span)[1])) is not None:
                # A restarted kernel may send a span again, but never with other content.
                assert repeats, "a span was exported twice"
                assert seen.to_json() == span.to_json()
            self.by_id[ctx(span)[1]] = span
        self.spans = list(self.by_id.values())

    def root(self, dfid: str) -> ReadableSpan:
        return self.by_id[root_id(dfid)]

    def stages(self, dfid: str) -> list[ReadableSpan]:
        """The stage spans of a flow (not its resume or child-flow spans), oldest first."""
        segments = {root_id(dfid), span_id_for(dfid, "resume", 0)}
        stages = [
            s
            for s in self.spans
            if parent_of(s) in segments and not s.name.startswith(("child flow", "resume"))
        ]
        return sorted(stages, key=lambda s: (s.start_time or 0, s.end_time or 0, s.name))

    def names(self, dfid: str) -> list[str]:
        """The kinds of a flow's stages: the first word of each span's name."""
        return sorted(s.name.split()[0] for s in self.stages(dfid))

    def outcome(self, dfid: str) -> ReadableSpan:
        """The span that carries the flow's end: its resume span if it waited, else its root."""
        return self.by_id.get(span_id_for(dfid, "resume", 0)) or self.root(dfid)


@pytest.fixture
async def tree(tmp_path: Path) -> tuple[Tree, Flows]:
    exporter = InMemorySpanExporter()
    flows = await run_flows(tmp_path / "j.db", Telemetry(SimpleSpanProcessor(exporter)))
    return Tree(exporter.get_finished_spans()), flows


async def test_every_flow_is_its_own_trace_and_a_child_links_to_its_parent(
    tree: tuple[Tree, Flows],
) -> None:
    spans, flows = tree

    every = [flows.accepted, flows.retried, flows.overridden, flows.aborted, flows.child]
    assert {ctx(s)[0] for s in spans.spans} == {trace_of(d) for d in every}
    for dfid in every:
        assert ctx(spans.root(dfid))[0] == trace_of(dfid)
        assert spans.root(dfid).parent is None
        for stage in spans.stages(dfid):
            assert ctx(stage)[0] == trace_of(dfid)

    child = spans.root(flows.child)
    assert [(link.context.trace_id, link.context.span_id) for link in child.links] == [
        (trace_of(flows.accepted), root_id(flows.accepted))
    ]
    assert child.attributes is not None
    assert child.attributes["dir.parent_dfid"] == flows.accepted
    # ... and the parent's trace links to the child where it began.
    (spawn,) = [s for s in spans.spans if s.name.startswith("child flow")]
    assert ctx(spawn)[0] == trace_of(flows.accepted)
    assert parent_of(spawn) == root_id(flows.accepted)
    assert [link.context.span_id for link in spawn.links] == [root_id(flows.child)]
    # Every span is a flow's root or hangs under one of its flow's spans: nothing is orphaned.
    assert all(
        parent_of(s) in spans.by_id and ctx(spans.by_id[parent_of(s)])[0] == ctx(s)[0]  # type: ignore[index]
        for s in spans.spans
        if s.parent is not None
    )


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
        assert root.name == "invoke_workflow test.transfer"
        end = spans.outcome(dfid)
        assert end.attributes is not None
        if dfid == flows.aborted:
            # A human's rejection is a governed outcome, not a fault.
            assert end.status.status_code is StatusCode.UNSET
            assert end.attributes["dir.status"] == "ABORTED"
            assert end.attributes["dir.reason_code"] == "HUMAN_REJECTED"
        else:
            assert end.status.status_code is StatusCode.OK
            assert end.attributes["dir.status"] == "CLOSED"
        if dfid in (flows.aborted, flows.overridden):
            assert root.attributes["dir.status"] == "ESCALATED"  # it left when the wait began
    assert spans.root(flows.retried).attributes["dir.attempts"] == 2  # type: ignore[index]


async def test_stage_spans_hang_under_their_flows_root(tree: tuple[Tree, Flows]) -> None:
    spans, flows = tree

    one = ["apply_guardrail", "context", "execute_tool", "invoke_agent"]
    assert spans.names(flows.accepted) == one
    assert spans.names(flows.child) == one
    assert spans.names(flows.retried) == [
        "apply_guardrail",
        "apply_guardrail",
        "context",
        "context",
        "execute_tool",
        "invoke_agent",
        "invoke_agent",
    ]
    assert spans.names(flows.overridden) == sorted(["escalation", *one])
    assert spans.names(flows.aborted) == [
        "apply_guardrail",
        "context",
        "escalation",
        "invoke_agent",
    ]
    root = spans.root(flows.accepted)
    starts = []
    for stage in spans.stages(flows.accepted):
        assert root.start_time is not None and root.end_time is not None
        assert stage.start_time is not None and stage.end_time is not None
        assert root.start_time < stage.start_time <= stage.end_time <= root.end_time
        starts.append(stage.start_time)
    # Stage order is visible even on a clock that stands still: starts never tie.
    assert len(set(starts)) == len(starts)
    (execute,) = [s for s in spans.stages(flows.accepted) if s.name.startswith("execute")]
    assert execute.attributes is not None
    assert execute.attributes["dir.adapter"] == "bank"
    assert str(execute.attributes["dir.external_id"]).startswith("tx-")


async def test_the_rejected_attempt_is_a_governed_judge_span(tree: tuple[Tree, Flows]) -> None:
    spans, flows = tree

    validates = [s for s in spans.stages(flows.retried) if s.name == "apply_guardrail dirk DIM"]
    first, second = sorted(validates, key=lambda s: attrs(s)["dir.attempt"])
    assert first.status.status_code is StatusCode.UNSET
    assert first.attributes is not None
    assert first.attributes["dir.reason_code"] == "SCHEMA_INVALID"
    assert first.attributes["dir.verdict"] == "REJECTED"
    feedback, result = first.events
    assert feedback.attributes is not None
    assert feedback.attributes["dir.field"] == "params.amount_cents"
    # The DIM's verdict as the GenAI conventions' guardrail result, in its own words.
    assert result.name == "gen_ai.guardrail.result" and result.attributes is not None
    assert result.attributes["gen_ai.guardrail.result.type"] == "verdict"
    assert result.attributes["gen_ai.guardrail.result.value"] == "REJECTED"
    assert result.attributes["gen_ai.guardrail.result.reason"] == "SCHEMA_INVALID"
    assert first.attributes["gen_ai.operation.name"] == "apply_guardrail"
    assert first.attributes["gen_ai.guardrail.component.name"] == "dirk DIM"
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
        (validate,) = [s for s in spans.stages(dfid) if s.name.startswith("apply_guardrail")]
        assert validate.attributes is not None
        assert validate.attributes["dir.verdict"] == "ESCALATED"
        (escalation,) = [s for s in spans.stages(dfid) if s.name == "escalation LOW_CONFIDENCE"]
        assert escalation.attributes is not None
        assert escalation.attributes["dir.reason_code"] == "LOW_CONFIDENCE"
        assert escalation.attributes["dir.decision"] == decision
        assert escalation.attributes["dir.operator"] == operator


async def test_a_flow_escalated_before_a_restart_shows_while_waiting_and_ends_after_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    first = InMemorySpanExporter()
    # On the journal's clock: a span sent again is the very same span.
    journal_time = Telemetry(SimpleSpanProcessor(first), span_time="journal")
    async with kernel_for(path, telemetry=journal_time) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
    # Waiting for a human: its root and finished stages are out, before any decision.
    waiting = Tree(first.get_finished_spans())
    assert waiting.root(dfid).attributes["dir.status"] == "ESCALATED"  # type: ignore[index]
    assert waiting.names(dfid) == ["apply_guardrail", "context", "invoke_agent"]

    second = InMemorySpanExporter()
    again = Telemetry(SimpleSpanProcessor(second), span_time="journal")
    async with kernel_for(path, telemetry=again) as kernel:
        await kernel.decide(
            dfid,
            "override",
            operator="ana",
            reason="checked by phone",
            action_hash=action_of(kernel, dfid),
        )
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED

    spans = Tree([*first.get_finished_spans(), *second.get_finished_spans()], repeats=True)
    assert spans.outcome(dfid).status.status_code is StatusCode.OK
    assert spans.names(dfid) == [
        "apply_guardrail",
        "context",
        "escalation",
        "execute_tool",
        "invoke_agent",
    ]


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
        read, held, reads = kernel.journal.read, anyio.Event(), list[dict[str, Any]]()

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

    resumed = [s for s in exporter.get_finished_spans() if s.name.startswith("resume")]
    assert [ctx(s)[1] for s in resumed] == [span_id_for(dfid, "resume", 0)], "no end exported"


# --- through a real OTLP receiver -----------------------------------------------


async def read_line(stdout: BufferedByteReceiveStream) -> str:
    return (await stdout.receive_until(b"\n", 1 << 20)).decode()


async def test_a_flow_reaches_a_real_otlp_receiver_on_the_wall_clock(tmp_path: Path) -> None:
    """The test kernel's clock says November 2023: by default its spans move to now, keep
    their durations, and say when they were recorded."""
    path = tmp_path / "j.db"
    before = time.time_ns()
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
            after = time.time_ns()

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
    shifts = {received[sid]["start"] - (want.start_time or 0) for sid, want in expected.items()}
    assert len(shifts) == 1, "a flow moves as one"
    for sid, span in received.items():
        want = expected[sid]
        assert span["name"] == want.name
        assert span["parent_span_id"] == (f"{parent_of(want):016x}" if want.parent else "")
        assert span["service_name"] == "kernel-test"
        assert before <= span["start"] <= span["end"] <= after + MS
        assert span["end"] - span["start"] == (want.end_time or 0) - (want.start_time or 0)
        assert span["attributes"]["dir.journal_time"] == iso_utc(want.start_time or 0)
        assert span["attributes"]["dir.journal_time"].startswith("2023-11-14T")
    root = received[f"{root_id(dfid):016x}"]
    assert root["attributes"]["dir.dfid"] == dfid
    assert root["attributes"]["dir.agent_id"] == "clerk"
    assert root["status_code"] == StatusCode.OK.value
    # The workflow, as the GenAI conventions and OpenInference (Phoenix's columns) name it.
    assert root["name"] == "invoke_workflow test.transfer"
    attrs = root["attributes"]
    assert attrs["gen_ai.operation.name"] == "invoke_workflow"
    assert attrs["gen_ai.workflow.name"] == "test.transfer"
    # The kernel calls no model: no provider on its own spans (an LLM client's carry one).
    assert "gen_ai.provider.name" not in attrs
    assert attrs["openinference.span.kind"] == "CHAIN"
    assert json.loads(attrs["input.value"])["params"] == {"account": "acc-1", "amount_cents": 250}
    assert json.loads(attrs["output.value"]) == {"status": "CLOSED"}
    kinds = {
        s["name"].split()[0]: s["attributes"].get("openinference.span.kind")
        for s in received.values()
    }
    assert kinds == {
        "context": None,
        "invoke_agent": None,  # Phoenix reads AGENT and TOOL off gen_ai.operation.name
        "apply_guardrail": "GUARDRAIL",
        "execute_tool": None,
        "invoke_workflow": "CHAIN",
    }
    # The DIM's verdict, as the receiver got it: a guardrail span by the GenAI conventions,
    # its result the DIM's own word, the pack that judged its policy; no model provider.
    [judged] = [s for s in received.values() if s["name"] == "apply_guardrail dirk DIM"]
    guard = judged["attributes"]
    assert guard["gen_ai.operation.name"] == "apply_guardrail"
    assert guard["gen_ai.guardrail.component.name"] == "dirk DIM"
    assert guard["gen_ai.guardrail.source"] == "proposal"
    assert (guard["gen_ai.guardrail.result.type"], guard["gen_ai.guardrail.result.value"]) == (
        "verdict",
        "ACCEPTED",
    )
    assert len(guard["gen_ai.guardrail.policy.id"]) == 64  # the judging pack's hash
    assert not any("provider" in key for s in received.values() for key in s["attributes"])
    [result] = [e for e in judged["events"] if e[0] == "gen_ai.guardrail.result"]
    assert result[1]["gen_ai.guardrail.result.value"] == "ACCEPTED"


# --- the host's tracing ---------------------------------------------------------


def host_provider(**kwargs: Any) -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(shutdown_on_exit=False, **kwargs)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def instrumented(provider: TracerProvider) -> Any:
    """A step that makes an instrumented "LLM call" inside ``decide()``, then proposes."""

    def step(ctx: Any) -> Any:
        with provider.get_tracer("llm-client").start_as_current_span("chat model-x"):
            pass
        return transfer(250)(ctx)

    return step


async def test_an_instrumented_call_inside_decide_is_a_child_of_the_reasoning_span(
    tmp_path: Path,
) -> None:
    provider, exporter = host_provider()
    async with kernel_for(tmp_path / "j.db", tracer_provider=provider) as kernel:
        await kernel.register(ScriptedAgent(steps=[instrumented(provider)]))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED

    spans = exporter.get_finished_spans()
    (call,) = [s for s in spans if s.name == "chat model-x"]
    assert ctx(call)[0] == trace_of(dfid)
    assert parent_of(call) == span_id_for(dfid, "reason", 1)
    # The kernel's spans went through the application's provider too, the reasoning span
    # among them.
    (reason,) = [s for s in spans if s.name == "invoke_agent clerk"]
    assert ctx(reason) == (trace_of(dfid), span_id_for(dfid, "reason", 1))
    assert parent_of(reason) == root_id(dfid)


async def test_the_host_providers_sampler_and_resource_govern_the_kernels_spans(
    tmp_path: Path,
) -> None:
    off, dropped = host_provider(sampler=ALWAYS_OFF)
    async with kernel_for(tmp_path / "off.db", tracer_provider=off) as kernel:
        await kernel.register(ScriptedAgent(steps=[instrumented(off)]))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
    assert dropped.get_finished_spans() == ()

    shop, kept = host_provider(resource=Resource.create({"service.name": "shop"}))
    async with kernel_for(tmp_path / "on.db", tracer_provider=shop) as kernel:
        await kernel.register(ScriptedAgent())
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
    spans = kept.get_finished_spans()
    assert len(spans) == 5
    assert {s.resource.attributes["service.name"] for s in spans} == {"shop"}
    # The kernel flushes the application's provider but leaves it running.
    assert shop.get_tracer("after").start_span("still-on").is_recording()


# --- live, through a real OTLP receiver and the standard variables ----------------


def live_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, **more: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")  # ms: a live test need not wait 5 s
    for name, value in more.items():
        monkeypatch.setenv(name, value)


def content(span: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in span.items() if k not in ("resource",)}


async def test_a_waiting_flow_is_visible_live_and_export_never_changes_a_spans_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"
    with anyio.fail_after(60):
        async with otlp_receiver() as received:
            # On the journal's clock, live, restarted and re-exported spans are identical.
            live_env(monkeypatch, received.endpoint, DIRK_SPAN_TIME="journal")
            async with kernel_for(path) as kernel:
                await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2)]))
                [dfid] = await kernel.trigger("bank.invoice")
                await kernel.wait_flow(dfid)
                root_hex = f"{root_id(dfid):016x}"

                def root_arrived(items: list[dict[str, Any]]) -> bool:
                    return any(i.get("span_id") == root_hex for i in items)

                # Before any decision, while the kernel runs: the root and finished stages.
                await received.until(root_arrived)
                (root,) = [s for s in received.spans() if s["span_id"] == root_hex]
                assert root["attributes"]["dir.status"] == "ESCALATED"
                assert root["trace_id"] == f"{trace_of(dfid):032x}"
            trace_hex = f"{trace_of(dfid):032x}"

            def ids() -> set[str]:
                return {s["span_id"] for s in received.spans() if s["trace_id"] == trace_hex}

            # The kernel has closed: what it showed of the waiting flow is all there.
            await received.until(lambda _: len(ids()) >= 4)
            waiting = ids()
            assert sorted(s["name"].split()[0] for s in received.spans()) == [
                "apply_guardrail",
                "context",
                "invoke_agent",
                "invoke_workflow",
            ]

            async with kernel_for(path) as kernel:
                await kernel.decide(
                    dfid,
                    "override",
                    operator="ana",
                    reason="ok",
                    action_hash=action_of(kernel, dfid),
                )
                assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            resume_hex = f"{span_id_for(dfid, 'resume', 0):016x}"
            await received.until(lambda items: any(i.get("span_id") == resume_hex for i in items))
            live = len(received.items)

            # Re-export the whole journal to the same receiver, as an operator would.
            argv = ["traces", "export", "--db", str(path)]
            assert await anyio.to_thread.run_sync(cli_main, argv) == 0
            capsys.readouterr()
            await received.until(lambda items: len(items) >= live + 7)

    by_id: dict[str, dict[str, Any]] = {}
    for span in received.spans():
        seen = by_id.setdefault(span["span_id"], span)
        assert content(seen) == content(span), f"span {span['name']} changed content"
    assert waiting <= by_id.keys()
    assert len(by_id) == 7  # + escalation, execute_tool, resume


async def test_the_standard_variables_choose_the_resource_and_the_sampler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with anyio.fail_after(60):
        async with otlp_receiver() as received:
            live_env(
                monkeypatch,
                received.endpoint,
                OTEL_RESOURCE_ATTRIBUTES="service.name=from-ra,deployment.environment=test",
            )
            async with kernel_for(tmp_path / "a.db") as kernel:
                await kernel.register(ScriptedAgent())
                [kept] = await kernel.trigger("bank.invoice")
                await kernel.wait_flow(kept)
            await received.until(lambda _: len(received.spans()) >= 5)
            assert {s["service_name"] for s in received.spans()} == {"from-ra"}
            assert {s["resource"]["deployment.environment"] for s in received.spans()} == {"test"}

            monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
            async with kernel_for(tmp_path / "b.db", ids=SeededIds(8)) as kernel:
                await kernel.register(ScriptedAgent())
                [dropped] = await kernel.trigger("bank.invoice")
                await kernel.wait_flow(dropped)
            # The kernel flushed on close; a marker sent after it arrives after anything it sent.
            monkeypatch.delenv("OTEL_TRACES_SAMPLER")
            marker = Telemetry.from_env()
            async with open_journal(tmp_path / "a.db", readonly=True) as journal:
                marker.emit(await journal.read())
            await anyio.to_thread.run_sync(marker.shutdown)
            await received.until(lambda _: len(received.spans()) >= 10)
    assert not [s for s in received.spans() if s["trace_id"] == f"{trace_of(dropped):032x}"]


async def test_metrics_arrive_over_otlp_when_an_endpoint_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with anyio.fail_after(60):
        async with otlp_receiver() as received:
            live_env(monkeypatch, received.endpoint)
            async with kernel_for(tmp_path / "j.db") as kernel:
                await kernel.register(
                    ScriptedAgent(steps=[schema_invalid, transfer(250)], subscriptions=["bank"])
                )
                await kernel.register(
                    ScriptedAgent("auditor", [transfer(confidence=0.2)], subscriptions=["audit"])
                )
                [closed] = await kernel.trigger("bank.invoice")
                [waiting] = await kernel.trigger("audit.check")
                await kernel.wait_flow(closed)
                await kernel.wait_flow(waiting)

            def points(name: str) -> list[dict[str, Any]]:
                return [i for i in received.items if i.get("metric") == name]

            names = ["dir.flows", "dir.verdicts", "dir.escalations.waiting"]
            names += ["dir.execution.duration", "dir.journal.batch_size"]
            await received.until(lambda _: all(points(name) for name in names))
    (flows,) = points("dir.flows")
    assert (flows["attributes"], flows["value"]) == ({"dir.status": "CLOSED"}, 1)
    verdicts = {
        (p["attributes"]["dir.verdict"], p["attributes"].get("dir.reason_code")): p["value"]
        for p in points("dir.verdicts")
    }
    assert verdicts == {
        ("REJECTED", "SCHEMA_INVALID"): 1,
        ("ACCEPTED", None): 1,
        ("ESCALATED", "LOW_CONFIDENCE"): 1,
    }
    assert [p["value"] for p in points("dir.escalations.waiting")] == [1]
    (latency,) = points("dir.execution.duration")
    assert latency["count"] == 1 and latency["attributes"]["dir.adapter"] == "bank"
