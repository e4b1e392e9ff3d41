"""The operator's side of ``dirk``: a decision on an escalation, an amendment, and their helpers.

``escalations`` and ``review`` only read the journal (kernel.cli._escalations).
``decide`` writes one signed request into the journal's operator inbox
(kernel.inbox), which the running kernel (another process, possibly not running
right now) polls and applies exactly once.
The request is signed with the operator's own key (``--key`` or ``DIRK_KEY``, made by
``dirk operator add``), and checked here as the kernel will check it
(kernel.inbox.prepare): what the kernel would refuse at once is refused here, with its
code, and never queued. An approval of a HIGH_IMPACT action takes the action's short
hash typed back (``--confirm``): no one-key approvals.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from kernel.cli._read import (
    FlowNotFound,
    resolve_flow,
    say,
)
from kernel.core import events as ev
from kernel.core.events import Event
from kernel.core.flow import FlowState
from kernel.core.keys import KeyUnusable
from kernel.core.reasons import CliError, ExitCode, ReasonCode
from kernel.core.wall import MAX_TTL_S, visible
from kernel.inbox import InboxRequest, RequestRefused, Signer, open_signer
from kernel.inbox.client import keyring_problem, queued_dfids, read_answer, taken_seq
from kernel.inbox.keyring import ENV as KEYRING_ENV
from kernel.inbox.prepare import amendment, prepare_decision
from kernel.journal.opening import open_journal
from kernel.journal.store import JournalError
from kernel.policy.quorums import waiting
from kernel.policy.rules import decimal_of
from kernel.state.projections import Projections, fold
from kernel.state.quorums import Ballot, Quorums

if TYPE_CHECKING:
    from kernel.audit.reverify import PackPathError

# How often ``decide --wait`` looks whether the kernel took the decision.
_WAIT_POLL_S = 0.05


def add_commands(commands: Any) -> None:
    """Add ``decide`` and ``amend`` to the ``dirk`` parser's subcommands.

    ``escalations`` and ``review``, which only read, are kernel.cli._escalations's.
    """
    decide = commands.add_parser("decide", help="decide on an escalated flow (via the inbox)")
    decide.add_argument(
        "dfid",
        metavar="FLOW",
        help="the escalated flow: its DFID, or a unique prefix (as dirk escalations shows it)",
    )
    choice = decide.add_mutually_exclusive_group(required=True)
    choice.add_argument("--approve", action="store_true", help="execute the action as shown")
    choice.add_argument("--reject", action="store_true", help="abort the flow")
    choice.add_argument(
        "--modify", metavar="JSON", help="new parameters; the DIM judges them again"
    )
    choice.add_argument(
        "--reconcile",
        metavar="done:EXTERNAL_ID|not-done",
        help="outcome unknown: record what the external system shows",
    )
    choice.add_argument(
        "--retry", action="store_true", help="outcome unknown: call again with the same key"
    )
    decide.add_argument("--operator", required=True, help="who decides (recorded)")
    decide.add_argument("--reason", required=True, help="why (recorded)")
    decide.add_argument(
        "--confirm",
        metavar="HASH",
        help="the action's short hash (required to approve HIGH_IMPACT)",
    )
    decide.add_argument(
        "--wait",
        type=wait_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the kernel to apply the decision and report the outcome",
    )
    add_key_argument(decide)
    decide.add_argument("--db", required=True, help="the journal file")
    decide.set_defaults(run=_decide)

    amend = commands.add_parser(
        "amend", help="amend one agent's limit within its pack's bounds (via the inbox)"
    )
    amend.add_argument("--agent", required=True, help="the agent whose limit changes")
    amend.add_argument("--limit", required=True, help="an amendable limit of a loaded pack")
    amend.add_argument("--value", required=True, help="an integer or a decimal string")
    amend.add_argument("--ttl", required=True, type=float, metavar="SECONDS", help="how long")
    add_key_argument(amend)
    amend.add_argument("--operator", required=True, help="who amends (recorded)")
    amend.add_argument("--reason", required=True, help="why (recorded)")
    amend.add_argument(
        "--wait",
        type=wait_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the kernel to apply the amendment and report the outcome",
    )
    amend.add_argument("--db", required=True, help="the journal file")
    amend.set_defaults(run=_amend)


def wait_seconds(text: str) -> float:
    """``--wait SECONDS``: a finite number of seconds, zero or more (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:32]!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_TTL_S):
        raise argparse.ArgumentTypeError(f"seconds from 0 up to {MAX_TTL_S}, not {text[:32]!r}")
    return value


