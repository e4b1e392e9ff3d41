"""``dirk agent AGENT --issue-credential``: provision or rotate an agent's credential.

The secret is made here, printed once for the operator to hand to whoever runs
the agent (``DIRK_AGENT_CREDENTIAL`` for ``python -m agents_sdk.serve``), and
never written anywhere: the inbox row carries only its verifier, which the
running kernel records (``CredentialIssued``, naming the row). Issuing again
rotates it: the next handshake must show the new secret; live sessions go on.
"""

from __future__ import annotations

import argparse
import sys
import time

from kernel.cli._operator import error, wait_taken
from kernel.core.reasons import ExitCode, ReasonCode
from kernel.core.wall import who_and_why
from kernel.inbox import CREDENTIAL, post
from kernel.registry import credential_verifier, new_credential


async def issue_credential(args: argparse.Namespace) -> int:
    """Queue a new credential's verifier for ``args.agent_id``; print the secret once."""
    if not args.operator or not args.reason:
        missing: str | None = "a change names the --operator and a --reason"
    else:
        missing = who_and_why(args.operator, args.reason)
    if missing is not None:
        return error(ReasonCode.SCHEMA_INVALID, missing, ExitCode.USAGE)
    secret = new_credential()
    row = {
        "type": CREDENTIAL,
        "agent_id": args.agent_id,
        "verifier": credential_verifier(secret),
        "operator": args.operator,
        "reason": args.reason,
    }
    row_id = post(args.db, "", row, time.time_ns())
    print(f"credential for {args.agent_id} queued as inbox row {row_id}", file=sys.stderr)
    print("hand it to the agent's host; it is shown only this once:", file=sys.stderr)
    print(secret)
    return await wait_taken(args.db, row_id, args.wait) if args.wait > 0 else 0
