"""Each compared system on tiny hand-built scenarios, and the governed kernel against its fold."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from examples.beliefs.governed import GovernedKernel
from examples.beliefs.port import ToolCall, translate
from examples.beliefs.scenarios import (
    FALSE,
    HOUR,
    TRUE,
    UNKNOWN,
    Observation,
    Question,
    Scenario,
    Source,
    Truth,
    bundle,
)
from examples.beliefs.systems import (
    KeyValue,
    Outcome,
    PolicyFold,
    RawLog,
    System,
    at_ns,
    offset_s,
    read_outcome,
)
from kernel.audit import open_journal, state_at


def src(id: str, group: str, reliability: int = 1_000_000) -> Source:
    return Source(id=id, source_type="news", group=group, reliability=reliability)


def obs(
    n: int,
    hours: int,
    source: str,
    mention: str,
    value: str,
    kind: str = "claim",
    attribute: str = "city",
    assertive: bool = False,
) -> Observation:
    return Observation(
        id=f"t/o{n}",
        at_s=hours * HOUR,
        source=source,
        kind=kind,
        mention=mention,
        attribute=attribute,
        value=value,
        text=f"{source}: {mention}'s {attribute} is {value}",
        assertive=assertive,
    )


def scenario(
    sources: list[Source],
    observations: list[Observation],
    truths: list[Truth],
    questions: list[Question],
    entities: dict[str, str] | None = None,
) -> Scenario:
    mentions = entities or {t.mention: f"true:{t.mention}" for t in truths}
    return Scenario(
        id="t",
        family="hand",
        seed=0,
        sources=sources,
        observations=observations,
        truths=truths,
        questions=questions,
        entities=mentions,
        volatility={"city": "medium"},
        end_s=observations[-1].at_s + HOUR,
    )


def truth(mention: str, value: str, label: str) -> Truth:
    return Truth(
        entity=f"true:{mention}", mention=mention, attribute="city", value=value, label=label
    )


def ask(mention: str, expected: str) -> Question:
    return Question(id="t/q1", mention=mention, attribute="city", expected=expected)


def run(system: System, sc: Scenario) -> Outcome:
    calls, res = translate(sc)

    async def go() -> Outcome:
        try:
            return await system.run_scenario(sc, calls, res)
        finally:
            await system.aclose()

    return anyio.run(go)


# One syndicate repeats "Lyon" three times, then two independent sources say "Porto".
MAJORITY = scenario(
    [src("s1", "synd"), src("s2", "synd"), src("s3", "synd"), src("a", "a"), src("b", "b")],
    [
        obs(1, 0, "s1", "Ana", "Lyon"),
        obs(2, 1, "s2", "Ana", "Lyon"),
        obs(3, 2, "s3", "Ana", "Lyon"),
        obs(4, 3, "a", "Ana", "Porto"),
        obs(5, 4, "b", "Ana", "Porto"),
    ],
    [truth("Ana", "Porto", TRUE), truth("Ana", "Lyon", FALSE)],
    [ask("Ana", "Porto")],
)


def test_raw_log_answers_the_majority_of_the_five_latest_lines() -> None:
    out = run(RawLog(), MAJORITY)
    assert out.answers == {"t/q1": "Lyon"}  # three lines against two: repetition wins
    assert [b.state for b in out.beliefs] == ["tentative", "accepted"]
    assert [b.confidence for b in out.beliefs] == [400_000, 600_000]  # vote shares


def test_raw_log_breaks_a_tie_by_recency_and_abstains_only_on_nothing() -> None:
    sc = scenario(
        [src("a", "a"), src("b", "b")],
        [obs(1, 0, "a", "Ana", "Lyon"), obs(2, 1, "b", "Ana", "Porto")],
        [truth("Ana", "Porto", TRUE)],
        [ask("Ana", "Porto"), Question(id="t/q2", mention="Bo", attribute="city", expected="?")],
    )
    out = run(RawLog(), sc)
    assert out.answers == {"t/q1": "Porto", "t/q2": "unknown"}


def test_raw_log_retrieves_by_bare_name_so_namesakes_mix() -> None:
    sc = scenario(
        [src("a", "a")],
        [obs(1, 0, "a", "Ana (Lyon)", "engineer"), obs(2, 1, "a", "Ana (Oslo)", "designer")],
        [truth("Ana (Lyon)", "engineer", TRUE), truth("Ana (Oslo)", "designer", TRUE)],
        [ask("Ana (Lyon)", "engineer")],
    )
    out = run(RawLog(), sc)
    assert out.answers == {"t/q1": "designer"}  # the namesake's line is more recent
    assert out.entities["Ana (Lyon)"] == out.entities["Ana (Oslo)"]


def test_key_value_keeps_the_last_write_and_loses_the_rest() -> None:
    sc = scenario(
        [src("a", "a"), src("b", "b")],
        [obs(1, 0, "a", "Ana", "Porto"), obs(2, 1, "b", "Ana", "Lyon")],
        [truth("Ana", "Porto", TRUE), truth("Ana", "Lyon", FALSE), truth("Ana", "Oslo", FALSE)],
        [ask("Ana", "Porto")],
    )
    kv = KeyValue()
    out = run(kv, sc)
    assert out.answers == {"t/q1": "Lyon"}
    assert [b.state for b in out.beliefs] == ["rejected", "accepted", "absent"]
    assert kv.transitions() == [
        {"scenario": "t", "call": 4, "key": "Ana/city", "from": "Porto", "to": "Lyon"}
    ]


def test_governed_policy_weighs_groups_not_copies() -> None:
    out = run(PolicyFold("governed_fold"), MAJORITY)
    assert out.answers == {"t/q1": "Porto"}
    assert [b.state for b in out.beliefs] == ["accepted", "contested"]


def test_no_independence_counts_each_copy_as_independent() -> None:
    only_copies = scenario(
        MAJORITY.sources,
        MAJORITY.observations[:3],
        [truth("Ana", "Lyon", UNKNOWN)],
        [ask("Ana", "unknown")],
    )
    governed = run(PolicyFold("governed_fold"), only_copies)
    ablated = run(PolicyFold("no_independence", independence="per_source"), only_copies)
    assert (governed.answers["t/q1"], governed.beliefs[0].state) == ("unknown", "provisional")
    assert (ablated.answers["t/q1"], ablated.beliefs[0].state) == ("Lyon", "accepted")


def test_direct_writes_settle_what_the_gate_refuses() -> None:
    sc = scenario(
        [src("a", "a")],
        [obs(1, 0, "a", "Ana", "Lyon", assertive=True)],
        [truth("Ana", "Lyon", UNKNOWN)],
        [ask("Ana", "unknown")],
    )
    governed = run(PolicyFold("governed_fold"), sc)
    ablated = run(PolicyFold("direct_writes", direct_writes=True), sc)
    assert governed.rejected_calls == {"DIRECT_CANONICAL_WRITE_FORBIDDEN": 1}
    assert (governed.answers["t/q1"], governed.beliefs[0].state) == ("unknown", "provisional")
    assert ablated.rejected_calls == {}
    assert (ablated.answers["t/q1"], ablated.beliefs[0].state) == ("Lyon", "accepted")


def test_policy_fold_rejects_a_bad_independence_mode() -> None:
    with pytest.raises(ValueError, match="per_source"):
        PolicyFold("x", independence="none")


def test_a_test_refutes_the_wrong_side_of_a_serious_dispute() -> None:
    sources = [src(x, x) for x in ("w", "x", "y", "z")] + [src("reg", "registry")]
    sc = scenario(
        sources,
        [
            obs(1, 0, "w", "Acme", "AA", attribute="city"),
            obs(2, 3, "x", "Acme", "BB", attribute="city"),
            obs(3, 6, "y", "Acme", "AA", attribute="city"),
            obs(4, 9, "z", "Acme", "BB", attribute="city"),
            obs(5, 13, "reg", "Acme", "BB", kind="test_result", attribute="city"),
        ],
        [truth("Acme", "BB", TRUE), truth("Acme", "AA", FALSE)],
        [ask("Acme", "BB")],
    )
    calls, _ = translate(sc)
    assert [c.kind for c in calls].count("propose_test") == 2
    out = run(PolicyFold("governed_fold"), sc)
    assert out.beliefs[1].state == "rejected"  # AA failed its test
    # The refuted side's testimony no longer counts against BB: the test settles it.
    assert out.beliefs[0].state == "accepted"
    assert out.answers["t/q1"] == "BB"


def comparable(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Transitions without the ids only a kernel mints (the intent key of a time step)."""
    return [{**r, "evidence": r["evidence"] if r["cause"] != "time" else ""} for r in rows]


