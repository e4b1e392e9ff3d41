"""End-to-end DecisionFlows through the real kernel (P1, P2).

A dedicated tiny domain keeps the figure about the kernel: one policy kind
with an int field, agents that decide instantly with high confidence and a
valid proposal, and an adapter that returns a Receipt without waiting. Every
flow takes the happy path (trigger, context, proposal, acceptance, execution,
close), and every one of them must end CLOSED or the run fails: a benchmark
that silently measures failures is worthless.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import anyio

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import FlowStatus, Kernel, Signing, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.config import KernelConfig, Ports, Storage
from kernel.core.events import Layer, Member, Permission, Principal, TenantPolicy, TenantSpec
from kernel.core.ports import SystemClock
from kernel.memory import MEMORY_PACK
from kernel.policy import Budget, Consume, Cost, PolicyKind, PolicyPack
from kernel.telemetry import Telemetry, configure_exporter
from kernel.testing import SeededIds

TOPIC = "bench.tick"
SPANS_PER_FLOW = 5
"""A happy-path flow projects to a root span plus context, reason, validate and execute."""

DRAIN_S = 600.0
"""How long P2's close may take to hand every span to the receiver."""

RECEIVER = Path(__file__).resolve().parent.parent / "tests" / "support" / "otlp_receiver.py"

# A small state layer, recorded before any agent is hosted (so it opens no flow):
# every context carries it and its hash, as a real one would.
STATE = {f"bench.fact.{i}": f"value-{i}" for i in range(8)}


class Order(PolicyKind, tag="bench.order"):
    """The benchmark's one policy kind."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "noop"
    scopes: ClassVar[tuple[str, ...]] = ("trade",)
    """Checked against the member's scopes when its tenant is declared (P18); a principal
    of no declared tenant is unrestricted, as P1's is."""

    quantity: int


PACK = PolicyPack(name="bench", version="1.0.0", kinds=(Order,), escalate_below_confidence=0.5)

LOCAL = Principal(tenant="local", user="bench")
"""P1's principal: the benchmark's host vouches for one local user (docs/identity.md)."""
TENANT = TenantSpec(
    id="bench-co",
    members={"bench": Member(email="bench@bench.test", scopes=["trade", "read"])},
    policy=TenantPolicy(
        tiers={"*": Layer(rate_per_minute=10_000_000)},
        kinds={"bench.order": {"*": Layer(permission=Permission.ALLOW)}},
        users={"bench": {"*": Layer(rate_per_minute=5_000_000)}},
    ),
)
"""P18's tenant: declared, its member's scopes checked, a layered policy with a permission
and per-user rate windows that every call is counted in (none is ever reached)."""

SHADOW = PolicyPack(name="bench", version="1.1.0", kinds=(Order,), escalate_below_confidence=0.6)
"""P17's candidate: judges every proposal beside PACK and agrees (the agents are sure), so
what P17 measures is the shadow's judging alone, with no difference recorded."""


DOMAINS_PACK = PolicyPack(
    name="bench",
    version="1.0.0",
    kinds=(Order,),
    escalate_below_confidence=0.5,
    consumes=(Consume(Order, "bench.lots", "quantity"),),
    capacities={"bench.lots": 10**9},
    costs=(Cost(Order, "quantity", "EUR"),),
    budgets=(Budget(name="bench", ceiling=10**15, currency="EUR"),),
)
"""P20's pack: PACK, with every order holding a resource (reservations) and costing money
under a budget (spent at its close), neither ever reached."""
CONSTRAINT = "never route orders to a closed venue"
"""P20's governed constraint: enforced on every order, broken by none (they say nothing of it)."""
RULE = "bench-rule"
"""P20's rule, in force: every context shows it, and every explanation cites it."""


