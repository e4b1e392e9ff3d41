"""The MCP server's tools over a journal whose kernel runs in another process.

See :mod:`kernel.mcp._backend` for how the follower writes: signed inbox requests, each
answered with what the kernel made of it once it takes it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from kernel.core.events import (
    ApprovalVoted,
    InputRefused,
    KernelStopped,
)
from kernel.core.events import Principal as OnBehalfOf
from kernel.core.fetching import ArtifactSlice
from kernel.core.flow import FlowStatus
from kernel.core.keys import KeyUnusable
from kernel.core.ports import Clock, SystemClock
from kernel.core.reasons import CliError, ReasonCode
from kernel.core.wall import InputInvalid
from kernel.inbox import (
    PROPOSE_TOPIC,
    InboxRequest,
    ProposeRequest,
    RequestRefused,
    Signer,
    open_signer,
    read_answer,
    taken_seq,
)
from kernel.inbox.client import keyring_problem, queued_dfids
from kernel.inbox.prepare import (
    checked,
    prepare_decision,
    rule_change,
    rule_decision,
    status_change,
)
from kernel.journal.opening import open_journal
from kernel.journal.store import Journal
from kernel.mcp._records import RuleAct, Settled, ToolRefused, View, settled
from kernel.state.projections import fold
from kernel.state.quorums import Quorums
from kernel.state.snapshots import state_at


class Follower:
    """Tools over a journal whose kernel runs in another process (or not at all, for reads).

    Args:
        path: the journal file.
        kinds: the JSON Schema of each kind agents may propose (for ``propose``'s schema).
        clock: stamps inbox rows and paces the wait for a verdict.
        wait_s: how long a proposal waits for the kernel's verdict before answering QUEUED
            (not at all when the journal's last kernel stopped: none will answer).
        poll_s: how often it reads the journal meanwhile (no notification crosses processes).
        key: where the keys are: a directory of ``<name>.key`` files (the server's own,
            ``<door>.key``, and each agent's), or one key file for the door alone (None:
            ``DIRK_KEY``).
        door: the name the kernel's keyring holds the server's key under (role ``door``):
            it signs operator acts for the operator principals.
        answer_s: how long an operator act waits for the kernel to take it before
            answering QUEUED.
        scopes: the scopes each kind requires (``PolicyKind.scopes``): what ``tools/list``
            offers a caller bound to a user (kernel.mcp._offered).
    """

    remote = True

    def __init__(
        self,
        path: str,
        kinds: Mapping[str, dict[str, Any]] | None = None,
        clock: Clock | None = None,
        *,
        wait_s: float = 5.0,
        poll_s: float = 0.1,
        key: str | None = None,
        door: str = "mcp",
        answer_s: float = 5.0,
        scopes: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.path = path
        self.kinds: Mapping[str, dict[str, Any]] = dict(kinds or {})
        self._clock = clock or SystemClock()
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.key = key
        self.door = door
        self.answer_s = answer_s
        self.scopes: Mapping[str, Sequence[str]] = dict(scopes or {})
        self._signers: dict[str, Signer] = {}

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[View]:
        async with open_journal(self.path, readonly=True) as journal:
            projections = await state_at(journal, None)
            yield View(journal=journal, projections=projections)

    async def _signer(self, name: str) -> Signer:
        """The signer for ``name`` (the door, or an agent), its key read once.

        Raises:
            ToolRefused: SIGNATURE_INVALID: no usable key, or one the keyring refuses.
        """
        signer = self._signers.get(name)
        if signer is None:
            try:
                signer = await open_signer(self.path, self.key, name)
            except KeyUnusable as exc:
                raise ToolRefused(
                    ReasonCode.SIGNATURE_INVALID, f"no key for {name}: {exc}"
                ) from None
            problem = keyring_problem(signer, None)
            if problem is not None:
                raise ToolRefused(ReasonCode.SIGNATURE_INVALID, problem)
            self._signers[name] = signer
        return signer

    async def _post_signed(self, signer: Signer, request: InboxRequest) -> int:
        """Sign and insert ``request``; return the row id.

        Raises:
            ToolRefused: the kernel's wall would refuse the request (nothing posted).
        """
        try:
            # Signed on the machine's clock, as the inbox judges a request's window.
            return await anyio.to_thread.run_sync(signer.post, request, time.time_ns())
        except InputInvalid as exc:
            raise ToolRefused(exc.reason_code, exc.detail, exc.field) from None

    async def propose(
        self,
        agent_id: str,
        policy: dict[str, Any],
        explain: str,
        confidence: float,
        principal: OnBehalfOf | None = None,
    ) -> Settled:
        """Queue the proposal in the inbox; wait (up to ``wait_s``) for its flow to settle.

        The request is signed with the agent's own key. The kernel opens the flow when
        it takes the row, on the topic ``inbox.<agent>.<row id>``; until then, or past
        the wait, the answer is QUEUED with the row id, and the flow's verdict can be
        read later (trace_provenance). A call bound to a user is refused
        (PRINCIPAL_MISSING): an inbox ``propose`` row carries no principal, and the
        call must never run as another's.
        """
        if principal is not None:
            raise ToolRefused(
                ReasonCode.PRINCIPAL_MISSING,
                "a proposal for a user goes to a kernel beside this server (dirk mcp --kernel):"
                " the inbox carries no principal",
                "authorization",
            )
        try:
            request = checked(
                ProposeRequest(
                    agent_id=agent_id, policy=policy, explain=explain, confidence=confidence
                )
            )
        except RequestRefused as refused:
            raise ToolRefused(refused.code, refused.message, "policy") from None
        signer = await self._signer(agent_id)
        async with open_journal(self.path, readonly=True) as journal:
            after = journal.head_seq  # what the kernel records of the row comes after this
            stopped = await _stopped(journal)
        row_id = await self._post_signed(signer, request)
        topic = f"{PROPOSE_TOPIC}.{agent_id}.{row_id}"
        with anyio.move_on_after(0 if stopped else self.wait_s):
            while True:
                answer = await self._settled(row_id, topic, after)
                if answer is not None:
                    return answer
                await self._clock.sleep(self.poll_s)
        return Settled(
            verdict="QUEUED",
            dfid="",
            status="",
            detail=_not_taken(row_id, stopped, self.wait_s),
            result={"inbox_id": row_id},
        )

    async def _settled(self, row_id: int, topic: str, after: int) -> Settled | None:
        """Return how the row's flow settled, its refusal, or None while neither is recorded."""
        async with open_journal(self.path, readonly=True) as journal:
            refusals = await journal.read(after + 1, types=["InputRefused"])
            for event in refusals:
                payload = event.payload
                if isinstance(payload, InputRefused) and payload.inbox_id == row_id:
                    raise ToolRefused(payload.reason_code, payload.detail, payload.field)
            created = await journal.read(after + 1, types=["FlowCreated"])
            dfid = next(
                (e.dfid for e in created if getattr(e.payload, "topic", "") == topic and e.dfid),
                None,
            )
            if dfid is None:
                return None
            events = await journal.flow_events(dfid)
        flow = fold(events).flows[dfid]
        if not flow.terminal and flow.status is not FlowStatus.ESCALATED:
            return None
        return settled(flow, events)

    async def decide(
        self,
        dfid: str,
        decision: str,
        operator: str,
        reason: str,
        params: dict[str, Any] | None,
        action_hash: str | None,
    ) -> dict[str, Any]:
        """Check the decision as ``dirk decide`` does, post it, and answer what became of it."""
        async with open_journal(self.path, readonly=True) as journal:
            folded = fold(await journal.flow_events(dfid))
        queued = await anyio.to_thread.run_sync(queued_dfids, self.path)
        outcome = params.get("outcome", "") if isinstance(params, dict) else ""
        external_id = params.get("external_id", "") if isinstance(params, dict) else ""
        try:
            request = prepare_decision(
                folded.flows.get(dfid),
                folded.approvals.get(dfid),
                dfid=dfid,
                choice=decision,
                operator=operator,
                reason=reason,
                confirm=action_hash or "",
                params=params if decision == "modify" else None,
                outcome=outcome if isinstance(outcome, str) else "",
                external_id=external_id if isinstance(external_id, str) else "",
                queued=dfid in queued,
                ballot=folded.domain(Quorums).ballots.get(dfid),
            )
        except RequestRefused as refused:
            return {
                "verdict": "REFUSED",
                "dfid": dfid,
                "reason_code": str(refused.code),
                "detail": refused.message,
            }
        return await self._post(dfid, request)

    async def set_agent_status(
        self, agent_id: str, status: str, operator: str, reason: str
    ) -> dict[str, Any]:
        async with self.reading() as view:
            known = set(view.projections.agents)
        try:
            request = status_change(known, agent_id, status, operator=operator, reason=reason)
        except RequestRefused as refused:
            raise ToolRefused(refused.code, refused.message) from None
        return await self._post("", request)

    async def fetch_artifact(
        self, agent_id: str, dfid: str, ref: str, start: int, length: int | None
    ) -> ArtifactSlice:
        """Refused: the artifact store is read by the kernel's process, which records each
        fetch it refuses; a follower holds neither (serve MCP beside the kernel, or use the
        mesh)."""
        raise ToolRefused(
            CliError.NOT_APPLIED,
            "artifacts are fetched through the running kernel (the embedded server, or the mesh)",
            "ref",
        )

    async def rule_act(self, act: RuleAct) -> dict[str, Any]:
        """Check an operator's act on the rulebook, post it, and answer what became of it."""
        async with self.reading() as view:
            book = view.projections.memory.rulebook
        try:
            if act.action in ("override", "skip"):
                request: InboxRequest = rule_decision(
                    book, act.proposal_seq, act.action, operator=act.operator, reason=act.reason
                )
            else:
                request = rule_change(
                    book,
                    act.rule,
                    act.action,
                    operator=act.operator,
                    reason=act.reason,
                    title=act.title,
                    content=act.content,
                    labels=act.labels,
                    ns=act.ns,
                )
        except RequestRefused as refused:
            field = "proposal_seq" if refused.code is CliError.RULE_NOT_PENDING else "item_id"
            raise ToolRefused(refused.code, refused.message, field) from None
        return await self._post("", request)

    async def _post(self, dfid: str, request: InboxRequest) -> dict[str, Any]:
        """Sign ``request`` as the door, post it, and wait (``answer_s``) for the answer."""
        async with open_journal(self.path, readonly=True) as journal:
            stopped = await _stopped(journal)
        row_id = await self._post_signed(await self._signer(self.door), request)
        seq = None
        with anyio.move_on_after(0 if stopped else self.answer_s):
            while seq is None:
                seq = await anyio.to_thread.run_sync(taken_seq, self.path, row_id)
                if seq is None:
                    await self._clock.sleep(self.poll_s)
        if seq is None:
            return {
                "verdict": "QUEUED",
                "dfid": dfid,
                "detail": _not_taken(row_id, stopped, self.answer_s),
                "result": {"inbox_id": row_id},
            }
        event, answer = await read_answer(self.path, seq)
        result: dict[str, Any] = {"verdict": answer.verdict, "dfid": dfid}
        if answer.verdict == "REFUSED":
            result["reason_code"] = answer.reason_code
            result["detail"] = answer.detail
        result["result"] = {"inbox_id": row_id, "seq": seq}
        if event is not None and isinstance(event.payload, ApprovalVoted):
            # A vote that does not meet the quorum: what the flow still waits for.
            result["result"]["waiting"] = event.payload.waiting
        return result


async def _stopped(journal: Journal) -> int | None:
    """Return the seq of the KernelStopped that ends the journal's last run, or None.

    None when a kernel may be running (the last start has no stop after it) or none
    ever ran: only a recorded stop says for sure that no kernel will take the inbox.
    """
    runs = await journal.read(types=["KernelStarted", "KernelStopped"])
    if runs and isinstance(runs[-1].payload, KernelStopped):
        return runs[-1].seq
    return None


def _not_taken(row_id: int, stopped: int | None, waited_s: float) -> str:
    """Say why an inbox row has no answer yet, and what becomes of it."""
    if stopped is not None:
        why = f"the journal's kernel stopped (event #{stopped}): none is running to take it"
    else:
        why = f"no kernel took it within {waited_s:g} s"
    return (
        f"inbox row {row_id} waits: {why}; the next kernel on this journal applies it"
        " (dirk serve, or the application's own)"
    )