def test_governed_kernel_reproduces_the_fold_of_the_pack(tmp_path: Path) -> None:
    """The real kernel and the pure fold of its pack agree on every scenario of a seed."""
    scenarios = bundle(3, per_family=1)

    async def go(system: System) -> list[Outcome]:
        try:
            outs = []
            for sc in scenarios:
                calls, res = translate(sc)
                outs.append(await system.run_scenario(sc, calls, res))
            return outs
        finally:
            await system.aclose()

    kernel = GovernedKernel(3, tmp_path)
    fold = PolicyFold("governed_fold")
    assert anyio.run(go, kernel) == anyio.run(go, fold)
    assert comparable(kernel.transitions()) == comparable(fold.transitions())
    assert kernel.consolidations() == fold.consolidations()
    assert any(t["to_state"] == "accepted" for t in kernel.transitions())


def test_tool_calls_carry_the_task_and_never_send_the_context() -> None:
    calls, _ = translate(MAJORITY)
    assert all(c.params["task"] == "t" for c in calls)
    assert all("answer" not in c.params for c in calls)
    assert isinstance(calls[0], ToolCall) and calls[0].kind == "record_observation"
    assert [c.kind for c in calls[-2:]] == ["request_consolidation", "archive_episode"]


def test_replaying_the_governed_journal_gives_the_same_answers_and_beliefs(
    tmp_path: Path,
) -> None:
    """The belief states the study reads are a fold of the journal: replay lands on them."""
    scenarios = bundle(5, per_family=1)

    async def go() -> tuple[list[Outcome], list[Outcome]]:
        kernel = GovernedKernel(5, tmp_path)
        lives, resolutions = [], []
        try:
            for sc in scenarios:
                calls, res = translate(sc)
                lives.append(await kernel.run_scenario(sc, calls, res))
                resolutions.append(res)
        finally:
            await kernel.aclose()
        async with open_journal(tmp_path / "governed.db", readonly=True) as journal:
            graph = (await state_at(journal, None)).beliefs
        replays = [
            read_outcome(sc, res, graph, at_ns(sc.end_s, offset_s(i)), {}, live.rejected_calls)
            for i, (sc, res, live) in enumerate(zip(scenarios, resolutions, lives, strict=True))
        ]
        return lives, replays

    lives, replays = anyio.run(go)
    assert lives == replays
