"""examples/frameworks/stop.py: the looping model's run ends on the governor, three calls in."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from examples.frameworks import stop
from kernel.journal.opening import open_journal


async def test_the_example_stops_at_the_third_call(tmp_path: Path) -> None:
    db = tmp_path / "loop.db"
    calls, code = await stop.loop(db)
    assert (calls, code) == (3, "REASONING_EXHAUSTION")
    async with open_journal(db, readonly=True) as journal:
        assert len(await journal.read(types=["FlowCreated"])) == 3
