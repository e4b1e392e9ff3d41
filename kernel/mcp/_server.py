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

import base64
from collections.abc import Mapping
from typing import Annotated, Any

import anyio
import msgspec
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.subscriptions import SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import WithJsonSchema

from kernel.audit.counterfactual import whatif
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.reasons import CliError, ReasonCode
from kernel.mcp._backend import Backend, Embedded, Principal, Settled, ToolRefused, settled
from kernel.mcp._offered import Offer, offer_of
from kernel.mcp._rules import add_rulebook
from kernel.mcp._tasks import Tasks, flow_reader, kernel_canceller
from kernel.mcp._tenancy import check_flow, refuse_on_record, rule_space
from kernel.mcp._tools import (
    ACT,
    EFFECT,
    MAX_RESULTS,
    PROPOSE,
    READ,
    Answer,
    CodedServer,
    Confidence,
    Id,
    Identity,
    Int,
    Ints,
    Labels,
    Number,
    Obj,
    OptId,
    OptInt,
    OptText,
    Priority,
    Rule,
    Text,
    checked_confidence,
    checked_seq,
    checked_text,
    registrar,
)
from kernel.mcp._words import escalation_item, escalations_summary, quorum_text, review_summary
from kernel.registry import KERNEL_VERSION
from kernel.state.approvals import ApprovalStatus
from kernel.state.quorums import Quorums
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
    auth: AuthSettings | None = None,
    token_verifier: TokenVerifier | None = None,
    currency: str = "USD",
) -> MCPServer[Any]:
    """Return the MCP server over ``backend``, its callers known by ``identity``.

    ``currency`` is the one whose minor units the packs' reasons quote: each answer's
    ``summary`` (and its first text) shows them in it, durations in the largest sensible
    unit; ``none`` leaves amounts as recorded. ``detail`` is always as recorded.

    ``bus`` carries change events to ``subscriptions/listen`` clients: give the same
    one to :func:`kernel.mcp.watch_rules` to tell them when the rules change.
    ``auth`` and ``token_verifier`` guard its streamable HTTP app with the SDK's
    bearer check and protected-resource metadata (see kernel.mcp._http.http_auth).
    """

    def caller(ctx: Any) -> Principal:
        try:
            return identity.of(Context(request_context=ctx, mcp_server=server))
        except ToolRefused as exc:
            raise MCPError(INVALID_PARAMS, exc.detail, {"reason_code": str(exc.code)}) from None

    # Beside a kernel a cancelled task withdraws its flow; a follower has no such door.
    cancel = kernel_canceller(backend.kernel) if isinstance(backend, Embedded) else None
    tasks = Tasks(flow_reader(backend, currency), caller, cancel, currency)
    server: MCPServer[Any] = CodedServer(
        name,
        title="dirk: a governed memory, rulebook and decisions",
        version=KERNEL_VERSION,
        auth=auth,
        token_verifier=token_verifier,
        instructions=(
            "A governed memory and rulebook: every write is a proposal the kernel judges."
            " Read a REJECTED verdict's reason_code and detail, revise, and call again."
        ),
        lifespan=lifespan,
        log_level="WARNING",
        subscriptions=bus,
        # Escalated calls answered as tasks on 2026-07-28, for clients that declare it.
        extensions=[tasks],
    )
    if isinstance(server, CodedServer):
        server.currency = currency
    tool = registrar(server, identity)

    async def offered(who: Principal) -> Offer:
        async with backend.reading() as view:
            return offer_of(backend, view, who)

    async def proposed(
        who: Principal, policy: dict[str, Any], explain: Any, conf: Any, tool: str
    ) -> Answer:
        kind = policy.get("kind")
        if isinstance(kind, str):
            refusal = (await offered(who)).refusal(kind)
            if refusal is not None:
                # A kind this agent is not offered: refused before any flow, on record.
                raise await refuse_on_record(backend, who, tool, refusal, kind)
        settled: Settled = await backend.propose(who.name, policy, explain, conf, who.on_behalf)
        return Answer(**msgspec.to_builtins(settled))

    # --- agent tools: every write a proposal -----------------------------------------

    @tool("agent", title="Remember a fact", hints=PROPOSE)
    async def add_fact(
        who: Principal, name: Id, value: Text, confidence: Confidence = "1", explain: Text = ""
    ) -> Answer:
        """Propose remembering that NAME is VALUE; the kernel judges it and records the fact.

        Args:
            name: the fact's name, e.g. "guest.wheelchair"; a later fact of the same name
                replaces it.
            value: what the fact says, as text.
            confidence: how sure the agent is, a decimal from 0 to 1 ("0.9"); default "1".
            explain: why the agent proposes it (recorded with the proposal).
        """
        policy = {"kind": "memory.add_fact", "name": name, "value": value}
        policy["confidence"] = checked_confidence(confidence)
        return await proposed(who, policy, explain or f"remember {name}", 1.0, "add_fact")

    @tool("agent", title="Add a constraint", hints=PROPOSE)
    async def add_constraint(
        who: Principal,
        text: Text,
        priority: Priority = "required",
        triggered_by: OptInt = None,
        explain: Text = "",
        kinds: Labels = None,
        params: Labels = None,
    ) -> Answer:
        """Propose a constraint: 'never X', 'avoid X', 'verify X before Y', 'always X'.

        Args:
            text: the constraint in words: "never X", "avoid X", "verify X before Y" or
                "always X".
            priority: required (refuses), learned (from a mistake) or preferred (flags only).
            triggered_by: for a learned constraint, the seq of the event of the mistake it
                learns from.
            explain: why the agent proposes it (recorded with the proposal).
            kinds: scope the constraint to these policy kinds only.
            params: scope it to these parameters of theirs only.

        A constraint contradicting an active one is refused (CONSTRAINT_CONFLICT).
        """
        policy: dict[str, Any] = {"kind": "memory.add_constraint", "text": text}
        policy["priority"] = priority
        if triggered_by is not None:
            policy["triggered_by"] = triggered_by
        for name, value in (("kinds", kinds), ("params", params)):
            if value is not None:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ToolRefused(ReasonCode.SCHEMA_INVALID, "a list of strings", name)
                policy[name] = value
        return await proposed(who, policy, explain or "constraint", 1.0, "add_constraint")

    @tool("agent", title="Record a decision", hints=PROPOSE)
    async def record_decision(
        who: Principal, text: Text, rationale: Text = "", refs: Ints = None, explain: Text = ""
    ) -> Answer:
        """Propose recording a decision; the kernel checks it against every active constraint.

        Args:
            text: the decision in words, e.g. "book room 12 for the guest".
            rationale: why the decision was taken.
            refs: the seqs of the events (facts, queries) the decision rests on.
            explain: why the agent proposes it (recorded with the proposal).
        """
        policy = {"kind": "memory.record_decision", "text": text, "rationale": rationale}
        if refs is not None:
            policy["refs"] = refs
        return await proposed(who, policy, explain or f"{text}", 1.0, "record_decision")

    @tool("agent", title="Query memory (recorded)", hints=PROPOSE)
    async def query_memory(who: Principal, topic: Text, explain: Text = "") -> Answer:
        """Consult memory about TOPIC; the query is recorded (it is what verification needs).

        Args:
            topic: what to look up, in words; a constraint "verify X before Y" is met by a
                recorded query about X.
            explain: why the agent asks (recorded with the query).
        """
        policy = {"kind": "memory.query", "topic": topic}
        return await proposed(who, policy, explain or f"query {topic}", 1.0, "query_memory")

    @tool("agent", title="Read an artifact", hints=READ)
    async def fetch_artifact(
        who: Principal, dfid: Id, ref: Id, start: Int = 0, length: OptInt = None
    ) -> Answer:
        """Read bytes of an artifact a context of your flow referenced, base64-encoded.

        Anything a context of your flow did not reference is refused, on record, and so is
        a flow of another tenant than yours (answered as unknown).

        Args:
            dfid: your flow, whose context listed the artifact (under ``artifacts``).
            ref: the artifact's reference, as the context lists it.
            start: the first byte to read (default 0).
            length: read at most this many bytes (default and most: 256 KiB).
        """
        flow = checked_text(dfid, "dfid", 256)
        name = checked_text(ref, "ref", 256)
        first = checked_seq(start, "start")
        count = None if length is None else checked_seq(length, "length")
        async with backend.reading() as view:
            # An agent serving several tenants reads a flow of the caller's tenant only.
            await check_flow(backend, view, who, "fetch_artifact", flow)
        piece = await backend.fetch_artifact(who.name, flow, name, first, count)
        result = {
            "ref": piece.ref,
            "start": piece.start,
            "size": piece.size,
            "media_type": piece.media_type,
            "more": piece.more,
            "data_base64": base64.b64encode(piece.data).decode("ascii"),
        }
        return Answer(verdict="OK", dfid=flow, result=result)

    @tool("agent", title="Propose an action", hints=EFFECT)
    async def propose(
        who: Principal, policy: Obj, explain: Text = "", confidence: Number = 1.0
    ) -> Answer:
        """Propose any policy kind the kernel knows; an accepted action is executed once.

        Args:
            policy: the action: {"kind": ..., and that kind's fields}; the input schema
                lists every kind the kernel judges.
            explain: why the agent proposes it (recorded; shown to a human on escalation).
            confidence: how sure the agent is, from 0 to 1.
        """
        if not isinstance(policy, dict) or not isinstance(policy.get("kind"), str):
            raise ToolRefused(
                ReasonCode.SCHEMA_INVALID, 'policy is an object with a "kind"', "policy"
            )
        return await proposed(who, policy, explain, confidence, "propose")

    # --- reads ---------------------------------------------------------------------

    @tool(None, title="Memory context", hints=READ)
    async def get_memory_context(who: Principal, max_facts: OptInt = None) -> Answer:
        """The memory an agent's context shows: constraints by priority, facts, current rules.

        Args:
            max_facts: show at most this many facts (default: all, up to 100).
        """
        limit = None if max_facts is None else checked_seq(max_facts, "max_facts")
        space = await rule_space(backend, who, "get_memory_context", None)
        async with backend.reading() as view:
            memory = view.projections.memory
            result = memory.view(limit, who.tenant or "")
            result["rules"] = [shown_item(r) for r in memory.rulebook.current(space)[:MAX_RESULTS]]
            result["as_of"] = view.projections.last_seq
        return Answer(verdict="OK", result=result)

    @tool(None, title="Trace provenance", hints=READ)
    async def trace_provenance(who: Principal, fact: OptId = None, seq: OptInt = None) -> Answer:
        """Where a fact (by name) or a memory event (by seq) comes from: agent, flow, verdict.

        Args:
            fact: the fact's name (give this or seq).
            seq: the seq of a journal event (give this or fact).
        """
        async with backend.reading() as view:
            if fact is not None:
                seen = view.projections.memory.facts_of(who.tenant or "")
                record = seen.get(checked_text(fact, "fact"))
                if record is None:
                    raise ToolRefused(CliError.BAD_ARGUMENT, f"no fact {fact!r}", "fact")
                seq = record.seq
            at = checked_seq(seq, "seq")
            found = await view.journal.read(at, at + 1)
            if not found:
                raise ToolRefused(CliError.UNKNOWN_SEQ, f"no event #{at}", "seq")
            event = found[0]
            if event.dfid:
                await check_flow(backend, view, who, "trace_provenance", event.dfid)
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

    @tool(None, title="Time travel", hints=READ)
    async def time_travel(who: Principal, at: Int) -> Answer:
        """The memory and state as they were right after event AT.

        Args:
            at: the seq of the event after which to look (1 is the journal's first).
        """
        seq = checked_seq(at, "at")
        async with backend.reading() as view:
            if seq > view.journal.head_seq:
                raise ToolRefused(
                    CliError.UNKNOWN_SEQ, f"the journal has events 1..{view.journal.head_seq}", "at"
                )
            then = await state_at(view.journal, seq)
        result = then.memory.view(tenant=who.tenant or "")
        result["state"] = {k: fact.value for k, fact in sorted(then.state.items())}
        result["at"] = seq
        return Answer(verdict="OK", result=result)

    @tool(None, title="Simulate another timeline", hints=READ)
    async def simulate_timeline(
        who: Principal,
        constraint: OptText = None,
        at: Int = 1,
        priority: Priority = "required",
        exclude: Ints = None,
    ) -> Answer:
        """Replay the journal in another history: which recorded verdicts would change.

        Nothing is recorded: the replay runs on a copy of the journal's events.

        Args:
            constraint: a constraint to add to the history, in words ("never X").
            at: the seq of the event after which the constraint holds (default 1).
            priority: the added constraint's priority: required, learned or preferred.
            exclude: the seqs of events to leave out of the history.
        """
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

    @tool(None, title="Wait for a flow", hints=READ)
    async def wait_flow(who: Principal, dfid: Id, timeout_s: OptInt = None) -> Answer:
        """Read a flow as its proposer sees it, first waiting up to timeout_s for it to end.

        An agent reads only its own flows. The answer is the flow's verdict as it stands:
        ACCEPTED, REJECTED, ESCALATED (still waiting) or the status of an open flow; an
        escalated flow ends once a human decided.

        Args:
            dfid: the flow, as a proposal's answer named it.
            timeout_s: wait up to this many seconds (0 to 30) for the flow to end first.
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
        async with backend.reading() as view:
            await check_flow(backend, view, who, "wait_flow", key)
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

    @tool("operator", title="List escalations", hints=READ)
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
                ballot = view.projections.domain(Quorums).ballots.get(dfid)
                waiting.append(escalation_item(flow, approval, ballot, currency))
        shown = waiting[:MAX_RESULTS]
        summary = escalations_summary(shown, len(waiting))
        return Answer(verdict="OK", result={"escalations": shown}, summary=summary)

    @tool("operator", title="Review an escalation", hints=READ)
    async def review(who: Principal, dfid: Id) -> Answer:
        """Everything needed to decide on one escalated flow.

        Args:
            dfid: the flow's DFID, as list_escalations shows it.
        """
        key = checked_text(dfid, "dfid", 256)
        async with backend.reading() as view:
            flow = view.projections.flows.get(key)
            approval = view.projections.approvals.get(key)
            ballot = view.projections.domain(Quorums).ballots.get(key)
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
        if quorum_text(ballot):
            assert ballot is not None
            result["quorum"] = {
                "waiting": quorum_text(ballot),
                "required": ballot.quorum.required,
                "roles": ballot.quorum.roles,
                "votes": [{"operator": v.operator, "vote": v.vote} for v in ballot.votes],
                "may_not_vote": ballot.excluded,
            }
        summary = review_summary(flow, approval, ballot, currency)
        return Answer(
            verdict="OK", dfid=key, status=str(flow.status), result=result, summary=summary
        )

    @tool("operator", title="Decide on an escalation", hints=EFFECT)
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
        """Decide on an escalated flow: approve, modify or reject; recorded with who and why.

        Args:
            dfid: the escalated flow's DFID, as list_escalations shows it.
            decision: approve (the action is executed), modify (new params, judged again)
                or reject (the flow ends).
            reason: why, in words (recorded).
            params: with modify, the action's whole new parameters.
            action_hash: approving a HIGH_IMPACT action takes its action hash typed back, as
                review shows it.
        """
        answer = await backend.decide(dfid, decision, who.name, reason, params, action_hash)
        return Answer(**answer)

    @tool("operator", title="Agent status", hints=ACT)
    async def agent_status(
        who: Principal, agent_id: Id, status: OptId = None, reason: OptText = None
    ) -> Answer:
        """An agent's status and manifest; with STATUS and REASON, change it (recorded).

        Args:
            agent_id: the agent's id.
            status: the new status: ACTIVE, PASSIVE, SUSPENDED or RETIRED (leave out to read).
            reason: why the status changes (recorded; needed with status).
        """
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
    options = _schema_of_propose(server, backend.kinds)
    if isinstance(server, CodedServer):
        server.offered = offered
        server.kind_options = options
    return server


def _schema_of_propose(
    server: MCPServer[Any], kinds: Mapping[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Put each kind's JSON Schema into ``propose``'s input schema (``policy`` is one of them).

    Returns each kind's option of ``policy``'s ``anyOf`` by name: what ``tools/list``
    narrows to the kinds an agent is offered.
    """
    defs: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {}
    for name in sorted(kinds):
        schema = kinds[name]
        defs.update(schema.get("$defs", {}))
        options[name] = {k: v for k, v in schema.items() if k != "$defs"}
    tool = server._tool_manager.get_tool("propose")
    if tool is None or not options:
        return options
    parameters = dict(tool.parameters)
    properties = dict(parameters.get("properties", {}))
    properties["policy"] = {
        "anyOf": list(options.values()),
        "description": "the policy: one of these kinds",
    }
    parameters["properties"] = properties
    parameters["$defs"] = {**parameters.get("$defs", {}), **defs}
    tool.parameters = parameters
    return options
