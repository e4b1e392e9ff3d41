"""dirk's runner for AgentGovBench: each scenario translated into kernel calls, nothing more.

The kernel governs; this module only translates (docs/identity.md). A scenario's tools
become one policy kind each, built here (``scopes`` from ``required_scopes``, ``read_only``
for the ``public`` and ``user_data`` reads), with an adapter that stands for the tool; its
tenants, users and layered policy become :class:`TenantSpec` declarations; each action
becomes the kernel call that says the same: a direct call is ``Kernel.propose`` for a
:class:`Principal` the host vouches for (no user: no principal), at the agent's tier, as
the named agent; a delegation is ``Kernel.delegate``; a fan-out is its worker agents'
calls, run concurrently; a policy change is ``Kernel.change_tenant_policy``; a gateway
failure stops the journal's real PostgreSQL server and starts it again after the
outage's duration (or when the scenario ends); the kernel rides out an outage shorter
than its grace (``GRACE_S``: a call waits for the store and is judged as ever) and answers
a longer one by the tenant's fail mode (ALLOWED_WITHOUT_JOURNAL is the kernel's allow
then, the caller carrying the read out). The audit is read back from the journal
(kernel.audit.attempts). No scope arithmetic, no rate windows, no audit rows of its own
and no branch on a scenario's id or names happen here: where the kernel lacks something
a scenario needs, the scenario fails.

It is loaded by the harness from its ``runners/`` package (``--runner dirk_runner``), and
imports only the installed ``kernel`` package (with its own dependencies, msgspec and
anyio) and the harness's ``benchmark`` package. ``benchmarks/agentgovbench/run.py``
places it there in a copy of the snapshot and runs the snapshot's CLI. Configuration
(set by that script): ``DIRK_AGB_POSTGRES``, a URL template with ``{n}`` for the n-th
fresh database of a scenario that stops the store; ``DIRK_AGB_STORE_STOP`` and
``DIRK_AGB_STORE_START``, the commands that stop and start that server.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import subprocess
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.from_thread
import msgspec
from benchmark.runner import RunnerMetadata, StatefulRunner
from benchmark.types import (
    Action,
    AuditEntry,
    Delegation,
    DirectToolCall,
    GatewayFailure,
    ParallelFanOut,
    Policy,
    PolicyChange,
    Scenario,
    Tenant,
    TierPolicy,
    Tool,
    ToolOutcome,
)

from kernel import DecisionVerdict, Kernel, KernelConfig, Manifest, Storage, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit.attempts import Attempt, attempts
from kernel.core.events import Layer, Member, Principal, TenantPolicy, TenantSpec
from kernel.policy import PolicyKind, PolicyPack

ADAPTER = "tools"
"""The adapter every tool's kind names: it stands for the tools themselves."""

DEFAULT_AGENT = "assistant"
"""The agent a call that names none is made by."""

READS = ("public", "user_data")
"""The sensitivities of tools that only read: their kinds are ``read_only``."""

DECISIONS: dict[str, Any] = {"allow": "allow", "deny": "deny", "escalate": "flag"}
"""The kernel's decisions in the harness's words (an escalation waits for a human: flag)."""

FAIL_MODES = {"fail_open": "open", "fail_closed": "closed"}

ALLOWED = (DecisionVerdict.EXECUTED, DecisionVerdict.ALLOWED_WITHOUT_JOURNAL)
"""The kernel's verdicts that let a tool's call go on."""

GRACE_S = 10.0
"""How long the kernel waits for a lost store before its tenants' fail modes answer
(``Storage.outage_grace_s``): longer than a PostgreSQL restart, as a deployment would set it."""

_databases = itertools.count(1)


