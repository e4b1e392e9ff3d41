"""``python -m examples.frameworks.mcp_proxy``: four rooms through the gateway, offline."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from examples.summary import read_events
from kernel.cli import main
from tests.support.mcp_kernel import require_mcp

require_mcp()

from examples.frameworks import mcp_proxy  # noqa: E402


def test_the_example_books_two_rooms_once_each_under_the_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "trip.db"
    assert mcp_proxy.main(["--db", str(db), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["executed"] == 2 and summary["bookings"] == 2 and summary["replayed"]
    events = anyio.run(read_events, db)
    types = [type(e.payload).__name__ for e in events]
    assert types.count("ExecutionSucceeded") == 2 and types.count("HumanDecided") == 1
    assert types.count("DuplicateSuppressed") == 1  # the resumed call, answered from the record
    [unnamed] = [
        e
        for e in events
        if type(e.payload).__name__ == "ProposalRejected" and "cancel_all" in str(e.payload)
    ]
    assert unnamed.agent_id == "booker"
    # What the pack was made from is saved beside the journal: the verdicts judge again.
    pack = tmp_path / "trip.gateway" / "gateway_pack.py"
    assert main(["verify", "--db", str(db), "--verdicts", "--pack", f"{pack}:PACK"]) == 0
