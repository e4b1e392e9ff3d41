"""The ``governance`` policy pack (one kind per tool of the seed's LLM boundary) and its executor.

Agents change beliefs only by proposing these kinds. They pass the DIM like any
other proposal, and its beliefs layer (kernel.state.beliefs.gate) refuses with a
fixed code or names a transformed form; an accepted one is executed by
:class:`BeliefsExecutor`, an adapter inside the kernel that returns the belief
events (kernel.state.beliefs.effects) in its receipt, which the execution engine
records with the intent's ExecutionSucceeded, in one append: exactly once per key.

``propose_test`` is the exception: a test is an action in the world, so its
adapter is yours (``belief_test``; kernel.testing.ScriptedTests is a deterministic
one). Its receipt's ``detail["outcome"]`` (passed, failed, inconclusive) is the
recorded result, which ``execute_test_result_ingest`` brings back as an observation.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from kernel.adapters.contract import AdapterError, Receipt
from kernel.core.events import ExecutionIntent, PropositionTransitioned
from kernel.core.ports import Clock
from kernel.policy.kinds import Impact, PolicyKind
from kernel.policy.packs import PolicyPack
from kernel.state.beliefs import BELIEFS_ADAPTER, TEST_ADAPTER
from kernel.state.beliefs.domain import Beliefs
from kernel.state.beliefs.effects import effects
from kernel.state.domain import ExecutorPorts, RecordingReceipt, State
from kernel.state.memory import Memory, memory_id, recorded_receipt, started
from kernel.state.principals import tenant_of


class GovernanceKind(PolicyKind, frozen=True, kw_only=True):
    """Base of the governance kinds: the fields through which a belief would be asserted.

    They exist so that a proposal using them is refused with
    DIRECT_CANONICAL_WRITE_FORBIDDEN (and not merely as an unknown field): belief
    status is derived from evidence, never asserted.
    """

    adapter: ClassVar[str] = BELIEFS_ADAPTER
    impact: ClassVar[Impact] = Impact.LOW_IMPACT

    task: str = ""
    """The task (workspace) it belongs to; empty: the root DFID of its flow."""
    status: str | None = None
    state: str | None = None
    belief_state: str | None = None
    confidence: str | None = None
    canonical: bool | None = None


class RecordObservation(GovernanceKind, frozen=True, tag="governance.record_observation"):
    """Record an immutable input from ``source`` (registered on first sight)."""

    observation: str
    source: str = ""
    source_type: str = ""
    independence_group: str = ""
    reliability: str = ""
    domain_tags: list[str] = []
    session: str = ""
    raw_payload: str = ""
    parsed_payload: dict[str, Any] = {}


class LinkEntityCandidate(
    GovernanceKind, frozen=True, tag="governance.create_or_link_entity_candidate"
):
    """Create an entity candidate for ``name``, or link it as an alias when unambiguous."""

    name: str
    observation: str
    entity: str = ""
    entity_type: str = ""
    alias_of: str = ""


class ProposeProposition(GovernanceKind, frozen=True, tag="governance.propose_proposition"):
    """Propose a claim derived from recorded observations (they become its first support)."""

    proposition: str
    text: str
    derived_from: list[str] = []
    proposition_class: Literal["descriptive", "predictive", "causal", "procedural"] = "descriptive"
    volatility: Literal["low", "medium", "high"] = "medium"
    about: list[str] = []
    predicts: list[str] = []
    supersedes: str = ""


class AttachSupport(GovernanceKind, frozen=True, tag="governance.attach_support"):
    proposition: str
    observation: str


class AttachContradiction(GovernanceKind, frozen=True, tag="governance.attach_contradiction"):
    proposition: str
    observation: str


class ProposeTest(GovernanceKind, frozen=True, tag="governance.propose_test"):
    """Run a discriminating test of ``proposition`` (against ``competing``), if a trigger holds."""

    adapter: ClassVar[str] = TEST_ADAPTER

    test: str
    proposition: str
    competing: list[str] = []
    action_impact: Literal["low", "high", "irreversible"] = "high"
    """The impact of the action that depends on the answer (the triggers and suppression)."""
    cost: str = "0"
    method: str = ""


class IngestTestResult(GovernanceKind, frozen=True, tag="governance.execute_test_result_ingest"):
    """Bring an executed test's recorded result back as an observation."""

    test: str
    outcome: str = ""


