"""Counterfactual replay: which recorded verdicts another history would change."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kernel.audit import open_journal
from kernel.audit.counterfactual import whatif
from kernel.cli import main
from tests.support.memory_domain import Planner, book, booking_kernel, note, remember, run

ACCESS = "verify accessibility before booking"


async def history(path: Path) -> dict[str, str]:
    """A booking accepted with no constraint, then a constraint, a query and a second booking."""
    async with booking_kernel(path) as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        flows = {"first": await run(kernel, agent, book("Bluebell"))}
        flows["note"] = await run(kernel, agent, note("nothing to do with hotels"))
        flows["rule"] = await run(kernel, agent, remember("memory.add_constraint", text=ACCESS))
        flows["query"] = await run(kernel, agent, remember("memory.query", topic="accessibility"))
        flows["second"] = await run(kernel, agent, book("Granvia"))
        return flows


async def test_injected_constraint_at_seq_1_flips_the_first_booking(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    flows = await history(path)
    async with open_journal(path, readonly=True) as journal:
        head = journal.head_hash
        result = await whatif(journal, constraint=ACCESS, at=1)
        assert journal.head_hash == head
    # The first booking was never verified; the second was, in both histories.
    [change] = result.changes
    assert change.dfid == flows["first"]
    assert change.then == "accepted" and change.now == "would have been refused"
    assert change.reason_code == "VERIFICATION_REQUIRED"
    assert "accepted then, would have been refused: VERIFICATION_REQUIRED" in change.line()
    assert result.judged == 5


async def test_excluding_the_query_flips_the_verified_booking(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    flows = await history(path)
    async with open_journal(path, readonly=True) as journal:
        queried = await journal.read(types=["MemoryQueried"])
        without_query = await whatif(journal, exclude=[queried[0].seq])
        rules = await journal.read(types=["ConstraintAdded"])
        without_rule = await whatif(journal, exclude=[rules[0].seq])
        nothing = await whatif(journal, exclude=[])
    assert [(c.dfid, c.reason_code) for c in without_query.changes] == [
        (flows["second"], "VERIFICATION_REQUIRED")
    ]
    assert without_rule.changes == [] and nothing.changes == []


async def test_a_refused_query_verifies_nothing_in_the_other_history(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    flows = await history(path)
    async with open_journal(path, readonly=True) as journal:
        # "never query" refuses the query, so its MemoryQueried is not there to verify.
        result = await whatif(journal, constraint="never accessibility", at=1)
    refused = {c.dfid: c.reason_code for c in result.changes}
    assert refused[flows["query"]] == "CONSTRAINT_VIOLATION"
    assert flows["note"] not in refused


def test_dirk_whatif_prints_the_flipped_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"
    flows = anyio.run(history, path)
    before = path.read_bytes()
    code = main(["whatif", "--db", str(path), "--inject-constraint", ACCESS, "--at", "1"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert len(out) == 2 and flows["first"] in out[0]
    assert "accepted then, would have been refused: VERIFICATION_REQUIRED" in out[0]
    assert out[-1] == "whatif: 5 recorded verdicts judged again, 1 change"
    assert path.read_bytes() == before
    assert main(["whatif", "--db", str(path)]) == 2