class NoopAdapter:
    """An adapter that carries nothing out and answers at once; it counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls += 1
        return Receipt(external_id=f"noop-{self.calls}")


class InstantAgent(Agent):
    """Proposes a valid Order on every context, with high confidence, without waiting."""

    synchronous = True  # it never waits: the kernel runs it where its context is delivered

    def __init__(self, agent_id: str, subscription: str = "bench") -> None:
        self.manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=["bench.order"],
            subscriptions=[subscription],
        )

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        return ctx.propose(Order(quantity=1), explain="benchmark", confidence=0.9)


class CitingAgent(InstantAgent):
    """An InstantAgent whose explanation cites the rule its context shows (P20)."""

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        cites = " ".join(rule["cite"] for rule in ctx.memory.get("rules", ()))
        return ctx.propose(Order(quantity=1), explain=f"benchmark {cites}", confidence=0.9)


class MemoryWriter(InstantAgent):
    """Writes P20's governed memory: the constraint, then a fact, one per flow."""

    def __init__(self) -> None:
        self.manifest = Manifest(
            agent_id="bench-memory",
            version="1.0.0",
            capabilities=["memory.add_constraint", "memory.add_fact"],
            subscriptions=["setup"],
        )
        self._writes = [
            {"kind": "memory.add_constraint", "text": CONSTRAINT},
            {"kind": "memory.add_fact", "name": "bench.venue", "value": "open"},
        ]

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        return ctx.propose(self._writes.pop(0), explain="benchmark setup", confidence=0.9)


async def use_every_domain(kernel: Kernel) -> None:
    """Put P20's optional domains in use: memory, the rulebook, a standing grant.

    The pack (DOMAINS_PACK) brings reservations and a money budget.
    """
    await kernel.register(MemoryWriter())
    for _ in range(2):
        [dfid] = await kernel.trigger("setup.memory", source="benchmark")
        if (await kernel.wait_flow(dfid)).status is not FlowStatus.CLOSED:
            raise BenchmarkFailed("P20's memory write did not close")
    await kernel.propose_rule(
        RULE,
        title="Orders",
        content="Every bench order is for one lot.",
        operator="bench",
        reason="P20",
        override=True,
    )
    await kernel.grant(
        "bench.order", operator="bench", reason="P20", uses=1_000_000, valid_for_s=86_400
    )


class BenchmarkFailed(Exception):
    """A run whose flows did not all close: its timing would measure failures."""


@dataclass(frozen=True)
class FlowRun:
    """What one end-to-end run measured."""

    flows: int
    seconds: float
    events: int
    """Events committed between the first trigger and quiet (TriggerFired included)."""
    journal_events: int
    """Every event in the file, kernel lifecycle and registrations included."""
    journal_bytes: int
    """The database file plus its -wal, after a checkpoint."""
    body_bytes: int
    """The canonical JSON bodies alone, summed over every event in the file."""
    transactions: int
    cpu_seconds: float
    """CPU time of the whole process (every thread) between the first trigger and quiet."""
    gc_seconds: float
    """Time spent in the cyclic garbage collector between the first trigger and quiet."""
    close_seconds: float
    """From quiet until the kernel closed (for P2: the final span flush)."""
    spans_received: int | None = None
    threads: dict[str, float] | None = None
    """CPU seconds of the timed block by thread group (see :func:`thread_groups`)."""
    io: dict[str, int] | None = None
    """This process's I/O in the timed block (/proc/self/io deltas: rchar, wchar, read_bytes,
    write_bytes), empty where /proc is not there."""

    @property
    def flows_per_s(self) -> float:
        return self.flows / self.seconds

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds


