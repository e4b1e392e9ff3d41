"""Golden journals: both examples' journals as an earlier kernel wrote them.

``tests/golden/`` holds the journals of ``examples.trading --seed 1 --minutes 40``
and ``examples.booking --seed 1`` made before this round's changes, with the
projection hash and counts each run printed. Every later kernel must still read
them: they verify, fold to the same projection hash, and every recorded verdict
is judged the same again. An incompatible event change or a nondeterministic
fold or gate fails here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from examples import desk
from examples.desk_0_1 import DESK_0_1
from kernel.audit import Projections, open_journal
from kernel.audit.reverify import rejudge
from kernel.journal.verify import verify_journal
from policies.booking import BOOKING
from policies.booking_0_1 import BOOKING_0_1
from policies.memory_1_0 import MEMORY_PACK_1_0
from policies.trading import TRADING
from policies.trading_0_2 import TRADING_0_2
from policies.trading_0_3 import TRADING_0_3
from tests.support import GOLDEN

# The versions that judged the journals ride along: re-judging picks each by its recorded hash.
PACKS: dict[str, list[Any]] = {
    "trading": [TRADING, desk.DESK, TRADING_0_3, TRADING_0_2, DESK_0_1],
    "booking": [BOOKING, BOOKING_0_1, MEMORY_PACK_1_0],
}


@pytest.fixture(params=sorted(PACKS))
def golden(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path, dict[str, Any]]:
    name = str(request.param)
    # A copy: opening a journal may add tables (the inbox, snapshots) to an old file.
    db = tmp_path / f"{name}.db"
    shutil.copyfile(GOLDEN / f"{name}.db", db)
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    return name, db, expected


async def test_golden_journal_verifies(golden: tuple[str, Path, dict[str, Any]]) -> None:
    _, db, expected = golden
    report = await verify_journal(db)
    assert report.ok, report.problem
    assert report.events == expected["events"]


async def test_golden_journal_folds_to_its_recorded_hash(
    golden: tuple[str, Path, dict[str, Any]],
) -> None:
    _, db, expected = golden
    projections = Projections()
    async with open_journal(db, readonly=True) as journal:
        async for batch in journal.scan():
            projections.apply(batch)
    assert projections.digest() == expected["projection_hash"]


async def test_golden_journal_verdicts_are_judged_the_same(
    golden: tuple[str, Path, dict[str, Any]],
) -> None:
    name, db, _ = golden
    async with open_journal(db, readonly=True) as journal:
        result = await rejudge(journal, PACKS[name])
    assert result.mismatches == []
    assert result.changes == []
    assert result.judged > 0
