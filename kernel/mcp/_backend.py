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
from typing import Any

import anyio
import msgspec

from kernel.api import Kernel
from kernel.api.decisions import DecisionVerdict
from kernel.core.events import (
    ContextCompiled,
    Manifest,
)
from kernel.core.events import Principal as OnBehalfOf
from kernel.core.fetching import ArtifactSlice, FetchRefused
from kernel.core.reasons import CliError, ReasonCode
from kernel.core.wall import InputInvalid
from kernel.mcp._follower import Follower as Follower
from kernel.mcp._records import Principal as Principal
from kernel.mcp._records import Role as Role
from kernel.mcp._records import RuleAct as RuleAct
from kernel.mcp._records import Settled as Settled
from kernel.mcp._records import ToolRefused as ToolRefused
from kernel.mcp._records import View as View
from kernel.mcp._records import settled as settled
from kernel.policy.contracts import HandshakeRefused
from kernel.registry import CONTRACT_VERSION
from kernel.state.rulebook import RuleNotInForce, RuleNotPending


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

    @property
    def scopes(self) -> Mapping[str, tuple[str, ...]]:
        """The scopes each policy kind requires (``PolicyKind.scopes``), by name."""
        return {name: kind.scopes for name, kind in self.kernel.catalog.kinds.items()}

    def capabilities_of(self, agent_id: str) -> list[str]:
        """The kinds MCP agent ``agent_id`` may propose: its manifest's capabilities."""
        return list(self._capabilities.get(agent_id, sorted(self.kinds)))

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[View]:
        yield View(journal=self.kernel.journal, projections=self.kernel.projections)

    async def propose(
        self,
        agent_id: str,
        policy: dict[str, Any],
        explain: str,
        confidence: float,
        principal: OnBehalfOf | None = None,
    ) -> Settled:
        """Propose ``policy`` as ``agent_id`` (one flow, ``Kernel.propose``) and answer it,
        with the artifacts its context referenced (what ``fetch_artifact`` may read).

        ``principal`` is the user the door authenticated for the call (None: the
        kernel's default principal, if it has one, or PRINCIPAL_MISSING).
        """
        answer = await self._propose(agent_id, policy, explain, confidence, principal)
        shown: dict[str, str] = {}
        for event in await self.kernel.journal.read(dfid=answer.dfid, types=["ContextCompiled"]):
            if isinstance(event.payload, ContextCompiled):
                shown.update(event.payload.artifacts)
        if not shown:
            return answer
        return msgspec.structs.replace(answer, result={**answer.result, "artifacts": shown})

    async def _propose(
        self,
        agent_id: str,
        policy: dict[str, Any],
        explain: str,
        confidence: float,
        principal: OnBehalfOf | None,
    ) -> Settled:
        await self._session(agent_id)
        params = dict(policy)
        kind = params.pop("kind", "")
        # Only a call the door bound to a user names one: the others act for the kernel's
        # default principal (KernelConfig.principal), as Kernel.propose decides.
        behalf: dict[str, Any] = {} if principal is None else {"principal": principal}
        decision = await self.kernel.propose(
            agent_id,
            kind if isinstance(kind, str) else "",
            params,
            explain=explain,
            confidence=confidence,
            **behalf,
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
            kinds = self.capabilities_of(agent_id)
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


Backend = Embedded | Follower
