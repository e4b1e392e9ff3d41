"""Operator acts through an MCP server following a journal: signed by the server, answered.

The follower signs an operator principal's request with its own key (a ``door`` of the
kernel's keyring) and waits for the kernel to take it: a decision the kernel refuses at
once is answered REFUSED with its code, not QUEUED; one the checks ``dirk decide`` makes
refuse is never posted. The record names the operator and, as the signer, the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.mcp_kernel import require_mcp

require_mcp()

from mcp import Client  # noqa: E402

from kernel import FlowStatus, SystemClock  # noqa: E402
from kernel.core.events import HumanDecided  # noqa: E402
from kernel.journal.inbox_store import open_inbox  # noqa: E402
from kernel.mcp import Follower, Identity, Principal, build_server  # noqa: E402
from kernel.testing import action_of  # noqa: E402
from tests.support.helpers import ScriptedAgent, kernel_for, transfer  # noqa: E402


async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None, result
    return dict(result.structured_content)


def rows(db: Path) -> int:
    with open_inbox(str(db), readonly=True) as store:
        return len(store.rows(pending=False))


async def test_a_decision_the_kernel_refuses_is_answered_refused_not_queued(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with kernel_for(db, clock=SystemClock(), inbox_poll_s=0.05) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(5_000, confidence=0.2)] * 2))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
        action = action_of(kernel, dfid)
        assert action is not None
        follower = Follower(str(db), answer_s=30, poll_s=0.02)

        def server(name: str) -> Client:
            who = Identity(Principal(role="operator", name=name))
            return Client(build_server(follower, who))

        async with server("ana") as c:
            # The checks dirk decide makes: refused here, with the code, never posted.
            other = await call(c, "decide", dfid=dfid, decision="approve", reason="ok",
                               action_hash="0" * 10)  # fmt: skip
            assert (other["verdict"], other["reason_code"]) == ("REFUSED", "ACTION_MISMATCH")
            assert rows(db) == 0
        # The flow's proposer deciding as an operator: only the kernel knows; it refuses at once.
        async with server("clerk") as c:
            own = await call(c, "decide", dfid=dfid, decision="approve", reason="mine",
                             action_hash=action)  # fmt: skip
        assert (own["verdict"], own["reason_code"]) == ("REFUSED", "SELF_APPROVAL_FORBIDDEN")
        assert rows(db) == 1
        async with server("ana") as c:
            done = await call(c, "decide", dfid=dfid, decision="approve", reason="ok",
                              action_hash=action)  # fmt: skip
        assert done["verdict"] == "APPLIED", done
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        [decided] = await kernel.journal.read(types=["HumanDecided"])
        assert isinstance(decided.payload, HumanDecided)
        assert (decided.payload.operator, decided.payload.via, decided.payload.signer) == (
            "ana",
            "inbox",
            "mcp",
        )
