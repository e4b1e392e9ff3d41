"""The context compiler: need-to-know, limits, the token budget, byte-identical recompilation."""

from __future__ import annotations

from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import Kernel
from kernel.audit import fold, payload_of
from kernel.context import DROP_ORDER, compile_layers, estimate
from kernel.core.events import ContextCompiled, Manifest
from kernel.core.flow import FlowState
from kernel.state.projections import Projections
from kernel.testing import ManualClock
from tests.support.helpers import ScriptedAgent, kernel_for


def manifest(**limits: float) -> Manifest:
    return Manifest(agent_id="a", version="1.0", subscriptions=["bank"], limits=limits)


async def test_need_to_know_limits_and_byte_identical_recompilation(
    kernel: Kernel, clock: ManualClock
) -> None:
    agent = ScriptedAgent(subscriptions=["bank.rates"])
    agent.manifest = msgspec.structs.replace(agent.manifest, limits={"context.state.max_items": 2})
    await kernel.register(agent)
    await kernel.trigger("fx.spot", {"fx.spot.eur": "1.08"})  # nobody subscribed
    await kernel.trigger("bank.rates", {"bank.rates.a": 1, "bank.rates.b": 2})
    clock.advance(1)  # the kernel fixture's clock
    [dfid] = await kernel.trigger("bank.rates", {"bank.rates.c": 3, "bank.secret": "x"})
    await kernel.wait_flow(dfid)
    ctx = agent.contexts[-1]
    # Need-to-know: only bank.rates.*; the limit keeps the two newest.
    assert ctx.state == {"bank.rates.b": 2, "bank.rates.c": 3}
    assert ctx.dropped == ["state:bank.rates.a"]
    assert set(ctx.schemas) == {"test.transfer"}
    assert ctx.session["topic"] == "bank.rates" and ctx.session["attempt"] == 1
    assert ctx.tokens > 0

    events = await kernel.journal.read()
    [compiled] = [e for e in events if e.dfid == dfid and isinstance(e.payload, ContextCompiled)]
    recorded = payload_of(compiled, ContextCompiled)
    assert recorded.dropped == ctx.dropped and recorded.tokens == ctx.tokens
    # Recompile from the journal just before the recorded context (it travels with its
    # FlowCreated: one row, two events), twice.
    outputs = []
    for _ in range(2):
        before = fold(events[: events.index(compiled)])
        layers = compile_layers(
            before,
            before.flows[dfid],
            before.agents["clerk"].manifest,
            kernel.catalog.schemas,
            as_of_ns=recorded.as_of_ns,
        )
        outputs.append(msgspec.msgpack.encode(layers))
    assert outputs[0] == outputs[1]
    layers = msgspec.msgpack.decode(outputs[0])
    assert layers["state"] == recorded.state == ctx.state
    assert layers["dropped"] == ctx.dropped and layers["tokens"] == ctx.tokens
    assert layers["session"] == ctx.session and layers["memory"] == ctx.memory


def projections_with(facts: dict[str, object], step_ns: int = 10**9) -> Projections:
    from kernel.core.events import Event, TriggerFired

    projections = Projections()
    for seq, (key, value) in enumerate(facts.items(), 1):
        projections.apply(
            [
                Event(
                    seq=seq,
                    ts=seq * step_ns,
                    payload=TriggerFired(topic="bank", facts={key: value}),
                )
            ]
        )
    return projections


def flow_of() -> FlowState:
    from kernel.core.flow import FlowState, FlowStatus

    return FlowState(
        dfid="d",
        root_dfid="d",
        parent_dfid=None,
        agent_id="a",
        topic="bank",
        status=FlowStatus.CREATED,
        created_ts=0,
        updated_ts=0,
        last_seq=0,
    )


def test_time_window_keeps_recent_facts_only() -> None:
    projections = projections_with({"bank.old": 1, "bank.mid": 2, "bank.new": 3})
    layers = compile_layers(
        projections, flow_of(), manifest(**{"context.state.window_s": 1.5}), {}, as_of_ns=3 * 10**9
    )
    assert layers.state == {"bank.mid": 2, "bank.new": 3}


