"""The rulebook seen from MCP: search, compile, get and why; admin tools, resources, prompt.

Reads come from the rulebook projection (kernel.state.rulebook). The admin tools
are operators' acts: beside a kernel they call it (recorded with who and why);
following a journal they queue inbox rows (``rule`` and ``rule_change``) the
kernel applies. A retraction keeps the rule's history (RuleRetracted).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import SubscriptionBus
from mcp.shared.subscriptions import ResourceUpdated

from kernel.core.events import RuleDecided, RuleProposed, RuleRetracted
from kernel.core.reasons import CliError, ReasonCode
from kernel.journal.store import Journal
from kernel.mcp._backend import Backend, Principal, RuleAct, ToolRefused
from kernel.mcp._tenancy import rule_space, tenant_of
from kernel.mcp._tools import (
    ACT,
    MAX_RESULTS,
    PROPOSE,
    READ,
    Answer,
    Id,
    Int,
    Labels,
    OptId,
    Register,
    Text,
    checked_seq,
    checked_text,
)
from kernel.state.memory import compile_memory as compiled
from kernel.state.rulebook import DEFAULT_NS, history, select, shown_item

CURRENT = "im://rules/current"
"""The resource of every rule in force; ``im://rules/{item_id}`` is one rule's."""


async def watch_rules(bus: SubscriptionBus, journal: Journal) -> None:
    """Tell listeners which rules resources changed whenever the journal records a change.

    Whoever changed the rules (an admin tool, ``dirk rules``, an agent's promoted
    proposal, the embedding code), listeners of ``subscriptions/listen`` hear
    ``im://rules/current`` and ``im://rules/<id>`` change. Runs until cancelled;
    ``dirk mcp --kernel`` runs it beside the server, embedding code in its own
    task group (give :func:`kernel.mcp.build_server` the same ``bus``).
    """
    async with journal.subscribe(journal.head_seq + 1) as batches:
        async for batch in batches:
            changed = sorted(
                {
                    e.payload.rule
                    for e in batch
                    if isinstance(e.payload, RuleRetracted)
                    or (isinstance(e.payload, RuleDecided) and e.payload.version > 0)
                }
            )
            if changed:
                await bus.publish(ResourceUpdated(uri=CURRENT))
            for rule in changed:
                await bus.publish(ResourceUpdated(uri=f"im://rules/{rule}"))


