"""Constraints by meaning through the kernel: scopes, conflicts, the embedding port, replay."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
from hypothesis import given, settings

from kernel import FlowStatus, Kernel, ReasonCode, open_kernel
from kernel.audit import open_journal, payloads
from kernel.audit.reverify import rejudge
from kernel.config import KernelConfig, Ports
from kernel.core.events import MeaningScored, ProposalRejected
from kernel.memory import memory_pack
from kernel.policy import PolicyPack
from kernel.state.meaning import EmbeddingMatcher, phrase_in, to_micro, words
from kernel.testing import ManualClock, SeededIds
from tests.support.helpers import PACK, Bank, configured, flow_of
from tests.support.hostile import hostile_text
from tests.support.memory_domain import BOOKING, Planner, book, note, remember, run
from tests.support.principals import LOCAL

DML = "Verify accessibility before booking"


class FakeEmbedder:
    """A deterministic model at the port: a text is [money moved?, anything else?].

    No network: "wire", "transfer" and "send" point one way, everything else the other.
    """

    model = "fake-embedder"
    version = "7"

    def __init__(self) -> None:
        self.calls = 0

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        self.calls += 1
        moving = ("wire", "transfer", "send", "remit")
        return [[1.0, 0.0] if any(m in t.lower() for m in moving) else [0.0, 1.0] for t in texts]


class BrokenEmbedder:
    """A model that fails: the words alone must still judge."""

    model = "broken"
    version = "0"

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        raise ConnectionError("the model host is down")


@asynccontextmanager
async def kernel_with(
    path: Path, memory: PolicyPack | None = None, meaning: EmbeddingMatcher | None = None
) -> AsyncIterator[Kernel]:
    ports = Ports(clock=ManualClock(), ids=SeededIds(11), meaning=meaning)
    async with open_kernel(
        path,
        packs=[PACK, BOOKING, memory or memory_pack()],
        adapters={"bank": Bank()},
        allow=["booker", "other"],
        config=configured(KernelConfig(principal=LOCAL, ports=ports)),
    ) as kernel:
        yield kernel


async def rejections(kernel: Kernel, dfid: str) -> list[tuple[ReasonCode, str]]:
    events = await kernel.journal.flow_events(dfid)
    return [(p.feedback.reason_code, p.feedback.detail) for p in payloads(events, ProposalRejected)]


async def test_the_dml_pair_book_hotel_granvia_is_refused_until_accessibility_was_queried(
    tmp_path: Path,
) -> None:
    async with kernel_with(tmp_path / "j.db") as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        await run(kernel, agent, remember("memory.add_constraint", text=DML))

        refused = await run(kernel, agent, note("Book Hotel Granvia"))
        await run(kernel, agent, remember("memory.query", topic="accessibility at Granvia"))
        allowed = await run(kernel, agent, note("Book Hotel Granvia"))

        [(code, detail)] = await rejections(kernel, refused)
        assert code is ReasonCode.VERIFICATION_REQUIRED
        assert DML in detail
        assert await rejections(kernel, allowed) == []
        assert flow_of(kernel, allowed).status is FlowStatus.CLOSED


async def test_a_scoped_constraint_governs_its_kinds_whatever_their_words_and_nothing_else(
    tmp_path: Path,
) -> None:
    async with kernel_with(tmp_path / "j.db") as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        scoped = remember("memory.add_constraint", text=DML, kinds=["booking.reserve"])
        await run(kernel, agent, scoped)

        # A reservation that never says "book" is the action all the same.
        reserve = await run(kernel, agent, book(explain="stay two nights at Granvia"))
        # A note saying "book" is not a reservation: out of scope.
        talk = await run(kernel, agent, note("book club meets on Friday"))

        assert [c for c, _ in await rejections(kernel, reserve)] == [
            ReasonCode.VERIFICATION_REQUIRED
        ]
        assert await rejections(kernel, talk) == []


async def test_a_scope_naming_an_unknown_kind_is_not_put_in_force(tmp_path: Path) -> None:
    async with kernel_with(tmp_path / "j.db") as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        typo = remember("memory.add_constraint", text=DML, kinds=["booking.reserv"])
        dfid = await run(kernel, agent, typo)

        assert flow_of(kernel, dfid).status is not FlowStatus.CLOSED
        assert kernel.projections.memory.constraints == {}


async def test_a_requirement_against_a_prohibition_is_refused_naming_both(tmp_path: Path) -> None:
    async with kernel_with(tmp_path / "j.db") as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        await run(kernel, agent, remember("memory.add_constraint", text="Never book Granvia"))
        clash = await run(
            kernel, agent, remember("memory.add_constraint", text="Always book Granvia")
        )
        twice = await run(
            kernel,
            agent,
            remember("memory.add_constraint", text="never book granvia", priority="preferred"),
        )

        [(code, detail)] = await rejections(kernel, clash)
        assert code is ReasonCode.CONSTRAINT_CONFLICT
        assert "'Always book Granvia'" in detail and "'Never book Granvia'" in detail
        [(code, detail)] = await rejections(kernel, twice)
        assert code is ReasonCode.CONSTRAINT_CONFLICT
        assert "priority required" in detail
        assert [c.text for c in kernel.projections.memory.constraints.values()] == [
            "Never book Granvia"
        ]


async def test_a_pack_may_send_a_conflict_to_a_human_instead(tmp_path: Path) -> None:
    async with kernel_with(tmp_path / "j.db", memory=memory_pack(conflicts="escalate")) as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        await run(kernel, agent, remember("memory.add_constraint", text="Never book Granvia"))
        agent.plans.append([remember("memory.add_constraint", text="Always book Granvia")])
        [dfid] = await kernel.trigger("desk.booker", {"desk.booker.request": 2})
        flow = await kernel.wait_flow(dfid)

        assert flow.status is FlowStatus.ESCALATED
        [escalated] = [
            e for e in await kernel.journal.flow_events(dfid) if e.type == "FlowEscalated"
        ]
        assert "CONSTRAINT_CONFLICT" in str(msgspec.to_builtins(escalated.payload))
        assert kernel.projections.memory.constraints.keys() == {
            c.seq for c in kernel.projections.memory.constraints.values()
        }
        assert len(kernel.projections.memory.constraints) == 1


async def test_an_embedding_match_is_recorded_with_its_model_and_replays_without_it(
    tmp_path: Path,
) -> None:
    embedder = FakeEmbedder()
    path = tmp_path / "j.db"
    async with kernel_with(path, meaning=EmbeddingMatcher(embedder, threshold=0.9)) as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        never = remember("memory.add_constraint", text="never send money to mallory")
        await run(kernel, agent, never)
        # No word of "send money to mallory" in order: only the model sees the likeness.
        wired = await run(kernel, agent, note("wire the funds over to M. at once"))
        fine = await run(kernel, agent, note("file the expense report"))

        [(code, detail)] = await rejections(kernel, wired)
        assert code is ReasonCode.CONSTRAINT_VIOLATION
        assert "fake-embedder@7 scored 1.000000" in detail
        [scored] = payloads(await kernel.journal.flow_events(wired), MeaningScored)
        assert (scored.model, scored.version) == ("fake-embedder", "7")
        assert scored.threshold == to_micro(0.9)
        assert list(scored.scores.values()) == [to_micro(1.0)]
        assert await rejections(kernel, fine) == []
        assert embedder.calls >= 2

    # Replay judges from the recorded scores: no model is given, and nothing differs.
    async with open_journal(path, readonly=True) as journal:
        again = await rejudge(journal, [PACK, BOOKING, memory_pack()])
    assert again.changes == []
    assert again.judged > 0


async def test_a_failing_model_leaves_the_words_to_judge(tmp_path: Path) -> None:
    async with kernel_with(tmp_path / "j.db", meaning=EmbeddingMatcher(BrokenEmbedder())) as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        await run(kernel, agent, remember("memory.add_constraint", text="never send money"))
        worded = await run(kernel, agent, note("send money to bob"))
        other = await run(kernel, agent, note("wire the funds"))

        assert [c for c, _ in await rejections(kernel, worded)] == [ReasonCode.CONSTRAINT_VIOLATION]
        assert await rejections(kernel, other) == []
        assert flow_of(kernel, other).status is FlowStatus.CLOSED


@settings(max_examples=200, deadline=None)
@given(phrase=hostile_text(), text=hostile_text())
def test_matching_any_text_never_raises_and_a_text_contains_its_own_words(
    phrase: str, text: str
) -> None:
    found = phrase_in(phrase, text, [["book", "reserve"]])
    assert isinstance(found, bool)
    if words(phrase):
        assert phrase_in(phrase, f"{text} {phrase}")
