"""The operator inbox: human decisions reach a running kernel through its journal's file.

``dirk decide`` (another process, maybe on a day the kernel is down) inserts a
row into ``operator_inbox`` with plain sqlite3; the kernel polls the table on
its clock and turns each new row into a Decide message. The operator needs no
server, and nothing is lost if either side restarts: a row stays until the
kernel has recorded what it made of it, and that record (HumanDecided,
DecisionRefused, LimitAmended, AmendmentRefused, AgentStatusChanged,
RuleDecided or InputRefused naming the row's id) is what makes the row count
exactly once, however often it is read.

A row is untrusted input like any other (anything may write the file): each
is checked at the wall (kernel.core.wall) by its type's fields, and a malformed
row, a row of an unknown type or one its handler cannot apply is refused with
a recorded reason (InputRefused) and never read again. Nothing in a row can
stop the poller or an actor.

A journal on PostgreSQL keeps its inbox in a table beside its events
(:mod:`kernel.journal.inbox_store`): the same rows, and an insert wakes the
poller by NOTIFY instead of waiting for its next round.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

import anyio
import msgspec

from kernel.core.errors import KernelShutdown
from kernel.core.events import Manifest
from kernel.core.ports import Clock
from kernel.core.reasons import CliError, ReasonCode
from kernel.core.wall import (
    AgentSpec,
    DecisionSpec,
    InputInvalid,
    Name,
    Reason,
    admit,
    who_and_why,
)
from kernel.journal.errors import JournalError, redact
from kernel.journal.inbox_store import InboxStore, on_server, open_inbox
from kernel.journal.store import INBOX_SCHEMA
from kernel.policy.contracts import Proposal, WorkingContext
from kernel.registry import CONTRACT_VERSION
from kernel.runtime.actors import Mailbox, MailboxClosed, Reply
from kernel.runtime.messages import AmendLimit, Decide, Decision, EscalationMessage, Tick
from kernel.state.projections import Projections
from kernel.state.rulebook import Rulebook

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 10.0
"""How long either side waits for the other's write lock on the shared file."""


class InboxRow(msgspec.Struct, frozen=True, kw_only=True):
    """One request as an operator wrote it: a decision, an amendment, an agent status, a rule..."""

    id: int
    dfid: str
    request: dict[str, Any]
    """The row's body (stored in the ``decision`` column, its name since the first journals)."""
    created_ts: int
    taken_seq: int | None = None


Connection = sqlite3.Connection | InboxStore
"""An open inbox: the journal file's sqlite3 connection, or a server's :class:`InboxStore`."""


def connect(path: str) -> Connection:
    """Open the journal file for inbox use, creating the inbox table if an old journal lacks it."""
    if on_server(path):
        return open_inbox(path)
    # Used from anyio worker threads, one call at a time (the poller holds a limiter of 1).
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.executescript(INBOX_SCHEMA)
    return conn


def queued_dfids(path: str) -> set[str]:
    """Return the DFIDs with a decision the kernel has not taken yet (reads only)."""
    if on_server(path):
        with open_inbox(path) as store:
            return {dfid for (_, dfid, *_) in store.rows(pending=True)}
    uri = Path(path).absolute().as_uri() + "?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)) as conn:
        try:
            rows = conn.execute("SELECT dfid FROM operator_inbox WHERE taken_seq IS NULL")
        except sqlite3.OperationalError:
            return set()  # a journal no kernel of this version opened yet: no inbox
        return {dfid for (dfid,) in rows}


def post(path: str, dfid: str, decision: Mapping[str, Any], now_ns: int) -> int:
    """Write one decision into the inbox of the journal at ``path``; return its row id."""
    text = json.dumps(dict(decision), sort_keys=True)
    if on_server(path):
        with open_inbox(path) as store:
            return store.insert(dfid, text, now_ns)
    with closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)) as conn:
        conn.executescript(INBOX_SCHEMA)
        cursor = conn.execute(
            "INSERT INTO operator_inbox (dfid, decision, created_ts) VALUES (?, ?, ?)",
            (dfid, text, now_ns),
        )
        return int(cursor.lastrowid or 0)


