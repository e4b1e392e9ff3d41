"""A travel desk that learns from its mistake, through governed memory, end to end.

The story (after the DML reference): a travel agent books a room that is not
accessible for a traveller who needs step-free access. The traveller's
correction becomes a *learned* constraint, "verify accessibility before
booking", whose ``triggered_by`` names the mistaken booking's event. The next
booking is refused (VERIFICATION_REQUIRED) until the agent queries memory about
accessibility; then it goes through. The desk lead writes the lesson into the
rulebook as rule ``access`` (with its provenance), and from then on the agent
cites it in its explanations (``dirk why access`` tells its history). A
counterfactual replay, which only reads
the journal, shows the first booking would have been refused had the
constraint existed from the start. On the way: a booking over the agent's
budget is refused and revised, an expensive one waits for a human, and another,
as expensive, goes through on the standing grant the desk lead gave for dee's week
(its use recorded with the booking; ``dirk grants`` lists it). The hotel's
accessibility statement (a few KB) is put in the artifact store: the journal records
its reference, never its bytes, and the agent's contexts name it, so the agent
fetches it and books the room the statement says is step-free.

    python -m examples.booking --seed 1 --db booking.db
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

import anyio

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from examples.clock import SimClock
from examples.llm import LanguageModel, ModelError, answer_of, conversation, open_model
from examples.serving import Served
from examples.summary import (
    checkpoint_signing,
    journal_and_files,
    public_key_of,
    read_events,
    show,
    summarize,
)
from kernel import (
    MEMORY_PACK,
    FlowStatus,
    Kernel,
    KernelConfig,
    Ports,
    Principal,
    Signing,
    Supervision,
    keyring_problem,
    open_kernel,
)
from kernel.audit import Event, open_journal, redact, whatif
from kernel.audit import events as ev
from kernel.testing import Faults, SeededIds, SimulatedSystem
from policies.booking import BOOKING

LESSON = "verify accessibility before booking"
ACCESS_RULE = (
    "Before booking for a traveller who needs step-free access, verify with the hotel"
    " that the room is accessible; an unverified room is never booked."
)
TRAVEL_KINDS = [
    "booking.reserve_room",
    "booking.cancel",
    "memory.add_constraint",
    "memory.query",
]
STATEMENT = "\n".join(
    [
        "# Hotel Miramar: accessibility statement",
        "",
        "Room 12 (accessible category): step-free from the street door to the bed;",
        "roll-in shower with a fold-down seat; grab rails; a 90 cm door.",
        "Rooms 1-11 and 13-40 are reached by six steps and have bathtubs.",
        "",
        *(
            f"- {area}: {detail}"
            for area, detail in [
                ("Entrance", "level access from Rua do Sol, automatic doors, 110 cm wide"),
                ("Reception", "lowered counter section at 76 cm, hearing loop"),
                ("Lift", "serves every floor, 140 x 110 cm car, braille buttons, voice"),
                ("Restaurant", "step-free, movable chairs, large-print menu on request"),
                ("Parking", "two marked bays 20 m from the entrance, level route"),
                ("Assistance", "trained staff 24 h; evacuation chair on every floor"),
            ]
        ),
        "",
        *(f"Note {n}: reconfirm the room category at check-in." for n in range(1, 40)),
    ]
)
"""The hotel's own statement (about 2.6 KB): kept in the artifact store, by reference."""
ACCESS_KEY = "hotel.miramar.access"
REQUESTS: list[dict[str, Any]] = [
    # The mistake: nobody asked whether Ana needs step-free access.
    {"traveller": "ana", "hotel": "Miramar", "nights": 3, "note": "conference in Lisbon"},
    # Over the agent's budget at first: a suite for a week.
    {"traveller": "bo", "hotel": "Grand Palace", "nights": 6, "note": "wants something nice"},
    # Above the pack's approval threshold: a human signs it off.
    {"traveller": "cy", "hotel": "Grand Palace", "nights": 4, "note": "board offsite, suite"},
    # Above it too, but dee's week was granted in advance: no human is asked.
    {"traveller": "dee", "hotel": "Grand Palace", "nights": 5, "note": "client week, suite"},
]
DEE_WEEK = {
    "traveller": {"eq": "dee"},
    "nightly_rate_cents": {"max": "60000"},
    "nights": {"max": "7"},
}
"""The standing grant for dee's week: any room up to 600.00 EUR a night, up to 7 nights."""
GUESTS = {
    "ana": "Ana Lopes Ferreira",
    "bo": "Bo Lindqvist",
    "cy": "Cy Okonkwo",
    "dee": "Dee Mbeki",
}
"""The travel agent's own directory of the names its travellers book under: personal data
(the pack seals it under the traveller's key; ``dirk erase --subject ana`` shreds it)."""
RATES = {"single": 12_000, "double": 18_000, "accessible": 21_000, "suite": 60_000}


