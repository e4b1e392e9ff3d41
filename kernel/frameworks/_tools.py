"""Tools from policy kinds, and the one gate every framework adapter calls.

A pack's ``PolicyKind`` already says what a tool takes: its fields are the
parameters, its docstring the description, the pack's invariants the bounds. So
the tool a framework shows its model is generated from the kind, never written a
second time, and a call of it goes to ``Kernel.propose`` (docs/frameworks.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from opentelemetry import context as otel_context

from kernel.api import Kernel
from kernel.api.decisions import Decision, DecisionVerdict
from kernel.core.events import AgentStatusChanged
from kernel.core.reasons import ReasonCode
from kernel.escalation import KERNEL_OPERATOR
from kernel.policy import OneOf, PolicyKind, PolicyPack, Range
from kernel.policy.kinds import kind_name

_SAFE = re.compile(r"[^A-Za-z0-9_-]")
_TYPES = {
    "integer": "an integer",
    "string": "text",
    "boolean": "true or false",
    "number": "a number",
}


STOPS = frozenset(
    {
        ReasonCode.REASONING_EXHAUSTION,
        ReasonCode.ESCALATION_BUDGET_EXHAUSTED,
        ReasonCode.AGENT_PASSIVE,
        ReasonCode.AGENT_SUSPENDED,
        ReasonCode.AGENT_RETIRED,
        ReasonCode.TOKEN_BUDGET_EXHAUSTED,
        ReasonCode.BUDGET_EXHAUSTED,
    }
)
"""Refusals that end a run, not a call: the conversation's governor tripped
(REASONING_EXHAUSTION), the agent was demoted for escalating past its budget
(ESCALATION_BUDGET_EXHAUSTED), it may not act (PASSIVE, SUSPENDED, RETIRED), or a
budget is spent. A model that revises and calls again would only be refused again."""


def stops(decision: Decision) -> bool:
    """Return whether ``decision`` ends the run: a refusal whose reason is in :data:`STOPS`."""
    return decision.verdict is DecisionVerdict.REFUSED and decision.reason_code in STOPS


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One policy kind as a framework's tool.

    Attributes:
        name: the tool's name: the kind's wire name with every character outside
            ``[A-Za-z0-9_-]`` made ``_`` (OpenAI's rule for tool names, the strictest).
        kind: the policy kind a call of the tool is proposed as.
        description: what the tool does: the kind's docstring.
        parameters: the JSON Schema of the arguments, a description on each.
    """

    name: str
    kind: str
    description: str
    parameters: dict[str, Any]


def tool_spec(kind: type[PolicyKind], invariants: Iterable[object] = ()) -> ToolSpec:
    """Return ``kind`` as a tool: its fields, docstring and (given) invariants, described.

    The schema says what the kind's type says and no more: bounds and allowed
    values are in the descriptions, not in ``minimum``/``enum``. Why: a framework
    that validates arguments against the schema would turn an out-of-bounds call
    into its own error before the kernel saw it (the Agents SDK then skips its
    approval hook), and the kernel's refusal, with its reason code, is what the
    model should read and what the journal should hold.
    """
    name = kind_name(kind)
    schema = msgspec.json.schema(kind)
    defs: dict[str, Any] = dict(schema.get("$defs", {}))
    body: dict[str, Any] = defs.pop(kind.__name__, schema)
    documented = _attributes(kind.__doc__ or "")
    bounds = _bounds(kind, invariants)
    properties: dict[str, Any] = {}
    for field, prop in body.get("properties", {}).items():
        if field == "kind":  # the tag: the tool's name already says it
            continue
        described = dict(prop)
        described["description"] = _describe(field, prop, documented, bounds)
        properties[field] = described
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": [f for f in body.get("required", []) if f != "kind"],
        "additionalProperties": False,
    }
    if defs:
        parameters["$defs"] = defs
    summary = (kind.__doc__ or name).strip().split("\n\n")[0].replace("``", "")
    return ToolSpec(
        name=_SAFE.sub("_", name),
        kind=name,
        description=" ".join(summary.split()),
        parameters=parameters,
    )