def taken_seq(path: str, row_id: int) -> int | None:
    """Return the seq of the event that took inbox row ``row_id`` (None: not taken yet)."""
    if on_server(path):
        with open_inbox(path) as store:
            return store.taken_seq(row_id)
    with closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)) as conn:
        ((seq,),) = conn.execute(
            "SELECT taken_seq FROM operator_inbox WHERE id = ?", (row_id,)
        ).fetchall()
        return None if seq is None else int(seq)


def read_rows(conn: Connection, *, pending: bool = True) -> list[InboxRow]:
    """Return the inbox rows (only those not yet taken, when ``pending``), oldest first."""
    if isinstance(conn, sqlite3.Connection):
        sql = "SELECT id, dfid, decision, created_ts, taken_seq FROM operator_inbox"
        if pending:
            sql += " WHERE taken_seq IS NULL"
        found: Any = conn.execute(sql + " ORDER BY id")
    else:
        found = conn.rows(pending)
    rows = []
    for id_, dfid, decision, created_ts, taken in found:
        try:
            body = json.loads(decision)
        except (TypeError, ValueError, RecursionError):
            body = None  # refused when applied, like any malformed row
        rows.append(
            InboxRow(
                id=id_,
                dfid=dfid if isinstance(dfid, str) else "",
                request=body if isinstance(body, dict) else {UNREADABLE: True},
                created_ts=created_ts if isinstance(created_ts, int) else 0,
                taken_seq=taken,
            )
        )
    return rows


def mark_taken(conn: Connection, row_id: int, seq: int) -> None:
    """Record on the row that the event at ``seq`` took it (-1: unreadable, never applied)."""
    if isinstance(conn, sqlite3.Connection):
        conn.execute("UPDATE operator_inbox SET taken_seq = ? WHERE id = ?", (seq, row_id))
    else:
        conn.mark_taken(row_id, seq)


AMEND = "amend"
"""The ``type`` of an inbox row that amends a limit (``dirk amend``) rather than decides a flow."""
AGENT_STATUS = "agent_status"
"""The ``type`` of a row that changes an agent's status (``dirk agent``)."""
RULE = "rule"
"""The ``type`` of a row that overrides or skips a deferred rule proposal (``dirk rules``)."""
RULE_CHANGE = "rule_change"
"""The ``type`` of a row that adds, edits or retracts a rule (``dirk rules --add`` ...)."""
CREDENTIAL = "credential"
"""The ``type`` of a row that provisions an agent's credential (``dirk agent --issue-credential``).

It carries only the credential's verifier, never the secret (kernel.registry).
"""
DECIDE = "decide"
"""The ``type`` of a decision on an escalated flow (rows without a type are decisions too)."""
UNREADABLE = "$unreadable"
"""The body :func:`read_rows` gives a row whose text is not a JSON object."""


def row_type(row: InboxRow) -> str:
    """What a row asks for: DECIDE, AMEND, AGENT_STATUS or RULE (or something unknown)."""
    kind = row.request.get("type") or DECIDE
    return kind if isinstance(kind, str) else repr(kind)