def travel(task: dict[str, Any], rng: Any) -> dict[str, Any]:
    """The scripted travel model: books quickly, learns when told, checks once reminded."""
    feedback = task.get("feedback") or {}
    code = feedback.get("reason_code", "")
    if task["kind"] == "correction":
        return {
            "proposal": {
                "kind": "memory.add_constraint",
                "text": LESSON,
                "priority": "learned",
                "triggered_by": task["booking_event"],
            },
            "confidence": 0.95,
            "explain": f"{task['traveller']} says: {task['message']} Never again without checking.",
        }
    request = task["request"]
    # Rules the desk put in the context are cited, so the kernel can check the citations.
    cites = "".join(f" [rule:{rule}]" for rule in task.get("rules", []))
    if code == "VERIFICATION_REQUIRED":
        # Reminded of the lesson: consult memory (the verification) before booking.
        return {
            "proposal": {"kind": "memory.query", "topic": f"accessibility {request['hotel']}"},
            "confidence": 0.9,
            "explain": f"Check accessibility at {request['hotel']} before booking.{cites}",
        }
    needs = task.get("needs_step_free", False)
    room = "accessible" if needs else "double"
    statement = task.get("access_statement", "")
    # The hotel's own statement names its step-free room: the model books and cites it.
    seen = f" The hotel's statement: {statement}" if needs and statement else ""
    if "suite" in request["note"] or (request["note"].endswith("nice") and not code):
        room = "suite"
    if code == "RISK_LIMIT_EXCEEDED":
        room = "double"  # over budget: the model trades down
    confidence = round(0.85 + rng.random() * 0.1, 2)
    return {
        "proposal": {
            "kind": "booking.reserve_room",
            "traveller": request["traveller"],
            "hotel": request["hotel"],
            "room_type": room,
            "nights": request["nights"],
            "nightly_rate_cents": RATES[room],
            "step_free": needs,
            "accessible": room == "accessible",
            "guest_name": GUESTS.get(request["traveller"], ""),
        },
        "confidence": confidence,
        "explain": (
            f"A {room} room at {request['hotel']} for {request['note']}; great reviews."
            f"{seen}{cites}"
        ),
    }


