"""The MCP server: the kernel's memory, rulebook and decisions as tools.

Every write is a proposal through the DIM or an operator's act on record;
reads come from projections of the journal. Each tool answers one structured
:class:`Answer`: a proposal's verdict (ACCEPTED; REJECTED with the reason code
and the feedback to revise on; ESCALATED with the DFID), an operator act's
outcome, or what was read. Bad input is an answer too: ERROR with a reason
code (or one of ``dirk``'s codes, such as UNKNOWN_RULE), marked ``isError``,
and recorded by the kernel wherever a proposal or a human act was involved.

Arguments are declared with their JSON types for hosts and models, but taken
as they come, so a wrong type reaches the kernel's own checks (and its record)
instead of stopping in the SDK's validation with no reason code.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, WithJsonSchema

from kernel.audit.counterfactual import whatif
from kernel.core.errors import KernelShutdown
from kernel.core.events import RuleProposed
from kernel.core.flow import FlowStatus
from kernel.core.reasons import CliError, ReasonCode
from kernel.mcp._backend import Backend, Principal, RuleAct, Settled, ToolRefused
from kernel.state.approvals import ApprovalStatus
from kernel.state.rulebook import history, select, shown_item
from kernel.state.snapshots import state_at

log = logging.getLogger(__name__)

Text = Annotated[Any, WithJsonSchema({"type": "string"})]
OptText = Annotated[Any, WithJsonSchema({"type": ["string", "null"]})]
Int = Annotated[Any, WithJsonSchema({"type": "integer"})]
OptInt = Annotated[Any, WithJsonSchema({"type": ["integer", "null"]})]
Number = Annotated[Any, WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1})]
Ints = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "integer"}})]
Labels = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "string"}})]
Obj = Annotated[Any, WithJsonSchema({"type": ["object", "null"]})]
Priority = Annotated[
    Any, WithJsonSchema({"type": "string", "enum": ["required", "learned", "preferred"]})
]

MAX_RESULTS = 100
"""The most items a listing or a search returns."""


class Answer(BaseModel):
    """What every tool answers (its structured content)."""

    verdict: str
    """ACCEPTED, REJECTED, ESCALATED (proposals); APPLIED, QUEUED, REFUSED (operator acts);
    OK (reads); ERROR (refused input)."""
    dfid: str = ""
    status: str = ""
    reason_code: str | None = None
    detail: str = ""
    field: str = ""
    result: dict[str, Any] = {}


Reply = Annotated[CallToolResult, Answer]


def reply(answer: Answer) -> CallToolResult:
    """Return ``answer`` as a tool result: structured, with a text copy for older hosts."""
    body = answer.model_dump(mode="json")
    text = msgspec.json.encode(body).decode()
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=body,
        is_error=answer.verdict == "ERROR",
    )


def refused(code: str, detail: str, field: str = "") -> CallToolResult:
    return reply(Answer(verdict="ERROR", reason_code=code, detail=detail, field=field))


class Identity:
    """Who calls: a fixed principal (stdio, in process), or one per bearer token (HTTP).

    Args:
        default: the principal of a call that carries no token (stdio, in process).
        tokens: principals by bearer token; when given, a call must carry one.
    """

    def __init__(
        self, default: Principal | None = None, tokens: Mapping[str, Principal] | None = None
    ) -> None:
        self.default = default
        self.tokens = dict(tokens or {})

    def of(self, ctx: Context[Any, Any]) -> Principal:
        headers = None
        try:
            headers = ctx.headers
        except ValueError:
            headers = None
        if self.tokens:
            value = (headers or {}).get("authorization", "")
            scheme, _, token = value.partition(" ")
            principal = self.tokens.get(token) if scheme.lower() == "bearer" else None
            if principal is None:
                raise ToolRefused(ReasonCode.INVALID_SESSION, "no valid bearer token")
            return principal
        if self.default is None:
            raise ToolRefused(ReasonCode.UNAUTHORIZED, "this server has no principal")
        return self.default


def _text(value: Any, field: str, limit: int = 4096) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ToolRefused(
            ReasonCode.SCHEMA_INVALID, f"a non-empty string of at most {limit} characters", field
        )
    return value


def _seq(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 2**63:
        raise ToolRefused(ReasonCode.SCHEMA_INVALID, "a non-negative integer (an event seq)", field)
    return value


def build_server(
    backend: Backend, identity: Identity, *, name: str = "dirk", lifespan: Any = None
) -> MCPServer[Any]:
    """Return the MCP server over ``backend``, its callers known by ``identity``."""
    server: MCPServer[Any] = MCPServer(
        name,
        version="0.1.0",
        instructions=(
            "A governed memory and rulebook: every write is a proposal the kernel judges."
            " Read a REJECTED verdict's reason_code and detail, revise, and call again."
        ),
        lifespan=lifespan,
        log_level="WARNING",
    )

    def tool(
        role: str | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a tool that answers errors as ERROR answers and checks the caller's role."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            async def run(ctx: Context[Any, Any], **kw: Any) -> CallToolResult:
                try:
                    who = identity.of(ctx)
                    if role is not None and who.role != role:
                        raise ToolRefused(
                            ReasonCode.UNAUTHORIZED,
                            f"{fn.__name__} is for {role}s; {who.name} is an {who.role}",
                        )
                    answer = await fn(who, **kw)
                except ToolRefused as exc:
                    return refused(str(exc.code), exc.detail, exc.field)
                except KernelShutdown as exc:
                    # Not a reason code of a decision: the StopReason says why it stopped.
                    return refused(str(exc.reason), f"the kernel stopped: {exc.detail}")
                except Exception as exc:
                    # Fail clear: the caller gets a code, the log the traceback, the kernel runs on.
                    log.exception("MCP tool %s failed", fn.__name__)
                    return refused(ReasonCode.KERNEL_FAULT, f"{fn.__name__}: {type(exc).__name__}")
                if fn.__name__.startswith("admin_") and answer.verdict == "APPLIED":
                    await _rules_changed(ctx)
                return reply(answer)

            run.__signature__ = _signature(fn)  # type: ignore[attr-defined]
            run.__name__ = fn.__name__
            run.__doc__ = fn.__doc__
            server.add_tool(run, name=fn.__name__, description=fn.__doc__)
            return fn

        return register

    async def proposed(who: Principal, policy: dict[str, Any], explain: Any, conf: Any) -> Answer:
        settled: Settled = await backend.propose(who.name, policy, explain, conf)
        return Answer(**msgspec.to_builtins(settled))

    # --- agent tools: every write a proposal -----------------------------------------

    @tool("agent")
    async def add_fact(
        who: Principal, name: Text, value: Text, confidence: Text = "1", explain: Text = ""
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

    @tool()
    async def get_memory_context(who: Principal, max_facts: OptInt = None) -> Answer:
        """The memory an agent's context shows: constraints by priority, facts, current rules."""
        limit = None if max_facts is None else _seq(max_facts, "max_facts")
        async with backend.reading() as view:
            memory = view.projections.memory
            result = memory.view(limit)
            result["rules"] = [shown_item(r) for r in memory.rulebook.current()[:MAX_RESULTS]]
            result["as_of"] = view.projections.last_seq
        return Answer(verdict="OK", result=result)

    @tool()
    async def trace_provenance(who: Principal, fact: OptText = None, seq: OptInt = None) -> Answer:
        """Where a fact (by name) or a memory event (by seq) comes from: agent, flow, verdict."""
        async with backend.reading() as view:
            if fact is not None:
                record = view.projections.memory.facts.get(_text(fact, "fact"))
                if record is None:
                    raise ToolRefused(CliError.BAD_ARGUMENT, f"no fact {fact!r}", "fact")
                seq = record.seq
            at = _seq(seq, "seq")
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

    @tool()
    async def time_travel(who: Principal, at: Int) -> Answer:
        """The memory and state as they were right after event AT."""
        seq = _seq(at, "at")
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

    @tool()
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
        seqs = [_seq(s, "exclude") for s in skipped]
        text = None if constraint is None else _text(constraint, "constraint")
        if priority not in ("required", "learned", "preferred"):
            raise ToolRefused(
                ReasonCode.SCHEMA_INVALID, "required, learned or preferred", "priority"
            )
        if text is None and not seqs:
            raise ToolRefused(CliError.BAD_ARGUMENT, "give a constraint or events to exclude")
        async with backend.reading() as view:
            replay = await whatif(
                view.journal, exclude=seqs, constraint=text, at=_seq(at, "at"), priority=priority
            )
        changes = [msgspec.to_builtins(c) for c in replay.changes[:MAX_RESULTS]]
        return Answer(verdict="OK", result={"judged": replay.judged, "changes": changes})

    # --- the rulebook ----------------------------------------------------------------

    @tool()
    async def search_rules(who: Principal, q: Text, k: Int = 5) -> Answer:
        """The current rules most relevant to Q (at most K)."""
        query, count = _text(q, "q"), min(_seq(k, "k"), MAX_RESULTS)
        async with backend.reading() as view:
            found = select(view.projections.memory.rulebook, query, count)
        return Answer(verdict="OK", result={"rules": [shown_item(r) for r in found]})

    @tool()
    async def compile_memory(who: Principal, prompt: Text, k: Int = 5) -> Answer:
        """The memory layer for a task: the K rules relevant to PROMPT, constraints and facts."""
        query, count = _text(prompt, "prompt"), min(_seq(k, "k"), MAX_RESULTS)
        async with backend.reading() as view:
            memory = view.projections.memory
            result = memory.view(MAX_RESULTS)
            result["rules"] = [shown_item(r) for r in select(memory.rulebook, query, count)]
        return Answer(verdict="OK", result=result)

    @tool()
    async def get_rule(who: Principal, item_id: Text) -> Answer:
        """The current version of rule ITEM_ID."""
        rule = _text(item_id, "item_id", 256)
        async with backend.reading() as view:
            item = view.projections.memory.rulebook.items.get(rule)
        current = item.current if item is not None else None
        if current is None:
            raise ToolRefused(CliError.UNKNOWN_RULE, f"no rule {rule!r} in force", "item_id")
        return Answer(verdict="OK", result=shown_item(current))

    @tool()
    async def why(who: Principal, item_id: Text) -> Answer:
        """Rule ITEM_ID's versions, the decisions on it, and where each version comes from."""
        rule = _text(item_id, "item_id", 256)
        async with backend.reading() as view:
            events = await view.journal.read(types=["RuleProposed", "RuleDecided", "RuleRetracted"])
        item = history(events).items.get(rule)
        if item is None:
            raise ToolRefused(CliError.UNKNOWN_RULE, f"no rule {rule!r}", "item_id")
        proposals = {e.seq: e.payload for e in events if isinstance(e.payload, RuleProposed)}
        result = {
            "versions": [msgspec.to_builtins(v) for v in item.versions],
            "decisions": [msgspec.to_builtins(d) for d in item.decisions],
            "proposers": {
                str(d.proposal): proposals[d.proposal].proposer
                for d in item.decisions
                if d.proposal in proposals
            },
        }
        return Answer(verdict="OK", result=result)

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
    async def review(who: Principal, dfid: Text) -> Answer:
        """Everything needed to decide on one escalated flow."""
        key = _text(dfid, "dfid", 256)
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
        dfid: Text,
        decision: Annotated[
            Any, WithJsonSchema({"type": "string", "enum": ["approve", "modify", "reject"]})
        ],
        reason: Text,
        params: Obj = None,
        action_hash: OptText = None,
    ) -> Answer:
        """Decide on an escalated flow: approve (a HIGH_IMPACT action takes its action hash
        typed back), modify (whole new params, judged again) or reject; recorded with why."""
        answer = await backend.decide(dfid, decision, who.name, reason, params, action_hash)
        return Answer(**answer)

    @tool("operator")
    async def agent_status(
        who: Principal, agent_id: Text, status: OptText = None, reason: OptText = None
    ) -> Answer:
        """An agent's status and manifest; with STATUS and REASON, change it (recorded)."""
        key = _text(agent_id, "agent_id", 256)
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

    # --- the rulebook's administration (operators only) -----------------------------

    def _labels(value: Any) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ToolRefused(ReasonCode.SCHEMA_INVALID, "a list of strings", "labels")
        return list(value)

    async def rule_act(who: Principal, action: str, reason: Any, **fields: Any) -> Answer:
        act = RuleAct(action=action, operator=who.name, reason=_text(reason, "reason"), **fields)
        answer = await backend.rule_act(act)
        return Answer(**answer)

    @tool("operator")
    async def admin_list_proposals(who: Principal) -> Answer:
        """The rule proposals the promoter deferred to an operator, oldest first."""
        async with backend.reading() as view:
            pending = sorted(view.projections.memory.rulebook.pending.items())
        proposals = [
            {
                "proposal_seq": seq,
                "rule": p.rule,
                "title": p.title,
                "content": p.content,
                "proposer": p.proposer,
                "reason": p.reason,
                "base_version": p.base_version,
            }
            for seq, p in pending[:MAX_RESULTS]
        ]
        return Answer(verdict="OK", result={"proposals": proposals})

    @tool("operator")
    async def admin_approve_proposal(who: Principal, proposal_seq: Int, reason: Text) -> Answer:
        """Put deferred proposal PROPOSAL_SEQ in force (an override, recorded with why)."""
        return await rule_act(
            who, "override", reason, proposal_seq=_seq(proposal_seq, "proposal_seq")
        )

    @tool("operator")
    async def admin_reject_proposal(who: Principal, proposal_seq: Int, reason: Text) -> Answer:
        """Drop deferred proposal PROPOSAL_SEQ (recorded with why)."""
        return await rule_act(who, "skip", reason, proposal_seq=_seq(proposal_seq, "proposal_seq"))

    @tool("operator")
    async def admin_create_rule(
        who: Principal,
        item_id: Text,
        title: Text,
        content: Text,
        reason: Text,
        labels: Labels = None,
    ) -> Answer:
        """Put a new rule in force (recorded as an operator's override, with why)."""
        return await rule_act(
            who,
            "add",
            reason,
            rule=_text(item_id, "item_id", 256),
            title=_text(title, "title"),
            content=_text(content, "content", 32 * 1024),
            labels=_labels(labels),
        )

    @tool("operator")
    async def admin_update_rule(
        who: Principal,
        item_id: Text,
        title: Text,
        content: Text,
        reason: Text,
        labels: Labels = None,
    ) -> Answer:
        """Put a new version of rule ITEM_ID in force (an override, with why)."""
        rule = _text(item_id, "item_id", 256)
        async with backend.reading() as view:
            item = view.projections.memory.rulebook.items.get(rule)
        if item is None or item.current is None:
            raise ToolRefused(CliError.UNKNOWN_RULE, f"no rule {rule!r} in force", "item_id")
        return await rule_act(
            who,
            "edit",
            reason,
            rule=rule,
            title=_text(title, "title"),
            content=_text(content, "content", 32 * 1024),
            labels=_labels(labels),
        )

    @tool("operator")
    async def admin_delete_rule(who: Principal, item_id: Text, reason: Text) -> Answer:
        """Retract rule ITEM_ID: agents no longer see it; its history stays (RuleRetracted)."""
        return await rule_act(who, "retract", reason, rule=_text(item_id, "item_id", 256))

    # --- resources and the prompt ----------------------------------------------------

    @server.resource("im://rules/current", mime_type="application/json")
    async def rules_current() -> str:
        """Every rule in force, current version each."""
        async with backend.reading() as view:
            current = view.projections.memory.rulebook.current()
        return msgspec.json.encode([shown_item(r) for r in current]).decode()

    @server.resource("im://rules/{item_id}", mime_type="application/json")
    async def rule_by_id(item_id: str) -> str:
        """Rule ITEM_ID's current version (null when none is in force)."""
        async with backend.reading() as view:
            item = view.projections.memory.rulebook.items.get(item_id)
        current = item.current if item is not None else None
        return msgspec.json.encode(shown_item(current) if current else None).decode()

    @server.prompt()
    async def apply_rulebook_prompt(task: str, k: int = 5) -> str:
        """Instructions to carry out TASK under the rules relevant to it, cited by id@version."""
        async with backend.reading() as view:
            found = select(view.projections.memory.rulebook, task, max(1, min(k, MAX_RESULTS)))
        lines = [f"Task: {task}", "", "Follow these rules of the house rulebook:"]
        lines += [f"- {r.cite} {r.title}: {r.content}" for r in found] or ["- (none)"]
        lines += [
            "",
            "Cite each rule you apply as [rule:id@vN] in your explanation. Every write is a"
            " proposal the kernel judges: on REJECTED, read the reason code and revise.",
        ]
        return "\n".join(lines)

    _schema_of_propose(server, backend.kinds)
    return server


async def _rules_changed(ctx: Context[Any, Any]) -> None:
    """Tell listening clients the rules changed (best effort: a write never fails on it)."""
    try:
        await ctx.notify_resource_updated("im://rules/current")
        await ctx.notify_resources_changed()
    except Exception:  # the act is recorded already; a missed notification only delays a read
        log.debug("no listener took the rules-changed notification", exc_info=True)


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


def _signature(fn: Callable[..., Any]) -> Any:
    """``fn``'s signature with the principal replaced by the SDK's Context."""
    import inspect

    sig = inspect.signature(fn, eval_str=True)
    params = list(sig.parameters.values())[1:]
    ctx = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    return sig.replace(parameters=[ctx, *params], return_annotation=Reply)


@asynccontextmanager
async def nothing(_: Any) -> AsyncIterator[None]:
    yield None
