"""``dirk agent AGENT --issue-credential``: provision or rotate an agent's credential.

The secret is made here, printed once for the operator to hand to whoever runs
the agent (``DIRK_AGENT_CREDENTIAL`` for ``python -m agents_sdk.serve``), and
never written anywhere: the signed inbox request carries only its verifier, which
the running kernel records (``CredentialIssued``, naming the row). Issuing again
rotates it: the next handshake must show the new secret; live sessions go on.

An agent the kernel would refuse (neither registered nor allowed by the kernel that
last opened the journal, as its KernelStarted records) is refused here, before a
secret is made.
"""

from __future__ import annotations

import argparse
import sys
import time

from kernel.cli._operator import error, refused, wait_taken
from kernel.cli._read import say
from kernel.core import events as ev
from kernel.core.keys import KeyUnusable
from kernel.core.reasons import ExitCode, ReasonCode
from kernel.inbox import RequestRefused, open_signer
from kernel.inbox.client import keyring_problem
from kernel.inbox.prepare import credential
from kernel.journal.opening import open_journal
from kernel.registry import credential_verifier, new_credential


async def issue_credential(args: argparse.Namespace) -> int:
    """Queue a new credential's verifier for ``args.agent_id``; print the secret once."""
    if not args.operator or not args.reason:
        return error(
            ReasonCode.SCHEMA_INVALID,
            "a change names the --operator and a --reason",
            ExitCode.USAGE,
        )
    secret = new_credential()
    try:
        request = credential(
            args.agent_id,
            credential_verifier(secret),
            operator=args.operator,
            reason=args.reason,
        )
    except RequestRefused as exc:
        return refused(exc)
    if not await _known(args.db, args.agent_id):
        return error(
            ReasonCode.UNKNOWN_AGENT,
            f"agent {args.agent_id!r} is neither registered in {args.db} nor allowed by its kernel",
        )
    try:
        signer = await open_signer(args.db, args.key, args.operator)
    except KeyUnusable as exc:
        return error(ReasonCode.SIGNATURE_INVALID, str(exc), ExitCode.USAGE)
    problem = keyring_problem(signer, None)
    if problem is not None:
        return error(ReasonCode.SIGNATURE_INVALID, problem)
    row_id = signer.post(request, time.time_ns())
    say(f"credential for {args.agent_id} queued as inbox row {row_id}", file=sys.stderr)
    print("hand it to the agent's host; it is shown only this once:", file=sys.stderr)
    print(secret)
    return await wait_taken(args.db, row_id, args.wait) if args.wait > 0 else ExitCode.OK


async def _known(db: str, agent_id: str) -> bool:
    """Whether the kernel would take a credential for ``agent_id`` (as the journal tells)."""
    async with open_journal(db, readonly=True) as journal:
        started = await journal.read(types=["KernelStarted"])
        registered = await journal.read(types=["AgentRegistered"])
    if any(
        isinstance(e.payload, ev.AgentRegistered) and e.payload.manifest.agent_id == agent_id
        for e in registered
    ):
        return True
    last = started[-1].payload if started else None
    allow = last.allow if isinstance(last, ev.KernelStarted) else None
    return allow is None or agent_id in allow