class TravelAgent(Agent):
    """Books rooms for travellers and keeps what it learns in governed memory."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.manifest = Manifest(
            agent_id="travel-agent",
            version="1.0.0",
            capabilities=TRAVEL_KINDS,
            subscriptions=["request", "correction", "traveller", "hotel"],
        )

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        kind, _, name = ctx.topic.partition(".")
        task: dict[str, Any] = {"task": "travel", "id": ctx.dfid, "attempt": ctx.attempt}
        task["kind"] = kind
        if kind == "correction":
            task.update(ctx.state[f"correction.{name}"])
        else:
            request = ctx.state[f"request.{name}"]
            task["request"] = request
            task["needs_step_free"] = bool(
                ctx.state.get(f"traveller.{request['traveller']}.step_free")
            )
            key = f"hotel.{str(request['hotel']).lower()}.access"
            if task["needs_step_free"] and key in ctx.artifacts:
                # Too large to inline: the context names it; the agent reads what it needs.
                piece = await ctx.fetch_artifact(key)
                lines = piece.data.decode("utf-8", "replace").splitlines()
                task["access_statement"] = next((x for x in lines if "step-free" in x), "")
        rules = ctx.memory.get("rules", [])
        task["rules"] = [f"{rule['id']}@v{rule['version']}" for rule in rules]
        if ctx.feedback is not None:
            task["feedback"] = {"reason_code": str(ctx.feedback.reason_code)}
        try:
            answer = answer_of(
                await self.model.complete(conversation("You are a travel agent.", task))
            )
        except ModelError:
            return None
        policy = answer.get("proposal")
        if not isinstance(policy, dict):
            return None
        return ctx.propose(
            policy,
            explain=str(answer.get("explain", "")),
            confidence=float(answer.get("confidence", 0.5)),
            valid_for_s=600,
        )


async def book(kernel: Kernel, name: str, request: dict[str, Any]) -> str:
    """The traveller's request arrives; return its flow once it has settled."""
    [dfid] = await kernel.trigger(f"request.{name}", {f"request.{name}": request}, source="app")
    await kernel.wait_quiet()
    return dfid


async def first_event(kernel: Kernel, dfid: str, type_: str) -> Event:
    [event, *_] = await kernel.journal.read(dfid=dfid, types=[type_])
    return event


def hotel_file(files: Path) -> Path:
    """The simulated hotel's own file, beside ``files``."""
    return files.with_name(f"{files.stem}.hotel.db")


async def simulate(
    seed: int,
    db: Path | str,
    llm: str,
    files: Path | None = None,
    signing: Signing | None = None,
) -> None:
    """Run the travel desk's day, journaling into ``db``."""
    model = open_model(llm, seed, {"travel": travel})
    clock = SimClock()
    hotel = SimulatedSystem(
        hotel_file(files or Path(db)),
        seed=seed,
        faults=Faults(latency_s=(0.1, 0.5), transient=0.2, duplicate=0.3),
        sleep=clock.sleep,
    )
    try:
        async with open_kernel(
            db,
            packs=[BOOKING, MEMORY_PACK],
            adapters={"hotel": hotel},
            allow=["travel-agent"],
            config=KernelConfig(
                # This host vouches for one local user: every flow acts on its behalf
                # (KernelConfig.principal; docs/identity.md).
                principal=Principal(tenant="local", user="local"),
                ports=Ports(clock=clock, ids=SeededIds(seed), jitter_seed=seed),
                supervision=Supervision(inbox_poll_s=None),
                signing=signing,
                # The guests' names are sealed under keys kept beside the run's files: for a
                # SQLite journal that is the default place, a PostgreSQL journal must name one.
                subject_keys=None if files is None else f"{files}.keys",
            ),
        ) as kernel:
            await kernel.register(TravelAgent(model))
            ana, bo, cy, dee = REQUESTS
            # The desk lead grants dee's client week before it starts: bookings within it
            # that would wait for a human go through, each use recorded with its booking.
            week = await kernel.grant(
                "booking.reserve_room",
                agent="travel-agent",
                bounds=DEE_WEEK,
                uses=3,
                valid_for_s=7 * 86_400,
                cap="4,000.00 EUR",
                operator="rui",
                reason="dee's client week, budgeted",
            )
            progress("1/7 booking for ana (nobody asked about access)")
            mistake = await book(kernel, "ana-1", ana)
            submitted = await first_event(kernel, mistake, "ProposalSubmitted")
            clock.at_minute(30)
            progress("2/7 ana's correction becomes a learned constraint")
            correction = {
                "traveller": "ana",
                "message": "I use a wheelchair and the Miramar room has steps.",
                "booking_event": submitted.seq,
            }
            await kernel.trigger(
                "correction.ana", {"correction.ana": correction, "traveller.ana.step_free": True}
            )
            await kernel.wait_quiet()
            # The hotel sends its accessibility statement: into the artifact store, and a
            # reference in the state (a topic no agent listens to: it opens no flow).
            statement = await kernel.put_artifact(
                STATEMENT.encode(),
                media_type="text/markdown",
                summary="Hotel Miramar's accessibility statement",
                by="hotel",
            )
            await kernel.trigger("directory.hotels", {ACCESS_KEY: statement}, source="hotel")
            # The desk lead writes the lesson down as a house rule, with where it lives.
            await kernel.propose_rule(
                "access",
                title="Accessibility first",
                content=ACCESS_RULE,
                labels=["accessibility", "booking", "step-free"],
                source=ev.RuleSource(
                    repo="travel-desk/handbook",
                    ref="main",
                    path="rules/access.md",
                    blob=hashlib.sha256(ACCESS_RULE.encode()).hexdigest(),
                ),
                operator="rui",
                reason="ana's correction, for every traveller",
            )
            clock.at_minute(40)
            progress("3/7 rebooking ana: refused until the agent verifies accessibility")
            await book(kernel, "ana-2", ana)
            await book(kernel, "ana-3", ana)
            clock.at_minute(60)
            progress("4/7 bo's suite is over budget; the agent trades down")
            await book(kernel, "bo-1", bo)
            progress("5/7 cy's offsite suite needs a human's approval")
            offsite = await book(kernel, "cy-1", cy)
            flow = kernel.flow(offsite)
            if flow is not None and flow.status is FlowStatus.ESCALATED:
                # Approving a HIGH_IMPACT action names it (as `dirk decide --confirm` does).
                approval = kernel.projections.approvals[offsite]
                await kernel.decide(
                    offsite,
                    "approve",
                    operator="rui",
                    reason="board offsite, budgeted",
                    action_hash=approval.action_hash,
                )
                await kernel.wait_quiet()
            grant = week.payload.grant  # type: ignore[union-attr]
            progress(f"6/7 dee's week: above the threshold, within grant {grant}")
            await book(kernel, "dee-1", dee)
    finally:
        hotel.close()


