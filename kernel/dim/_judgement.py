"""What the gate judges against and what it answers (kernel.dim._gate runs the layers).

Each is built per proposal (several per verdict): frozen msgspec Structs, which cost a
tenth of a frozen dataclass to build (``msgspec.structs.replace`` changes a copy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from kernel.core.events import Applied, Delegated, Feedback, OnBehalf, QuorumRule, TenantSpec
from kernel.core.reasons import ReasonCode
from kernel.state.grants import Grant


class Behalf(msgspec.Struct, frozen=True, kw_only=True):
    """What the principal layer judges against (kernel.dim.verdict builds it).

    Attributes:
        on_behalf: whom the proposal's flow acts for (None: nobody).
        agent_id: the flow's agent.
        tenants: the declared tenants, by id.
        delegations: every recorded delegation, by id.
        accepted: the calls of the flow's (tenant, user, tier) accepted within the rate
            window, the DIM's staged acceptances included.
    """

    on_behalf: OnBehalf | None
    agent_id: str
    tenants: Mapping[str, TenantSpec]
    delegations: Mapping[str, Delegated]
    accepted: int = 0


class Inputs(msgspec.Struct, frozen=True, kw_only=True):
    """What the pipeline judges against, besides the proposal and the agent.

    Args:
        context_ref: the reference of the agent's current visible state.
        state: the agent's visible state (what rules and invariants read).
        held: the total held of each pool by open flows (staged ones included).
        own: what this flow already holds (it does not contend with itself).
        capacities: capacities set by facts; they override the packs'.
        amendments: limits an operator amended for this agent, still in force.
        unsettled: the agent's flows whose effects have not converged (a saga
            unwinding, or waiting for a human after an undo failed).
        tree: the root DFID of the flow's tree (a ``tree`` budget's scope).
        spent: what each money pool spent within its window (kernel.state.budgets).
        grants: the standing grants as folded (kernel.state.grants).
        granted: the uses and money each grant's acceptances staged in this batch.
        principal: what the principal layer judges against (kernel.dim._principal); None:
            the journal's fold rules predate principals, and the layer does not run.
    """

    context_ref: str = ""
    state: Mapping[str, Any] = {}
    held: Mapping[str, int] = {}
    own: Mapping[str, int] = {}
    capacities: Mapping[str, int] = {}
    amendments: Mapping[str, int | str] = {}
    unsettled: Sequence[str] = ()
    tree: str = ""
    spent: Mapping[str, int] = {}
    grants: Sequence[Grant] = ()
    granted: Mapping[str, tuple[int, int]] = {}
    principal: Behalf | None = None


class Judgement(msgspec.Struct, frozen=True, kw_only=True):
    """The pipeline's answer: a rejection, an escalation, or an acceptance.

    ``reserve`` holds what the flow must hold once accepted or escalated; ``pack``
    is the hash of the pack that judged (empty when no pack knows the kind);
    ``policy`` is the proposal as its (frozen) kind, so execution need not convert again.
    ``applied`` is set on a transformed acceptance: the form executed instead of the
    submitted one (kernel.dim.verdict adds it; kernel.state.beliefs.gate decides it).
    ``quorum`` is what an escalation needs when its pack asks for more than one operator;
    ``grant`` the standing grant an acceptance uses; ``costs`` the proposal's cost by
    currency.
    """

    rejection: Feedback | None = None
    escalation: Feedback | None = None
    reserve: Mapping[str, int] = {}
    pack: str = ""
    policy: Any = None
    applied: Applied | None = None
    quorum: QuorumRule | None = None
    grant: GrantUse | None = None
    costs: Mapping[str, int] = {}


class GrantUse(msgspec.Struct, frozen=True, kw_only=True):
    """A standing grant that lets an escalating proposal through: which, and what it spends.

    ``uses`` counts this use; ``amount`` is the proposal's cost in the grant's currency
    (0 when the grant has no money cap); ``escalation`` what it would have escalated for.
    """

    grant: str
    uses: int
    amount: int
    currency: str
    escalation: ReasonCode


def reject(
    layer: str, code: ReasonCode, detail: str, field: str = "", rule: str = "", limit: Any = ""
) -> Feedback:
    """Build the feedback of a failed layer."""
    return Feedback(
        reason_code=code, detail=detail, layer=layer, field=field, rule=rule, limit=str(limit)
    )
