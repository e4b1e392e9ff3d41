"""The execution engine actor: accepted intents cross into the world exactly once."""

from kernel.execution._engine import ExecutionEngine

__all__ = [
    "ExecutionEngine",
]
