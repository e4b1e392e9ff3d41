"""Governed beliefs as pure folds: the scoring model, the belief graph, the gate and the effects.

Public through :mod:`kernel.beliefs`; here because projections need it (kernel.state).
"""

BELIEFS_ADAPTER = "beliefs"
"""The adapter name of the built-in beliefs executor (kernel.beliefs)."""

TEST_ADAPTER = "belief_test"
"""The adapter that runs propose_test intents: yours (kernel.testing has a deterministic one)."""