def tool_specs(
    packs: PolicyPack | Sequence[PolicyPack], kinds: Iterable[str] | None = None
) -> list[ToolSpec]:
    """Return the tools of every kind in ``packs`` (or only of ``kinds``), in pack order."""
    packs = [packs] if isinstance(packs, PolicyPack) else list(packs)
    wanted = None if kinds is None else set(kinds)
    return [
        tool_spec(kind, pack.invariants)
        for pack in packs
        for kind in pack.kinds
        if wanted is None or kind_name(kind) in wanted
    ]


def _attributes(doc: str) -> dict[str, str]:
    """Read a Google-style ``Attributes:`` section: field name to its words."""
    found: dict[str, str] = {}
    inside, current = False, ""
    for line in doc.splitlines():
        text = line.strip()
        if text == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        match = re.match(r"^(\w+)(?: \([^)]*\))?: (.*)$", text)
        if match:
            current = match.group(1)
            found[current] = match.group(2)
        elif text and current:
            found[current] += " " + text
        elif not text and found:
            break
    return found


def _bounds(kind: type[PolicyKind], invariants: Iterable[object]) -> dict[str, str]:
    """What the pack's invariants allow, per field, in words."""
    said: dict[str, str] = {}
    for inv in invariants:
        if isinstance(inv, Range) and inv.kind is kind:
            low = "" if inv.min is None else f"at least {inv.min}"
            high = "" if inv.max is None else f"at most {inv.max}"
            said[inv.field] = " and ".join(p for p in (low, high) if p)
        elif isinstance(inv, OneOf) and inv.kind is kind:
            said[inv.field] = "one of " + ", ".join(sorted(map(str, inv.values)))
    return said


def _describe(
    field: str, prop: Mapping[str, Any], documented: Mapping[str, str], bounds: Mapping[str, str]
) -> str:
    """One parameter's description: its ``msgspec.Meta`` description, the docstring's
    ``Attributes:`` words, else its name and type; then the pack's bounds and the default."""
    words = (
        prop.get("description")
        or documented.get(field)
        or f"{field.replace('_', ' ')}: {_TYPES.get(prop.get('type', ''), 'a value')}"
    )
    if field in bounds:
        words += f" ({bounds[field]})"
    if "default" in prop:
        words += f"; default {msgspec.json.encode(prop['default']).decode()}"
    return words


