"""The six supervised actors of one kernel: their mailboxes and how each is (re)started.

Data flows one way: trigger -> context compiler -> agent (user space) -> DIM
-> (escalation) -> execution -> journal, with the guard runner beside the DIM
and the registry answering handshakes. Each actor owns its mailbox; a restart
builds a fresh actor on the same mailbox from its :class:`ChildSpec`.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping
from typing import Any

from kernel.adapters.contract import Adapter, CallPool
from kernel.config import KernelConfig
from kernel.context import ContextCompiler, Subscribers
from kernel.core.ports import Clock, IdSource
from kernel.dim import IntegrityModule, Shadows
from kernel.escalation import EscalationDesk
from kernel.execution import ExecutionEngine
from kernel.guards import GuardRunner
from kernel.hosting import AgentHost, Answering, Fetch
from kernel.policy.packs import PolicyCatalog
from kernel.registry import Registry
from kernel.runtime.actors import Carrier, Effects, Mailbox
from kernel.runtime.messages import (
    AgentMessage,
    CompilerMessage,
    DimMessage,
    EscalationMessage,
    ExecutionMessage,
    GuardMessage,
    RegistryMessage,
)
from kernel.runtime.supervision import ChildSpec
from kernel.state.domain import ExecutorPorts, executor_factory
from kernel.state.projections import Projections


class Actors:
    """The mailboxes, the agent host and the child specs of one kernel's actors.

    ``effects`` is the task group the adapter calls and the guards run on (opened by
    the kernel's lifetime); ``fetch`` the artifact fetch an agent's context reaches.
    Where the agents' answers go is set once it exists (:meth:`answer_with`).
    """

    def __init__(
        self,
        *,
        projections: Projections,
        catalog: PolicyCatalog,
        adapters: Mapping[str, Adapter],
        allow: Collection[str],
        config: KernelConfig,
        clock: Clock,
        ids: IdSource,
        hosts: Mapping[str, Mailbox[AgentMessage]],
        effects: Effects,
        fetch: Fetch | None = None,
    ) -> None:
        limits = config.limits
        max_in_flight = limits.max_in_flight
        # A flow has at most one message on its way between actors at any time, so
        # mailboxes larger than the flows admitted at once can never fill up in a
        # cycle (compiler -> agent -> DIM -> compiler) and deadlock.
        capacity = 2 * max_in_flight + 64
        # One jitter source for every instance of the engine, so a restart does not
        # replay the same draws.
        jitter = random.Random(config.ports.jitter_seed)
        unsure: set[str] = set()  # keys of unknown outcome, kept across engine restarts
        self.capacity = capacity
        self.registry: Mailbox[RegistryMessage] = Mailbox("registry", capacity)
        self.compiler: Mailbox[CompilerMessage] = Mailbox("context", capacity)
        self.dim: Mailbox[DimMessage] = Mailbox("dim", capacity)
        self.escalation: Mailbox[EscalationMessage] = Mailbox("escalation", capacity)
        self.execution: Mailbox[ExecutionMessage] = Mailbox("execution", capacity)
        self.guards: Mailbox[GuardMessage] = Mailbox("guards", capacity)
        self.shadows = Shadows()
        """The shadow packs the DIM judges by beside the enforced ones (kept across restarts)."""
        self.subscribers = Subscribers(hosts, projections)
        """Which hosted agents a topic wakes: the compiler's, and the trigger's count of the
        flows it will open (kept across restarts)."""
        adapters = {**adapters, **_executors(projections, catalog, adapters, clock, self.dim)}
        self.adapters: Mapping[str, Adapter] = adapters
        """The adapters by name, with the domains' executors the packs need and none gave."""
        self.carry: Carrier | None = None
        """Records the compiler's batch in the DIM's append with what its synchronous
        agents answered (:meth:`answer_with`; None: the compiler commits on its own)."""
        self.agents = AgentHost(
            dim=self.dim,
            clock=clock,
            concurrency=limits.agent_concurrency,
            token_budget=limits.token_budget,
            reasoning_timeout_s=limits.reasoning_timeout_s,
            moving=projections.moving,
            fetch=fetch,
        )
        # Adapter calls run on kept worker tasks (shared by every engine instance); a
        # flow has at most one call at a time, so this many never makes one wait.
        adapter_calls = CallPool(effects, size=max_in_flight)
        self.specs: list[ChildSpec[Any]] = [
            ChildSpec[RegistryMessage](
                "registry",
                lambda: Registry(projections, catalog, ids, allow),
                self.registry,
            ),
            ChildSpec[CompilerMessage](
                "context",
                lambda: ContextCompiler(
                    projections,
                    clock,
                    ids,
                    hosts,
                    catalog.schemas,
                    config.ports.rule_search,
                    principal=config.principal,
                    subscribers=self.subscribers,
                    dim=self.dim,
                ),
                self.compiler,
            ),
            ChildSpec[DimMessage](
                "dim",
                lambda: IntegrityModule(
                    projections,
                    catalog,
                    clock,
                    self.compiler,
                    self.escalation,
                    self.execution,
                    guards=self.guards,
                    prices=config.prices,
                    shadows=self.shadows,
                ),
                self.dim,
            ),
            ChildSpec[GuardMessage](
                "guards",
                lambda: GuardRunner(
                    catalog.guards_of,
                    catalog.kinds,
                    self.guards,
                    effects,
                    limits.guard_timeout_s,
                ),
                self.guards,
            ),
            ChildSpec[EscalationMessage](
                "escalation",
                lambda: EscalationDesk(
                    projections,
                    catalog,
                    clock,
                    self.dim,
                    self.execution,
                    config.escalation,
                ),
                self.escalation,
            ),
            ChildSpec[ExecutionMessage](
                "execution",
                lambda: ExecutionEngine(
                    catalog,
                    adapters,
                    self.execution,
                    adapter_calls,
                    projections=projections,
                    clock=clock,
                    rng=jitter,
                    retry=config.retry,
                    escalation=self.escalation,
                    unsure=unsure,
                    dim=self.dim,
                ),
                self.execution,
            ),
        ]

    def answer_with(self, answers: Answering, carry: Carrier) -> None:
        """Send the hosted agents' answers to ``answers``, and carry the compiler's batches
        with ``carry`` (kernel.api.answers: both exist only once the actors do)."""
        self.agents.answers = answers
        self.carry = carry


def _executors(
    projections: Projections,
    catalog: PolicyCatalog,
    given: Mapping[str, Adapter],
    clock: Clock,
    dim: Mailbox[DimMessage],
) -> dict[str, Adapter]:
    """Build the executors the domains provide for the adapters the packs need, unless given."""
    needed = catalog.adapters_needed()
    ports = ExecutorPorts(projections=projections, clock=clock, dim=dim, catalog=catalog)
    built: dict[str, Adapter] = {}
    for domain in projections.domains:
        for name, entry in domain.executors().items():
            if name in needed and name not in given:
                built[name] = executor_factory(entry)(ports)
    return built
