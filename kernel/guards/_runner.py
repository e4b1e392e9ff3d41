"""The actor that runs soft guards beside the pipeline and records what they flag.

See kernel.policy.guards for what a guard is. The DIM sends :class:`Screen` once a
verdict that lets a proposal through is recorded; nothing here can delay or
change that verdict. Findings become FlowFlagged events (NEEDS_REVIEW); a guard
that raises, overruns or answers nonsense flags the flow too (fail closed:
a check that could not judge is a reason for a human to look). Guards still
running when the kernel stops are not resumed after a restart.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import msgspec

from kernel.core.events import FlowFlagged
from kernel.policy.guards import Guard, confidence_text, well_formed
from kernel.runtime.actors import Mailbox, MailboxClosed, Outbox
from kernel.runtime.messages import Found, GuardMessage, Screen

log = logging.getLogger(__name__)

GUARD_TIMEOUT_S = 30.0
"""How long one soft guard may take before it counts as failed (and the flow is flagged)."""


class GuardRunner:
    """The actor that runs soft guards beside the pipeline and records what they flag.

    Deterministic guards run in ``handle``; async ones run as tasks in the
    kernel's effects task group (``spawn``) and report back through the mailbox,
    so a slow guard holds up nothing but its own finding.
    """

    def __init__(
        self,
        guards_of: Mapping[str, Sequence[Guard]],
        kinds: Mapping[str, type[Any]],
        mailbox: Mailbox[GuardMessage],
        spawn: Callable[[Callable[[], Any]], None],
        timeout_s: float = GUARD_TIMEOUT_S,
    ) -> None:
        self._guards_of = guards_of
        self._kinds = kinds
        self._mailbox = mailbox
        self._spawn = spawn
        self._timeout_s = timeout_s

    async def handle(self, msg: GuardMessage, out: Outbox) -> None:
        match msg:
            case Screen():
                self._screen(msg, out)
            case Found():
                _record(msg, out)

    def _screen(self, msg: Screen, out: Outbox) -> None:
        guards = self._guards_of.get(msg.proposal.kind, ())
        kind = self._kinds.get(msg.proposal.kind)
        if not guards or kind is None:
            return
        params = msgspec.convert({"kind": msg.proposal.kind, **msg.proposal.params}, kind)
        for guard in guards:
            if guard.deterministic:
                try:
                    finding = guard.check(msg.proposal, params, msg.state)
                except Exception as exc:
                    _record(_failed(msg.dfid, guard, exc), out)
                    continue
                _record(_found(msg.dfid, guard, finding=finding), out)
            else:
                self._spawn(self._run(msg, guard, params))

    def _run(self, msg: Screen, guard: Guard, params: Any) -> Callable[[], Any]:
        async def run() -> None:
            found = _found(msg.dfid, guard, error=f"no answer within {self._timeout_s:g} s")
            with anyio.move_on_after(self._timeout_s):
                try:
                    finding = await guard.check(msg.proposal, params, msg.state)  # type: ignore[misc]
                    found = _found(msg.dfid, guard, finding=finding)
                except Exception as exc:
                    found = _failed(msg.dfid, guard, exc)
            with contextlib.suppress(MailboxClosed):  # the kernel stopped meanwhile
                await self._mailbox.send(found)

        return run


def _found(dfid: str, guard: Guard, *, finding: Any = None, error: str = "") -> Found:
    return Found(
        dfid=dfid, guard=guard.name, flag_above=guard.flag_above, finding=finding, error=error
    )


def _failed(dfid: str, guard: Guard, exc: Exception) -> Found:
    log.warning("soft guard %s failed on flow %s: %r", guard.name, dfid, exc)
    return _found(dfid, guard, error=f"{type(exc).__name__}: {exc}"[:300])


def _record(found: Found, out: Outbox) -> None:
    """Flag the flow when the guard failed, or found something sure enough."""
    if not found.error and found.finding is not None and not well_formed(found.finding):
        found = msgspec.structs.replace(
            found,
            finding=None,
            error=f"not a finding with a confidence in [0, 1]: {found.finding!r}"[:300],
        )
    if found.error:
        event = FlowFlagged(
            guard=found.guard, reason=f"the guard could not judge: {found.error}", failed=True
        )
    elif found.finding is not None and found.finding.confidence >= found.flag_above:
        event = FlowFlagged(
            guard=found.guard,
            reason=found.finding.reason[:500],
            confidence=confidence_text(found.finding.confidence),
        )
    else:
        return
    if out.flow(found.dfid) is not None:
        out.emit(event, dfid=found.dfid)
