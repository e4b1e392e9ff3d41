"""The console's shadow packs: ``/audit/shadows``, each candidate's report.

Every shadow the journal records (kernel.state.shadows), and the report of the one
chosen (the last loaded unless ``?shadow=SEQ`` names another), as ``dirk shadow report``
reads it (kernel.audit.shadow): the totals by reason, kind, agent and principal, the
money, each differing verdict with its flow, and the digest a promotion records.
``/audit/shadows.json`` is the same report as one JSON object. The page only reads.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from kernel.audit.shadow import NoShadow, ShadowReport, digest, live_report, shadows_of
from kernel.journal.store import Journal
from kernel.policy.money import format_money

Page = Callable[..., HTMLResponse]
Get = Callable[..., Route]


def _chosen(request: Request) -> int | None:
    """The ``shadow`` seq asked for: None (not asked) is the last loaded; text that is no
    seq names none (-1), so the page shows no report rather than another's."""
    text = request.query_params.get("shadow", "")
    if not text:
        return None
    return int(text) if text.isascii() and text.isdigit() and len(text) < 19 else -1


async def _report(journal: Journal, seq: int | None) -> ShadowReport | None:
    try:
        return await live_report(journal, shadow=seq)
    except NoShadow:
        return None


def shadow_routes(journal: Callable[[], Journal], page: Page, get: Get) -> list[Route]:
    """The routes of the shadow reports, guarded by the console's ``get``."""

    async def shadows_page(request: Request, session: Any) -> Response:
        opened = journal()
        report = await _report(opened, _chosen(request))
        money = (
            [format_money(amount, currency) for currency, amount in report.money.items()]
            if report is not None
            else []
        )
        return page(
            request,
            "shadows.html",
            session,
            shadows=list(reversed(await shadows_of(opened))),
            report=report,
            digest=digest(report) if report is not None else "",
            money=money,
        )

    async def shadows_export(request: Request, session: Any) -> Response:
        report = await _report(journal(), _chosen(request))
        if report is None:
            return Response("no such shadow in the journal", status_code=404)
        body = msgspec.to_builtins(report) | {"differed": report.differed, "digest": digest(report)}
        return Response(json.dumps(body, ensure_ascii=False), media_type="application/json")

    handlers: list[tuple[str, Callable[[Request, Any], Awaitable[Response]]]] = [
        ("/audit/shadows", shadows_page),
        ("/audit/shadows.json", shadows_export),
    ]
    return [get(path, handler) for path, handler in handlers]
