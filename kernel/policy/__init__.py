"""What pack authors write with: policy kinds, packs, rules, invariants and guards.

A pack (``policies/``) imports only from here::

    from kernel.policy import PolicyKind, PolicyPack, rule, deny, ALLOW

"""

from kernel.policy.escalations import EscalationBudget
from kernel.policy.guards import Guard, GuardFinding, SoftGuard
from kernel.policy.kinds import Impact, NeedsHuman, PolicyKind
from kernel.policy.money import Budget, Cost, ModelPrice, format_money, parse_money
from kernel.policy.monitors import Monitor
from kernel.policy.packs import Consume, LimitSpec, PackError, PolicyPack, Threshold
from kernel.policy.quorums import Quorum
from kernel.policy.rules import (
    ALLOW,
    DecimalStr,
    OneOf,
    Range,
    Rule,
    RuleVerdict,
    StateMatch,
    View,
    deny,
    rule,
)

__all__ = [
    "ALLOW",
    "Budget",
    "Consume",
    "Cost",
    "DecimalStr",
    "EscalationBudget",
    "Guard",
    "GuardFinding",
    "Impact",
    "LimitSpec",
    "ModelPrice",
    "Monitor",
    "NeedsHuman",
    "OneOf",
    "PackError",
    "PolicyKind",
    "PolicyPack",
    "Quorum",
    "Range",
    "Rule",
    "RuleVerdict",
    "SoftGuard",
    "StateMatch",
    "Threshold",
    "View",
    "deny",
    "format_money",
    "parse_money",
    "rule",
]