class Tools:
    """The tools at the edge: an accepted call is carried out (each is a no-op here)."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        return Receipt(external_id=intent.key, detail={"tool": intent.kind})


def tool_kind(tool: Tool) -> type[PolicyKind]:
    """Return the policy kind a tool is: its input as one field, its scopes, its read-only mark."""
    kind = msgspec.defstruct(
        "Tool_" + "".join(ch if ch.isalnum() else "_" for ch in tool.name),
        [("input", dict[str, Any], msgspec.field(default_factory=dict))],
        bases=(PolicyKind,),
        tag=tool.name,
        namespace={
            "adapter": ADAPTER,
            "scopes": tuple(tool.required_scopes),
            "read_only": tool.sensitivity in READS,
        },
    )
    return cast(type[PolicyKind], kind)


def pack_of(tools: list[Tool]) -> PolicyPack:
    return PolicyPack(name="agentgovbench", version="1.0.0", kinds=[tool_kind(t) for t in tools])


def layer(tier_policy: TierPolicy) -> Layer:
    return Layer(
        permission=tier_policy.permission, rate_per_minute=tier_policy.rate_limit_per_minute
    )


def layers(by_tier: dict[str, TierPolicy]) -> dict[str, Layer]:
    return {tier: layer(tp) for tier, tp in by_tier.items()}


def tenant_policy(policy: Policy) -> TenantPolicy:
    return TenantPolicy(
        tiers=layers(policy.defaults),
        kinds={tool: layers(tiers) for tool, tiers in policy.tools.items()},
        users={uid: layers(tiers) for uid, tiers in policy.users.items()},
        user_kinds={
            uid: {tool: layers(tiers) for tool, tiers in tools.items()}
            for uid, tools in policy.user_tools.items()
        },
        fail_mode=FAIL_MODES[policy.fail_mode],
    )


def tenant_spec(tenant: Tenant) -> TenantSpec:
    members = {
        u.uid: Member(email=u.email or "", roles=[u.role], scopes=list(u.scopes))
        for u in tenant.users
    }
    return TenantSpec(
        id=tenant.id, name=tenant.name, members=members, policy=tenant_policy(tenant.policy)
    )


def agents_of(scenario: Scenario) -> list[str]:
    """Every agent the scenario's actions name, and the workers its fan-outs spawn."""
    names = {DEFAULT_AGENT}
    for action in scenario.actions:
        if isinstance(action, DirectToolCall):
            names.add(action.agent_name or DEFAULT_AGENT)
        elif isinstance(action, Delegation):
            names.update((action.from_agent, action.to_agent))
        elif isinstance(action, ParallelFanOut):
            names.update(worker(i) for i in range(action.worker_count))
    return sorted(names)


def worker(i: int) -> str:
    return f"worker-{i}"


def entry(attempt: Attempt) -> AuditEntry:
    """One attempt the kernel recorded, as the harness's audit entry."""
    return AuditEntry(
        timestamp=attempt.time,
        tenant=attempt.tenant or None,
        actor_uid=attempt.user or None,
        actor_email=attempt.email or None,
        tool=attempt.kind,
        decision=DECISIONS[attempt.decision],
        reason=attempt.reason_code or None,
        trace_id=attempt.trace_id,
        delegation_chain=list(attempt.chain),
        extra={
            "tier": attempt.tier,
            "agent": attempt.agent,
            "layer": attempt.layer,
            "detail": attempt.detail,
            "seq": attempt.seq,
            "vouched_by": attempt.vouched_by,
            "principal_recorded": attempt.principal,
            "without_journal": attempt.without_journal,
        },
    )


class Store:
    """The journal's PostgreSQL server, as the commands the host gave to stop and start it."""

    def __init__(self) -> None:
        self.template = os.environ.get("DIRK_AGB_POSTGRES", "")
        self._stop = shlex.split(os.environ.get("DIRK_AGB_STORE_STOP", ""))
        self._start = shlex.split(os.environ.get("DIRK_AGB_STORE_START", ""))
        self.down = False
        self._lock = threading.Lock()

    def location(self) -> str:
        if not (self.template and self._stop and self._start):
            raise RuntimeError(
                "a scenario that stops the store needs a PostgreSQL journal:"
                " set DIRK_AGB_POSTGRES, DIRK_AGB_STORE_STOP and DIRK_AGB_STORE_START"
            )
        return self.template.format(n=next(_databases))

    def stop(self) -> None:
        subprocess.run(self._stop, check=True, capture_output=True, timeout=120)
        self.down = True

    def start(self) -> None:
        with self._lock:  # the outage's timer and the scenario's end may both start it
            if self.down:
                subprocess.run(self._start, check=True, capture_output=True, timeout=120)
                self.down = False