def add_key_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--key``: the private key that signs the command's inbox request."""
    parser.add_argument(
        "--key",
        metavar="PATH",
        help="the operator's private key file, or a directory of NAME.key files"
        " (default: $DIRK_KEY; made by dirk operator add NAME)",
    )


def add_act_arguments(parser: argparse.ArgumentParser) -> None:
    """Add what every signed operator act takes: ``--operator``, ``--reason``, ``--wait``,
    ``--key`` and ``--db``."""
    parser.add_argument("--operator", required=True, help="who acts (recorded)")
    parser.add_argument("--reason", required=True, help="why (recorded)")
    parser.add_argument(
        "--wait",
        type=wait_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the kernel to apply it and report the outcome",
    )
    add_key_argument(parser)
    parser.add_argument("--db", required=True, help="the journal file")


async def post_request(args: argparse.Namespace, request: InboxRequest, what: str) -> int:
    """Sign ``request`` with ``args.operator``'s key, post it, say so; wait if ``--wait``."""
    try:
        signer = await open_signer(args.db, args.key, args.operator)
    except KeyUnusable as exc:
        return error(ReasonCode.SIGNATURE_INVALID, str(exc), ExitCode.USAGE)
    return await post_signed(args, signer, request, what)


async def post_signed(
    args: argparse.Namespace, signer: Signer, request: InboxRequest, what: str
) -> int:
    """Post ``request`` signed by ``signer``; print ``what`` was queued; wait if ``--wait``."""
    problem = keyring_problem(signer, None) or await _revoked(args.db, signer)
    if problem is not None:
        return error(ReasonCode.SIGNATURE_INVALID, problem)
    if not os.environ.get(KEYRING_ENV):
        say(
            f"note: ${KEYRING_ENV} is not set, so whether the kernel trusts {signer.name}'s key"
            " is not known here (dirk serve without a keyring trusts only its console's)",
            file=sys.stderr,
        )
    try:
        row_id = signer.post(request, time.time_ns())
    except ValueError as exc:  # InputInvalid: the request as the kernel's wall sees it
        return error(ReasonCode.SCHEMA_INVALID, str(exc), ExitCode.USAGE)
    say(f"{what} queued as inbox row {row_id}")
    if args.wait <= 0:
        return ExitCode.OK
    return await wait_taken(args.db, row_id, args.wait)


async def _revoked(db: str, signer: Signer) -> str | None:
    """Why the journal's kernel will never again trust ``signer``'s key, or None."""
    async with open_journal(db, readonly=True) as journal:
        found = await journal.read(types=["OperatorKeyRevoked"])
    for event in found:
        payload = event.payload
        if isinstance(payload, ev.OperatorKeyRevoked) and payload.key == signer.public:
            return f"{signer.name}'s key was revoked at #{event.seq}: this journal never trusts it"
    return None


def refused(exc: RequestRefused) -> int:
    """Print a request refused before posting; USAGE for a malformed one, else FAILED."""
    usage = exc.malformed or exc.code is CliError.BAD_ARGUMENT
    return error(exc.code, exc.message, ExitCode.USAGE if usage else ExitCode.FAILED)


def error(code: ReasonCode | CliError, message: str, status: ExitCode = ExitCode.FAILED) -> int:
    """Print ``error: CODE: message`` on stderr; return ``status`` (by default FAILED)."""
    print(f"error: {code}: {visible(message)}", file=sys.stderr)
    return status


def counted(n: int, word: str, plural: str = "") -> str:
    """``n`` and ``word`` in the number ``n`` takes: "1 flow", "2 flows", "0 keys"."""
    return f"{n} {word if n == 1 else plural or word + 's'}"


def error_of(exc: JournalError | PackPathError, status: ExitCode) -> int:
    """Print ``error: CODE: ...`` for an error that carries its code (a ``CliError`` value)."""
    print(one_line(f"error: {exc.code}: {exc}"), file=sys.stderr)
    return status


def one_line(text: str) -> str:
    """Return ``text`` with control characters escaped: what a damaged file says stays one line."""
    return visible(text)


def describe_action(flow: FlowState) -> str:
    """Return the proposed action in plain words."""
    if flow.proposal is None:
        return "(nothing proposed)"
    params = ", ".join(f"{k}={v}" for k, v in sorted(flow.proposal.params.items()))
    return f"{flow.proposal.kind}({params})"


async def fold_journal(db: str) -> Projections:
    return (await fold_journal_now(db))[0]


async def fold_journal_now(db: str) -> tuple[Projections, int]:
    """Fold the journal; return the projections and its "now": its last event's time.

    Ages are measured on the journal's clock, so a simulated run's read the same
    however long ago (on the wall's clock) it ran.
    """
    projections = Projections()
    now = 0
    async with open_journal(db, readonly=True) as journal:
        async for batch in journal.scan():
            projections.apply(batch)
            now = max(now, batch[-1].ts) if batch else now
    return projections, now


