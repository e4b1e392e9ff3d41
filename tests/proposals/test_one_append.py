"""A governed call commits once before it acts: opening, verdict and intent in one append.

Issue 45, lever 3. ``Kernel.propose`` hands its proposal to the compiler with the flow's
opening (``Open.judge``); the DIM records the compiler's events, the proposal, its verdict
and its intent together, and the outcome is the flow's second commit, as a synchronous
agent's flow (tests/hosting/test_two_commits.py). Where something between opening and
verdict waits on the open flow (meaning to score), the flow is opened first, as before.
Either way the journal holds the same events, and the verdicts judge again the same
(tests/execution/test_execution_crash.py kills a kernel between the commits).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel import DecisionVerdict, Manifest
from kernel.audit import open_journal, verify_journal
from kernel.audit.reverify import rejudge
from kernel.core.events import Event
from kernel.state.meaning import EmbeddingMatcher
from policies.booking import BOOKING
from tests.memory.test_constraints import FakeEmbedder, kernel_with
from tests.proposals.test_propose import CHEAP, OVER_LIMIT, OVER_THRESHOLD, Hotel, book
from tests.proposals.test_propose import booking_kernel as booking

Commits = list[list[Event]]

OPENED = ["FlowCreated", "ContextCompiled", "ProposalSubmitted"]


def commits_of(commits: Commits, dfid: str) -> list[list[str]]:
    """The types of each commit that holds an event of ``dfid`` (its own events only)."""
    return [
        [e.type for e in batch if e.dfid == dfid]
        for batch in commits
        if any(e.dfid == dfid for e in batch)
    ]


@pytest.mark.parametrize(
    ("params", "verdict", "count"),
    [
        (CHEAP, DecisionVerdict.EXECUTED, 2),
        (OVER_THRESHOLD, DecisionVerdict.ESCALATED, 1),
        (OVER_LIMIT, DecisionVerdict.REFUSED, 1),
    ],
    ids=["executed", "escalated", "refused"],
)
async def test_a_proposed_call_is_opened_judged_and_its_intent_recorded_in_one_commit(
    tmp_path: Path, params: dict[str, object], verdict: DecisionVerdict, count: int
) -> None:
    path = tmp_path / "j.db"
    commits: Commits = []
    async with booking(path, Hotel()) as kernel:
        kernel.journal.add_listener(lambda batch: commits.append(list(batch)))
        decision = await book(kernel, params, tool_call_id="call-1")
        assert decision.verdict is verdict, decision
    seen = commits_of(commits, decision.dfid)
    assert len(seen) == count, seen
    first = seen[0]
    assert first[: len(OPENED)] == OPENED, first
    if verdict is DecisionVerdict.EXECUTED:
        # Accepted, its resources reserved, its intent started: all before anything acts.
        assert first[len(OPENED)] == "ProposalAccepted" and first[-1] == "ExecutionStarted"
        assert "ExecutionSucceeded" in seen[1] and "FlowClosed" in seen[1], seen
    assert (await verify_journal(path)).ok
    async with open_journal(path) as journal:
        report = await rejudge(journal, [BOOKING])
    assert report.judged >= 1 and not report.changes and not report.mismatches, report


async def test_a_call_whose_meaning_is_scored_opens_its_flow_first(tmp_path: Path) -> None:
    # Scoring records MeaningScored on the open flow before the verdict: three commits.
    commits: Commits = []
    async with kernel_with(
        tmp_path / "j.db", meaning=EmbeddingMatcher(FakeEmbedder(), threshold=0.9)
    ) as kernel:
        await kernel.handshake(
            Manifest(agent_id="booker", version="1.0.0", capabilities=["test.note"])
        )
        kernel.journal.add_listener(lambda batch: commits.append(list(batch)))
        decision = await kernel.propose(
            "booker", "test.note", {"text": "file it"}, explain="file it", confidence=0.9
        )
        assert decision.verdict is DecisionVerdict.EXECUTED, decision
    seen = commits_of(commits, decision.dfid)
    assert seen[0] == ["FlowCreated", "ContextCompiled"], seen
    assert len(seen) == 3, seen


async def test_a_repeated_key_is_answered_from_the_record_without_a_second_flow(
    tmp_path: Path,
) -> None:
    hotel = Hotel()
    async with booking(tmp_path / "j.db", hotel) as kernel:
        first = await book(kernel, CHEAP, tool_call_id="call-7")
        again = await book(kernel, CHEAP, tool_call_id="call-7")
    assert first.verdict is again.verdict is DecisionVerdict.EXECUTED
    assert again.replayed and again.dfid == first.dfid
    assert again.result == first.result
    assert len(hotel.calls) == 1