def row_fields(row: InboxRow, allowed: frozenset[str]) -> dict[str, Any]:
    """Return a row's fields (without its ``type``), refusing one it may not carry.

    Raises:
        InputInvalid: the row is not a JSON object, or carries an unknown field.
    """
    body = {key: value for key, value in row.request.items() if key != "type"}
    if UNREADABLE in body:
        raise InputInvalid("$", "the row is not a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InputInvalid(unknown[0][:64], "a field this type of row does not have")
    return body


DECIDE_FIELDS = frozenset({"decision", "operator", "reason", "params", "action_hash"})
AMEND_FIELDS = frozenset({"agent_id", "limit", "value", "ttl_s", "operator", "reason"})
AGENT_STATUS_FIELDS = frozenset({"agent_id", "status", "operator", "reason"})
RULE_FIELDS = frozenset({"proposal_seq", "decision", "operator", "reason"})
RULE_CHANGE_FIELDS = frozenset(
    {"action", "rule", "title", "content", "labels", "base_version", "operator", "reason"}
)
PROPOSE = "propose"
"""The ``type`` of a row that carries an agent's proposal (``dirk mcp`` following this journal)."""
PROPOSE_FIELDS = frozenset({"agent_id", "policy", "explain", "confidence"})
PROPOSE_TOPIC = "inbox"
"""Flows of proposals from the inbox open on ``inbox.<agent>.<row id>``."""
RULE_ACTIONS = ("add", "edit", "retract")
"""What a RULE_CHANGE row does: add and edit put a version in force (an operator's
override, recorded with who and why); retract takes the rule out of force."""


CREDENTIAL_FIELDS = frozenset({"agent_id", "verifier", "operator", "reason"})


class CredentialFields(msgspec.Struct, frozen=True, kw_only=True):
    """A credential to provision: the agent, the verifier (``sha256:<hex>``), who and why."""

    agent_id: Name
    verifier: Annotated[str, msgspec.Meta(max_length=80)]
    operator: Name
    reason: Reason


def check_credential(fields: Mapping[str, Any]) -> CredentialFields:
    """Admit a credential's fields at the wall.

    Raises:
        InputInvalid: a field missing, of the wrong type or too long.
    """
    return admit(dict(fields), CredentialFields)


def to_credential(row: InboxRow) -> CredentialFields:
    """Turn a credential row into its checked fields.

    Raises:
        InputInvalid: the row carries a field a credential row does not have, or a bad one.
    """
    return check_credential(row_fields(row, CREDENTIAL_FIELDS))


def to_amend(row: InboxRow, reply: Reply[Any]) -> AmendLimit:
    """Turn an amendment row into the message the DIM handles (kernel.state.amendments checks it).

    Raises:
        InputInvalid: the row carries a field an amendment does not have, or no agent id.
    """
    body = row_fields(row, AMEND_FIELDS)
    # The agent names the event's envelope: checked here, the rest by kernel.state.amendments.
    agent = admit({"agent_id": body.get("agent_id")}, AgentSpec)
    return AmendLimit(
        agent_id=agent.agent_id,
        limit=body.get("limit", ""),
        value=body.get("value"),
        ttl_s=body.get("ttl_s"),
        operator=body.get("operator", ""),
        reason=body.get("reason", ""),
        inbox_id=row.id,
        reply=reply,
    )


def to_decide(row: InboxRow, reply: Reply[Any]) -> Decide:
    """Turn an inbox row into the message the escalation desk handles.

    Raises:
        InputInvalid: when the row is not a well-formed decision (kernel.core.wall).
    """
    body = row_fields(row, DECIDE_FIELDS)
    checked = admit({"dfid": row.dfid, **body}, DecisionSpec)
    try:
        decision = Decision(checked.decision)
    except ValueError:
        raise InputInvalid("decision", "a decision is approve, reject or modify") from None
    return Decide(
        dfid=checked.dfid,
        decision=decision,
        operator=checked.operator,
        reason=checked.reason,
        params=checked.params,
        action_hash=checked.action_hash or None,
        inbox_id=row.id,
        reply=reply,
    )


class InboxAgent:
    """A hosted agent whose proposals arrive as inbox rows: it proposes what its row brings."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.calls: dict[str, tuple[dict[str, Any], Any, Any]] = {}

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        call = self.calls.pop(ctx.topic, None)
        if call is None:
            return None  # its row was applied by an earlier run: declined, on record
        policy, explain, confidence = call
        return ctx.propose(policy, explain=explain, confidence=confidence, valid_for_s=600)


class InboxAgents:
    """Agents in another process whose proposals reach the kernel through the inbox.

    ``dirk mcp`` following a journal writes a PROPOSE row per agent write. The
    kernel hosts an :class:`InboxAgent` for that agent (it must be allowed; it may
    propose every kind the packs define), opens one flow per row on the topic
    ``inbox.<agent>.<row id>``, and the agent proposes the row's policy in it, so
    the DIM judges it like any other. The flow's events are the answer the
    other process reads back. A row whose flow an earlier run already opened is
    not proposed again.

    Args:
        register: hosts an agent (``Kernel.register``).
        trigger: opens the flows of a topic (``Kernel.trigger``).
        kinds: the kinds the packs define.
        projections: the kernel's projections (the flows already opened).
    """

    def __init__(
        self,
        register: Callable[[InboxAgent], Awaitable[object]],
        trigger: Callable[[str], Awaitable[list[str]]],
        kinds: Callable[[], Iterable[str]],
        projections: Projections,
    ) -> None:
        self._register = register
        self._trigger = trigger
        self._kinds = kinds
        self._projections = projections
        self._agents: dict[str, InboxAgent] = {}

    async def propose(self, row: InboxRow) -> None:
        """Apply a PROPOSE row: open its flow, in which its agent proposes its policy.

        Raises:
            InputInvalid: a malformed row, or an agent that is not active (no flow opened).
            HandshakeRefused: the kernel does not allow the agent.
        """
        body = row_fields(row, PROPOSE_FIELDS)
        agent_id = admit({"agent_id": body.get("agent_id")}, AgentSpec).agent_id
        policy = body.get("policy")
        if not isinstance(policy, dict):
            raise InputInvalid("policy", 'an object with a "kind"')
        topic = f"{PROPOSE_TOPIC}.{agent_id}.{row.id}"
        if any(flow.topic == topic for flow in self._projections.flows.values()):
            return
        agent = self._agents.get(agent_id)
        if agent is None:
            major, minor = CONTRACT_VERSION
            agent = InboxAgent(
                Manifest(
                    agent_id=agent_id,
                    version=f"{major}.{minor}.0",
                    capabilities=sorted(self._kinds()),
                    subscriptions=[f"{PROPOSE_TOPIC}.{agent_id}"],
                    max_attempts=1,
                )
            )
            await self._register(agent)
            self._agents[agent_id] = agent
        agent.calls[topic] = (policy, body.get("explain", ""), body.get("confidence", 1.0))
        if not await self._trigger(topic):
            agent.calls.pop(topic, None)
            raise InputInvalid("agent_id", f"agent {agent_id} is not ACTIVE: no flow was opened")


Handler = Callable[[InboxRow], Awaitable[None]]
"""Applies one row of its type; the event it records names the row's id."""
Refuse = Callable[[InboxRow, Exception], Awaitable[int]]
"""Records why a row was refused (InputRefused naming its id); returns the event's seq."""


async def poll(
    path: str,
    clock: Clock,
    interval_s: float,
    escalation: Mailbox[EscalationMessage],
    projections: Projections,
    handlers: Mapping[str, Handler],
    refuse: Refuse,
) -> None:
    """Tick the escalation desk and apply new inbox rows, every ``interval_s`` on ``clock``.

    ``handlers`` apply the rows of each type (see :func:`row_type`); ``refuse``
    records a row that none can apply.

    A failed round (the file busy beyond the timeout, say) is logged and tried
    again on the next one: the rows wait in the table meanwhile.
    """
    limiter = anyio.CapacityLimiter(1)
    waits = anyio.CapacityLimiter(1)  # the waits for a NOTIFY, on a connection of their own
    conn = await anyio.to_thread.run_sync(connect, path, limiter=limiter)
    try:
        if not isinstance(conn, sqlite3.Connection):
            # Listening before the first read: a row inserted after it is read or announced.
            await anyio.to_thread.run_sync(conn.wait, 0.0, limiter=waits)
        while True:
            await escalation.send(Tick())
            try:
                rows = await anyio.to_thread.run_sync(read_rows, conn, limiter=limiter)
                for row in rows:
                    seq = await _apply(row, projections, handlers, refuse)
                    await anyio.to_thread.run_sync(mark_taken, conn, row.id, seq, limiter=limiter)
            except (sqlite3.Error, JournalError) as exc:
                log.warning("operator inbox of %s: %r; trying again", redact(path), exc)
            await _pause(conn, clock, interval_s, waits)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(conn.close, limiter=limiter)


async def _pause(
    conn: Connection, clock: Clock, interval_s: float, limiter: anyio.CapacityLimiter
) -> None:
    """Wait ``interval_s`` on the clock; on a server, also stop early when a row is announced."""
    if isinstance(conn, sqlite3.Connection):
        await clock.sleep(interval_s)
        return
    store, store_path = conn, getattr(conn, "location", "-")
    async with anyio.create_task_group() as tg:

        async def tick() -> None:
            await clock.sleep(interval_s)
            tg.cancel_scope.cancel()

        async def announced() -> None:
            # Short waits, so a wait abandoned when the clock wins ends soon after.
            try:
                while not await anyio.to_thread.run_sync(
                    store.wait, 0.5, abandon_on_cancel=True, limiter=limiter
                ):
                    pass
            except JournalError as exc:
                log.warning("operator inbox of %s: %r; polling only", redact(store_path), exc)
                return  # the clock's round still comes
            tg.cancel_scope.cancel()

        tg.start_soon(tick)
        tg.start_soon(announced)


async def _apply(
    row: InboxRow, projections: Projections, handlers: Mapping[str, Handler], refuse: Refuse
) -> int:
    """Apply one row through the handler of its type; return the seq of the event that took it.

    A row no handler can apply is refused and the refusal recorded, so its seq is
    that of the InputRefused event; -1 remains only for a row that was applied but
    recorded nothing.
    """
    taken = projections.inbox_taken.get(row.id)
    if taken is not None:
        return taken  # taken before a restart, and not marked yet: never applied twice
    handler = handlers.get(row_type(row))
    try:
        if handler is None:
            raise InputInvalid("type", f"no such type of row: {row_type(row)[:64]!r}")
        await handler(row)
    except (KernelShutdown, MailboxClosed):
        raise
    except Exception as exc:
        # Whatever the row holds, it is refused with a reason on record, never retried.
        log.warning("operator inbox row %d refused: %s", row.id, exc)
        if row.id not in projections.inbox_taken:
            return await refuse(row, exc)
    return projections.inbox_taken.get(row.id, -1)


class RuleChangeRefused(Exception):
    """A rule change no inbox row may carry: ``code`` (a closed reason) and a one-line message."""

    def __init__(self, code: ReasonCode | CliError, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def rule_change_row(
    book: Rulebook,
    rule: str,
    action: str,
    *,
    operator: str,
    reason: str,
    title: str = "",
    content: str = "",
    labels: Iterable[str] = (),
) -> dict[str, Any]:
    """Return the RULE_CHANGE row that adds, edits or retracts ``rule`` in ``book``.

    The one builder of such rows, for ``dirk rules`` and the console alike.

    Raises:
        RuleChangeRefused: no operator or reason, an unknown action, a retract or edit of
            a rule not in force, an add of one in force, or an add/edit without title and text.
    """
    problem = who_and_why(operator, reason)
    if problem is not None:
        raise RuleChangeRefused(ReasonCode.SCHEMA_INVALID, problem)
    if action not in RULE_ACTIONS:
        raise RuleChangeRefused(CliError.BAD_ARGUMENT, f"no such rule action: {action[:32]!r}")
    item = book.items.get(rule)
    in_force = item is not None and item.current is not None
    body: dict[str, Any] = {
        "type": RULE_CHANGE,
        "rule": rule,
        "operator": operator,
        "reason": reason,
        "action": action,
    }
    if action in ("retract", "edit") and not in_force:
        raise RuleChangeRefused(CliError.UNKNOWN_RULE, f"no rule {rule[:64]!r} in force")
    if action == "retract":
        return body
    if not title or not content:
        raise RuleChangeRefused(CliError.BAD_ARGUMENT, "an add or edit takes a title and a text")
    if action == "add" and in_force:
        raise RuleChangeRefused(CliError.BAD_ARGUMENT, f"rule {rule[:64]!r} exists: edit it")
    body.update(
        title=title,
        content=content,
        labels=list(labels),
        base_version=item.latest if item is not None else 0,
    )
    return body