def serving(files: Path) -> Served:
    """The travel desk's parts for ``dirk serve --example booking``: its packs and hotel."""
    hotel = SimulatedSystem(hotel_file(files))
    return Served(
        packs=[BOOKING, MEMORY_PACK],
        adapters={"hotel": hotel},
        allow=["travel-agent"],
        close=hotel.close,
    )


def progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


async def story(db: Path | str, public_key: Path | None = None) -> dict[str, Any]:
    """The summary, the learned-constraint story and the counterfactual, from the journal."""
    summary = await summarize(db, ("booking.reserve_room",), public_key)
    events = await read_events(db)
    learned = [e.payload for e in events if isinstance(e.payload, ev.ConstraintAdded)]
    progress("7/7 counterfactual: the lesson in force from the start")
    async with open_journal(db, readonly=True) as journal:
        replay = await whatif(journal, constraint=LESSON, at=1, priority="learned")
    summary["story.learned"] = [
        f"{c.text!r} ({c.priority}) triggered_by #{c.triggered_by}" for c in learned
    ]
    summary["story.counterfactual"] = [change.line() for change in replay.changes]
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m examples.booking", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seed", type=int, default=1, help="the seed of the whole run (default 1)")
    p.add_argument(
        "--db", help="journal file or postgresql:// URL (default: a fresh temporary file)"
    )
    p.add_argument("--llm", choices=("scripted", "openai"), default="scripted")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    args = p.parse_args(argv)
    db, files = journal_and_files(args.db, "booking.db")
    for taken in (files, hotel_file(files)):
        if taken.exists():
            print(f"error: {taken} exists; pick a new --db path", file=sys.stderr)
            return 2
    unusable = keyring_problem()  # before any file is made: none is left half made
    if unusable is not None:
        print(f"error: BAD_ARGUMENT: {unusable}", file=sys.stderr)
        return 2
    print(f"travel desk, seed {args.seed} -> {redact(str(db))}", file=sys.stderr)
    try:
        anyio.run(simulate, args.seed, db, args.llm, files, checkpoint_signing(files))
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = anyio.run(story, db, public_key_of(files))
    show(f"travel desk, seed {args.seed}", summary, args.json)
    return 0 if summary["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
