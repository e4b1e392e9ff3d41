"""Where the MCP server's tools read and write: a kernel beside it, or a journal it follows.

:class:`Embedded` runs next to a kernel in the same process. An agent's write
is one call of the kernel's ``propose``: the server opens a session for each MCP
agent principal (a handshake, nothing hosted), and each tool call is a flow with
its proposal in it, judged by the DIM, answered once it settles. Operator acts
call the kernel's API, which records them with who and why.

:class:`Follower` works against a journal whose kernel runs in another process.
Reads fold the journal as it is on disk at the time of the call; operator acts
go through the operator inbox as signed requests (kernel.inbox), checked first by
the same functions ``dirk decide`` uses (kernel.inbox.prepare), and signed with the
server's own key, a ``door`` of the kernel's keyring, on behalf of the operator
principal. The follower waits (``answer_s``) for the kernel to take the request and
answers what it made of it (APPLIED, or REFUSED with the code), else QUEUED with the
row's id. An agent's write goes through the inbox too, as a ``propose`` request
signed with the agent's own key: that kernel opens a flow with the proposal in it
(kernel.inbox.InboxProposals), and the follower reads the verdict back from the
journal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import msgspec

from kernel.api import Kernel
from kernel.api.decisions import DecisionVerdict
from kernel.core.events import (
    ApprovalVoted,
    ContextCompiled,
    Event,
    ExecutionSucceeded,
    InputRefused,
    KernelStopped,
    Manifest,
    ProposalRejected,
)
from kernel.core.fetching import ArtifactSlice, FetchRefused
from kernel.core.flow import FlowState, FlowStatus
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
from kernel.policy.contracts import HandshakeRefused
from kernel.registry import CONTRACT_VERSION
from kernel.state.projections import Projections, fold
from kernel.state.quorums import Quorums
from kernel.state.rulebook import RuleNotInForce, RuleNotPending
from kernel.state.snapshots import state_at

Role = Literal["agent", "operator"]


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who calls a tool: an agent (by id) or an operator (by name)."""

    role: Role
    name: str


class ToolRefused(Exception):
    """A tool call refused before or instead of any proposal, with a code and a field."""

    def __init__(self, code: str, detail: str, field: str = "") -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.field = field


class Settled(msgspec.Struct, frozen=True, kw_only=True):
    """How a proposal's flow settled, as the tool answers it."""

    verdict: str
    dfid: str
    status: str
    reason_code: str | None = None
    detail: str = ""
    field: str = ""
    result: dict[str, Any] = {}


class View(msgspec.Struct, frozen=True, kw_only=True):
    """What a read sees: the journal and the projections folded from it."""

    journal: Journal
    projections: Projections


