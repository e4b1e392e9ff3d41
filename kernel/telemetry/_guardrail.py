"""The DIM's verdict as the GenAI conventions' guardrail: its span's attributes and result.

The conventions (open-telemetry/semantic-conventions-genai, docs/gen-ai/gen-ai-guardrails.md,
status Development) describe a guardrail by its component, the policy it evaluated and the
result it reported in its own words. The DIM is a dedicated in-process guardrail: its span
is ``apply_guardrail dirk DIM`` (``gen_ai.operation.name=apply_guardrail``), the policy is
the pack that judged (its hash, and its version where the verdict records one; the rule or
layer that decided), and the result
is the DIM's verdict as it records it, ``ACCEPTED``, ``REJECTED`` or ``ESCALATED``, with its
reason code: no allow or deny is inferred from it, as the conventions ask. What the kernel
then does with the verdict (waits for a human, executes) is a span of its own, apart.
"""

from __future__ import annotations

from typing import Any

OPERATION = "apply_guardrail"
COMPONENT = "dirk DIM"
"""``gen_ai.guardrail.component.name``: the component that evaluates, not the policy."""
SPAN_NAME = f"{OPERATION} {COMPONENT}"
RESULT_EVENT = "gen_ai.guardrail.result"
COMPONENT_NAME = "gen_ai.guardrail.component.name"
POLICY_ID = "gen_ai.guardrail.policy.id"
POLICY_VERSION = "gen_ai.guardrail.policy.version"
RULE_ID = "gen_ai.guardrail.policy.rule.id"
SOURCE = "gen_ai.guardrail.source"
RESULT_TYPE = "gen_ai.guardrail.result.type"
RESULT_VALUE = "gen_ai.guardrail.result.value"
RESULT_REASON = "gen_ai.guardrail.result.reason"
_RULE_LIMIT = 256  # characters of a rule's id


def started() -> dict[str, Any]:
    """The attributes a guardrail span carries from its start (what sampling may read)."""
    return {"gen_ai.operation.name": OPERATION, COMPONENT_NAME: COMPONENT, SOURCE: "proposal"}


def result(
    verdict: str, *, pack: str, version: str = "", code: str = "", rule: str = ""
) -> dict[str, Any]:
    """The result attributes of a verdict by the pack ``pack`` hashes.

    Only what the verdict's own event records: a span's content never depends on where
    the projector began reading (live spans and ``dirk traces export`` agree).
    """
    found: dict[str, Any] = {RESULT_TYPE: "verdict", RESULT_VALUE: verdict}
    if pack:
        found[POLICY_ID] = pack
    if version:
        found[POLICY_VERSION] = version
    if code:
        found[RESULT_REASON] = code
    if rule:
        found[RULE_ID] = rule[:_RULE_LIMIT]
    return found
