"""The console's web application: Starlette routes, Jinja2 pages, server-sent events.

Every page is rendered on the server from the follower's projections; htmx
(vendored, served from ``/static``) re-fetches the parts that change when the
``/events`` stream says the journal moved. Every template is autoescaped, so
an agent's explanation (untrusted text) is shown as text, never run. The
Content-Security-Policy allows scripts from this origin only, so even markup
that slipped through could not run inline script.

Every change an operator makes is one inbox request (see kernel.inbox), naming
the operator who signed in and signed with the console's own key (a ``door`` of
the kernel's keyring); the kernel applies it and records who did it, why, and
that the console signed it.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import anyio
import jinja2
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kernel.audit.units import readable
from kernel.console._attempts import attempt_routes
from kernel.console._auth import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    Gate,
    Session,
    Throttled,
    csrf_ok,
)
from kernel.console._decide import Door, Refused, decision_request
from kernel.console._drift import drift_routes
from kernel.console._fields import field_refusal, form_items
from kernel.console._follow import Follower
from kernel.console._manage import (
    agent_row,
    agents_view,
    rule_change,
    rule_row,
    rules_view,
)
from kernel.console._settings import Settings as Settings  # re-exported: its old home
from kernel.console._shadows import shadow_routes
from kernel.console._views import (
    HUMAN_ACTS,
    PAGE,
    Act,
    ActFilter,
    Change,
    FlowFilter,
    acts,
    as_json,
    diff,
    edited_params,
    field_text,
    flows,
    queue,
    review,
)
from kernel.console._web import (
    SecurityHeaders,
    cell,
    checked,
    form_of,
    new_nonce,
    plain,
    same_origin,
    set_cookie,
    span_text,
    trace_link,
    utc,
)
from kernel.core.flow import FlowStatus
from kernel.core.reasons import CliError
from kernel.inbox import InboxRequest
from kernel.journal.opening import open_journal
from kernel.journal.store import Journal
from kernel.state.roadmap.domain import Roadmap
from kernel.state.roadmap.view import roadmap_json
from kernel.state.rulebook import DEFAULT_NS

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
THEME_COOKIE = "dirk_theme"
THEMES = ("light", "dark")
"""The colour schemes an operator may choose; without a choice, the system's preference."""


