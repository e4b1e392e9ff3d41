"""The trading desk runs its next pack version as a shadow: the day is the same, the report
from its records is the report from replaying its journal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from examples import desk, trading
from kernel.audit import open_journal, payloads
from kernel.audit.shadow import digest, history_report, live_report
from kernel.core.events import AgentStatusChanged, DriftBreached, ShadowLoaded
from kernel.memory import MEMORY_PACK
from kernel.state.drift import OPERATOR
from policies.trading import TRADING
from policies.trading_0_5 import TRADING_0_5
from tests.test_examples import MINUTES, run_example

UNSHADOWED = ("ShadowLoaded", "ShadowDiffered", "ShadowRetired", "ShadowPromoted")
# A checkpoint hashes the projections (the shadows' counters among them), the last event
# the journal's head (its seq and hash count the shadow's events); each run has its own key.
DERIVED = ("ProjectionCheckpoint", "KernelStopped", "CheckpointKeyChanged")


async def enforced(db: Path) -> list[tuple[str, str | None, Any]]:
    async with open_journal(db, readonly=True) as journal:
        events = await journal.read()
    kept = [e for e in events if e.type not in (*UNSHADOWED, *DERIVED)]
    return [(e.type, e.dfid, positionless(e.payload)) for e in kept]


def positionless(payload: Any) -> Any:
    """A drift breach without the seqs of its window (the shadow's own events shift them)."""
    if isinstance(payload, DriftBreached):
        return msgspec.structs.replace(payload, first_seq=0, last_seq=0, as_of_seq=0)
    if isinstance(payload, AgentStatusChanged) and payload.operator == OPERATOR:
        return msgspec.structs.replace(payload, reason=payload.reason.split(" over seq ")[0])
    return payload


async def test_the_shadowed_day_is_the_same_day_and_its_report_is_the_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shadowed = tmp_path / "shadowed" / "desk.db"
    plain = tmp_path / "plain" / "desk.db"
    shadowed.parent.mkdir()
    plain.parent.mkdir()
    await _run(trading.main, shadowed, capsys)
    monkeypatch.setattr(trading, "shadow_window", lambda minutes: range(0))
    await _run(trading.main, plain, capsys)

    # The shadow never changed an enforced outcome: the record is the same but for its own.
    assert await enforced(shadowed) == await enforced(plain)
    async with open_journal(shadowed, readonly=True) as journal:
        [loaded] = await journal.read(types=["ShadowLoaded"])
        [shadow] = payloads([loaded], ShadowLoaded)
        assert shadow.pack == TRADING_0_5.ref and shadow.enforced == TRADING.ref
        live = await live_report(journal)
        replayed = await history_report(
            journal, [TRADING_0_5], [TRADING, desk.DESK, MEMORY_PACK],
            start=loaded.seq, stop=live.stop,
        )  # fmt: skip
    assert live.ended == "retired" and live.differed > 0
    assert replayed.differences == live.differences
    assert digest(replayed) == digest(live)
    assert live.money and all(amount > 0 for amount in live.money.values())


async def _run(main: Any, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    summary = await anyio.to_thread.run_sync(
        lambda: run_example(trading, db, "--seed", "1", "--minutes", MINUTES, capsys=capsys)
    )
    assert summary["verified"] is True
