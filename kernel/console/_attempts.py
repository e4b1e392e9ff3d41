"""The console's audit of attempts, one tenant at a time: ``/audit/attempts``.

Every call an agent made for a user of the chosen tenant, allowed or refused at any
layer, as kernel.audit.attempts derives it from the journal: when, who for, which agent
and tier, the kind, the decision, the reason and layer, the delegation chain and the
flow (its trace). A tenant is chosen first (those declared, and those seen on flows);
nothing of another tenant is shown beside it. ``/audit/attempts.jsonl`` exports the same
rows as JSON Lines. The page shows the newest :data:`SHOWN` rows; the export has all.
"""

from __future__ import annotations

import collections
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from kernel.audit.attempts import Attempt, attempts
from kernel.core import events as ev
from kernel.journal.store import Journal

SHOWN = 1000
"""The most rows the page shows (the newest); the export is never cut."""

Page = Callable[..., HTMLResponse]
Get = Callable[..., Route]


def _filters(request: Request) -> tuple[str | None, str | None]:
    """The tenant and user asked for: None when the query names none."""
    q = request.query_params
    tenant = q.get("tenant")
    user = q.get("user") or None
    return (tenant[:256] if tenant is not None else None), (user[:256] if user else None)


async def tenants_of(journal: Journal) -> list[str]:
    """The tenants declared in the journal, in the order first declared."""
    declared = await journal.read(types=["TenantDeclared"])
    names = [e.payload.tenant.id for e in declared if isinstance(e.payload, ev.TenantDeclared)]
    return list(dict.fromkeys(names))


async def newest(journal: Journal, tenant: str, user: str | None) -> tuple[list[Attempt], int]:
    """The newest :data:`SHOWN` attempts of ``tenant`` (newest first), and how many there are."""
    kept: collections.deque[Attempt] = collections.deque(maxlen=SHOWN)
    count = 0
    async for row in attempts(journal, tenant=tenant, user=user):
        kept.append(row)
        count += 1
    return list(reversed(kept)), count


def attempt_routes(journal: Callable[[], Journal], page: Page, get: Get) -> list[Route]:
    """The routes of the attempts audit, guarded by the console's ``get``."""

    async def attempts_page(request: Request, session: Any) -> Response:
        tenant, user = _filters(request)
        opened = journal()
        rows: list[Attempt] = []
        count = 0
        if tenant is not None:
            rows, count = await newest(opened, tenant, user)
        return page(
            request,
            "attempts.html",
            session,
            tenants=await tenants_of(opened),
            tenant=tenant,
            user=user or "",
            rows=rows,
            count=count,
            shown=SHOWN,
        )

    async def attempts_export(request: Request, session: Any) -> Response:
        tenant, user = _filters(request)
        if tenant is None:
            return Response("name a tenant: ?tenant=T", status_code=400)
        opened = journal()

        async def lines() -> AsyncIterator[str]:
            async for row in attempts(opened, tenant=tenant, user=user):
                yield json.dumps(msgspec.to_builtins(row), ensure_ascii=False) + "\n"

        return StreamingResponse(
            lines(),
            media_type="application/jsonl; charset=utf-8",
            headers={"content-disposition": 'attachment; filename="dirk-attempts.jsonl"'},
        )

    handlers: list[tuple[str, Callable[[Request, Any], Awaitable[Response]]]] = [
        ("/audit/attempts", attempts_page),
        ("/audit/attempts.jsonl", attempts_export),
    ]
    return [get(path, handler) for path, handler in handlers]
