"""The one call passes the kernel's edge as a submission does: sealed, and scored by meaning.

``Kernel.propose`` builds its proposal itself instead of receiving it from an agent's
``submit``; what happens to a proposal before its verdict (kernel.api.edge) must happen on
this path too, or a framework's tool call would record a guest's name in clear and
escape the memory's constraints by meaning.
"""

from __future__ import annotations

from pathlib import Path

from kernel import DecisionVerdict, Manifest, ReasonCode
from kernel.core import events as ev
from kernel.proofs.erasure import is_sealed
from kernel.state.meaning import EmbeddingMatcher, to_micro
from tests.memory.test_constraints import FakeEmbedder, kernel_with
from tests.proposals.test_propose import CHEAP, Hotel, book, booking_kernel
from tests.support.memory_domain import MEMORY_KINDS

NAME = "Ana Lima-Ferreira"


def journal_bytes(db: Path) -> bytes:
    """Every file the journal keeps (the database, its WAL), not the subject key store."""
    return b"".join(p.read_bytes() for p in db.parent.glob(f"{db.name}*") if ".keys" not in p.name)


async def test_a_proposed_guest_name_is_sealed_before_it_is_judged_and_reaches_the_hotel(
    tmp_path: Path,
) -> None:
    hotel = Hotel()
    db = tmp_path / "j.db"
    async with booking_kernel(db, hotel) as kernel:
        decision = await book(kernel, {**CHEAP, "guest_name": NAME}, tool_call_id="call-1")
        assert decision.verdict is DecisionVerdict.EXECUTED
        [submitted] = await kernel.journal.read(dfid=decision.dfid, types=["ProposalSubmitted"])
        assert isinstance(submitted.payload, ev.ProposalSubmitted)
        recorded = submitted.payload.proposal.params["guest_name"]
        assert is_sealed(recorded) and NAME not in str(recorded)
    # The hotel adapter alone gets the name; the journal never held it.
    [intent] = hotel.calls
    assert intent.params["guest_name"] == NAME
    assert NAME.encode() not in journal_bytes(db)


async def test_a_proposed_call_is_scored_by_meaning_and_refused_by_a_constraint(
    tmp_path: Path,
) -> None:
    embedder = FakeEmbedder()
    async with kernel_with(
        tmp_path / "j.db", meaning=EmbeddingMatcher(embedder, threshold=0.9)
    ) as kernel:
        await kernel.handshake(
            Manifest(
                agent_id="booker",
                version="1.0.0",
                capabilities=["test.note", *MEMORY_KINDS],
                subscriptions=["desk.booker"],
            )
        )
        never = await kernel.propose(
            "booker",
            "memory.add_constraint",
            {"text": "never send money to mallory"},
            explain="the operator's rule",
            confidence=0.9,
        )
        assert never.verdict is DecisionVerdict.EXECUTED, never
        # No word of the constraint in order: only the model sees the likeness.
        wired = await kernel.propose(
            "booker",
            "test.note",
            {"text": "wire the funds over to M. at once"},
            explain="wire the funds over to M. at once",
            confidence=0.9,
        )
        fine = await kernel.propose(
            "booker",
            "test.note",
            {"text": "file the expense report"},
            explain="file the expense report",
            confidence=0.9,
        )
        assert wired.verdict is DecisionVerdict.REFUSED
        assert wired.reason_code is ReasonCode.CONSTRAINT_VIOLATION
        assert "fake-embedder@7" in wired.detail
        [scored] = await kernel.journal.read(dfid=wired.dfid, types=["MeaningScored"])
        assert isinstance(scored.payload, ev.MeaningScored)
        assert list(scored.payload.scores.values()) == [to_micro(1.0)]
        assert fine.verdict is DecisionVerdict.EXECUTED
        assert embedder.calls >= 2
