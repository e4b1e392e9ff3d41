"""What a kernel is opened with, besides its packs, adapters and allowed agents.

One frozen :class:`KernelConfig`, grouped by concern, replaces a long list of
keyword arguments; every field has a default that suits production, so
``KernelConfig()`` is a working kernel. Derive a variant with
:func:`msgspec.structs.replace`::

    config = KernelConfig(ports=Ports(clock=ManualClock(0.0), ids=SeededIds(7)))
    tight = msgspec.structs.replace(config, limits=Limits(max_in_flight=64))
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence

import msgspec
from opentelemetry.sdk.trace import TracerProvider

from kernel.adapters.contract import RetryPolicy
from kernel.core.events import Principal
from kernel.core.ports import Clock, IdSource
from kernel.escalation import EscalationPolicy
from kernel.guards import GUARD_TIMEOUT_S
from kernel.journal.store import JournalFaults
from kernel.policy.money import ModelPrice
from kernel.proofs.signing import Signing
from kernel.state.meaning import EmbeddingMatcher
from kernel.state.rulebook import RuleSearch
from kernel.state.snapshots import CHECKPOINT_EVERY
from kernel.telemetry import Telemetry
from kernel.webhooks import Webhook

KEEP_FINISHED = 10_000


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """How much the kernel takes on at once, and how long reasoning may run.

    Attributes:
        max_in_flight: flows moving at once; triggers wait for room beyond it.
        agent_concurrency: flows one hosted agent reasons about at once.
        token_budget: the most tokens one flow's reasoning may report spending in all
            attempts together (None: no cap).
        reasoning_timeout_s: the longest one reasoning step may take on the clock (None: no cap).
        guard_timeout_s: how long a soft guard may take before its flow is flagged anyway.
        keep_finished: finished flows kept in memory for ``Kernel.flow`` and ``Kernel.flows``
            (the most recently ended); older ones are read back from the journal when a
            request names them. None keeps every one (memory then grows with each flow).
    """

    max_in_flight: int = 2048
    agent_concurrency: int = 64
    token_budget: int | None = None
    reasoning_timeout_s: float | None = None
    guard_timeout_s: float = GUARD_TIMEOUT_S
    keep_finished: int | None = KEEP_FINISHED


class Supervision(msgspec.Struct, frozen=True, kw_only=True):
    """How actors are restarted, and how often the operator inbox is read.

    Attributes:
        max_restarts: actor restarts allowed within ``restart_period_s``; one more stops the
            kernel with RESTART_INTENSITY.
        restart_period_s: the window of the restart intensity.
        inbox_poll_s: how often (on the clock) to read the operator inbox and tick the
            escalation desk; None: neither (decisions only through ``Kernel.decide``).
    """

    max_restarts: int = 3
    restart_period_s: float = 5.0
    inbox_poll_s: float | None = 1.0


class Storage(msgspec.Struct, frozen=True, kw_only=True):
    """How the journal is written and anchored.

    Attributes:
        synchronous: SQLite's synchronous setting; FULL is the durable default.
        checkpoint_every: events between projection checkpoints and snapshots (0: none).
        chain_key: the journal's chain key, at least 16 bytes (default: ``DIRK_CHAIN_KEY``,
            if set): every hash becomes an HMAC under it. A new journal is keyed with it; a
            keyed journal refuses to open without it or with another.
        faults: fault injection, for tests (``kernel.testing.JournalFaults``).
        compress: keep SQLite bodies deflated with the journal's preset dictionary (about
            0.55x the bytes on disk, for about 13 us of the writer's CPU per event:
            docs/benchmarks.md); False stores canonical JSON as it is. Either way every
            body stays readable, and hashes are over the canonical bytes. PostgreSQL keeps
            JSON regardless.
        outage_grace_s: how long a journal store that cannot be reached (a PostgreSQL
            server restarting) is retried before calls are answered by their tenant's
            fail mode; an outage shorter than this is waited out and judged normally
            (docs/identity.md, "Fail modes").
        outage_probe_s: how often an idle writer asks its store whether it is there (a
            busy one learns of a lost store from its next commit).
        spool: the local SQLite file that keeps calls decided while the store is away,
            until they are appended to the journal (None: beside a SQLite journal, or
            ``dirk-spool-<journal id>.db`` in the working directory for PostgreSQL).
        group_reads: a call of a read-only kind (``PolicyKind.read_only``: it changes
            nothing in the world) is recorded, judged and answered as any other, but its
            commits skip their own sync where no other event shares them (SQLite WAL at
            ``synchronous = NORMAL`` for that transaction): safe from a killed kernel,
            durable with the next synced commit; the machine losing power may lose the
            last such records, never an effect's. PostgreSQL syncs every commit (a server
            restart would lose an asynchronous one). False: every commit syncs.
    """

    synchronous: str = "FULL"
    checkpoint_every: int = CHECKPOINT_EVERY
    chain_key: bytes | str | None = None
    faults: JournalFaults | None = None
    compress: bool = True
    outage_grace_s: float = 5.0
    outage_probe_s: float = 1.0
    spool: str | None = None
    group_reads: bool = True


class Ports(msgspec.Struct, frozen=True, kw_only=True):
    """Where time, randomness and rule search come from.

    Deterministic code reads time and draws ids only through these, so a replay
    with the same ports gives the same journal.

    Attributes:
        clock: the time port (None: the system clock).
        ids: the DFID and token port (None: OS randomness).
        jitter_seed: seeds the retry backoff jitter (None: OS randomness).
        rule_search: how rules relevant to a flow are found for its context (None:
            lexical search; a vector search plugs in through the same port).
        meaning: an embedding matcher for memory constraints (kernel.state.meaning): a
            proposal's text is scored against the constraints its words did not match,
            and the scores are recorded before the verdict reads them (None: words only).
    """

    clock: Clock | None = None
    ids: IdSource | None = None
    jitter_seed: int | None = None
    rule_search: RuleSearch | None = None
    meaning: EmbeddingMatcher | None = None


class KernelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a kernel is opened with besides packs, adapters and allowed agents.

    Attributes:
        limits: admission, concurrency and reasoning caps.
        supervision: restart intensity and the operator inbox's poll.
        storage: the journal's durability, checkpoints and chain key.
        ports: clock, ids, jitter and rule search.
        telemetry: span export (None: ``tracer_provider``'s, else the global SDK provider's,
            else configured from the ``OTEL_*`` environment).
        tracer_provider: the application's OpenTelemetry SDK TracerProvider: its sampler,
            span limits, resource and exporters then govern the kernel's spans.
        escalation: approval expiry, the escalation budget per agent and the silence
            watchdog.
        retry: the retry policy of adapters without a ``retry_policy`` of their own
            (None: the engine's default).
        bus: a NATS URL (``nats://127.0.0.1:4222``, or ``tls://...``) where agents hosted in
            other processes reach this kernel (kernel.mesh, ``pip install 'dir-kernel[nats]'``);
            None: the ``DIRK_BUS`` environment variable, else no bus.
        bus_key: the kernel's key file on the bus (PEM, Ed25519, readable by its owner
            only; ``python -m kernel.mesh.config key PATH``): the server knows the kernel
            by its public half (docs/mesh.md). None: ``DIRK_BUS_KEY``, else no identity
            (a server without users only).
        bus_tls: the TLS context for the bus (trust its server's CA). None: a context
            trusting the CA file ``DIRK_BUS_CA`` names, else the system's CAs for a
            ``tls://`` URL.
        prices: what a million tokens of each model cost (kernel.policy.money.ModelPrice), by
            model name: the DIM turns the tokens an agent's reasoning reports
            (``ctx.report_usage(tokens=..., model=...)``) into money (ReasoningCharged), spent
            in the budgets that count reasoning. Empty: reasoning is not priced.
        webhooks: where approval requests, reminders and outcomes are sent
            (kernel.webhooks.Webhook); delivered beside the kernel, never in its way.
        keyring: the file of public keys whose holders may sign operator inbox requests
            (kernel.inbox.keyring; ``dirk operator add``); None: the ``DIRK_KEYRING``
            environment variable, else none, and every inbox row is refused. Kept outside
            the journal on purpose: whoever can write the journal cannot add a key.
        artifacts: where the artifact store keeps documents' bytes (kernel.artifacts): a
            SQLite file, a ``postgresql://`` URL or a directory (``dir:PATH``). None: beside
            the journal (``X.artifacts.db`` next to ``X.db``; a table in a PostgreSQL
            journal's database), opened the first time it is used.
        subject_keys: the file of the per-subject keys that seal personal fields
            (kernel.proofs.erasure); None: ``DIRK_SUBJECT_KEYS``, else ``<journal>.keys``
            beside a SQLite journal. Only opened when a pack's kind has personal fields.
            Keep it out of the journal's backups: restoring it brings erased data back.
        principal: the principal this host vouches for (kernel.core.events.Principal):
            a flow opened with none of its own (a trigger, a hosted agent, a ``propose``
            that names none) acts on its behalf. None: such a flow's proposals are refused
            PRINCIPAL_MISSING, never run under a service identity (docs/identity.md).
        signing: how the kernel signs checkpoints of its journal's Merkle tree with its
            Ed25519 key, and where it publishes them (kernel.proofs.signing); None: a key
            in ``DIRK_CHECKPOINT_KEY_FILE`` or ``DIRK_CHECKPOINT_KEY``, else no signing.
    """

    limits: Limits = Limits()
    supervision: Supervision = Supervision()
    storage: Storage = Storage()
    ports: Ports = Ports()
    telemetry: Telemetry | None = None
    tracer_provider: TracerProvider | None = None
    escalation: EscalationPolicy = EscalationPolicy()
    retry: RetryPolicy | None = None
    bus: str | None = None
    keyring: str | None = None
    prices: Mapping[str, ModelPrice] = {}
    webhooks: Sequence[Webhook] = ()
    bus_key: str | None = None
    bus_tls: ssl.SSLContext | None = None
    artifacts: str | None = None
    signing: Signing | None = None
    subject_keys: str | None = None
    principal: Principal | None = None
