"""The rulebook through MCP and the CLI: search, admin acts, retraction with history kept."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402
from mcp.server.subscriptions import InMemorySubscriptionBus  # noqa: E402
from mcp_types import TextContent, TextResourceContents  # noqa: E402

from kernel import MEMORY_PACK, Kernel, open_kernel  # noqa: E402
from kernel.audit import payload_of  # noqa: E402
from kernel.cli import main  # noqa: E402
from kernel.config import KernelConfig, Ports  # noqa: E402
from kernel.core.events import Event, RuleDecided, RuleRetracted  # noqa: E402
from kernel.mcp import (  # noqa: E402
    Embedded,
    Follower,
    Identity,
    Principal,
    build_server,
    watch_rules,
)
from kernel.state.projections import fold  # noqa: E402
from kernel.testing import ManualClock, SeededIds  # noqa: E402
from tests.support.principals import LOCAL  # noqa: E402

AGENT = Principal(role="agent", name="ide")
OPERATOR = Principal(role="operator", name="rui")
ACCESS = "Before booking for a traveller who needs step-free access, verify the room."


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def kernel(tmp_path: Path) -> AsyncIterator[Kernel]:
    async with memory_kernel(tmp_path / "j.db") as opened:
        yield opened


def client(kernel: Kernel, mode: str, who: Principal) -> Client:
    return Client(build_server(Embedded(kernel), Identity(who)), mode=mode)


async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None
    return dict(result.structured_content)


async def test_operators_administer_rules_and_a_retraction_keeps_history(
    kernel: Kernel, mode: str
) -> None:
    async with client(kernel, mode, OPERATOR) as c:
        made = await call(
            c,
            "admin_create_rule",
            item_id="access",
            title="Accessibility first",
            content=ACCESS,
            reason="ana's correction",
            labels=["booking", "step-free"],
        )
        assert made["verdict"] == "APPLIED" and made["result"]["version"] == 1
        edited = await call(
            c,
            "admin_update_rule",
            item_id="access",
            title="Accessibility first",
            content=ACCESS + " Ask the hotel in writing.",
            reason="in writing",
        )
        assert edited["result"]["version"] == 2
        [found] = (await call(c, "search_rules", q="step-free booking"))["result"]["rules"]
        assert found["cite"] == "[rule:access@v2]"
        compiled = await call(c, "compile_memory", prompt="book a step-free room")
        assert [r["id"] for r in compiled["result"]["rules"]] == ["access"]
        current = await c.read_resource("im://rules/current")
        assert [r["id"] for r in json.loads(text_of(current.contents[0]))] == ["access"]
        prompt = await c.get_prompt("apply_rulebook_prompt", {"task": "book step-free"})
        assert "[rule:access@v2]" in text_of(prompt.messages[0].content)

        gone = await call(c, "admin_delete_rule", item_id="access", reason="the law now says it")
        assert gone["verdict"] == "APPLIED"
        assert (await call(c, "get_rule", item_id="access"))["reason_code"] == "UNKNOWN_RULE"
        again = await call(c, "admin_delete_rule", item_id="access", reason="twice")
        assert again["reason_code"] == "UNKNOWN_RULE"
        assert (await call(c, "search_rules", q="step-free"))["result"]["rules"] == []
        one = await c.read_resource("im://rules/access")
        assert json.loads(text_of(one.contents[0])) is None
        why = (await call(c, "why", item_id="access"))["result"]
        assert [v["version"] for v in why["versions"]] == [1, 2]
        assert [d["decision"] for d in why["decisions"]] == ["override", "override", "retract"]
        assert why["decisions"][-1]["actor"] == "rui"
        # Put back later, it goes on from the last version: versions never repeat.
        back = await call(
            c, "admin_create_rule", item_id="access", title="Back", content=ACCESS, reason="r"
        )
        assert back["result"]["version"] == 3
    [retracted] = await kernel.journal.read(types=["RuleRetracted"])
    assert isinstance(retracted.payload, RuleRetracted)
    assert (retracted.payload.operator, retracted.payload.version) == ("rui", 2)
    # The live rulebook is the one folded from the journal.
    replayed = fold(await kernel.journal.read())
    live = kernel.projections.memory.rulebook
    assert replayed.memory.rulebook.current() == live.current()
    assert [d.decision for d in replayed.memory.rulebook.items["access"].decisions] == [
        "override",
        "override",
        "retract",
        "override",
    ]


async def test_deferred_agent_proposals_wait_for_an_operator(kernel: Kernel, mode: str) -> None:
    async with client(kernel, mode, AGENT) as agent:
        policy = {
            "kind": "memory.propose_rule",
            "rule": "tone",
            "title": "Tone",
            "content": "Be kind.",
        }
        proposed = await call(agent, "propose", policy=policy, explain="a house rule")
        assert proposed["verdict"] == "ACCEPTED"
        assert proposed["result"]["decision"] == "defer"
        refused = await call(agent, "admin_list_proposals")
        assert refused["reason_code"] == "UNAUTHORIZED"
        other = {**policy, "rule": "pace", "title": "Pace", "content": "Answer within a day."}
        await call(agent, "propose", policy=other, explain="another")
    async with client(kernel, mode, OPERATOR) as operator:
        listed = (await call(operator, "admin_list_proposals"))["result"]["proposals"]
        assert [p["rule"] for p in listed] == ["tone", "pace"]
        tone, pace = (p["proposal_seq"] for p in listed)
        approved = await call(operator, "admin_approve_proposal", proposal_seq=tone, reason="ok")
        assert approved["verdict"] == "APPLIED" and approved["result"]["version"] == 1
        skipped = await call(operator, "admin_reject_proposal", proposal_seq=pace, reason="no")
        assert skipped["verdict"] == "APPLIED"
        stale = await call(operator, "admin_reject_proposal", proposal_seq=pace, reason="again")
        assert stale["reason_code"] == "RULE_NOT_PENDING"
        assert (await call(operator, "get_rule", item_id="tone"))["result"]["version"] == 1
        assert (await call(operator, "admin_list_proposals"))["result"]["proposals"] == []


def text_of(content: object) -> str:
    """The text of a resource's contents or a prompt message's content (both text here)."""
    assert isinstance(content, TextResourceContents | TextContent), type(content).__name__
    return content.text


async def applied(kernel: Kernel, count: int) -> list[Event]:
    """Wait until the kernel recorded ``count`` rule acts taken from the inbox; return them."""
    taken: list[Event] = []
    async with kernel.journal.subscribe(1) as batches:
        async for batch in batches:
            taken += [
                e
                for e in batch
                if type(e.payload).__name__ in ("RuleDecided", "RuleRetracted", "InputRefused")
                and getattr(e.payload, "inbox_id", None) is not None
            ]
            if len(taken) >= count:
                return taken
    return taken


async def dirk(argv: list[str]) -> int:
    """Run ``dirk`` as another process would (its own event loop, on a thread)."""
    return await anyio.to_thread.run_sync(main, argv)


def inbox_kernel(db: Path) -> AbstractAsyncContextManager[Kernel]:
    return open_kernel(
        db,
        packs=[MEMORY_PACK],
        adapters={},
        allow=["ide"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(8))),
    )


async def test_dirk_rules_adds_edits_and_retracts_through_the_inbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    async with memory_kernel(db):
        pass
    who = ["--operator", "rui", "--reason", "house rule", "--db", str(db)]
    assert (
        await dirk(["rules", "--add", "access", "--title", "Access", "--content", ACCESS, *who])
        == 0
    )
    async with inbox_kernel(db) as kernel:
        [added] = await applied(kernel, 1)
        assert type(added.payload).__name__ == "RuleDecided"
    assert (
        await dirk(["rules", "--edit", "access", "--title", "Access", "--content", "v2", *who]) == 0
    )
    assert await dirk(["rules", "--add", "access", "--title", "T", "--content", "c", *who]) == 2
    async with inbox_kernel(db) as kernel:
        await applied(kernel, 2)
        current = kernel.projections.memory.rulebook.items["access"].current
        assert current is not None and current.version == 2
    assert await dirk(["rules", "--retract", "access", *who]) == 0
    async with inbox_kernel(db) as kernel:
        *_, retracted = await applied(kernel, 3)
        assert isinstance(retracted.payload, RuleRetracted)
        assert retracted.payload.operator == "rui" and retracted.payload.reason == "house rule"
        assert kernel.projections.memory.rulebook.items["access"].current is None
    assert await dirk(["rules", "--retract", "access", *who]) == 1
    assert await dirk(["why", "access", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "RETRACT by rui, house rule" in out and "no version in force" in out


async def test_a_follower_queues_rule_acts_in_the_inbox(tmp_path: Path, mode: str) -> None:
    db = tmp_path / "j.db"
    async with memory_kernel(db):
        pass
    # No kernel runs: the act waits in the inbox (its answer, not at all), QUEUED.
    server = build_server(Follower(str(db), answer_s=0), Identity(OPERATOR))
    async with Client(server, mode=mode) as c:
        queued = await call(
            c, "admin_create_rule", item_id="access", title="A", content=ACCESS, reason="r"
        )
        assert queued["verdict"] == "QUEUED"
    async with inbox_kernel(db) as kernel:
        [decided] = await applied(kernel, 1)
        assert payload_of(decided, RuleDecided).inbox_id == queued["result"]["inbox_id"]
        assert kernel.projections.memory.rulebook.items["access"].current is not None


async def test_listeners_hear_every_rule_change_whoever_made_it(kernel: Kernel) -> None:
    # subscriptions/listen is the modern protocol's (2026-07-28) change stream.
    bus = InMemorySubscriptionBus()
    server = build_server(Embedded(kernel), Identity(OPERATOR), bus=bus)
    async with anyio.create_task_group() as tg, Client(server) as c:
        tg.start_soon(watch_rules, bus, kernel.journal)
        wanted = ["im://rules/current", "im://rules/x"]
        async with c.listen(resource_subscriptions=wanted) as changes:
            heard: list[str | None] = []

            async def hear(count: int) -> None:
                # The client folds a change into one still unread: read each before the next.
                with anyio.fail_after(30):
                    async for event in changes:
                        heard.append(getattr(event, "uri", None))
                        if len(heard) == count:
                            return

            await call(c, "admin_create_rule", item_id="x", title="t", content="c", reason="r")
            await hear(2)
            # Not through MCP at all: the embedding code's own act is heard too.
            await kernel.retract_rule("x", operator="ana", reason="gone")
            await hear(4)
        tg.cancel_scope.cancel()
    assert heard == wanted * 2
