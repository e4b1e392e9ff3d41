"""The console's drift monitors: ``/audit/drift``, every breach and what it led to.

Each ``DriftBreached`` the journal records (kernel.state.drift), newest first: the pack
and monitor, whom it is about, the value over its bound with the samples and the
evidence window's seqs, the action the pack named; and every status change of an agent
a breach named, by the monitor (operator ``drift``) and by the operator who restored
it. The page only reads; ``dirk agent NAME --set ACTIVE`` restores an agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from kernel.core.events import AgentStatusChanged, DriftBreached
from kernel.journal.store import Journal

Page = Callable[..., HTMLResponse]
Get = Callable[..., Route]


async def breaches_of(journal: Journal) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The recorded breaches, and the status changes of the agents they named (newest first)."""
    events = await journal.read(types=["DriftBreached", "AgentStatusChanged"])
    breaches: list[dict[str, Any]] = []
    named: set[str] = set()
    for event in events:
        p = event.payload
        if isinstance(p, DriftBreached):
            breaches.append({"seq": event.seq, "breach": p})
            if p.by == "agent":
                named.add(p.subject)
    changes = [
        {"seq": e.seq, "agent": e.agent_id, "change": e.payload}
        for e in events
        if isinstance(e.payload, AgentStatusChanged) and e.agent_id in named
    ]
    return list(reversed(breaches)), list(reversed(changes))


def drift_routes(journal: Callable[[], Journal], page: Page, get: Get) -> list[Route]:
    """The route of the drift page, guarded by the console's ``get``."""

    async def drift_page(request: Request, session: Any) -> Response:
        breaches, changes = await breaches_of(journal())
        return page(request, "drift.html", session, breaches=breaches, changes=changes)

    return [get("/audit/drift", drift_page)]