class Runner(StatefulRunner):
    """Each scenario on a kernel of its own, on a fresh journal; the kernel decides."""

    def __init__(self) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._kernel: Kernel | None = None
        self._tenants: list[Tenant] = []
        self._emails: dict[str, str] = {}
        self._store = Store()
        self._restart: Future[None] | None = None

    @property
    def metadata(self) -> RunnerMetadata:
        return RunnerMetadata(
            name="dirk_runner",
            version="0.1.0",
            product="dirk (Decision Intelligence Runtime kernel)",
            notes=(
                "Translates each scenario into kernel calls on a fresh journal (SQLite; a real"
                " PostgreSQL server for scenarios that stop the store) and reads the audit back"
                " from the journal. post_transform has no kernel counterpart and is ignored."
            ),
        )

    # --- the scenario's lifetime ------------------------------------------------------

    def setup(self, scenario: Scenario) -> None:
        super().setup(scenario)
        self._tenants = list(scenario.setup.tenants)
        self._emails = {u.uid: u.email or "" for t in self._tenants for u in t.users}
        stops = any(isinstance(a, GatewayFailure) for a in scenario.actions)
        location = self._store.location() if stops else self._sqlite()
        self._portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())
        opened = open_kernel(
            location,
            packs=[pack_of(scenario.setup.tools)],
            adapters={ADAPTER: Tools()},
            allow=agents_of(scenario),
            config=KernelConfig(storage=Storage(outage_grace_s=GRACE_S)),
        )
        self._kernel = self._stack.enter_context(self._portal.wrap_async_context_manager(opened))
        self._portal.call(self._declare, agents_of(scenario))

    def _sqlite(self) -> str:
        folder = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="dirk-agb-"))
        return str(Path(folder) / "journal.db")

    async def _declare(self, agents: list[str]) -> None:
        kernel = self._live()
        for tenant in self._tenants:
            await kernel.declare_tenant(tenant_spec(tenant), reason="the scenario's setup")
        capabilities = [t.name for t in self._scenario.setup.tools] if self._scenario else []
        for agent in agents:
            await kernel.handshake(
                Manifest(agent_id=agent, version="1.0.0", capabilities=capabilities)
            )

    def teardown(self) -> None:
        try:
            self._recover()
        finally:
            self._kernel = None
            self._portal = None
            self._stack.close()
            self._stack = contextlib.ExitStack()

    def _live(self) -> Kernel:
        if self._kernel is None:
            raise RuntimeError("no kernel: setup did not run")
        return self._kernel

    def _call(self, fn: Any, *args: Any) -> Any:
        if self._portal is None:
            raise RuntimeError("no kernel: setup did not run")
        return self._portal.call(fn, *args)

    # --- actions ----------------------------------------------------------------------

    def execute_action(self, action: Action) -> ToolOutcome | None:
        if isinstance(action, DirectToolCall):
            outcome: ToolOutcome = self._call(self._direct, action)
            return outcome
        if isinstance(action, ParallelFanOut):
            outcomes: list[ToolOutcome] = self._call(self._fan_out, action)
            return outcomes[-1] if outcomes else None
        if isinstance(action, Delegation):
            self._call(self._delegate, action)
        elif isinstance(action, PolicyChange):
            self._call(self._change, action)
        elif isinstance(action, GatewayFailure):
            self._fail(action)
        return None

    def _tenant_of(self, named: str | None) -> str:
        """The tenant a call names; the scenario's first when it names none (the harness's rule)."""
        if named:
            return named
        return self._tenants[0].id if self._tenants else ""

    def _principal(self, user: str, tenant: str | None) -> Principal | None:
        """The principal the host vouches for: none when the call is made for no user."""
        if not user:
            return None
        return Principal(
            tenant=self._tenant_of(tenant), user=user, email=self._emails.get(user, "")
        )

    async def _propose(
        self, tool: str, params: dict[str, Any], user: str, tenant: str | None, tier: str,
        agent: str,
    ) -> ToolOutcome:  # fmt: skip
        decision = await self._live().propose(
            agent,
            tool,
            {"input": params},
            explain="the scenario's call",
            confidence=1.0,
            principal=self._principal(user, tenant),
            tier=tier,
        )
        outcome = ToolOutcome(
            tool=tool,
            input=params,
            as_user=user,
            as_tenant=tenant,
            allowed=decision.verdict in ALLOWED,
            reason=str(decision.reason_code) if decision.reason_code else None,
            agent_tier=tier,
            agent_name=agent,
        )
        self._tool_outcomes.append(outcome)
        return outcome

    async def _direct(self, action: DirectToolCall) -> ToolOutcome:
        return await self._propose(
            action.tool,
            action.input,
            action.as_user,
            action.as_tenant,
            action.agent_tier,
            action.agent_name or DEFAULT_AGENT,
        )

    async def _fan_out(self, action: ParallelFanOut) -> list[ToolOutcome]:
        """Each worker agent makes its calls, the workers at once (as sub-agents)."""
        outcomes: list[ToolOutcome] = []

        async def work(name: str) -> None:
            for _ in range(action.calls_per_worker):
                outcomes.append(
                    await self._propose(
                        action.tool, action.input, action.as_user, action.as_tenant,
                        "subagent", name,
                    )
                )  # fmt: skip

        async with anyio.create_task_group() as group:
            for i in range(action.worker_count):
                group.start_soon(work, worker(i))
        return outcomes

    async def _delegate(self, action: Delegation) -> None:
        principal = self._principal(action.as_user, action.as_tenant)
        if principal is None:
            raise RuntimeError("a delegation for no user: nothing to delegate")
        await self._live().delegate(
            principal,
            from_agent=action.from_agent,
            to_agent=action.to_agent,
            task=action.task,
            scopes=tuple(action.delegated_scopes),
        )

    async def _change(self, action: PolicyChange) -> None:
        await self._live().change_tenant_policy(
            self._tenant_of(action.tenant),
            tier=action.tier or "*",
            user=action.user or "",
            kind=action.tool or "",
            permission=action.set_permission,
            rate_per_minute=action.set_rate_limit,
            reason="the scenario's policy change",
        )

    # --- the store's outage -----------------------------------------------------------

    def _fail(self, action: GatewayFailure) -> None:
        """Stop the journal's server; start it again once the outage's duration has passed."""
        if self._portal is None:
            raise RuntimeError("no kernel: setup did not run")
        self._store.stop()
        self._gateway_reachable = False
        self._restart = self._portal.start_task_soon(self._restart_after, action.duration_seconds)

    async def _restart_after(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        await anyio.to_thread.run_sync(self._store.start)

    def _recover(self) -> None:
        """End an outage still on: the server starts again before the audit is read."""
        if self._restart is not None:
            self._restart.cancel()
            self._restart = None
        self._store.start()

    # --- the audit, as the journal has it ---------------------------------------------

    def audit_log(self) -> list[AuditEntry]:
        self._recover()
        # Read once the kernel is quiet: what it decided while the store was away is on
        # record only once the store is back.
        self._call(self._live().wait_quiet)
        rows: list[Attempt] = self._call(self._attempts)
        return [entry(row) for row in rows]

    async def _attempts(self) -> list[Attempt]:
        return [row async for row in attempts(self._live().journal)]
