"""The rulebook: rules with provenance, the promoter gate, relevance, citations, ``dirk why``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from agents_sdk import Proposal, WorkingContext
from kernel import FlowStatus, Kernel
from kernel.audit import fold, payload_of
from kernel.cli import main
from kernel.context import compile_layers
from kernel.core.events import (
    CitationsChecked,
    ContextCompiled,
    Event,
    RuleDecided,
    RuleProposed,
    RuleSource,
)
from kernel.state.rulebook import (
    LexicalSearch,
    Rulebook,
    RuleNotPending,
    RuleVersion,
    promote,
    select,
)
from kernel.state.snapshots import capture, decode_snapshot, encode_snapshot
from tests.support.helpers import flow_of
from tests.support.memory_domain import Planner, Step, booking_kernel, remember, run

ACCESS = {
    "rule": "access",
    "title": "Accessibility before booking",
    "content": "Before booking a hotel, query memory about the guest's accessibility needs.",
    "labels": ["booking", "guests"],
    "repo": "acme/runbooks",
    "ref": "main",
    "path": "hotels/access.md",
    "blob": "3f2a9c",
}
SHORTS = {
    "rule": "shorts",
    "title": "Short positions close by noon",
    "content": "Close short positions before noon.",
    "labels": ["trading"],
    "repo": "acme/runbooks",
    "ref": "main",
    "path": "trading/shorts.md",
    "blob": "77aa01",
}


async def decisions_of(kernel: Kernel, dfid: str) -> list[Event]:
    return [e for e in await kernel.journal.flow_events(dfid) if isinstance(e.payload, RuleDecided)]


async def propose(kernel: Kernel, agent: Planner, **params: Any) -> Event:
    """Run a flow that proposes a rule; return the promoter's ``RuleDecided`` event."""
    dfid = await run(kernel, agent, remember("memory.propose_rule", **params))
    assert flow_of(kernel, dfid).status is FlowStatus.CLOSED
    [decided] = await decisions_of(kernel, dfid)
    return decided


def current(book: Rulebook, rule: str) -> RuleVersion:
    """Return the version of ``rule`` agents see now, which the test knows there is."""
    version = book.items[rule].current
    assert version is not None, f"no current version of {rule}"
    return version