def quorum_text(ballot: Ballot | None) -> str:
    """What a flow's quorum waits for ("1 of 2, waiting for a desk-head"); "" without one."""
    if ballot is None or (ballot.quorum.required < 2 and not ballot.quorum.roles):
        return ""
    return ballot.waiting or waiting(ballot.quorum, [])


def manifest_of(agents: list[Event], agent_id: str) -> ev.Manifest | None:
    """The manifest ``agent_id`` last registered with, among the ``AgentRegistered`` events."""
    for event in reversed(agents):
        payload = event.payload
        if isinstance(payload, ev.AgentRegistered) and payload.manifest.agent_id == agent_id:
            return payload.manifest
    return None


async def _decide(args: argparse.Namespace) -> int:
    # One flow's events, not the whole journal: what the decision is checked against.
    async with open_journal(args.db, readonly=True) as journal:
        try:
            # A prefix is resolved here, and the request names the whole DFID.
            args.dfid = await resolve_flow(journal, args.dfid)
        except FlowNotFound as exc:
            unknown = exc.code is CliError.UNKNOWN_FLOW
            return error(exc.code, f"{exc.message} in {args.db}" if unknown else exc.message)
        folded = fold(await journal.flow_events(args.dfid))
    flow = folded.flows.get(args.dfid)
    chosen = _choice(args)
    if isinstance(chosen, int):
        return chosen
    choice, outcome, external_id = chosen
    try:
        request = prepare_decision(
            flow,
            folded.approvals.get(args.dfid),
            dfid=args.dfid,
            choice=choice,
            operator=args.operator,
            reason=args.reason,
            confirm=args.confirm or "",
            params=args.modify,
            outcome=outcome,
            external_id=external_id,
            queued=flow is not None and args.dfid in queued_dfids(args.db),
            ballot=folded.domain(Quorums).ballots.get(args.dfid),
        )
    except RequestRefused as exc:
        return _decision_refused(exc, args)
    return await post_request(args, request, f"decision {request.decision}")


def _choice(args: argparse.Namespace) -> tuple[str, str, str] | int:
    """The decision the flags choose: (choice, outcome, external id), or the exit code."""
    if args.retry:
        return "retry", "", ""
    if args.reconcile is not None:
        if args.reconcile == "not-done":
            return "reconcile", "not_done", ""
        if args.reconcile.startswith("done:") and args.reconcile[5:].strip():
            return "reconcile", "done", args.reconcile[5:].strip()
        return error(
            ReasonCode.SCHEMA_INVALID,
            "--reconcile takes done:EXTERNAL_ID or not-done",
            ExitCode.USAGE,
        )
    if args.approve or args.reject:
        return ("approve" if args.approve else "reject"), "", ""
    return "modify", "", ""


def _decision_refused(exc: RequestRefused, args: argparse.Namespace) -> int:
    """Say why a decision was refused before it was written, in the terms of the flags."""
    if exc.code is CliError.UNKNOWN_FLOW:
        return error(exc.code, f"no flow {args.dfid} in {args.db}")
    if exc.code is CliError.CONFIRMATION_REQUIRED:
        return error(exc.code, f"{exc.message}: --confirm HASH (see dirk review {args.dfid})")
    return refused(exc)


async def _amend(args: argparse.Namespace) -> int:
    if decimal_of(args.value) is None:
        return error(
            ReasonCode.SCHEMA_INVALID,
            f"--value {args.value!r} is not an integer or a decimal",
            ExitCode.USAGE,
        )
    if not (math.isfinite(args.ttl) and 0 < args.ttl <= MAX_TTL_S):
        return error(
            ReasonCode.SCHEMA_INVALID,
            f"--ttl must be positive seconds up to {MAX_TTL_S}, not {args.ttl}",
            ExitCode.USAGE,
        )
    try:
        request = amendment(
            args.agent,
            args.limit,
            args.value,
            args.ttl,
            operator=args.operator,
            reason=args.reason,
        )
    except RequestRefused as exc:
        return refused(exc)
    async with open_journal(args.db, readonly=True) as journal:
        agents = await journal.read(types=["AgentRegistered"])
    if manifest_of(agents, args.agent) is None:
        return error(
            ReasonCode.UNKNOWN_AGENT, f"no agent {args.agent!r} ever registered in {args.db}"
        )
    return await post_request(args, request, f"amendment of {args.limit} for {args.agent}")


