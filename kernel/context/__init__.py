"""The context compiler actor: triggers in, one immutable WorkingContext per attempt out."""

from kernel.context._compiler import ContextCompiler
from kernel.context._layers import DROP_ORDER, compile_layers, estimate
from kernel.context._subscribers import Hosted, Subscribers

__all__ = [
    "DROP_ORDER",
    "ContextCompiler",
    "Hosted",
    "Subscribers",
    "compile_layers",
    "estimate",
]