def add_rulebook(server: MCPServer[Any], tool: Callable[..., Register], backend: Backend) -> None:
    """Add the rulebook's tools, resources and prompt to ``server``.

    A tool's caller reads its tenant's namespace only (kernel.mcp._tenancy). The
    resources and the prompt, which the SDK calls with no caller, show the default
    namespace only, as they always did.
    """
    # --- the rulebook ----------------------------------------------------------------

    @tool(None, title="Search the rules", hints=READ)
    async def search_rules(who: Principal, q: Text, k: Int = 5, ns: Id = DEFAULT_NS) -> Answer:
        """The current rules of namespace NS most relevant to Q (at most K).

        Args:
            q: what to search for, in words.
            k: return at most this many rules (default 5, at most 100).
            ns: the rule namespace (a tenant or team); "default" unless given.
        """
        query, count = checked_text(q, "q"), min(checked_seq(k, "k"), MAX_RESULTS)
        space = await rule_space(backend, who, "search_rules", checked_text(ns, "ns", 256))
        async with backend.reading() as view:
            found = select(view.projections.memory.rulebook, query, count, ns=space)
        return Answer(verdict="OK", result={"rules": [shown_item(r) for r in found], "ns": space})

    @tool(None, title="Compile memory for a task", hints=READ)
    async def compile_memory(
        who: Principal, prompt: Text, k: Int = 5, ns: Id = DEFAULT_NS
    ) -> Answer:
        """The memory layer for a task: NS's K rules relevant to PROMPT, constraints and facts.

        It carries ``ns`` and ``generated_at`` (the time of the journal's last event).

        Args:
            prompt: the task, in words.
            k: include at most this many rules (default 5, at most 100).
            ns: the rule namespace (a tenant or team); "default" unless given.
        """
        query, count = checked_text(prompt, "prompt"), min(checked_seq(k, "k"), MAX_RESULTS)
        space = await rule_space(backend, who, "compile_memory", checked_text(ns, "ns", 256))
        async with backend.reading() as view:
            head = view.journal.head_seq
            last = await view.journal.read(head, head + 1) if head else []
            result = compiled(
                view.projections.memory,
                query,
                ns=space,
                k=count,
                generated_at_ns=last[0].ts if last else 0,
                max_facts=MAX_RESULTS,
            )
        return Answer(verdict="OK", result=result)

    @tool(None, title="Get a rule", hints=READ)
    async def get_rule(who: Principal, item_id: Id, ns: Id = DEFAULT_NS) -> Answer:
        """The current version of rule ITEM_ID in namespace NS.

        Args:
            item_id: the rule's id, as search_rules shows it.
            ns: the rule namespace (a tenant or team); "default" unless given.
        """
        rule = checked_text(item_id, "item_id", 256)
        space = await rule_space(backend, who, "get_rule", checked_text(ns, "ns", 256))
        async with backend.reading() as view:
            item = view.projections.memory.rulebook.item(rule, space)
        current = item.current if item is not None else None
        if current is None:
            raise ToolRefused(CliError.UNKNOWN_RULE, f"no rule {rule!r} in force", "item_id")
        return Answer(verdict="OK", result=shown_item(current))

    @tool(None, title="Why this rule", hints=READ)
    async def why(who: Principal, item_id: Id, ns: Id = DEFAULT_NS) -> Answer:
        """Rule ITEM_ID's versions, the decisions on it, and where each version comes from.

        Args:
            item_id: the rule's id, as search_rules shows it.
            ns: the rule namespace (a tenant or team); "default" unless given.
        """
        rule = checked_text(item_id, "item_id", 256)
        space = await rule_space(backend, who, "why", checked_text(ns, "ns", 256))
        async with backend.reading() as view:
            events = await view.journal.read(types=["RuleProposed", "RuleDecided", "RuleRetracted"])
        item = history(events).item(rule, space)
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

    # --- the rulebook's administration (operators only) -----------------------------

    def _labels(value: Any) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ToolRefused(ReasonCode.SCHEMA_INVALID, "a list of strings", "labels")
        return list(value)

    async def rule_act(who: Principal, action: str, reason: Any, **fields: Any) -> Answer:
        act = RuleAct(
            action=action, operator=who.name, reason=checked_text(reason, "reason"), **fields
        )
        answer = await backend.rule_act(act)
        return Answer(**answer)

    @tool("operator", title="List rule proposals", hints=READ)
    async def admin_list_proposals(who: Principal, ns: OptId = None) -> Answer:
        """The rule proposals the promoter deferred to an operator, oldest first.

        Args:
            ns: list only this rule namespace's proposals (every namespace unless given).
        """
        space = None if ns is None else checked_text(ns, "ns", 256)
        if space is not None or tenant_of(who, backend) is not None:
            space = await rule_space(backend, who, "admin_list_proposals", space)
        async with backend.reading() as view:
            pending = sorted(view.projections.memory.rulebook.pending.items())
        if space is not None:
            pending = [(seq, p) for seq, p in pending if p.ns == space]
        proposals = [
            {
                "proposal_seq": seq,
                "ns": p.ns,
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

    @tool("operator", title="Approve a rule proposal", hints=ACT)
    async def admin_approve_proposal(who: Principal, proposal_seq: Int, reason: Text) -> Answer:
        """Put deferred proposal PROPOSAL_SEQ in force (an override, recorded with why).

        Args:
            proposal_seq: the proposal's seq, as admin_list_proposals shows it.
            reason: why, in words (recorded).
        """
        return await rule_act(
            who, "override", reason, proposal_seq=checked_seq(proposal_seq, "proposal_seq")
        )

    @tool("operator", title="Reject a rule proposal", hints=ACT)
    async def admin_reject_proposal(who: Principal, proposal_seq: Int, reason: Text) -> Answer:
        """Drop deferred proposal PROPOSAL_SEQ (recorded with why).

        Args:
            proposal_seq: the proposal's seq, as admin_list_proposals shows it.
            reason: why, in words (recorded).
        """
        return await rule_act(
            who, "skip", reason, proposal_seq=checked_seq(proposal_seq, "proposal_seq")
        )

    @tool("operator", title="Create a rule", hints=PROPOSE)
    async def admin_create_rule(
        who: Principal,
        item_id: Id,
        title: Text,
        content: Text,
        reason: Text,
        labels: Labels = None,
        ns: Id = DEFAULT_NS,
    ) -> Answer:
        """Put a new rule in force in namespace NS (an operator's override, with why).

        Args:
            item_id: the new rule's id, e.g. "refunds.over-500".
            title: the rule's title, one line.
            content: what the rule says agents must do.
            reason: why, in words (recorded).
            labels: labels that help search find the rule.
            ns: the rule namespace (a tenant or team); "default" unless given.
        """
        return await rule_act(
            who,
            "add",
            reason,
            ns=await rule_space(backend, who, "admin_create_rule", checked_text(ns, "ns", 256)),
            rule=checked_text(item_id, "item_id", 256),
            title=checked_text(title, "title"),
            content=checked_text(content, "content", 32 * 1024),
            labels=_labels(labels),
        )

    @tool("operator", title="Update a rule", hints=ACT)
    async def admin_update_rule(
        who: Principal,
        item_id: Id,
        title: Text,
        content: Text,
        reason: Text,
        labels: Labels = None,
        ns: Id = DEFAULT_NS,
    ) -> Answer:
        """Put a new version of rule ITEM_ID of namespace NS in force (an override, with why).

        Args:
            item_id: the rule's id, as search_rules shows it.
            title: the new version's title, one line.
            content: what the new version says agents must do.
            reason: why, in words (recorded).
            labels: labels that help search find the rule.
            ns: the rule namespace (a tenant or team); "default" unless given.
        """
        rule = checked_text(item_id, "item_id", 256)
        space = await rule_space(backend, who, "admin_update_rule", checked_text(ns, "ns", 256))
        async with backend.reading() as view:
            item = view.projections.memory.rulebook.item(rule, space)
        if item is None or item.current is None:
            raise ToolRefused(CliError.UNKNOWN_RULE, f"no rule {rule!r} in force", "item_id")
        return await rule_act(
            who,
            "edit",
            reason,
            ns=space,
            rule=rule,
            title=checked_text(title, "title"),
            content=checked_text(content, "content", 32 * 1024),
            labels=_labels(labels),
        )

    @tool("operator", title="Retract a rule", hints=ACT)
    async def admin_delete_rule(
        who: Principal, item_id: Id, reason: Text, ns: Id = DEFAULT_NS
    ) -> Answer:
        """Retract rule ITEM_ID of NS: agents no longer see it; its history stays (RuleRetracted).

        Args:
            item_id: the rule's id, as search_rules shows it.
            reason: why, in words (recorded).
            ns: the rule namespace (a tenant or team); "default" unless given.
        """
        rule = checked_text(item_id, "item_id", 256)
        space = await rule_space(backend, who, "admin_delete_rule", checked_text(ns, "ns", 256))
        return await rule_act(who, "retract", reason, rule=rule, ns=space)

    # --- resources and the prompt ----------------------------------------------------

    @server.resource(CURRENT, mime_type="application/json")
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

    @server.prompt(title="Apply the rulebook to a task")
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