class Gate:
    """What every adapter calls: a tool call becomes ``Kernel.propose``, keyed for replay.

    One per agent: the agent needs a session in the kernel (``kernel.handshake``),
    whose manifest's ``max_attempts`` governs each conversation's retries.

    Args:
        kernel: the running kernel.
        agent_id: the agent the framework's model acts as.
        packs: the packs whose kinds become tools.
        kinds: only these kinds (default: every kind of ``packs``).
        confidence: the confidence each call is proposed with (frameworks report none).
        model: the model name its tokens are priced under when the framework names none
            (the pack's ``prices`` table: docs/budgets.md).
    """

    def __init__(
        self,
        kernel: Kernel,
        agent_id: str,
        packs: PolicyPack | Sequence[PolicyPack],
        *,
        kinds: Iterable[str] | None = None,
        confidence: float = 0.9,
        model: str = "",
    ) -> None:
        self.kernel = kernel
        self.agent_id = agent_id
        self.confidence = confidence
        self.model = model
        # Per conversation, the run's tokens already reported: each call reports what
        # the framework's running total grew by since (a replayed call adds nothing).
        self._reported: dict[str | None, int] = {}
        self.tools = tool_specs(packs, kinds)
        self._kind_of = {spec.name: spec.kind for spec in self.tools}
        self._stopped: dict[str | None, Decision] = {}

    def stop_of(self, conversation: str | None) -> Decision | None:
        """Return the refusal that stopped ``conversation`` in this gate, or None."""
        return self._stopped.get(conversation)

    def forget(self, conversation: str | None) -> None:
        """Let ``conversation`` reach the kernel again (after an operator restored the agent).

        A conversation the governor stopped stays stopped in the kernel as well:
        its next call is refused there, on record.
        """
        self._stopped.pop(conversation, None)

    async def call(
        self,
        tool: str,
        args: Mapping[str, Any],
        *,
        conversation: str | None,
        tool_call_id: str | None,
        explain: str = "",
        spent: tuple[str, int] | None = None,
    ) -> Decision:
        """Propose one tool call; return the kernel's Decision (it never raises on input).

        The same (conversation, tool-call id) is answered from the record, so a
        framework that runs the call again on resume gets the first answer, and the
        executor runs once. The current OpenTelemetry context (the framework's tool
        span, or the app's) becomes the flow's parent link.

        A call of a conversation this gate saw stopped (:func:`stops`) is answered
        with that refusal and never reaches the kernel: the adapters end the run on
        it, and a framework that calls again anyway is not another proposal.

        ``spent`` is the framework's running total of the run's tokens (model name, or
        "" for :attr:`model`, and tokens): what it grew by since this conversation's
        last call is the call's usage, charged to the reasoning budgets.
        """
        stopped = self._stopped.get(conversation)
        if stopped is not None:
            return stopped
        usage = self._usage(conversation, spent)
        kind = self._kind_of.get(tool, tool)  # an unknown name is the kernel's to refuse
        decision = await self.kernel.propose(
            self.agent_id,
            kind,
            args,
            explain=explain or f"tool call {tool_call_id or '(no id)'} of {tool}",
            confidence=self.confidence,
            conversation=conversation,
            trace_context=otel_context.get_current(),
            tool_call_id=tool_call_id,
            usage=usage,
        )
        if decision.reason_code is ReasonCode.AGENT_PASSIVE:
            decision = await self._demotion(decision)
        if stops(decision):
            self._stopped[conversation] = decision
        return decision

    def _usage(
        self, conversation: str | None, spent: tuple[str, int] | None
    ) -> dict[str, int] | None:
        """The tokens spent since this conversation's last call, by model (None: none)."""
        if spent is None:
            return None
        model, total = spent
        if not isinstance(total, int) or isinstance(total, bool):
            return None  # the framework's to report; nothing is guessed
        grown = total - self._reported.get(conversation, 0)
        self._reported[conversation] = max(total, self._reported.get(conversation, 0))
        model = model or self.model
        return {model: grown} if grown > 0 and model else None

    async def _demotion(self, passive: Decision) -> Decision:
        """Say why the agent is PASSIVE when the kernel demoted it for escalating too often.

        The refusal is AGENT_PASSIVE whoever set the status; a framework (and the
        person reading its run) needs to know that the agent's escalation budget was
        spent, and that an operator restores it: the demotion's own reason code,
        ESCALATION_BUDGET_EXHAUSTED, with the kernel's recorded reason.
        """
        changes = await self.kernel.journal.read(types=["AgentStatusChanged"])
        mine = [e.payload for e in changes if e.agent_id == self.agent_id]
        last = mine[-1] if mine else None
        code = ReasonCode.ESCALATION_BUDGET_EXHAUSTED
        if not (
            isinstance(last, AgentStatusChanged)
            and last.operator == KERNEL_OPERATOR
            and last.reason.startswith(str(code))
        ):
            return passive
        detail = (
            f"agent {self.agent_id} was demoted to PASSIVE ({last.reason}); an operator sets it"
            f" ACTIVE again (dirk agent {self.agent_id} --set ACTIVE)"
        )
        return msgspec.structs.replace(passive, reason_code=code, detail=detail[:500])
