"""The helper process's verify (kernel.journal._helper): ``verify_journal``, bodies handed over."""

from __future__ import annotations

from typing import Any

import msgspec

from kernel.journal._helper_worker import REPORT, send, send_bodies
from kernel.journal.verify import parse_anchor, verify_journal


async def verify(request: dict[str, Any]) -> None:
    """Verify the journal the request names, writing each checked batch's bodies, then the
    report."""

    async def sink(bodies: list[bytes]) -> None:
        send_bodies(bodies)

    key, anchor = request["key"], request["anchor"]
    report = await verify_journal(
        request["path"],
        chain_key=bytes.fromhex(key) if key is not None else None,
        anchor=parse_anchor(anchor) if anchor else None,
        public_only=request["public_only"],
        bodies=sink,
    )
    send(REPORT, msgspec.json.encode(report))
