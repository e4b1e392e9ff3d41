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
- :class:`JournalStoreContract` and :class:`InboxStoreContract`: the journal store's
  and the operator inbox's contracts as pytest mixins, the suites the kernel runs
  against its SQLite and PostgreSQL stores, to run against any database a journal
  can be opened on (eventsourcing's recorder test cases, subclassed per backend).

Running the store contracts against your own database: subclass each in a test
module, and return from ``journal_location`` a place no journal is at yet (a
SQLite file path, or the ``postgresql://`` URL of an empty database)::

    from kernel.testing import InboxStoreContract, JournalStoreContract

    class TestMyDatabase(JournalStoreContract):
        def journal_location(self, tmp_path):
            return create_empty_database()  # "postgresql://user:pw@host/fresh_db"

    class TestMyDatabaseInbox(InboxStoreContract):
        def journal_location(self, tmp_path):
            return create_empty_database()

``pytest`` then runs every rule as a test of its own (``test_contract_...``); a
broken rule fails with :class:`ContractBroken` naming it. The tests are
synchronous, so no async plugin is needed.
"""

from kernel.beliefs._pack import ScriptedTests
from kernel.core.ports import ManualClock, SeededIds
from kernel.journal.store import JournalFaults
from kernel.testing._agents import ScriptedAgent, Step, action_of, flow_types
from kernel.testing._contract import AdapterContract, ContractBroken
from kernel.testing._simulated import Faults, SimulatedSystem
from kernel.testing._stores import InboxStoreContract, JournalStoreContract

__all__ = [
    "AdapterContract",
    "ContractBroken",
    "Faults",
    "InboxStoreContract",
    "JournalFaults",
    "JournalStoreContract",
    "ManualClock",
    "ScriptedAgent",
    "ScriptedTests",
    "SeededIds",
    "SimulatedSystem",
    "Step",
    "action_of",
    "flow_types",
]
