"""What tests and simulations of a kernel need: a public surface, pinned by a test.

- :class:`ManualClock` and :class:`SeededIds`: time and ids only move when the
  test says so, so a run is the same run every time.
- :class:`JournalFaults`: faults injected into the journal's writes (a failed
  append, a failed fsync) to test what the kernel does when its record fails.
- :class:`SimulatedSystem` and its :class:`Faults`: an external system with a
  durable ledger by key that misbehaves like a real one, from a seed.
- :class:`ScriptedAgent` (its :data:`Step` is one attempt's proposal) plays a
  script of proposals and remembers every context; :func:`action_of` and
  :func:`flow_types` read a running kernel's flows.
- :class:`AdapterContract`: the adapter contract of docs/adapters.md as a pytest
  mixin, to run against any adapter; a broken rule raises :class:`ContractBroken`.
- :class:`ScriptedTests`: a deterministic ``belief_test`` adapter for the governance
  pack's hypothesis tests (kernel.beliefs): outcomes set in advance.
"""

from kernel.beliefs._pack import ScriptedTests
from kernel.core.ports import ManualClock, SeededIds
from kernel.journal.store import JournalFaults
from kernel.testing._agents import ScriptedAgent, Step, action_of, flow_types
from kernel.testing._contract import AdapterContract, ContractBroken
from kernel.testing._simulated import Faults, SimulatedSystem

__all__ = [
    "AdapterContract",
    "ContractBroken",
    "Faults",
    "JournalFaults",
    "ManualClock",
    "ScriptedAgent",
    "ScriptedTests",
    "SeededIds",
    "SimulatedSystem",
    "Step",
    "action_of",
    "flow_types",
]
