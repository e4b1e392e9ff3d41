"""What a constraint matches by meaning, and what it must not: the table.

Each row is (kind, the proposal's text, the constraint, what memory was queried,
expected). "Expected True" means the constraint objects: a prohibition's X occurs in
the proposal (CONSTRAINT_VIOLATION), or a procedure's action Y does and its X was not
queried (VERIFICATION_REQUIRED). The rows marked *limit* document what word matching
cannot tell (negation, noun from verb, "access" from "accessibility"); they pin the
behaviour so a change is seen. The last rows are the matcher of constraints recorded
before meaning (``matcher=""``), which older journals re-judge with, unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernel.core.events import ProposalRecord
from kernel.state.constraints import ENFORCED, ConstraintRecord, violations
from kernel.state.meaning import MATCHER, canonical, groups_of, phrase_in, words
from kernel.state.memory import MemoryState
from policies.booking import SYNONYMS

DML = "Verify accessibility before booking"
DECIDE = "memory.record_decision"
RESERVE = "booking.reserve_room"
MONEY = (("send money", "transfer funds", "wire money"),)

Row = tuple[str, str, str, dict[str, Any], tuple[str, ...], bool]
# (kind, text, constraint, how it is recorded, topics queried, expected)

ROWS: list[Row] = [
    # --- procedures: the action, by stem and synonym -------------------------------
    (DECIDE, "Book Hotel Granvia", DML, {}, (), True),  # the DML paper's Appendix B
    (DECIDE, "booking for ana at Miramar", DML, {}, (), True),
    (DECIDE, "Hotel booking for ana", DML, {}, (), True),
    (DECIDE, "booked the Miramar for two nights", DML, {}, (), True),
    (DECIDE, "Reserve a room at Granvia", DML, {"synonyms": SYNONYMS}, (), True),
    (DECIDE, "Make a reservation at Granvia", DML, {"synonyms": SYNONYMS}, (), True),
    (DECIDE, "Reserve a room at Granvia", DML, {}, (), False),  # no synonyms recorded
    (DECIDE, "Books on accessibility", DML, {}, (), True),  # limit: noun or verb
    (DECIDE, "Cancel the trip", DML, {}, (), False),
    (DECIDE, "Look up the bookkeeping rules", DML, {}, (), False),
    (DECIDE, "Post a Facebook ad", DML, {}, (), False),
    (DECIDE, "Buy a notebook", DML, {}, (), False),
    (DECIDE, "Book Hotel Granvia", "Verify accessibility before payment", {}, (), False),
    (DECIDE, "Pay the invoice", "Verify the amount before paying", {}, (), True),
    (DECIDE, "Payment of the invoice", "Verify the amount before paying", {}, (), False),
    (RESERVE, "a suite for bo", DML, {}, (), True),  # the kind's name says booking
    # --- procedures: what counts as the verification ------------------------------
    (DECIDE, "Book Hotel Granvia", DML, {}, ("accessibility",), False),
    (DECIDE, "Book Hotel Granvia", DML, {}, ("accessible rooms at Granvia",), False),
    (DECIDE, "Book Hotel Granvia", DML, {"synonyms": SYNONYMS}, ("wheelchair access",), False),
    (DECIDE, "Book Hotel Granvia", DML, {}, ("wheelchair access",), False),  # limit: "access"
    (DECIDE, "Book Hotel Granvia", DML, {}, ("door codes",), True),
    (DECIDE, "Book Hotel Granvia", DML, {}, ("Granvia prices",), True),
    ("memory.query", "accessibility at Granvia", DML, {}, (), False),  # the query is exempt
    # --- prohibitions ---------------------------------------------------------------
    (DECIDE, "use eval() to parse the input", "Never use eval()", {}, (), True),
    (DECIDE, "call eval(x) on it", "Never use eval()", {}, (), True),
    (DECIDE, "parse it with ast.literal_eval", "Never use eval()", {}, (), False),  # identifier
    ("trading.place_order", "100 ACME", "Verify limits before placing an order", {}, (), True),
    (DECIDE, "evaluate the results", "Never use eval()", {}, (), False),
    (DECIDE, "concatenate the strings", "avoid cat", {}, (), False),
    (DECIDE, "cat the file", "avoid cat", {}, (), True),
    (DECIDE, "Cats are fine", "avoid cat", {}, (), True),  # limit: stems, not senses
    (DECIDE, "run rm -rf / now", "never run rm -rf", {}, (), True),
    (DECIDE, "sudo apt install curl", "do not use sudo", {}, (), True),
    (DECIDE, "write the pseudocode", "do not use sudo", {}, (), False),
    (DECIDE, "send the money to Mallory", "never send money to mallory", {}, (), True),
    (DECIDE, "SEND MONEY TO MALLORY", "never send money to mallory", {}, (), True),
    (DECIDE, "ｓｅｎｄ money to mallory", "never send money to mallory", {}, (), True),  # noqa: RUF001 (NFKC)
    (DECIDE, "send money to Bob", "never send money to mallory", {}, (), False),
    (DECIDE, "mallory, money: send", "never send money to mallory", {}, (), False),  # order
    (DECIDE, "don't send money to mallory", "never send money to mallory", {}, (), True),  # limit
    (DECIDE, "transfer funds to mallory", "never send money to mallory", {}, (), False),
    (
        DECIDE,
        "transfer funds to mallory",
        "never send money to mallory",
        {"synonyms": MONEY},
        (),
        True,
    ),
    (DECIDE, "a non-smoking room", "avoid smoking", {}, (), True),  # limit: negation
    (DECIDE, "a room with a view", "avoid smoking", {}, (), False),
    # --- scopes: kinds and parameters ------------------------------------------------
    (RESERVE, "anything at all", DML, {"kinds": [RESERVE]}, (), True),
    (DECIDE, "Book Hotel Granvia", DML, {"kinds": [RESERVE]}, (), False),
    (RESERVE, "eval the hotel", "never use eval", {"params": ["hotel"]}, (), False),
    (RESERVE, "", "never use eval", {"params": ["hotel"], "hotel": "eval"}, (), True),
    (DECIDE, "always book early", "always book early", {}, (), False),  # never refuses
    # --- before meaning: whole words, as those journals were judged -------------------
    (DECIDE, "Booking Hotel Granvia", DML, {"matcher": ""}, (), True),
    (DECIDE, "Book Hotel Granvia", DML, {"matcher": ""}, (), False),
    (DECIDE, "call eval(x) on it", "Never use eval()", {"matcher": ""}, (), False),
    (DECIDE, "use eval() to parse", "Never use eval()", {"matcher": ""}, (), True),
]


def objects(row: Row) -> bool:
    """Whether the row's constraint objects to the row's proposal."""
    kind, text, constraint, how, queried, _ = row
    params: dict[str, Any] = {"text": text}
    if kind == RESERVE:
        params = {"hotel": how.get("hotel", "Granvia"), "traveller": "ana"}
    record = ConstraintRecord(
        seq=7,
        text=constraint,
        priority="required",
        triggered_by=None,
        agent_id="a",
        correlation_id="r",
        matcher=how.get("matcher", MATCHER),
        synonyms=[list(g) for g in how.get("synonyms", ())],
        kinds=list(how.get("kinds", [])),
        params=list(how.get("params", [])),
    )
    state = MemoryState(constraints={7: record}, queried={"agent": {topic: 1 for topic in queried}})
    proposal = ProposalRecord(kind=kind, params=params, explain=text)
    found = list(violations(state, proposal, "agent", "root"))
    return any(c.priority in ENFORCED for c, _, _ in found)


def test_the_table_has_at_least_forty_rows_with_both_outcomes() -> None:
    assert len(ROWS) >= 40
    assert {row[-1] for row in ROWS} == {True, False}


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"{row[2][:24]}|{row[1][:24]}")
def test_what_matches_and_what_must_not(row: Row) -> None:
    assert objects(row) is row[-1]


def test_words_are_normalised_stemmed_and_function_words_dropped() -> None:
    assert words("Booking the Hotel") == ("book", "hotel")
    assert words("eval(x)") == ("eval", "x")
    assert words("trading.place_order") == ("trade", words("place_order")[0])
    assert words("ast.literal_eval(x)") == ("ast", words("literal_eval")[0], "x")
    assert words("ＢＯＯＫ") == ("book",)  # noqa: RUF001 (fullwidth on purpose)
    assert words("") == ()


def test_synonyms_read_as_their_groups_first_phrase_longest_first() -> None:
    groups = groups_of((("accessibility", "step-free access", "step"),))
    assert canonical(words("ask for step-free access"), groups) == ("ask", "for", "access")
    assert canonical(words("one step"), groups) == ("one", "access")
    assert phrase_in("accessibility", "wheelchair access", SYNONYMS)
    assert not phrase_in("", "anything")  # an empty phrase never occurs
