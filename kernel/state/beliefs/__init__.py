"""Governed beliefs as pure folds: the scoring model, the belief graph, the gate and the effects.

Public through :mod:`kernel.beliefs`; here because projections need it (kernel.state).
"""

from kernel.state.memory import MEMORY_ADAPTER

BELIEFS_ADAPTER = "beliefs"
"""The adapter name of the built-in beliefs executor (kernel.beliefs)."""

TEST_ADAPTER = "belief_test"
"""The adapter that runs propose_test intents: yours (kernel.testing has a deterministic one)."""

BUILT_IN = frozenset({MEMORY_ADAPTER, BELIEFS_ADAPTER, TEST_ADAPTER})
"""Adapters a kernel provides when a pack needs them and none is given (kernel.wiring):
the memory executor, the beliefs executor, and a test adapter that refuses every test (no
tests configured)."""