def create_app(
    settings: Settings, gate: Gate, *, now_ns: Callable[[], int] | None = None
) -> Starlette:
    """Return the console's ASGI application over the journal ``settings.db``.

    Args:
        settings: how it runs.
        gate: who may sign in.
        now_ns: the clock ages and deadlines are measured on. None: the journal's own,
            the time of its last event, so a journal written on a simulated clock shows
            "waiting 46 m" as ``dirk escalations`` does, not the years since; ``dirk serve``
            passes the clock of the kernel it runs, which continues the journal's.
    """
    follower = Follower(settings.db, settings.poll_s)
    clock: Callable[[], int] = now_ns or (lambda: follower.last_ts)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["ago"] = lambda ts: span_text(clock() - ts)
    env.filters["within"] = lambda ts: span_text(ts - clock())
    env.filters["json"] = as_json
    env.filters["utc"] = utc
    env.filters["money"] = lambda text: readable(str(text), settings.currency)
    env.globals["now_ns"] = clock
    env.globals["trace_link"] = lambda dfid, root: trace_link(settings.trace_url, dfid, root)
    holder: dict[str, Journal] = {}
    door = Door(settings.db, settings.key, settings.door, settings.answer_s)

    async def post(request: InboxRequest) -> Refused | None:
        """Post ``request``; return the kernel's refusal if it refused it within answer_s."""
        # Signed and posted now, on this machine's clock, or on the clock of the kernel it
        # runs beside (dirk serve): the one the kernel judges the request's window on.
        # Signed on the machine's clock, as the inbox judges a request's window.
        answer = await door.post(request, time.time_ns())
        await follower.catch_up(holder["journal"])
        if answer is not None and answer.verdict == "REFUSED":
            detail = f"{answer.field}: {answer.detail}" if answer.field else answer.detail
            return Refused(answer.reason_code, detail)  # type: ignore[arg-type]
        return None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_journal(settings.db, readonly=True) as journal:
            holder["journal"] = journal
            try:
                await follower.catch_up(journal)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(follower.run, journal)
                    yield
                    tg.cancel_scope.cancel()
            finally:
                follower.close()

    def page(
        request: Request, name: str, session: Session | None, status: int = 200, **context: Any
    ) -> HTMLResponse:
        theme = request.cookies.get(THEME_COOKIE, "")
        body = env.get_template(name).render(
            session=session,
            version=follower.version,
            named=gate.named,
            path=request.url.path,
            theme=theme if theme in THEMES else "",
            back=quote(request.url.path + (f"?{request.url.query}" if request.url.query else "")),
            **context,
        )
        return HTMLResponse(body, status_code=status)

    def secure(request: Request) -> bool:
        """Whether cookies go only over HTTPS: under TLS, or forwarded as https by a local proxy."""
        return settings.tls or request.url.scheme == "https"

    def signed_in(request: Request) -> Session | None:
        return gate.session(request.cookies.get(SESSION_COOKIE))

    Handler = Callable[[Request, Session], Awaitable[Response]]

    def guarded(
        handler: Handler, *, fragment: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        """Sign-in for every route; a same-origin check and the CSRF token for every POST."""

        async def endpoint(request: Request) -> Response:
            session = signed_in(request)
            if session is None:
                if fragment or request.method != "GET":
                    return Response("sign in first", status_code=401)
                return RedirectResponse("/login", status_code=303)
            if request.method == "POST":
                if not same_origin(request):
                    return Response("cross-origin request refused", status_code=403)
                form = await form_of(request)
                if form is None or not csrf_ok(session, form.get("csrf")):
                    return Response("CSRF token missing or wrong", status_code=403)
                refused = field_refusal([*request.path_params.items(), *form_items(form)])
                if refused is not None:
                    return page(request, "refused.html", session, 400, error=refused)
                request.state.form = form
            return await handler(request, session)

        return endpoint

    # --- signing in -------------------------------------------------------------------

    async def login_page(request: Request) -> Response:
        nonce = new_nonce()
        response = page(
            request,
            "login.html",
            None,
            nonce=nonce,
            token=request.query_params.get("token", "")[:200],
            error="",
            code="",
        )
        set_cookie(response, LOGIN_COOKIE, nonce, path="/login", secure=secure(request))
        return response

    async def login(request: Request) -> Response:
        form = await form_of(request)
        nonce = request.cookies.get(LOGIN_COOKIE, "")
        if form is None or not same_origin(request) or not nonce or form.get("nonce") != nonce:
            return Response("CSRF check failed: load the sign-in page again", status_code=403)
        refused = field_refusal(form_items(form))
        if refused is not None:
            return login_refused(request, 400, refused.message, refused.code)
        name = str(form.get("name", "")).strip()
        secret = str(form.get("secret", ""))
        address = request.client.host if request.client else ""
        try:
            # scrypt takes a good part of a second: off the event loop.
            sid = await anyio.to_thread.run_sync(gate.sign_in, name, secret, address)
        except Throttled as throttled:
            response = login_refused(request, 429, str(throttled), CliError.SIGN_IN_THROTTLED)
            response.headers["retry-after"] = str(math.ceil(throttled.wait_s))
            return response
        if sid is None:
            return login_refused(request, 401, "not signed in: wrong name, password or token")
        home = RedirectResponse("/", status_code=303)
        set_cookie(home, SESSION_COOKIE, sid, secure=secure(request))
        home.delete_cookie(LOGIN_COOKIE, path="/login", secure=secure(request), httponly=True)
        return home

    def login_refused(request: Request, status: int, error: str, code: str = "") -> Response:
        fresh = new_nonce()
        response = page(
            request, "login.html", None, status, nonce=fresh, token="", error=error, code=code
        )
        set_cookie(response, LOGIN_COOKIE, fresh, path="/login", secure=secure(request))
        return response

    async def logout(request: Request, session: Session) -> Response:
        gate.sign_out(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, secure=secure(request), httponly=True)
        return response

    # --- escalations ------------------------------------------------------------------

    def cards() -> Any:
        return queue(follower.projections, follower.queued, settings.approval_ttl_s)

    async def home(request: Request, session: Session) -> Response:
        return page(request, "queue.html", session, cards=cards())

    async def queue_fragment(request: Request, session: Session) -> Response:
        return page(request, "_queue.html", session, cards=cards())

    async def flow_review(
        request: Request,
        session: Session,
        status: int = 200,
        error: Refused | None = None,
        changes: list[Change] | None = None,
    ) -> Response:
        dfid = request.path_params["dfid"]
        events = await holder["journal"].flow_events(dfid)
        seen = review(follower.projections, events)
        if seen is None:
            return page(request, "missing.html", session, 404, what=f"no flow {dfid}")
        template = "_panel.html" if request.url.path.endswith("/panel") else "flow.html"
        return page(
            request,
            template,
            session,
            status,
            r=seen,
            queued=dfid in follower.queued,
            error=error,
            form=getattr(request.state, "form", None) or {},
            fragment=template == "_panel.html",
            ttl_ns=None if settings.approval_ttl_s is None else int(settings.approval_ttl_s * 1e9),
            changes=changes,
            field_text=field_text,
        )

    async def flow_panel(request: Request, session: Session) -> Response:
        return await flow_review(request, session)

    async def decide(request: Request, session: Session) -> Response:
        dfid = request.path_params["dfid"]
        form = plain(request.state.form)
        flow = follower.projections.flows.get(dfid)
        if form.get("decision") == "modify" and flow is not None and flow.proposal is not None:
            proposed = dict(flow.proposal.params)
            if not str(form.get("params", "")).strip():
                # The form's fields, one per parameter: the whole new set, as JSON.
                form["params"] = json.dumps(edited_params(proposed, form), sort_keys=True)
            if form.get("preview"):
                try:
                    edited = json.loads(form["params"])
                except ValueError:
                    edited = {}
                shown = diff(proposed, edited if isinstance(edited, dict) else {})
                return await flow_review(request, session, changes=shown)
        try:
            decision = decision_request(
                follower.projections, follower.queued, dfid, form, session.operator
            )
            checked(decision)
            refused = await post(decision)
        except Refused as refusal:
            return await flow_review(request, session, 409, refusal)
        if refused is not None:
            return await flow_review(request, session, 409, refused)
        return RedirectResponse(f"/flows/{dfid}", status_code=303)

    # --- flows, agents, rules -----------------------------------------------------------

    async def flows_page(request: Request, session: Session) -> Response:
        q = request.query_params
        try:
            since_s = float(q.get("since_h") or 0) * 3600
        except ValueError:
            since_s = 0.0
        where = FlowFilter(
            status=q.get("status", ""),
            agent=q.get("agent", ""),
            kind=q.get("kind", ""),
            reason=q.get("reason", ""),
            since_s=since_s if since_s == since_s and since_s >= 0 else 0.0,
            q=q.get("q", "")[:200],
        )
        number = int(q["page"]) if q.get("page", "").isdigit() and len(q["page"]) < 9 else 1
        projections = follower.projections
        kinds = sorted({f.proposal.kind for f in projections.flows.values() if f.proposal})
        reasons = sorted({str(f.reason_code) for f in projections.flows.values() if f.reason_code})
        found = flows(projections, where, clock())
        pages = max(1, -(-len(found) // PAGE))
        number = min(max(1, number), pages)
        start = (number - 1) * PAGE
        kept = {k: v for k, v in q.items() if k != "page" and v}
        return page(
            request,
            "flows.html",
            session,
            rows=found[start : start + PAGE],
            total=len(found),
            first=start + 1,
            number=number,
            pages=pages,
            query=urlencode(kept),
            where=where,
            since_h=q.get("since_h", ""),
            statuses=[s.value for s in FlowStatus],
            agents=sorted(projections.agents),
            kinds=kinds,
            reasons=reasons,
        )

    async def agents_page(
        request: Request, session: Session, status: int = 200, error: Refused | None = None
    ) -> Response:
        changes = await holder["journal"].read(types=["AgentStatusChanged"])
        return page(
            request,
            "agents.html",
            session,
            status,
            agents=agents_view(follower.projections, changes),
            error=error,
        )

    async def agents_live(request: Request, session: Session) -> Response:
        """The agents page's figures and history, swapped in place (the forms stay as typed)."""
        changes = await holder["journal"].read(types=["AgentStatusChanged"])
        return page(
            request, "_agents_live.html", session, agents=agents_view(follower.projections, changes)
        )

    async def queue_row(
        request: Request,
        session: Session,
        build: Callable[[dict[str, Any]], InboxRequest],
        refused_page: Callable[..., Awaitable[Response]],
        back: str,
    ) -> Response:
        """Post the request ``build`` makes of the form, or show why not."""
        try:
            built = build(plain(request.state.form))
            checked(built)
            refused = await post(built)
        except Refused as refusal:
            return await refused_page(request, session, 409, refusal)
        if refused is not None:
            return await refused_page(request, session, 409, refused)
        return RedirectResponse(back, status_code=303)

    async def agent_status(request: Request, session: Session) -> Response:
        agent_id = request.path_params["agent_id"]
        return await queue_row(
            request,
            session,
            lambda form: agent_row(follower.projections, agent_id, form, session.operator),
            agents_page,
            "/agents",
        )

    def namespace_of(request: Request) -> str:
        # A namespace the wall would refuse shows the default one (a filter, not an input).
        ns = request.query_params.get("ns", "") or DEFAULT_NS
        return ns if len(ns) <= 128 and ns.isprintable() else DEFAULT_NS

    async def rules_page(
        request: Request, session: Session, status: int = 200, error: Refused | None = None
    ) -> Response:
        return page(
            request,
            "rules.html",
            session,
            status,
            view=rules_view(follower.projections, namespace_of(request)),
            error=error,
        )

    async def rule_decide(request: Request, session: Session) -> Response:
        seq = request.path_params["seq"]
        return await queue_row(
            request,
            session,
            lambda form: rule_row(follower.projections, seq, form, session.operator),
            rules_page,
            "/rules",
        )

    async def rule_changed(request: Request, session: Session) -> Response:
        action = request.path_params["action"]
        return await queue_row(
            request,
            session,
            lambda form: rule_change(follower.projections, action, form, session.operator),
            rules_page,
            "/rules",
        )

    async def roadmap_page(request: Request, session: Session) -> Response:
        projections = follower.projections
        state = projections.domain(Roadmap).state
        return page(
            request, "roadmap.html", session, roadmap=roadmap_json(state, projections.last_seq)
        )

    # --- the audit page: every human act -----------------------------------------------

    async def audit_acts(request: Request) -> tuple[ActFilter, list[Any]]:
        q = request.query_params
        where = ActFilter(
            operator=q.get("operator", "")[:256],
            kind=q.get("kind", "")[:64],
            q=q.get("q", "")[:200],
        )
        events = await holder["journal"].read(types=sorted(HUMAN_ACTS))
        return where, acts(events, where)

    async def audit_page(request: Request, session: Session) -> Response:
        where, found = await audit_acts(request)
        everyone = await holder["journal"].read(types=sorted(HUMAN_ACTS))
        operators = sorted({a.operator for a in acts(everyone, ActFilter()) if a.operator})
        kept = {k: v for k, v in request.query_params.items() if v}
        return page(
            request,
            "audit.html",
            session,
            acts=found,
            where=where,
            operators=operators,
            kinds=sorted(set(HUMAN_ACTS.values())),
            query=urlencode(kept),
        )

    async def audit_export(request: Request, session: Session) -> Response:
        _, found = await audit_acts(request)
        rows = [act.row(utc(act.ts)) for act in found]
        if request.url.path.endswith(".json"):
            return Response(
                json.dumps(rows, ensure_ascii=False, indent=1),
                media_type="application/json",
                headers={"content-disposition": 'attachment; filename="dirk-audit.json"'},
            )
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(Act.COLUMNS))
        writer.writeheader()
        for row in rows:
            # A spreadsheet runs a cell that starts with = + - @: quoted as text instead.
            writer.writerow({k: cell(v) for k, v in row.items()})
        return Response(
            out.getvalue(),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": 'attachment; filename="dirk-audit.csv"'},
        )

    async def theme(request: Request) -> Response:
        """Remember the colour scheme chosen (a cookie), and go back to the page."""
        mode = request.query_params.get("mode", "")
        back = request.query_params.get("back", "/")
        if not back.startswith("/") or back.startswith("//") or "\\" in back:
            back = "/"
        response = RedirectResponse(back, status_code=303)
        if mode in THEMES:
            response.set_cookie(
                THEME_COOKIE, mode, samesite="strict", secure=secure(request), max_age=31_536_000
            )
        else:
            response.delete_cookie(THEME_COOKIE, secure=secure(request))
        return response

    # --- live -------------------------------------------------------------------------

    async def events(request: Request, session: Session) -> Response:
        try:
            seen = int(request.query_params.get("v", "0"))
        except ValueError:
            seen = 0

        async def changes() -> AsyncIterator[dict[str, str]]:
            version = seen
            while True:
                version = await follower.wait_changed(version)
                yield {
                    "event": "changed",
                    "id": str(follower.projections.last_seq),
                    "data": str(version),
                }

        return EventSourceResponse(changes(), ping=15)

    def get(path: str, handler: Handler, *, fragment: bool = False) -> Route:
        return Route(path, guarded(handler, fragment=fragment), methods=["GET"])

    def post_(path: str, handler: Handler) -> Route:
        return Route(path, guarded(handler), methods=["POST"])

    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        post_("/logout", logout),
        get("/", home),
        get("/queue", queue_fragment, fragment=True),
        get("/events", events, fragment=True),
        get("/flows", flows_page),
        get("/flows/{dfid}", flow_review),
        get("/flows/{dfid}/panel", flow_panel, fragment=True),
        post_("/flows/{dfid}/decide", decide),
        get("/agents", agents_page),
        get("/agents/live", agents_live, fragment=True),
        post_("/agents/{agent_id}/status", agent_status),
        get("/rules", rules_page),
        get("/audit", audit_page),
        get("/audit.csv", audit_export),
        get("/audit.json", audit_export),
        *attempt_routes(lambda: holder["journal"], page, get),
        *shadow_routes(lambda: holder["journal"], page, get),
        *drift_routes(lambda: holder["journal"], page, get),
        Route("/theme", theme, methods=["GET"]),
        post_("/rules/change/{action}", rule_changed),
        post_("/rules/{seq}", rule_decide),
        get("/roadmap", roadmap_page),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if settings.allowed_hosts is not None:
        middleware.append(
            Middleware(TrustedHostMiddleware, allowed_hosts=list(settings.allowed_hosts))
        )
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
