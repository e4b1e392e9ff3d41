"""The MCP server: the kernel's memory, rulebook and decisions as tools.

Every write is a proposal through the DIM or an operator's act on record;
reads come from projections of the journal. Each tool answers one structured
:class:`Answer`: a proposal's verdict (ACCEPTED; REJECTED with the reason code
and the feedback to revise on; ESCALATED with the DFID), an operator act's
outcome, or what was read. Bad input is an answer too: ERROR with a reason
code (or one of ``dirk``'s codes, such as UNKNOWN_RULE), marked ``isError``,
and recorded by the kernel wherever a proposal or a human act was involved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import anyio
import msgspec
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import SubscriptionBus
from pydantic import WithJsonSchema

from kernel.audit.counterfactual import whatif
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.reasons import CliError, ReasonCode
from kernel.mcp._backend import Backend, Embedded, Principal, Settled, ToolRefused, settled
from kernel.mcp._rules import add_rulebook
from kernel.mcp._tools import (
    MAX_RESULTS,
    Answer,
    CodedServer,
    Id,
    Identity,
    Int,
    Ints,
    Number,
    Obj,
    OptId,
    OptInt,
    OptText,
    Priority,
    Rule,
    Text,
    checked_seq,
    checked_text,
    registrar,
)
from kernel.state.approvals import ApprovalStatus
from kernel.state.rulebook import shown_item
from kernel.state.snapshots import state_at

MAX_WAIT_S = 30
"""The longest ``wait_flow`` holds a call open: a long-poll, bounded."""


def build_server(
    backend: Backend,
    identity: Identity,
    *,
    name: str = "dirk",
    lifespan: Any = None,
    bus: SubscriptionBus | None = None,
) -> MCPServer[Any]:
    """Return the MCP server over ``backend``, its callers known by ``identity``.

    ``bus`` carries change events to ``subscriptions/listen`` clients: give the same
    one to :func:`kernel.mcp.watch_rules` to tell them when the rules change.
    """
    server: MCPServer[Any] = CodedServer(
        name,
        version="0.1.0",
        instructions=(
            "A governed memory and rulebook: every write is a proposal the kernel judges."
            " Read a REJECTED verdict's reason_code and detail, revise, and call again."
        ),
        lifespan=lifespan,
        log_level="WARNING",
        subscriptions=bus,
    )
    tool = registrar(server, identity)

    async def proposed(who: Principal, policy: dict[str, Any], explain: Any, conf: Any) -> Answer:
        settled: Settled = await backend.propose(who.name, policy, explain, conf)
        return Answer(**msgspec.to_builtins(settled))

    # --- agent tools: every write a proposal -----------------------------------------

    @tool("agent")
    async def add_fact(
        who: Principal, name: Id, value: Text, confidence: Id = "1", explain: Text = ""
    ) -> Answer:
        """Propose remembering that NAME is VALUE (confidence as a decimal string, 0..1)."""
        policy = {"kind": "memory.add_fact", "name": name, "value": value}
        policy["confidence"] = confidence
        return await proposed(who, policy, explain or f"remember {name}", 1.0)

    @tool("agent")
    async def add_constraint(
        who: Principal,
        text: Text,
        priority: Priority = "required",
        triggered_by: OptInt = None,
        explain: Text = "",
    ) -> Answer:
        """Propose a constraint on later proposals: 'never X', 'avoid X', 'verify X before Y'.

        A learned constraint names the event of the mistake it learns from in triggered_by.
        """
        policy = {"kind": "memory.add_constraint", "text": text, "priority": priority}
        if triggered_by is not None:
            policy["triggered_by"] = triggered_by
        return await proposed(who, policy, explain or "constraint", 1.0)

    @tool("agent")
    async def record_decision(
        who: Principal, text: Text, rationale: Text = "", refs: Ints = None, explain: Text = ""
    ) -> Answer:
        """Propose recording a decision; the kernel checks it against every active constraint."""
        policy = {"kind": "memory.record_decision", "text": text, "rationale": rationale}
        if refs is not None:
            policy["refs"] = refs
        return await proposed(who, policy, explain or f"{text}", 1.0)

    @tool("agent")
    async def query_memory(who: Principal, topic: Text, explain: Text = "") -> Answer:
        """Consult memory about TOPIC; the query is recorded (it is what verification needs)."""
        policy = {"kind": "memory.query", "topic": topic}
        return await proposed(who, policy, explain or f"query {topic}", 1.0)

    @tool("agent")
    async def propose(
        who: Principal, policy: Obj, explain: Text = "", confidence: Number = 1.0
    ) -> Answer:
        """Propose any policy kind the kernel knows: POLICY is {"kind": ..., its fields}."""
        if not isinstance(policy, dict) or not isinstance(policy.get("kind"), str):
            raise ToolRefused(
                ReasonCode.SCHEMA_INVALID, 'policy is an object with a "kind"', "policy"
            )
        return await proposed(who, policy, explain, confidence)

    # --- reads ---------------------------------------------------------------------

    @tool(None)
    async def get_memory_context(who: Principal, max_facts: OptInt = None) -> Answer:
        """The memory an agent's context shows: constraints by priority, facts, current rules."""
        limit = None if max_facts is None else checked_seq(max_facts, "max_facts")
        async with backend.reading() as view:
            memory = view.projections.memory
            result = memory.view(limit)
            result["rules"] = [shown_item(r) for r in memory.rulebook.current()[:MAX_RESULTS]]
            result["as_of"] = view.projections.last_seq
        return Answer(verdict="OK", result=result)

    @tool(None)
    async def trace_provenance(who: Principal, fact: OptId = None, seq: OptInt = None) -> Answer:
        """Where a fact (by name) or a memory event (by seq) comes from: agent, flow, verdict."""
        async with backend.reading() as view:
            if fact is not None:
                record = view.projections.memory.facts.get(checked_text(fact, "fact"))
                if record is None:
                    raise ToolRefused(CliError.BAD_ARGUMENT, f"no fact {fact!r}", "fact")
                seq = record.seq
            at = checked_seq(seq, "seq")
            found = await view.journal.read(at, at + 1)
            if not found:
                raise ToolRefused(CliError.UNKNOWN_SEQ, f"no event #{at}", "seq")
            event = found[0]
            flow = await view.journal.flow_events(event.dfid) if event.dfid else []
        result: dict[str, Any] = {
            "seq": event.seq,
            "type": type(event.payload).__name__,
            "payload": msgspec.to_builtins(event.payload),
            "agent_id": event.agent_id,
            "caused_by": event.caused_by,
            "ts": event.ts,
            "flow": [{"seq": e.seq, "type": type(e.payload).__name__} for e in flow],
        }
        for e in flow:
            proposal = getattr(e.payload, "proposal", None)
            if proposal is not None and type(e.payload).__name__ == "ProposalSubmitted":
                result["proposal"] = msgspec.to_builtins(proposal)
        return Answer(verdict="OK", dfid=event.dfid or "", result=result)

    @tool(None)
    async def time_travel(who: Principal, at: Int) -> Answer:
        """The memory and state as they were right after event AT."""
        seq = checked_seq(at, "at")
        async with backend.reading() as view:
            if seq > view.journal.head_seq:
                raise ToolRefused(
                    CliError.UNKNOWN_SEQ, f"the journal has events 1..{view.journal.head_seq}", "at"
                )
            then = await state_at(view.journal, seq)
        result = then.memory.view()
        result["state"] = {k: fact.value for k, fact in sorted(then.state.items())}
        result["at"] = seq
        return Answer(verdict="OK", result=result)

    @tool(None)
    async def simulate_timeline(
        who: Principal,
        constraint: OptText = None,
        at: Int = 1,
        priority: Priority = "required",
        exclude: Ints = None,
    ) -> Answer:
        """Replay the journal in another history: which recorded verdicts would change."""
        skipped = exclude or []
        if not isinstance(skipped, list):
            raise ToolRefused(ReasonCode.SCHEMA_INVALID, "a list of event seqs", "exclude")
        seqs = [checked_seq(s, "exclude") for s in skipped]
        text = None if constraint is None else checked_text(constraint, "constraint")
        if priority not in ("required", "learned", "preferred"):
            raise ToolRefused(
                ReasonCode.SCHEMA_INVALID, "required, learned or preferred", "priority"
            )
        if text is None and not seqs:
            raise ToolRefused(CliError.BAD_ARGUMENT, "give a constraint or events to exclude")
        async with backend.reading() as view:
            replay = await whatif(
                view.journal,
                exclude=seqs,
                constraint=text,
                at=checked_seq(at, "at"),
                priority=priority,
            )
        changes = [msgspec.to_builtins(c) for c in replay.changes[:MAX_RESULTS]]
        return Answer(verdict="OK", result={"judged": replay.judged, "changes": changes})

    @tool(None)
    async def wait_flow(who: Principal, dfid: Id, timeout_s: OptInt = None) -> Answer:
        """Read flow DFID as its proposer sees it; with timeout_s (0 to 30 seconds), first
        wait up to that long for it to end (an escalated flow ends once a human decided).

        An agent reads only its own flows. The answer is the flow's verdict as it stands:
        ACCEPTED, REJECTED, ESCALATED (still waiting) or the status of an open flow.
        """
        key = checked_text(dfid, "dfid", 256)
        if timeout_s is not None and (
            not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or timeout_s < 0
        ):
            raise ToolRefused(ReasonCode.SCHEMA_INVALID, "timeout_s is 0 to 30", "timeout_s")
        bounded = float(min(timeout_s or 0, MAX_WAIT_S))
        flow = await _flow_of(key, who)
        if bounded and not flow.terminal:
            flow = await _wait_end(key, who, bounded)
        async with backend.reading() as view:
            events = await view.journal.read(dfid=key)
        answer = settled(flow, events)
        if not flow.terminal and flow.status is not FlowStatus.ESCALATED:
            return Answer(verdict="PENDING", dfid=key, status=str(flow.status))
        return Answer(**msgspec.to_builtins(answer))

    async def _flow_of(key: str, who: Principal) -> FlowState:
        async with backend.reading() as view:
            flow = view.projections.flows.get(key)
        if flow is None:
            raise ToolRefused(CliError.UNKNOWN_FLOW, f"no open or recent flow {key}", "dfid")
        if who.role == "agent" and flow.agent_id != who.name:
            # The same answer as an unknown flow: an agent learns nothing of others' flows.
            raise ToolRefused(CliError.UNKNOWN_FLOW, f"no open or recent flow {key}", "dfid")
        return flow

    async def _wait_end(key: str, who: Principal, bounded: float) -> FlowState:
        if isinstance(backend, Embedded):
            await backend.kernel.await_decision(key, bounded)  # woken by the journal
            return await _flow_of(key, who)
        # Another process's kernel: nothing wakes this one, so read the journal again.
        with anyio.move_on_after(bounded):
            while True:
                await anyio.sleep(backend.poll_s)
                flow = await _flow_of(key, who)
                if flow.terminal:
                    return flow
        return await _flow_of(key, who)

    # --- operators -------------------------------------------------------------------

    @tool("operator")
    async def list_escalations(who: Principal) -> Answer:
        """The flows waiting for a human, oldest first."""
        async with backend.reading() as view:
            waiting = []
            for dfid, approval in sorted(
                view.projections.approvals.items(), key=lambda item: item[1].escalated_seq
            ):
                flow = view.projections.flows.get(dfid)
                if flow is None or flow.status is not FlowStatus.ESCALATED:
                    continue
                if approval.status is not ApprovalStatus.PENDING:
                    continue
                waiting.append(
                    {
                        "dfid": dfid,
                        "agent_id": approval.agent_id,
                        "reason_code": str(approval.reason_code),
                        "detail": approval.detail,
                        "impact": str(approval.impact),
                        "action_hash": approval.short_hash,
                        "kind": flow.proposal.kind if flow.proposal else "",
                    }
                )
        return Answer(verdict="OK", result={"escalations": waiting[:MAX_RESULTS]})

    @tool("operator")
    async def review(who: Principal, dfid: Id) -> Answer:
        """Everything needed to decide on one escalated flow."""
        key = checked_text(dfid, "dfid", 256)
        async with backend.reading() as view:
            flow = view.projections.flows.get(key)
            approval = view.projections.approvals.get(key)
        if flow is None:
            raise ToolRefused(CliError.UNKNOWN_FLOW, f"no open or recent flow {key}", "dfid")
        result: dict[str, Any] = {
            "agent_id": flow.agent_id,
            "topic": flow.topic,
            "proposal": msgspec.to_builtins(flow.proposal) if flow.proposal else None,
        }
        if approval is not None:
            result.update(
                reason_code=str(approval.reason_code),
                detail=approval.detail,
                impact=str(approval.impact),
                approval=str(approval.status),
                action_hash=approval.action_hash,
            )
        return Answer(verdict="OK", dfid=key, status=str(flow.status), result=result)

    @tool("operator")
    async def decide(
        who: Principal,
        dfid: Id,
        decision: Annotated[
            Any,
            WithJsonSchema({"type": "string", "enum": ["approve", "modify", "reject"]}),
            Rule.ID,
        ],
        reason: Text,
        params: Obj = None,
        action_hash: OptId = None,
    ) -> Answer:
        """Decide on an escalated flow: approve (a HIGH_IMPACT action takes its action hash
        typed back), modify (whole new params, judged again) or reject; recorded with why."""
        answer = await backend.decide(dfid, decision, who.name, reason, params, action_hash)
        return Answer(**answer)

    @tool("operator")
    async def agent_status(
        who: Principal, agent_id: Id, status: OptId = None, reason: OptText = None
    ) -> Answer:
        """An agent's status and manifest; with STATUS and REASON, change it (recorded)."""
        key = checked_text(agent_id, "agent_id", 256)
        if status is not None:
            answer = await backend.set_agent_status(key, status, who.name, reason or "")
            return Answer(**{k: v for k, v in answer.items() if k in Answer.model_fields})
        async with backend.reading() as view:
            agent = view.projections.agents.get(key)
        if agent is None:
            raise ToolRefused(ReasonCode.UNKNOWN_AGENT, f"no agent {key!r}", "agent_id")
        return Answer(
            verdict="OK",
            status=str(agent.status),
            result={"manifest": msgspec.to_builtins(agent.manifest)},
        )

    add_rulebook(server, tool, backend)
    _schema_of_propose(server, backend.kinds)
    return server


def _schema_of_propose(server: MCPServer[Any], kinds: Mapping[str, dict[str, Any]]) -> None:
    """Put each kind's JSON Schema into ``propose``'s input schema (``policy`` is one of them)."""
    defs: dict[str, Any] = {}
    options = []
    for name in sorted(kinds):
        schema = kinds[name]
        defs.update(schema.get("$defs", {}))
        options.append({k: v for k, v in schema.items() if k != "$defs"})
    tool = server._tool_manager.get_tool("propose")
    if tool is None or not options:
        return
    parameters = dict(tool.parameters)
    properties = dict(parameters.get("properties", {}))
    properties["policy"] = {"anyOf": options, "description": "the policy: one of these kinds"}
    parameters["properties"] = properties
    parameters["$defs"] = {**parameters.get("$defs", {}), **defs}
    tool.parameters = parameters