class RequestConsolidation(GovernanceKind, frozen=True, tag="governance.request_consolidation"):
    """Consolidate the task's workspace now (the task boundary)."""

    reason: str = ""


class ArchiveEpisode(GovernanceKind, frozen=True, tag="governance.archive_episode"):
    """Consolidate the task and archive it as an episode with a summary."""

    episode: str = ""
    summary: str = ""


GOVERNANCE_PACK = PolicyPack(
    name="governance",
    version="1.0.0",
    kinds=(
        RecordObservation,
        LinkEntityCandidate,
        ProposeProposition,
        AttachSupport,
        AttachContradiction,
        ProposeTest,
        IngestTestResult,
        RequestConsolidation,
        ArchiveEpisode,
    ),
    escalate_below_confidence=0.0,
)
"""Load it to let agents (with these capabilities) keep governed beliefs."""


class BeliefsExecutor:
    """The adapter that turns accepted belief intents into belief events.

    Args:
        projections: the kernel's projections (the belief graph, the pending intents).
        clock: the kernel's clock: the time it reads is recorded in every event as ``at_ns``.
    """

    def __init__(self, projections: State, clock: Clock) -> None:
        self._projections = projections
        self._memory = projections.domain(Memory)
        self._beliefs = projections.domain(Beliefs)
        self._clock = clock

    async def lookup(self, key: str) -> Receipt | None:
        """Return the receipt of the belief effect recorded under ``key``, None if none is."""
        return recorded_receipt(self._memory.state, key)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Return the belief events of ``intent`` for the engine to record, once per key."""
        memory = self._memory.state
        done = recorded_receipt(memory, intent.key)
        if done is not None:
            return done
        pending = started(memory, intent.key, "belief")
        task = str(intent.params.get("task", "")) or pending.root_dfid
        # Effects read the graph the flow's tenant sees, as its proposal was judged on.
        graph = self._beliefs.graph.seen_by(tenant_of(self._projections, pending.dfid))
        records = effects(
            graph,
            intent.kind,
            intent.params,
            task=task,
            key=intent.key,
            now_ns=self._clock.now_ns(),
        )
        if not records:
            raise AdapterError(f"the beliefs executor does not know {intent.kind!r}")
        # What the agent learns from its receipt: what was recorded and the states it changed.
        detail: dict[str, object] = {
            "events": [type(r).__name__ for r in records],
            "states": {
                r.proposition: str(r.to_state)
                for r in records
                if isinstance(r, PropositionTransitioned)
            },
        }
        return RecordingReceipt(
            external_id=memory_id(intent.key), detail=detail, records=tuple(records)
        )


class NoTests:
    """The ``belief_test`` adapter a kernel gets when none is given: every test fails to run.

    A test is an action in the world, and this kernel was given nothing to act with;
    the flow ends EXECUTION_FAILED, naming the missing adapter, and no result exists.
    """

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Refuse, terminally: nothing happened."""
        raise AdapterError(
            f"no {TEST_ADAPTER!r} adapter was given to this kernel: test"
            f" {intent.params.get('test', '')!r} cannot run"
        )


class ScriptedTests:
    """A deterministic ``belief_test`` adapter: outcomes set in advance, by test or proposition.

    Args:
        outcomes: ``passed``, ``failed`` or ``inconclusive`` by test id or proposition id
            (a test id wins); anything unnamed is ``inconclusive``.
    """

    def __init__(self, outcomes: dict[str, str] | None = None) -> None:
        self.outcomes = dict(outcomes or {})
        self.calls: list[ExecutionIntent] = []

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Return the outcome of the test as the receipt's ``detail["outcome"]``."""
        self.calls.append(intent)
        test = str(intent.params.get("test", ""))
        proposition = str(intent.params.get("proposition", ""))
        outcome = self.outcomes.get(test, self.outcomes.get(proposition, "inconclusive"))
        return Receipt(external_id=f"test:{test}", detail={"outcome": outcome})


def executor(ports: ExecutorPorts) -> BeliefsExecutor:
    """Build the beliefs executor of one kernel (the beliefs domain names it: kernel.api.wiring)."""
    return BeliefsExecutor(ports.projections, ports.clock)


def no_tests(ports: ExecutorPorts) -> NoTests:
    """Build the ``belief_test`` adapter of a kernel given none."""
    return NoTests()
