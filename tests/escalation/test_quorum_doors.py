"""Quorums through every door: the CLI, the console and MCP show what an approval waits for
("1 of 2, waiting for a desk-head") and refuse a second vote from the same operator before
posting it; the roles a vote counts come from the kernel's keyring, signed requests only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernel import FlowStatus, Kernel, SystemClock
from kernel.core.events import ApprovalVoted, Event
from kernel.journal.inbox_store import open_inbox
from kernel.policy import Quorum
from kernel.testing import action_of
from tests.support import ROOT
from tests.support.approvals_domain import TWO_ROLES, Send, pack, pay_kernel, sender
from tests.support.operators import Keys, add, with_keys


@pytest.fixture
def role_keys(tmp_path: Path) -> Keys:
    """ana holds risk, cy desk-head, bo no role; the console and MCP doors."""
    root = tmp_path / "keys"
    root.mkdir()
    keys = Keys(keyring=root / "keyring", keys=root / "private")
    keys.keys.mkdir()
    add(keys, "ana", roles=["risk"])
    add(keys, "cy", roles=["desk-head"])
    add(keys, "bo")
    add(keys, "console", "door")
    add(keys, "mcp", "door")
    return keys


def rows(db: Path) -> int:
    with open_inbox(str(db), readonly=True) as store:
        return len(store.rows(pending=False))


async def dirk(keys: Keys, *args: str) -> tuple[int, str, str]:
    """Run ``dirk`` in a subprocess with these keys; its exit status, stdout and stderr."""
    done = await anyio.run_process(
        [sys.executable, "-m", "kernel", *args],
        cwd=ROOT,
        env=with_keys(keys.env()),
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def votes(kernel: Kernel, count: int) -> list[Event]:
    """Wait (on the journal) until ``count`` votes are recorded; return them."""
    found: list[Event] = []
    with anyio.fail_after(30):
        async with kernel.journal.subscribe() as batches:
            async for batch in batches:
                found += [e for e in batch if isinstance(e.payload, ApprovalVoted)]
                if len(found) >= count:
                    return found
    return found


async def test_the_cli_shows_the_quorum_and_refuses_a_second_vote(
    tmp_path: Path, role_keys: Keys
) -> None:
    db = tmp_path / "j.db"
    async with pay_kernel(
        db,
        [pack(quorums=(TWO_ROLES,))],
        clock=SystemClock(),
        keyring=str(role_keys.keyring),
        inbox_poll_s=0.05,
    ) as kernel:
        await kernel.register(sender())
        [dfid] = await kernel.trigger("pay.250000")
        await kernel.wait_flow(dfid)
        short = str(action_of(kernel, dfid))[:10]
        decide = ["decide", dfid, "--approve", "--confirm", short, "--db", str(db)]
        code, out, err = await dirk(
            role_keys, *decide, "--operator", "ana", "--reason", "risk ok", "--wait", "20"
        )
        assert code == 0, err
        assert "1 of 2, waiting for a desk-head" in out
        [voted] = await votes(kernel, 1)
        assert voted.payload.roles == ["risk"]  # type: ignore[union-attr]  # from the keyring

        code, out, _ = await dirk(role_keys, "escalations", "--db", str(db))
        assert "[1 of 2, waiting for a desk-head]" in out
        code, out, _ = await dirk(role_keys, "review", dfid, "--db", str(db))
        assert "quorum: 2 operators holding risk, desk-head: 1 of 2, waiting for a desk-head" in out
        assert "approve by ana (risk)" in out

        posted = rows(db)
        code, _, err = await dirk(role_keys, *decide, "--operator", "ana", "--reason", "again")
        assert code == 1 and "DUPLICATE_VOTE" in err
        code, _, err = await dirk(role_keys, *decide, "--operator", "clerk", "--reason", "mine")
        assert code == 1 and "SELF_APPROVAL_FORBIDDEN" in err
        assert rows(db) == posted  # neither was posted

        # bo holds no role: only the kernel (with its keyring) knows, and refuses on record.
        code, _, err = await dirk(
            role_keys, *decide, "--operator", "bo", "--reason", "me too", "--wait", "20"
        )
        assert code == 1 and "UNAUTHORIZED" in err
        code, out, err = await dirk(
            role_keys, *decide, "--operator", "cy", "--reason", "head ok", "--wait", "20"
        )
        assert code == 0, err
        assert "applied: vote approve by cy: quorum met" in out
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


async def test_mcp_shows_the_quorum_and_refuses_a_second_vote(
    tmp_path: Path, operator_keys: Keys
) -> None:
    from tests.support.mcp_kernel import require_mcp

    require_mcp()
    from mcp import Client

    from kernel.mcp import Follower, Identity, Principal, build_server

    async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
        result = await c.call_tool(tool, args)
        assert result.structured_content is not None, result
        return dict(result.structured_content)

    db = tmp_path / "j.db"
    four_eyes = pack(quorums=(Quorum(required=2, kind=Send),))
    async with pay_kernel(
        db,
        [four_eyes],
        clock=SystemClock(),
        inbox_poll_s=0.05,
    ) as kernel:
        await kernel.register(sender())
        [dfid] = await kernel.trigger("pay.250000")
        await kernel.wait_flow(dfid)
        action = action_of(kernel, dfid)
        follower = Follower(str(db), answer_s=30, poll_s=0.02)

        def server(name: str) -> Client:
            who = Identity(Principal(role="operator", name=name))
            return Client(build_server(follower, who))

        async with server("ana") as c:
            first = await call(c, "decide", dfid=dfid, decision="approve", reason="ok",
                               action_hash=action)  # fmt: skip
            assert first["verdict"] == "APPLIED", first
            assert first["result"]["waiting"] == "1 of 2, waiting for 1 more operator"
            listed = await call(c, "list_escalations")
            [row] = listed["result"]["escalations"]
            assert row["quorum"] == "1 of 2, waiting for 1 more operator"
            reviewed = await call(c, "review", dfid=dfid)
            assert reviewed["result"]["quorum"]["votes"] == [{"operator": "ana", "vote": "approve"}]
            posted = rows(db)
            again = await call(c, "decide", dfid=dfid, decision="approve", reason="again",
                               action_hash=action)  # fmt: skip
            assert (again["verdict"], again["reason_code"]) == ("REFUSED", "DUPLICATE_VOTE")
            assert rows(db) == posted
        async with server("bo") as c:
            done = await call(c, "decide", dfid=dfid, decision="approve", reason="ok",
                              action_hash=action)  # fmt: skip
            assert done["verdict"] == "APPLIED"
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


def test_the_console_shows_the_quorum_and_refuses_a_second_vote(
    tmp_path: Path, operator_keys: Keys
) -> None:
    from tests.support.browser import console_extra

    console_extra()
    import re

    from starlette.testclient import TestClient

    from kernel.console._app import Settings, create_app
    from kernel.console._auth import Gate

    db = tmp_path / "j.db"

    async def build() -> str:
        async with pay_kernel(db, [pack(quorums=(TWO_ROLES,))]) as kernel:
            await kernel.register(sender())
            [dfid] = await kernel.trigger("pay.250000")
            await kernel.wait_flow(dfid)
            await kernel.decide(dfid, "approve", operator="ana", reason="risk ok",
                                action_hash=action_of(kernel, dfid), roles=["risk"])  # fmt: skip
            return str(dfid)

    dfid = anyio.run(build)
    gate = Gate(None)
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        client.get("/login")
        nonce = client.cookies.get("dirk_console_login")
        client.post("/login", data={"nonce": nonce, "name": "ana", "secret": gate.token})
        queue = client.get("/queue").text
        assert "1 of 2, waiting for a desk-head" in queue
        page = client.get(f"/flows/{dfid}").text
        assert 'id="quorum"' in page and "1 of 2, waiting for a desk-head" in page
        assert 'data-vote="approve"' in page
        short = re.search(r'class="hash">([0-9a-f]{10})<', page)
        token = re.search(r'name="csrf" value="([^"]+)"', page)
        assert short is not None and token is not None
        refused = client.post(
            f"/flows/{dfid}/decide",
            data={
                "csrf": token.group(1),
                "decision": "approve",
                "reason": "again",
                "confirm": short.group(1),
            },
        )
        assert 'data-code="DUPLICATE_VOTE"' in refused.text
        assert rows(db) == 0
