"""The public names of kernel.testing are pinned: changing them is a decision, not an accident."""

import kernel
import kernel.testing


def test_testing_exports() -> None:
    assert sorted(kernel.testing.__all__) == sorted(
        [
            "AdapterContract",
            "ContractBroken",
            "Faults",
            "InboxStoreContract",
            "JournalStoreContract",
            "JournalFaults",
            "ManualClock",
            "SeededIds",
            "ScriptedAgent",
            "ScriptedTests",
            "SimulatedSystem",
            "Step",
            "action_of",
            "flow_types",
        ]
    )
    for name in kernel.testing.__all__:
        assert getattr(kernel.testing, name) is not None


def test_reexports_are_the_kernels_own() -> None:
    """The clock, ids and journal faults are the very classes the kernel takes, not copies."""
    from kernel.core.ports import ManualClock, SeededIds
    from kernel.journal.store import JournalFaults

    assert kernel.testing.ManualClock is ManualClock
    assert kernel.testing.SeededIds is SeededIds
    assert kernel.testing.JournalFaults is JournalFaults
