"""Artifacts end to end in one process: put, referenced by a context, fetched, refused, collected.

A document larger than the inline limit goes to the artifact store; the journal holds
its reference only; the agent whose context references it reads it in ranges through
``ctx.fetch_artifact``; an agent whose context did not reference it is refused, on
record, and the kernel runs on. ``dirk verify`` notices bytes that no longer hash, and
collecting keeps what something live references.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import ArtifactSlice, FetchRefused, FlowStatus, Kernel, ReasonCode
from kernel.artifacts import artifacts_beside, open_artifacts, ref_of
from kernel.cli import main
from kernel.core.events import ArtifactsCollected, ArtifactStored, ContextCompiled, InputRefused
from kernel.core.fetching import fetch_artifact
from tests.support.helpers import Transfer, kernel_for
from tests.support.hostile import hostile_text

STATEMENT = (
    "Hotel Granvia, Rua Augusta 12. Accessibility statement.\n"
    + "Step-free entrance; lift to every floor; roll-in shower in rooms 101-104.\n" * 80
).encode()

Read = Callable[[WorkingContext], Awaitable[Any]]


async def dirk(*argv: str) -> int:
    """Run ``dirk`` in a worker thread (it runs its own event loop)."""
    return int(await anyio.to_thread.run_sync(main, list(argv)))


class Reader(Agent):
    """An agent that runs ``read`` on each context, keeps what it got, then proposes a note."""

    def __init__(self, agent_id: str, read: Read, subscriptions: list[str]) -> None:
        self.manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=["test.transfer"],
            subscriptions=subscriptions,
            max_attempts=1,
        )
        self.read = read
        self.got: list[Any] = []
        self.contexts: list[WorkingContext] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self.contexts.append(ctx)
        try:
            self.got.append(await self.read(ctx))
        except FetchRefused as exc:
            self.got.append(exc)
        return ctx.propose(
            Transfer(account="acc-1", amount_cents=1), explain="read", confidence=0.9
        )


async def read_all(ctx: WorkingContext) -> bytes:
    """Read every artifact of the context, 4 KiB at a time."""
    [ref] = ctx.artifacts.values()
    parts: list[bytes] = []
    start = 0
    while True:
        piece = await ctx.fetch_artifact(ref, start=start, length=4096)
        parts.append(piece.data)
        start += len(piece.data)
        if not piece.more:
            return b"".join(parts)


async def test_an_agent_reads_an_artifact_larger_than_the_inline_limit(tmp_path: Path) -> None:
    reader = Reader("clerk", read_all, ["hotel"])
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(reader)
        ref = await kernel.put_artifact(
            STATEMENT, media_type="text/plain", summary="Granvia's accessibility", by="app"
        )
        assert ref == ref_of(STATEMENT) and len(STATEMENT) > 4096
        [dfid] = await kernel.trigger("hotel.granvia", {"hotel.granvia.access": ref})
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        events = await kernel.journal.read()
    ctx = reader.contexts[0]
    assert ctx.artifacts == {"hotel.granvia.access": ref}
    assert "hotel.granvia.access" not in ctx.state
    assert ctx.artifact_info[ref] == {
        "size": len(STATEMENT),
        "media_type": "text/plain",
        "summary": "Granvia's accessibility",
    }
    assert reader.got == [STATEMENT]  # read back whole, in ranges
    # The journal records the reference and what the context referenced, never the bytes.
    [stored] = [e.payload for e in events if isinstance(e.payload, ArtifactStored)]
    assert (stored.ref, stored.size, stored.by) == (ref, len(STATEMENT), "app")
    [compiled] = [e.payload for e in events if isinstance(e.payload, ContextCompiled)]
    assert compiled.artifacts == {"hotel.granvia.access": ref}
    raw = sqlite3.connect(tmp_path / "j.db").execute("SELECT body FROM events").fetchall()
    assert not any(b"roll-in shower" in bytes(body) for (body,) in raw)
    async with open_artifacts(artifacts_beside(tmp_path / "j.db"), readonly=True) as store:
        assert await store.get(ref) == STATEMENT


async def test_a_large_state_value_is_fetched_from_the_state_it_came_from(tmp_path: Path) -> None:
    big = {"floors": ["step-free"] * 600}  # > 2 KiB of canonical JSON, put in no store

    async def first_bytes(ctx: WorkingContext) -> ArtifactSlice:
        return await ctx.fetch_artifact("hotel.plan", length=64)

    reader = Reader("clerk", first_bytes, ["hotel"])
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(reader)
        [dfid] = await kernel.trigger("hotel.plan", {"hotel.plan": big})
        await kernel.wait_flow(dfid)
    [piece] = reader.got
    assert isinstance(piece, ArtifactSlice)
    assert piece.data == b'{"floors":["step-free","step-free","step-free","step-free","step'
    assert piece.media_type == "application/json" and piece.more
    assert piece.ref == reader.contexts[0].artifacts["hotel.plan"]


async def refused_on_record(kernel: Kernel, count: int) -> list[InputRefused]:
    events = await kernel.journal.read(types=["InputRefused"])
    refusals = [e.payload for e in events if isinstance(e.payload, InputRefused)]
    assert len(refusals) == count
    return refusals


async def test_an_agent_cannot_fetch_an_artifact_its_context_did_not_reference(
    tmp_path: Path,
) -> None:
    async def nothing(ctx: WorkingContext) -> None:
        return None

    clerk = Reader("clerk", nothing, ["hotel"])
    other = Reader("other", nothing, ["bank"])
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(clerk)
        await kernel.register(other)
        secret = await kernel.put_artifact(b"the clerk's eyes only" * 200, by="app")
        [clerks] = await kernel.trigger("hotel.x", {"hotel.x.doc": secret})
        [others] = await kernel.trigger("bank.y", {"bank.y.note": "hello"})
        await kernel.wait_quiet()
        # The other agent knows the reference, but no context of its flow referenced it.
        with pytest.raises(FetchRefused) as mine:
            await kernel.fetch_artifact("other", others, secret)
        # Nor may it name the clerk's flow, whose context did.
        with pytest.raises(FetchRefused) as theirs:
            await kernel.fetch_artifact("other", clerks, secret)
        # An artifact nobody referenced at all, and a flow that does not exist.
        with pytest.raises(FetchRefused) as unseen:
            await kernel.fetch_artifact("clerk", clerks, ref_of(b"never put"))
        with pytest.raises(FetchRefused) as nowhere:
            await kernel.fetch_artifact("clerk", "no-such-flow", secret)
        assert mine.value.reason_code is ReasonCode.UNAUTHORIZED
        assert theirs.value.reason_code is ReasonCode.UNAUTHORIZED
        assert theirs.value.field == "dfid"
        assert unseen.value.reason_code is ReasonCode.UNAUTHORIZED
        assert nowhere.value.reason_code is ReasonCode.UNAUTHORIZED
        refusals = await refused_on_record(kernel, 4)
        assert {r.entry for r in refusals} == {"artifact"}
        assert refusals[0].target == secret
        # The owner still may, after its flow ended; and the kernel runs on.
        got = await kernel.fetch_artifact("clerk", clerks, secret)
        assert got.data.startswith(b"the clerk's eyes only")
        [later] = await kernel.trigger("bank.z", {"bank.z.note": "again"})
        assert (await kernel.wait_flow(later)).status is FlowStatus.CLOSED


async def test_outside_a_decision_there_is_nothing_to_fetch_with() -> None:
    with pytest.raises(FetchRefused) as refused:
        await fetch_artifact("d", ref_of(b"x"), 0, None)
    assert refused.value.reason_code is ReasonCode.UNAUTHORIZED


async def test_a_range_past_the_limit_or_past_the_end_is_refused(tmp_path: Path) -> None:
    async def greedy(ctx: WorkingContext) -> list[Any]:
        ref = ctx.artifacts["hotel.doc"]
        results: list[Any] = []
        for start, length in ((0, 10**9), (10**6, 10), (-1, 10), (0, 0)):
            try:
                results.append(await ctx.fetch_artifact(ref, start=start, length=length))
            except FetchRefused as exc:
                results.append((exc.reason_code, exc.field))
        return results

    reader = Reader("clerk", greedy, ["hotel"])
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(reader)
        ref = await kernel.put_artifact(b"abc" * 1000)
        [dfid] = await kernel.trigger("hotel.doc", {"hotel.doc": ref})
        await kernel.wait_flow(dfid)
    too_much, past_end, negative, empty = reader.got[0]
    assert too_much == (ReasonCode.SCHEMA_INVALID, "length")
    assert past_end == (ReasonCode.SCHEMA_INVALID, "start")
    assert negative == (ReasonCode.SCHEMA_INVALID, "start")
    assert isinstance(empty, ArtifactSlice) and empty.data == b"" and empty.size == 3000


async def test_bytes_that_no_longer_hash_are_never_served_and_verify_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"

    async def read(ctx: WorkingContext) -> bytes:
        return (await ctx.fetch_artifact(ctx.artifacts["hotel.doc"])).data

    reader = Reader("clerk", read, ["hotel"])
    async with kernel_for(db) as kernel:
        await kernel.register(reader)
        ref = await kernel.put_artifact(b"original text" * 300, media_type="text/plain")
    assert await dirk("verify", "--db", str(db)) == 0
    assert "artifacts ok (1 referenced" in capsys.readouterr().out
    # Someone rewrites the stored bytes behind the kernel's back.
    store = sqlite3.connect(artifacts_beside(db))
    with store:
        store.execute("UPDATE artifacts SET body = ? WHERE ref = ?", (b"forged" * 10, ref))
    store.close()
    async with kernel_for(db) as kernel:
        await kernel.register(reader)
        [dfid] = await kernel.trigger("hotel.doc", {"hotel.doc": ref})
        await kernel.wait_flow(dfid)
        [refusal] = await refused_on_record(kernel, 1)
    [got] = reader.got
    assert isinstance(got, FetchRefused) and got.reason_code is ReasonCode.ARTIFACT_MISSING
    assert refusal.reason_code is ReasonCode.ARTIFACT_MISSING
    assert await dirk("verify", "--db", str(db)) == 1
    out = capsys.readouterr().out
    assert f"verify: FAILED artifact {ref}" in out and "no longer hash" in out


async def test_collecting_keeps_what_is_live_and_records_what_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"

    async def nothing(ctx: WorkingContext) -> None:
        return None

    async with kernel_for(db) as kernel:
        await kernel.register(Reader("clerk", nothing, ["hotel"]))
        named = await kernel.put_artifact(b"named by a state fact" * 100)
        orphan = await kernel.put_artifact(b"named by nothing" * 100)
        [dfid] = await kernel.trigger("hotel.a", {"hotel.a.doc": named})
        await kernel.wait_flow(dfid)
        assert await kernel.collect_artifacts(operator="ana", reason="r", dry_run=True) == [orphan]
        assert await kernel.collect_artifacts(operator="ana", reason="monthly") == [orphan]
        store = await kernel.artifact_store()
        assert await store.refs() == [named]
        [collected] = [
            e.payload
            for e in await kernel.journal.read(types=["ArtifactsCollected"])
            if isinstance(e.payload, ArtifactsCollected)
        ]
        assert (collected.refs, collected.operator) == ([orphan], "ana")
        assert collected.size == len(b"named by nothing" * 100)
        # Once the state no longer names it, it goes too.
        [dfid] = await kernel.trigger("hotel.a", {"hotel.a.doc": "moved on"})
        await kernel.wait_flow(dfid)
        assert await kernel.collect_artifacts(operator="ana", reason="again") == [named]
        assert await kernel.collect_artifacts(operator="ana", reason="nothing left") == []
    assert await dirk("verify", "--db", str(db)) == 0
    assert await dirk("artifacts", "--db", str(db), "--json") == 0
    assert '"collected"' in capsys.readouterr().out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ref=hostile_text(), dfid=hostile_text(), start=st.integers(-(2**70), 2**70))
async def test_any_fetch_is_answered_with_a_code_never_a_traceback(
    kernel: Kernel, ref: str, dfid: str, start: int
) -> None:
    try:
        await kernel.fetch_artifact("clerk", dfid, ref, start)
    except FetchRefused as exc:
        assert exc.reason_code in (ReasonCode.SCHEMA_INVALID, ReasonCode.UNAUTHORIZED)
    else:
        pytest.fail("a fetch nothing referenced was served")
    assert kernel.stopped is None