async def test_promote_defer_skip_override_each_audited(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with booking_kernel(path) as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)

        first = await propose(kernel, agent, **ACCESS)
        decided = payload_of(first, RuleDecided)
        assert (decided.decision, decided.reason) == ("promote", "NEW_RULE")
        assert (decided.actor, decided.prior_version, decided.version) == (
            "promoter",
            0,
            1,
        )
        [proposed] = await kernel.journal.read(types=["RuleProposed"])
        assert first.caused_by == proposed.seq
        assert payload_of(proposed, RuleProposed).proposer == "booker"

        same = await propose(kernel, agent, **ACCESS, base_version=1)
        decided = payload_of(same, RuleDecided)
        assert (decided.decision, decided.reason) == ("skip", "SAME_CONTENT")

        stale = await propose(kernel, agent, **{**ACCESS, "content": "Ask first."})
        decided = payload_of(stale, RuleDecided)
        assert (decided.decision, decided.reason) == ("defer", "STALE_BASE")

        unsourced = {**ACCESS, "content": "Ask about lifts.", "blob": "", "base_version": 1}
        deferred = await propose(kernel, agent, **unsourced)
        decided = payload_of(deferred, RuleDecided)
        assert (decided.decision, decided.reason) == ("defer", "NO_PROVENANCE")
        book = kernel.projections.memory.rulebook
        assert stale.caused_by is not None and deferred.caused_by is not None
        assert set(book.pending) == {stale.caused_by, deferred.caused_by}
        assert current(book, "access").version == 1  # a deferral changes nothing

        overridden = await kernel.decide_rule(
            deferred.caused_by, "override", operator="ana", reason="lifts matter"
        )
        assert overridden.payload == RuleDecided(
            rule="access",
            decision="override",
            actor="ana",
            reason="lifts matter",
            prior_version=1,
            version=2,
        )
        assert current(book, "access").content == "Ask about lifts."
        assert book.items["access"].pinned

        # An operator's version is not replaced by an agent without an operator.
        pinned = await propose(
            kernel, agent, **{**ACCESS, "content": "Skip it.", "base_version": 2}
        )
        decided = payload_of(pinned, RuleDecided)
        assert (decided.decision, decided.reason) == ("defer", "OPERATOR_PINNED")
        assert pinned.caused_by is not None
        skipped = payload_of(
            await kernel.decide_rule(
                pinned.caused_by, "skip", operator="bo", reason="not our policy"
            ),
            RuleDecided,
        )
        assert (skipped.decision, skipped.actor) == ("skip", "bo")
        assert skipped.version == 0 and pinned.caused_by not in book.pending

        # Decisions on what is not waiting, or without a reason, are refused.
        with pytest.raises(RuleNotPending):
            await kernel.decide_rule(pinned.caused_by, "override", operator="ana", reason="again")
        with pytest.raises(ValueError, match="override or skip"):
            await kernel.decide_rule(stale.caused_by, "promote", operator="ana", reason="x")
        with pytest.raises(ValueError, match="reason"):
            await kernel.decide_rule(stale.caused_by, "skip", operator="ana", reason="")

        # An operator proposes through the same gate, or overrides at once.
        source = RuleSource(repo="acme/runbooks", ref="v2", path="hotels/access.md", blob="9d")
        gated_event = await kernel.propose_rule(
            "access",
            title="Accessibility",
            content="Ask, then book.",
            source=source,
            base_version=2,
            operator="ana",
            reason="wording",
        )
        gated = payload_of(gated_event, RuleDecided)
        assert (gated.decision, gated.actor) == ("promote", "promoter")
        forced_event = await kernel.propose_rule(
            "shorts",
            title="Shorts",
            content="Close by noon.",
            operator="ana",
            reason="desk rule",
            override=True,
        )
        forced = payload_of(forced_event, RuleDecided)
        assert (forced.decision, forced.actor, forced.version) == (
            "override",
            "ana",
            1,
        )

        decisions = [d.decision for d in book.items["access"].decisions]
        assert decisions == [
            "promote",
            "skip",
            "defer",
            "defer",
            "override",
            "defer",
            "skip",
            "promote",
        ]
        assert [v.version for v in book.items["access"].versions] == [1, 2, 3]
        events = await kernel.journal.read()
        assert fold(events).digest() == kernel.projections.digest()
        # A snapshot holds the rulebook like every other projection.
        digest, body = encode_snapshot(capture(kernel.projections))
        restored = decode_snapshot(body)
        assert restored is not None and restored.memory.rulebook == book
        assert digest == kernel.projections.digest()


