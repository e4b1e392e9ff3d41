"""What ``dirk`` prints for people shows control characters as escapes; JSON stays exact.

The wall now refuses control characters in ids and in an agent's explanation, but a
journal written before it (or by a kernel of another version) may hold them, and a
terminal obeys them: ``ESC]0;...BEL`` retitles the window, ``ESC[2J`` clears the screen,
``ESC[1A ESC[2K`` and ``\\r`` erase and overwrite the line above (the action an operator
is about to approve), ``ESC]8;;URL`` disguises a link (trust-and-edges.md, D6). Here a
real kernel's journal is rewritten, event by event through the journal's own append
(so it verifies), with D6's agent id and explanation, and every display command runs
on it in a real ``dirk`` process.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from kernel.audit import open_journal, verify_journal
from kernel.core.events import Draft, Event, is_derived
from kernel.policy.contracts import Proposal, WorkingContext
from kernel.testing import ManualClock
from tests.cli.test_operator_admin import dirk
from tests.support.helpers import ScriptedAgent, Transfer, kernel_for

AGENT = "pm\x1b]0;pwned\x07\x1b[2J"
EXPLAIN = (
    "fine\x1b[31;1m RED \x1b[0m\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\"
    " \x1b[1A\x1b[2Kerased \r overwritten\x9b31m\x7f"
)
TITLE = "Refunds\x1b[2J\u202e"
"""A rule title with a screen clear and a right-to-left override."""

SHOWN_AGENT = "pm\\x1b]0;pwned\\x07\\x1b[2J"
# Anything a terminal would act on: C0 but the newline, DEL, C1, bidirectional overrides.
OBEYED = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def hostile(value: Any) -> Any:
    """Replace the plain stand-ins of a recorded value with D6's text."""
    if isinstance(value, str):
        return {"clerk": AGENT, "EXPLAIN": EXPLAIN, "TITLE": TITLE}.get(value, value)
    if isinstance(value, list):
        return [hostile(v) for v in value]
    if isinstance(value, dict):
        return {hostile(k): hostile(v) for k, v in value.items()}
    return value


def rewritten(event: Event) -> Draft:
    """The event as a journal from before the wall could hold it."""
    payload = msgspec.convert(
        hostile(msgspec.to_builtins(event.payload)), type(event.payload), strict=False
    )
    return Draft(
        payload=payload,
        dfid=event.dfid,
        parent_dfid=event.parent_dfid,
        caused_by=event.caused_by,
        agent_id=hostile(event.agent_id),
    )


def explained(ctx: WorkingContext) -> Proposal:
    """A transfer a human must approve, explained with the stand-in for D6's text."""
    policy = Transfer(account="acc-1", amount_cents=100)
    return ctx.propose(policy, explain="EXPLAIN", confidence=0.2, valid_for_s=600)


def strings(document: Any) -> set[str]:
    """Every string in a decoded JSON document, keys included."""
    if isinstance(document, str):
        return {document}
    if isinstance(document, list):
        return set().union(*map(strings, document))
    if isinstance(document, dict):
        return set(document) | set().union(*map(strings, document.values()))
    return set()


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A journal whose agent id, explanation and rule title carry terminal escapes."""
    base = tmp_path_factory.mktemp("d6")
    source, target = base / "plain.db", base / "hostile.db"

    async def make() -> str:
        async with kernel_for(source, inbox_poll_s=None) as kernel:
            await kernel.register(ScriptedAgent(steps=[explained]))
            [dfid] = await kernel.trigger("bank.invoice")
            await kernel.wait_flow(dfid)
            await kernel.propose_rule(
                "refunds",
                title="TITLE",
                content="ask first",
                operator="ana",
                reason="policy",
                override=True,
            )
            events = await kernel.journal.read()
        async with open_journal(target, clock=ManualClock()) as copy:
            for event in events:
                if not is_derived(event):  # its row's copy stands for it again
                    await copy.append([rewritten(event)])
        assert (await verify_journal(target)).ok
        return dfid

    return target, anyio.run(make)


DISPLAYS = [
    ("flows",),
    ("show", "{dfid}"),
    ("review", "{dfid}"),
    ("escalations",),
    ("state",),
    ("agent", AGENT),
    ("rules",),
    ("why", "refunds"),
    ("verify",),
]


@pytest.mark.parametrize("command", DISPLAYS, ids=[c[0] for c in DISPLAYS])
async def test_every_display_command_shows_escapes_never_the_controls(
    journal: tuple[Path, str], command: tuple[str, ...]
) -> None:
    path, dfid = journal
    args = [arg.format(dfid=dfid) for arg in command]
    code, out, err = await dirk(*args, "--db", path)
    assert code == 0, err
    assert out.strip()
    assert not OBEYED.search(out), [line for line in out.splitlines() if OBEYED.search(line)]
    assert not OBEYED.search(err)
    if command[0] in ("flows", "show", "review", "escalations", "agent"):
        assert SHOWN_AGENT in out
    if command[0] in ("show", "review"):
        assert "\\x1b[1A\\x1b[2Kerased \\r overwritten\\x9b31m\\x7f" in out
    if command[0] in ("rules", "why"):
        assert "Refunds\\x1b[2J\\u202e" in out


JSON_READS = [("flows", "--json"), ("show", "{dfid}", "--json"), ("review", "{dfid}", "--json")]


@pytest.mark.parametrize("command", JSON_READS, ids=[c[0] for c in JSON_READS])
async def test_json_output_stays_exact(journal: tuple[Path, str], command: tuple[str, ...]) -> None:
    path, dfid = journal
    code, out, err = await dirk(*[arg.format(dfid=dfid) for arg in command], "--db", path)
    assert code == 0, err
    assert not OBEYED.search(out)
    found = strings([json.loads(line) for line in out.splitlines()])
    assert AGENT in found
    if command[0] != "flows":
        assert EXPLAIN in found


async def test_state_as_json_escapes_c1_and_overrides_and_reads_back_the_same(
    journal: tuple[Path, str],
) -> None:
    path, _ = journal
    for flag in ((), ("--json",)):
        code, out, err = await dirk("state", *flag, "--db", path)
        assert code == 0, err
        assert not OBEYED.search(out)
        assert AGENT in strings(json.loads(out))