class Embedded:
    """Tools beside a running kernel in the same process.

    Args:
        kernel: the running kernel.
        capabilities: the kinds each MCP agent may propose, by agent id (default: every
            kind the kernel's packs define). The kernel's ``allow`` must name the agent;
            an agent the embedding code hosts is refused (AGENT_IN_SESSION).
    """

    remote = False

    def __init__(self, kernel: Kernel, capabilities: Mapping[str, list[str]] | None = None) -> None:
        self.kernel = kernel
        self._capabilities = dict(capabilities or {})
        self._sessions: set[str] = set()
        self._lock = anyio.Lock()

    @property
    def kinds(self) -> Mapping[str, dict[str, Any]]:
        """The JSON Schema of every policy kind, by name."""
        return self.kernel.catalog.schemas

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[View]:
        yield View(journal=self.kernel.journal, projections=self.kernel.projections)

    async def propose(
        self, agent_id: str, policy: dict[str, Any], explain: str, confidence: float
    ) -> Settled:
        """Propose ``policy`` as ``agent_id`` (one flow, ``Kernel.propose``) and answer it,
        with the artifacts its context referenced (what ``fetch_artifact`` may read)."""
        answer = await self._propose(agent_id, policy, explain, confidence)
        shown: dict[str, str] = {}
        for event in await self.kernel.journal.read(dfid=answer.dfid, types=["ContextCompiled"]):
            if isinstance(event.payload, ContextCompiled):
                shown.update(event.payload.artifacts)
        if not shown:
            return answer
        return msgspec.structs.replace(answer, result={**answer.result, "artifacts": shown})

    async def _propose(
        self, agent_id: str, policy: dict[str, Any], explain: str, confidence: float
    ) -> Settled:
        await self._session(agent_id)
        params = dict(policy)
        kind = params.pop("kind", "")
        decision = await self.kernel.propose(
            agent_id,
            kind if isinstance(kind, str) else "",
            params,
            explain=explain,
            confidence=confidence,
        )
        code = str(decision.reason_code) if decision.reason_code is not None else None
        if not decision.dfid:
            # Refused before any flow opened (an agent that may not act, a malformed call).
            raise ToolRefused(code or ReasonCode.SCHEMA_INVALID, decision.detail, decision.field)
        flow = self.kernel.flow(decision.dfid)
        status = str(flow.status) if flow is not None else ""
        match decision.verdict:
            case DecisionVerdict.EXECUTED:
                return Settled(
                    verdict="ACCEPTED", dfid=decision.dfid, status=status, result=decision.result
                )
            case DecisionVerdict.ESCALATED | DecisionVerdict.PENDING:
                return Settled(
                    verdict=str(decision.verdict),
                    dfid=decision.dfid,
                    status=status,
                    reason_code=code,
                    detail=decision.detail,
                )
        return Settled(
            verdict="REJECTED",
            dfid=decision.dfid,
            status=status,
            reason_code=code,
            detail=decision.detail,
            field=decision.field,
        )

    async def _session(self, agent_id: str) -> None:
        """Open a session for the MCP agent ``agent_id`` once: a handshake, nothing hosted.

        Raises:
            ToolRefused: AGENT_IN_SESSION for an agent the embedding code hosts; the
                registry's refusal otherwise.
        """
        async with self._lock:
            if agent_id in self._sessions:
                return
            if self.kernel.actors.agents.hosting(agent_id):
                raise ToolRefused(
                    ReasonCode.AGENT_IN_SESSION,
                    f"agent {agent_id} is hosted in this kernel: MCP does not propose for it",
                    "agent_id",
                )
            kinds = self._capabilities.get(agent_id, sorted(self.kinds))
            manifest = Manifest(
                agent_id=agent_id,
                version=f"{CONTRACT_VERSION[0]}.{CONTRACT_VERSION[1]}.0",
                capabilities=list(kinds),
                subscriptions=[f"mcp.{agent_id}"],
                max_attempts=1,
            )
            try:
                await self.kernel.handshake(manifest)
            except HandshakeRefused as exc:
                raise ToolRefused(exc.reason_code, str(exc)) from None
            self._sessions.add(agent_id)

    async def decide(
        self,
        dfid: str,
        decision: str,
        operator: str,
        reason: str,
        params: dict[str, Any] | None,
        action_hash: str | None,
    ) -> dict[str, Any]:
        verdict = await self.kernel.decide(
            dfid, decision, operator=operator, reason=reason, params=params, action_hash=action_hash
        )
        answer: dict[str, Any] = {"verdict": str(verdict.outcome), "dfid": verdict.dfid}
        if verdict.feedback is not None:
            answer["reason_code"] = str(verdict.feedback.reason_code)
            answer["detail"] = verdict.feedback.detail
        return answer

    async def set_agent_status(
        self, agent_id: str, status: str, operator: str, reason: str
    ) -> dict[str, Any]:
        try:
            await self.kernel.set_agent_status(agent_id, status, operator=operator, reason=reason)
        except (InputInvalid, HandshakeRefused) as exc:
            raise ToolRefused(exc.reason_code, str(exc)) from None
        return {"verdict": "APPLIED", "agent_id": agent_id, "status": status}

    async def fetch_artifact(
        self, agent_id: str, dfid: str, ref: str, start: int, length: int | None
    ) -> ArtifactSlice:
        """Read a range of an artifact a context of ``agent_id``'s flow ``dfid`` referenced."""
        try:
            return await self.kernel.fetch_artifact(agent_id, dfid, ref, start, length)
        except FetchRefused as exc:
            raise ToolRefused(exc.reason_code, exc.detail, exc.field) from None

    async def rule_act(self, act: RuleAct) -> dict[str, Any]:
        """Apply an operator's act on the rulebook; answer APPLIED with the event's seq."""
        kernel = self.kernel
        try:
            if act.action in ("override", "skip"):
                event = await kernel.decide_rule(
                    act.proposal_seq, act.action, operator=act.operator, reason=act.reason
                )
            elif act.action == "retract":
                event = await kernel.retract_rule(
                    act.rule, operator=act.operator, reason=act.reason, ns=act.ns
                )
            else:
                item = kernel.projections.memory.rulebook.item(act.rule, act.ns)
                event = await kernel.propose_rule(
                    act.rule,
                    ns=act.ns,
                    title=act.title,
                    content=act.content,
                    labels=act.labels,
                    operator=act.operator,
                    reason=act.reason,
                    base_version=item.latest if item is not None else 0,
                    override=True,
                )
        except RuleNotPending as exc:
            raise ToolRefused(CliError.RULE_NOT_PENDING, str(exc), "proposal_seq") from None
        except RuleNotInForce as exc:
            raise ToolRefused(CliError.UNKNOWN_RULE, str(exc), "item_id") from None
        except InputInvalid as exc:
            raise ToolRefused(exc.reason_code, exc.detail, exc.field) from None
        except ValueError as exc:
            raise ToolRefused(ReasonCode.SCHEMA_INVALID, str(exc)) from None
        version = getattr(event.payload, "version", 0)
        return {"verdict": "APPLIED", "result": {"seq": event.seq, "version": version}}