async def wait_taken(db: str, row_id: int, timeout_s: float) -> int:
    """Wait for the kernel to take inbox row ``row_id``; print what it made of it."""
    seq = None
    with anyio.move_on_after(timeout_s):
        while seq is None:
            seq = taken_seq(db, row_id)
            if seq is None:
                await anyio.sleep(_WAIT_POLL_S)
    if seq is None:
        return error(
            CliError.NOT_TAKEN, f"the kernel did not take the decision within {timeout_s:g} s"
        )
    event, _ = await read_answer(db, seq)
    payload = event.payload if event is not None else None
    if isinstance(payload, ev.DecisionRefused | ev.AmendmentRefused):
        return error(payload.reason_code, payload.detail)
    if isinstance(payload, ev.InputRefused):
        return error(payload.reason_code, f"{payload.field}: {payload.detail}")
    if isinstance(payload, ev.RequestVerified):
        print(f"applied: {payload.request} by {payload.principal} (event #{seq})")
        return ExitCode.OK
    applied = None if event is None else _applied(event, seq)
    if applied is not None:
        say(f"applied: {applied}")
        return ExitCode.OK
    return error(CliError.NOT_APPLIED, f"inbox row {row_id} was not applied (marker {seq})")


def _applied(event: Event, seq: int) -> str | None:
    """What the kernel's answer at ``seq`` says it applied, or None if it applied nothing."""
    words = _APPLIED.get(type(event.payload))
    return None if words is None else words(event.payload, event, seq)


def _words_decided(p: ev.HumanDecided, event: Event, seq: int) -> str:
    return f"{p.decision} by {p.operator} (event #{seq})"


def _words_voted(p: ev.ApprovalVoted | ev.GrantVoted, event: Event, seq: int) -> str:
    met = "quorum met" if p.met else p.waiting
    return f"vote {p.vote} by {p.operator}: {met} (event #{seq})"


def _words_issued(p: ev.GrantIssued, event: Event, seq: int) -> str:
    waiting = " (waiting for its quorum)" if p.quorum is not None else ""
    return f"grant {p.grant} by {p.operator}{waiting} (event #{seq})"


def _words_revoked(p: ev.GrantRevoked, event: Event, seq: int) -> str:
    return f"grant {p.grant} revoked by {p.operator} (event #{seq})"


def _words_status(p: ev.AgentStatusChanged, event: Event, seq: int) -> str:
    return f"{event.agent_id} is {p.status}, by {p.operator} (event #{seq})"


def _words_rule_decided(p: ev.RuleDecided, event: Event, seq: int) -> str:
    version = f", now v{p.version}" if p.version else ""
    return f"rule {p.rule} {p.decision} by {p.actor}{version} (event #{seq})"


def _words_retracted(p: ev.RuleRetracted, event: Event, seq: int) -> str:
    return f"rule {p.rule} v{p.version} retracted by {p.operator}"


def _words_amended(p: ev.LimitAmended, event: Event, seq: int) -> str:
    return (
        f"{p.limit} = {p.value} for {event.agent_id} by"
        f" {p.operator} (event #{seq}, floor {p.floor}, ceiling {p.ceiling})"
    )


def _words_credential(p: ev.CredentialIssued, event: Event, seq: int) -> str:
    return f"credential of {event.agent_id} by {p.operator} (event #{seq})"


def _words_shadow_loaded(p: ev.ShadowLoaded, event: Event, seq: int) -> str:
    ref, enforced = p.pack, p.enforced.version
    return f"pack {ref.name} {ref.version} shadows {enforced} by {p.operator} (event #{seq})"


def _words_shadow(p: ev.ShadowRetired | ev.ShadowPromoted, event: Event, seq: int) -> str:
    done = "retired" if isinstance(p, ev.ShadowRetired) else "promoted"
    return f"shadow {p.pack.name} {p.pack.version} {done} by {p.operator} (event #{seq})"


_APPLIED: dict[type[Any], Callable[[Any, Event, int], str]] = {
    ev.HumanDecided: _words_decided,
    ev.ApprovalVoted: _words_voted,
    ev.GrantVoted: _words_voted,
    ev.GrantIssued: _words_issued,
    ev.GrantRevoked: _words_revoked,
    ev.AgentStatusChanged: _words_status,
    ev.RuleDecided: _words_rule_decided,
    ev.RuleRetracted: _words_retracted,
    ev.LimitAmended: _words_amended,
    ev.CredentialIssued: _words_credential,
    ev.ShadowLoaded: _words_shadow_loaded,
    ev.ShadowRetired: _words_shadow,
    ev.ShadowPromoted: _words_shadow,
}
"""The words of each answer that says an act was applied, by its event type."""