def test_dirk_why_prints_versions_decisions_and_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"

    async def write() -> int:
        async with booking_kernel(path) as kernel:
            agent = Planner(max_attempts=1)
            await kernel.register(agent)
            await propose(kernel, agent, **ACCESS)
            later = {**ACCESS, "content": "Ask about lifts.", "blob": "", "base_version": 1}
            deferred = await propose(kernel, agent, **later)
            assert deferred.caused_by is not None
            event = await kernel.decide_rule(
                deferred.caused_by, "override", operator="ana", reason="lifts matter"
            )
            return event.seq

    override_seq = anyio.run(write)
    assert main(["why", "access", "--db", str(path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "rule access: current v2 'Accessibility before booking'"
    assert "v1 'Accessibility before booking' labels [booking, guests]" in out
    assert "source repo acme/runbooks ref main path hotels/access.md blob 3f2a9c" in out
    assert "source repo acme/runbooks ref main path hotels/access.md blob -" in out
    decided = [line for line in lines if line.startswith("  #")]
    assert len(decided) == 3
    assert "PROMOTE by promoter, NEW_RULE" in decided[0] and "by agent booker" in decided[0]
    assert "DEFER by promoter, NO_PROVENANCE" in decided[1] and "prior v1)" in decided[1]
    assert decided[2].startswith(f"  #{override_seq} OVERRIDE by ana, lifts matter")
    assert "prior v1 -> v2" in decided[2]

    assert main(["why", "nothing", "--db", str(path)]) == 1
    assert "UNKNOWN_RULE" in capsys.readouterr().err


def cite(text: str) -> Step:
    def step(ctx: WorkingContext) -> Proposal:
        rules = " ".join(rule["cite"] for rule in ctx.memory.get("rules", []))
        return ctx.propose({"kind": "test.note", "text": "ok"}, explain=f"{rules} {text}")

    return step


async def test_relevant_rules_reach_the_context_and_citations_are_checked(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        await propose(kernel, agent, **ACCESS)
        await propose(kernel, agent, **SHORTS)
        await propose(
            kernel, agent, **{**ACCESS, "content": "Ask first, then book.", "base_version": 1}
        )

        dfid = await run(kernel, agent, cite("[rule:access@v1] [rule:shorts@v1] [rule:nope@v3]"))
        ctx = agent.contexts[-1]
        # The booking rule is relevant to this agent (its kinds, its topic); the trading one not.
        assert [r["cite"] for r in ctx.memory["rules"]] == ["[rule:access@v2]"]
        assert ctx.memory["rules"][0]["content"] == "Ask first, then book."
        events = await kernel.journal.flow_events(dfid)
        [compiled] = [e for e in events if e.type == "ContextCompiled"]
        assert payload_of(compiled, ContextCompiled).rules == ["access@v2"]
        [checked_event] = [e for e in events if isinstance(e.payload, CitationsChecked)]
        checked = payload_of(checked_event, CitationsChecked)
        assert checked.correct == ["access@v2"]
        assert checked.incorrect == {
            "access@v1": "WRONG_VERSION: the context showed v2",
            "shorts@v1": "NOT_IN_CONTEXT: the rule exists but this flow's context did not show it",
            "nope@v3": "UNKNOWN_RULE: the rulebook has no such rule version",
        }
        submitted = next(e for e in events if e.type == "ProposalSubmitted")
        assert checked_event.caused_by == submitted.seq
        # Recorded, not judged: the explanation's citations do not change the verdict.
        assert flow_of(kernel, dfid).status is FlowStatus.CLOSED
        assert dfid not in kernel.projections.memory.rulebook.shown  # only open flows are kept

        # An explanation without citations records nothing about them.
        quiet = await run(kernel, agent, remember("memory.add_fact", name="a", value="b"))
        assert not [
            e for e in await kernel.journal.flow_events(quiet) if e.type == "CitationsChecked"
        ]


def version_of(rule: str, title: str, content: str, labels: list[str]) -> Event:
    return Event(
        seq=0,
        ts=0,
        payload=RuleProposed(
            rule=rule,
            title=title,
            content=content,
            labels=labels,
            source=RuleSource(repo="r", path="p", blob="b"),
        ),
    )


def book_of(*rules: tuple[str, str, str, list[str]]) -> Rulebook:
    """A rulebook with these rules promoted, the way the fold builds it."""
    book = Rulebook()
    seq = 0
    for rule in rules:
        seq += 1
        proposed = version_of(*rule)
        book.apply(Event(seq=seq, ts=0, payload=proposed.payload))
        decided = promote(book, payload_of(proposed, RuleProposed))
        seq += 1
        book.apply(Event(seq=seq, ts=0, payload=decided, caused_by=seq - 1))
    return book


def test_lexical_search_ranks_by_relevance_and_breaks_ties_by_id() -> None:
    book = book_of(
        ("b-cash", "Cash", "Keep cash above the floor.", ["trading"]),
        ("a-cash", "Cash", "Keep cash above the floor.", ["trading"]),
        ("limits", "Order limits", "Orders over the notional limit need a human.", ["trading"]),
        ("hotels", "Hotels", "Book step-free rooms.", ["booking"]),
    )
    assert [r.rule for r in select(book, "trading place order limit", 5)] == [
        "limits",
        "a-cash",
        "b-cash",
    ]
    assert [r.rule for r in select(book, "cash", 1)] == ["a-cash"]  # a tie: by id
    assert select(book, "weather", 5) == []  # nothing relevant, nothing shown
    assert LexicalSearch().search(book.current(), "", 3) == []


class ByLabel:
    """A stand-in for a vector index behind the port: the rules whose label is in the query."""

    def search(self, rules: Sequence[RuleVersion], query: str, k: int) -> list[str]:
        words = set(query.split())
        return [r.rule for r in rules if set(r.labels) & words][:k]


def test_the_search_port_the_limit_and_the_token_budget_shape_the_memory_layer() -> None:
    from tests.context.test_context import flow_of, manifest, projections_with

    projections = projections_with({"bank.x": "1"})
    projections.memory.rulebook = book_of(
        ("bank-1", "Rule one", "Transfers need care.", ["bank"]),
        ("bank-2", "Bank rule two", "Bank transfers need an invoice bank reference.", ["bank"]),
        ("other", "Other", "Nothing relevant.", ["misc"]),
    )
    layers = compile_layers(projections, flow_of(), manifest(), {})
    assert layers.rules == ["bank-2@v1", "bank-1@v1"]
    assert [r["id"] for r in layers.memory["rules"]] == ["bank-2", "bank-1"]
    one = compile_layers(projections, flow_of(), manifest(**{"context.memory.max_rules": 1}), {})
    assert one.rules == ["bank-2@v1"]
    port = compile_layers(projections, flow_of(), manifest(), {}, search=ByLabel())
    assert port.rules == ["bank-1@v1", "bank-2@v1"]

    # Over budget, the least relevant rule goes first, then the next; the state after them.
    rule_cost = (
        layers.tokens
        - compile_layers(
            projections, flow_of(), manifest(**{"context.memory.max_rules": 0}), {}
        ).tokens
    )
    tight = compile_layers(
        projections, flow_of(), manifest(**{"context.tokens": layers.tokens - 1}), {}
    )
    assert tight.dropped == ["memory:rule:bank-1@v1"] and tight.rules == ["bank-2@v1"]
    tighter = compile_layers(
        projections, flow_of(), manifest(**{"context.tokens": layers.tokens - rule_cost}), {}
    )
    assert tighter.dropped == ["memory:rule:bank-1@v1", "memory:rule:bank-2@v1"]
    assert "rules" not in tighter.memory and tighter.state == {"bank.x": "1"}


async def test_checkpoints_and_time_travel_hold_constraints_and_rules(tmp_path: Path) -> None:
    from kernel.audit import open_journal, state_at, verify_projections
    from kernel.state.snapshots import checkpoints, state_json

    path = tmp_path / "j.db"
    async with booking_kernel(path, checkpoint_every=5) as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        await run(kernel, agent, remember("memory.add_constraint", text="never use eval()"))
        await propose(kernel, agent, **ACCESS)
        await run(kernel, agent, remember("memory.add_fact", name="a", value="b"))
        live = kernel.projections.digest()
        events = await kernel.journal.read()
    async with open_journal(path, readonly=True) as journal:
        assert len(await checkpoints(journal)) >= 3
        report = await verify_projections(journal)
        assert report.ok, report.problems
        whole = await state_at(journal, events[-1].seq)
    assert whole.digest() == live
    assert current(whole.memory.rulebook, "access").version == 1
    assert state_json(whole)["memory"]["constraints"]  # seq keys serialise