class RuleAct(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's act on the rulebook: override or skip a proposal; add, edit, retract a rule."""

    action: str
    operator: str
    reason: str
    rule: str = ""
    proposal_seq: int = 0
    title: str = ""
    content: str = ""
    labels: list[str] = []
    ns: str = "default"
    """The rulebook namespace of ``rule``."""


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
    ) -> None:
        self.path = path
        self.kinds: Mapping[str, dict[str, Any]] = dict(kinds or {})
        self._clock = clock or SystemClock()
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.key = key
        self.door = door
        self.answer_s = answer_s
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
            return await anyio.to_thread.run_sync(signer.post, request, self._clock.now_ns())
        except InputInvalid as exc:
            raise ToolRefused(exc.reason_code, exc.detail, exc.field) from None

    async def propose(
        self, agent_id: str, policy: dict[str, Any], explain: str, confidence: float
    ) -> Settled:
        """Queue the proposal in the inbox; wait (up to ``wait_s``) for its flow to settle.

        The request is signed with the agent's own key. The kernel opens the flow when
        it takes the row, on the topic ``inbox.<agent>.<row id>``; until then, or past
        the wait, the answer is QUEUED with the row id, and the flow's verdict can be
        read later (trace_provenance).
        """
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


Backend = Embedded | Follower


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


def settled(flow: FlowState, events: list[Event]) -> Settled:
    """Return the verdict a settled flow gives its proposer, with the artifacts its context
    referenced (``artifacts``: key -> reference; what ``fetch_artifact`` may read)."""
    answer = _settled(flow, events)
    shown: dict[str, str] = {}
    for event in events:
        if isinstance(event.payload, ContextCompiled):
            shown.update(event.payload.artifacts)
    if not shown:
        return answer
    return msgspec.structs.replace(answer, result={**answer.result, "artifacts": shown})


def _settled(flow: FlowState, events: list[Event]) -> Settled:
    status = str(flow.status)
    if flow.status is FlowStatus.CLOSED:
        result: dict[str, Any] = {"external_id": flow.external_id}
        for event in events:
            if isinstance(event.payload, ExecutionSucceeded):
                result.update(event.payload.detail)
        return Settled(verdict="ACCEPTED", dfid=flow.dfid, status=status, result=result)
    if flow.status is FlowStatus.ESCALATED:
        return Settled(
            verdict="ESCALATED",
            dfid=flow.dfid,
            status=status,
            reason_code=str(flow.reason_code) if flow.reason_code else None,
            detail=flow.detail,
        )
    rejected = [e.payload for e in events if isinstance(e.payload, ProposalRejected)]
    if rejected:
        feedback = rejected[-1].feedback
        return Settled(
            verdict="REJECTED",
            dfid=flow.dfid,
            status=status,
            reason_code=str(feedback.reason_code),
            detail=feedback.detail,
            field=feedback.field,
        )
    return Settled(
        verdict="REJECTED",
        dfid=flow.dfid,
        status=status,
        reason_code=str(flow.reason_code) if flow.reason_code else None,
        detail=flow.detail,
    )