async def run_flows(
    path: Path | str,
    flows: int,
    *,
    agents: int = 4,
    outstanding: int = 256,
    telemetry: Telemetry | None = None,
    signing: Signing | None = None,
    tree: bool = True,
    ordered_ids: bool = True,
    shadow: bool = False,
    tenants: bool = False,
    idle: int = 0,
    domains: bool = False,
) -> FlowRun:
    """Drive ``flows`` DecisionFlows through a kernel on a fresh journal at ``path``.

    ``flows // agents`` triggers are fired by ``outstanding`` concurrent tasks
    (each waits for its trigger to be durable before firing the next); every
    one of the ``agents`` hosted agents is subscribed, so each trigger opens
    ``agents`` flows. The clock starts at the first trigger and stops when the
    kernel is quiet (no flow moves on its own). ``signing`` signs checkpoints as the
    kernel runs; ``tree`` False drops the Merkle tree from the open journal (P15.p1's
    baseline: such a journal keeps no proofs, and is for measuring only). ``ordered_ids``
    False draws the DFIDs as random UUIDv4 (the ids before time-ordered ones), for paired
    comparisons. ``shadow`` loads :data:`SHADOW` as a shadow of the pack first (P17).
    ``tenants`` declares :data:`TENANT` and has every flow act for its member (P18).
    ``idle`` more agents are registered and hosted, each subscribed to a topic of its own
    that nothing fires (P19: what a kernel with many agents pays for those that do not act).
    ``domains`` puts the optional domains in use (P20): :data:`DOMAINS_PACK`'s reservation
    and money budget, a governed constraint and fact, a rule shown and cited, a grant.

    Raises:
        BenchmarkFailed: when a flow did not close, or the adapter was not called once per flow.
    """
    if flows % agents:
        raise ValueError(f"flows ({flows}) must be a multiple of agents ({agents})")
    adapter = NoopAdapter()
    names = [f"agent-{i}" for i in range(agents)]
    triggers = iter(range(flows // agents))
    clock = SystemClock()
    ids = SeededIds(7, clock=clock) if ordered_ids else SeededIds(7)

    async with open_kernel(
        path,
        packs=[DOMAINS_PACK, MEMORY_PACK] if domains else [PACK],
        adapters={"noop": adapter},
        allow=[*names, *(f"idle-{i}" for i in range(idle)), *(["bench-memory"] if domains else [])],
        config=KernelConfig(
            principal=Principal(tenant=TENANT.id, user="bench") if tenants else LOCAL,
            ports=Ports(clock=clock, ids=ids),
            storage=Storage(synchronous="FULL"),
            telemetry=telemetry if telemetry is not None else Telemetry(None),
            signing=signing,
        ),
    ) as kernel:
        if not tree:
            kernel.journal._tree = None
        await kernel.trigger("bench.setup", STATE, source="benchmark")
        if domains:
            await use_every_domain(kernel)
        for name in names:
            await kernel.register(CitingAgent(name) if domains else InstantAgent(name))
        for i in range(idle):
            await kernel.register(InstantAgent(f"idle-{i}", subscription=f"idle.{i}"))
        if shadow:
            await kernel.load_shadow(SHADOW, operator="bench", reason="P17")
        if tenants:
            await kernel.declare_tenant(TENANT)

        async def fire() -> None:
            for _ in triggers:  # shared by every firing task
                await kernel.trigger(TOPIC, source="benchmark")

        first_seq = kernel.journal.head_seq
        first_tx = kernel.journal.statistics().transactions
        with _gc_timer() as gc_seconds:
            threads_before = thread_cpu()
            io = _proc_io()
            cpu = time.process_time()
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(min(outstanding, flows // agents)):
                    tg.start_soon(fire)
            await kernel.wait_quiet()
            seconds = time.perf_counter() - start
            cpu = time.process_time() - cpu
            io = {k: v - io.get(k, 0) for k, v in _proc_io().items()}
            threads = thread_groups(threads_before, thread_cpu())
        events = kernel.journal.head_seq - first_seq
        transactions = kernel.journal.statistics().transactions - first_tx

        # Every flow that ever ended (only the latest stay in memory), and any still open.
        statuses = Counter({str(status): n for status, n in kernel.finished().items()})
        statuses.update(str(f.status) for f in kernel.flows() if not f.terminal)
        reasons = Counter(str(f.reason_code) for f in kernel.flows() if f.reason_code)
        closing = time.perf_counter()
    close_seconds = time.perf_counter() - closing

    setup = 2 if domains else 0  # P20's memory writes closed too
    if statuses != {str(FlowStatus.CLOSED): flows + setup} or adapter.calls != flows:
        raise BenchmarkFailed(
            f"expected {flows} CLOSED flows and as many adapter calls; got"
            f" {dict(statuses)} (reasons {dict(reasons)}) and {adapter.calls} calls"
        )
    journal_events, body_bytes = _checkpoint(path)
    return FlowRun(
        flows=flows,
        seconds=seconds,
        events=events,
        journal_events=journal_events,
        journal_bytes=_file_bytes(path),
        body_bytes=body_bytes,
        transactions=transactions,
        cpu_seconds=cpu,
        gc_seconds=gc_seconds[0],
        close_seconds=close_seconds,
        threads=threads,
        io=io,
    )


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Return each live thread's CPU seconds so far (user + system), by native id, with its name.

    Read from /proc/self/task/<tid>/stat (Linux): the journal writer's deflate, SQLite and
    syscalls run with the GIL released, so a ``--gil`` profile never sees them, and
    ``time.thread_time`` cannot be read from another thread. Empty elsewhere.
    """
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    seen: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return seen
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended meanwhile
        # After the command's ")": state is field 3, utime 14 and stime 15 (1-based).
        seen[int(tid)] = (
            names.get(int(tid), "?"),
            (int(fields[11]) + int(fields[12])) / tick,
        )
    return seen


def _group(tid: int, name: str) -> str:
    if tid == threading.main_thread().native_id:
        return "event loop"
    if name.startswith("AnyIO worker") or name.startswith("asyncio_"):
        return "journal writer (worker threads)"
    return "other threads"


def thread_groups(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """Return the CPU seconds spent between two :func:`thread_cpu` readings, by thread group.

    Groups: the event loop (the main thread), the journal writer (anyio's worker threads, where
    the writer compresses and commits; the checkpoint snapshots run there too), and the rest
    (aiosqlite's reader thread, an exporter). A thread that ended between the readings is lost
    (its CPU is still in the process's total, C1).
    """
    groups: dict[str, float] = {}
    for tid, (name, seconds) in after.items():
        spent = seconds - before.get(tid, (name, 0.0))[1]
        group = _group(tid, name)
        groups[group] = groups.get(group, 0.0) + spent
    return groups


def _proc_io() -> dict[str, int]:
    try:
        with open("/proc/self/io") as io:
            return {k: int(v) for k, _, v in (line.partition(": ") for line in io) if v}
    except OSError:
        return {}


@contextmanager
def _gc_timer() -> Iterator[list[float]]:
    """Sum the time the cyclic garbage collector runs inside the block (it is a real cost)."""
    total = [0.0]
    started = [0.0]

    def track(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            total[0] += time.perf_counter() - started[0]

    gc.callbacks.append(track)
    try:
        yield total
    finally:
        gc.callbacks.remove(track)


def _checkpoint(path: Path | str) -> tuple[int, int]:
    """Checkpoint the closed journal's WAL; return its event count and summed body bytes."""
    if str(path).startswith("postgresql://"):
        return _server_counts(str(path))  # P10: the journal on PostgreSQL
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        count, body = conn.execute("SELECT count(*), sum(length(body)) FROM events").fetchone()
    finally:
        conn.close()
    return int(count), int(body)


def _server_counts(url: str) -> tuple[int, int]:
    """Return the events of the journal at ``url`` (PostgreSQL) and their summed body bytes."""
    import psycopg  # the dir-kernel[postgres] extra: only P10 journals are on a server

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*), coalesce(sum(length(body)), 0) FROM events").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _file_bytes(path: Path | str) -> int:
    if isinstance(path, str):
        return 0  # a database on a server: no file of its own
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


class SpanReceiver:
    """A real OTLP/HTTP receiver in its own process (tests/support/otlp_receiver.py).

    Its stdout (one line per span) is drained by a thread that only counts the
    lines, so the receiver never blocks on a full pipe.
    """

    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self._proc = proc
        self.port = port
        self.spans = 0
        self._drain = threading.Thread(target=self._count, name="span-receiver", daemon=True)
        self._drain.start()

    def _count(self) -> None:
        assert self._proc.stdout is not None
        for _ in self._proc.stdout:
            self.spans += 1

    def telemetry(self) -> Telemetry:
        """Return fresh telemetry exporting to this receiver (the kernel shuts it down).

        The kernel's close waits for every span (S2 measures delivery, not a deadline): the
        time it takes is P2's ``close_s``.
        """
        processor = configure_exporter(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            }
        )
        try:
            return Telemetry(processor, drain_s=DRAIN_S)
        except TypeError:  # a kernel from before drain_s (benchmarks.pair's side A)
            return Telemetry(processor)

    async def wait_settled(self, since: int, expected: int, timeout_s: float = 5.0) -> int:
        """Wait until ``expected`` spans arrived after ``since`` or none arrive for 0.5 s."""
        deadline = time.monotonic() + timeout_s
        last, last_change = self.spans, time.monotonic()
        while self.spans - since < expected and time.monotonic() < deadline:
            await anyio.sleep(0.05)
            if self.spans != last:
                last, last_change = self.spans, time.monotonic()
            elif time.monotonic() - last_change > 0.5:
                break
        return self.spans - since


@contextmanager
def open_receiver() -> Iterator[SpanReceiver]:
    """Start the OTLP receiver subprocess and stop it on exit."""
    proc = subprocess.Popen(
        [sys.executable, str(RECEIVER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode().strip()
        if not first.startswith("PORT "):
            raise RuntimeError(f"the OTLP receiver did not start (said {first!r})")
        yield SpanReceiver(proc, int(first.removeprefix("PORT ")))
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # its end-of-input is its signal to stop
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