def test_over_budget_drops_artifacts_then_memory_then_state_oldest_first() -> None:
    assert DROP_ORDER == ("artifact", "memory", "state")
    big = "x" * 5000
    projections = projections_with(
        {"bank.blob": big, "bank.s1": "a" * 40, "bank.s2": "b" * 40, "bank.s3": "c" * 40}
    )
    unlimited = compile_layers(projections, flow_of(), manifest(), {})
    # The large value goes by reference, never inlined.
    assert unlimited.artifacts["bank.blob"].startswith("sha256:")
    assert "bank.blob" not in unlimited.state and unlimited.dropped == []

    budget = unlimited.tokens - estimate({"bank.s1": "a" * 40})
    tight = compile_layers(projections, flow_of(), manifest(**{"context.tokens": budget}), {})
    assert tight.dropped == ["artifact:bank.blob"]
    assert tight.tokens <= budget

    fixed = compile_layers(projections, flow_of(), manifest(**{"context.tokens": 1}), {})
    assert fixed.dropped == [
        "artifact:bank.blob",
        "state:bank.s1",
        "state:bank.s2",
        "state:bank.s3",
    ]
    assert fixed.state == {} and fixed.session["topic"] == "bank"  # the session is never dropped


async def test_triggers_compiled_in_one_batch_each_get_the_reference_of_their_state(
    tmp_path: Path,
) -> None:
    from kernel.runtime.actors import Reply
    from kernel.runtime.messages import FireTrigger
    from kernel.state.projections import context_ref

    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(subscriptions=["bank"])
        await kernel.register(agent)
        replies: list[Reply[list[str]]] = []
        # Queued before the compiler wakes, so one batch handles all three.
        for facts in ({}, {"bank.rate": 1}, {}):
            replies.append(Reply())
            kernel.actors.compiler.send_nowait(
                FireTrigger(
                    topic="bank", facts=facts, source="", parent_dfid=None, reply=replies[-1]
                )
            )
        dfids = [(await reply.wait())[0] for reply in replies]
        compiled = {
            e.dfid: payload_of(e, ContextCompiled).context_ref
            for e in await kernel.journal.read(types=["ContextCompiled"])
        }
    before, after = context_ref({}), context_ref({"bank.rate": 1})
    assert [compiled[d] for d in dfids] == [before, after, after]


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    facts=st.dictionaries(
        st.sampled_from([f"bank.k{i}" for i in range(6)]),
        st.one_of(st.integers(-5, 5), st.text(max_size=30), st.just("x" * 2100)),
        max_size=6,
    ),
    budget=st.one_of(st.none(), st.integers(1, 200)),
    rejections=st.lists(st.integers(0, 3), min_size=1, max_size=4),
)
def test_a_body_shared_by_a_batch_compiles_what_each_flow_would_alone(
    facts: dict[str, object], budget: int | None, rejections: list[int]
) -> None:
    from kernel.context._layers import layer_body

    projections = projections_with(facts)
    limits = {} if budget is None else {"context.tokens": budget}
    body = layer_body(projections, manifest(**limits), {}, "bank")
    before = msgspec.msgpack.encode(body.items)
    for n, count in enumerate(rejections):
        # Flows of one topic whose sessions differ (a tight budget then drops differently).
        flow = msgspec.structs.replace(flow_of(), dfid=f"d{n}", root_dfid=f"r{'x' * 40 * count}")
        alone = compile_layers(projections, flow, manifest(**limits), {})
        shared = compile_layers(projections, flow, manifest(**limits), {}, body=body)
        assert msgspec.msgpack.encode(shared) == msgspec.msgpack.encode(alone)
        assert msgspec.msgpack.encode(body.items) == before  # dropping left the body whole
        # An agent editing its context does not edit the next one's (nor the body's).
        shared.state.clear()
        shared.artifacts.clear()
        shared.memory["constraints"].append({"id": 0})
        shared.memory["facts"]["edited"] = True
        shared.memory["generated_at"] = "edited"
