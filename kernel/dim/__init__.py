"""The Decision Integrity Module: the deterministic gate every proposal passes.

:func:`kernel.dim.verdict.verdict` is the one verdict function; the actor judges with it
and ``dirk verify --verdicts`` / ``whatif`` re-judge with it.
"""

from kernel.dim._actor import IntegrityModule
from kernel.dim._gate import LAYERS, judge
from kernel.dim._judgement import Inputs, Judgement, reject
from kernel.dim._records import BUDGET_GUARD
from kernel.dim._shadow import ShadowRefused, Shadows

__all__ = [
    "BUDGET_GUARD",
    "LAYERS",
    "Inputs",
    "IntegrityModule",
    "Judgement",
    "ShadowRefused",
    "Shadows",
    "judge",
    "reject",
]
