"""The agent mesh: agents hosted in other processes, over NATS JetStream (``dir-kernel[nats]``).

Topology (``KernelConfig(bus="nats://...")`` or ``DIRK_BUS``): the kernel stays
the one writer of its journal; agent hosts (``python -m agents_sdk.serve``) and
executors (``python -m kernel.mesh.executor``) are separate processes that reach it
only through the bus, which makes the process boundary the wall between untrusted
code and the kernel. docs/mesh.md has the table of subjects: who may publish, who
may subscribe, and why.

Trust (kernel.mesh._wire, _protocol, _config): every principal is one Ed25519 key,
known to the server as an nkey user with publish and subscribe allow lists
(:func:`server_config`). Agents prove their credential by signing the kernel's
one-time challenge and sign each proposal; executors sign each result; no message
holds a secret, and no message, from anyone, can stop the kernel: each is decoded
strictly, refused on record (``InputRefused``, entry ``bus.*``) when it is not what
its subject expects, and a message nats.py could not even build is dropped.

Subjects and streams (JetStream carries messages derived from the journal, it
is never the record):

- ``dirk.mesh.handshake.<agent_id>`` (core request/reply): challenge, then the
  manifest with its proof; the kernel holds the session. A kernel that (re)starts
  says so on ``dirk.mesh.started``, and running hosts handshake again.
- ``DIRK_WORK`` (work queue) on ``dirk.work.<agent_id>``: each WorkingContext,
  ``Nats-Msg-Id = <journal_id>:<dfid>:<attempt>``; one durable pull consumer
  ``pool-<agent_id>`` per agent pool, explicit ack (sent by the host only once the
  kernel has recorded its proposal), in-progress acks, a ``max_deliver`` bound.
- ``DIRK_PROPOSALS`` on ``dirk.proposals.<agent_id>``: proposals (or withdrawals)
  with ``Dirk-Sig`` (signing the work id ``<journal_id>:<dfid>:<attempt>`` and the
  body) and ``Nats-Msg-Id = <work id>:<digest of Dirk-Sig>`` (:func:`proposal_id`): the
  stream deduplicates ids across every agent, and no other agent can make this one.
- ``DIRK_VERDICTS`` on ``dirk.verdicts.<agent_id>.<journal_id>.<dfid>.<attempt>``
  (one kept per subject): the verdict with its feedback.
- ``DIRK_INTENTS`` (work queue) on ``dirk.intents.<adapter>`` and ``DIRK_RESULTS`` on
  ``dirk.results.<adapter>.<hash>``: remote executors (:class:`RemoteAdapter`).
- ``DIRK_EVENTS`` on ``dirk.evt.<type>.<dfid>``: every committed journal event, for
  the principals allowed to read it (kernel.mesh._relay).

The kernel never imports ``nats`` unless a bus is configured.

Key files (:func:`write_private_key`, :func:`load_private_key`, :func:`public_text`,
:class:`KeyUnusable`) are kernel.core.keys's, named here for the applications that run
principals of their own on the bus (``python -m kernel.mesh.config key`` writes the same).
"""

from kernel.core.fetching import current_fetcher
from kernel.core.keys import KeyUnusable, load_private_key, public_text, write_private_key
from kernel.mesh._bridge import (
    PROPOSAL_STREAM,
    VERDICT_STREAM,
    WORK_STREAM,
    Mesh,
    MeshConfig,
    open_mesh,
)
from kernel.mesh._config import (
    Grants,
    agent_grants,
    app_grants,
    app_inbox,
    executor_grants,
    kernel_grants,
    reader_grants,
    server_config,
)
from kernel.mesh._executor import (
    INTENT_STREAM,
    RESULT_STREAM,
    RemoteAdapter,
    Result,
    recorded_result_holds,
    result_holds,
    result_subject,
    serve_executor,
    sign_result,
)
from kernel.mesh._principal import PRINCIPAL_HEADER
from kernel.mesh._protocol import (
    ARTIFACT_PREFIX,
    FETCHED_DECODER,
    HANDSHAKE_PREFIX,
    SIGNATURE_HEADER,
    STARTED_SUBJECT,
    ArtifactData,
    ArtifactRefused,
    Challenge,
    FetchArtifact,
    Hello,
    Prove,
    Refused,
    Welcome,
    artifact_subject,
    fetch_signature,
    fetch_signed,
    handshake_subject,
    parse_work_id,
    proof_message,
    proposal_body,
    proposal_id,
    proposal_signature,
    proposal_signed,
    safe_token,
    sign_proof,
    verdict_subject,
    work_id,
)
from kernel.mesh._relay import EVENT_STREAM, Relay, subject_of
from kernel.mesh._wire import (
    KERNEL_INBOX,
    RETRY_S,
    BusAuth,
    GuardedClient,
    agent_inbox,
    connect,
    executor_inbox,
    kernel_auth,
    nkey_public,
    nkey_seed,
    reader_inbox,
    tls_from_env,
)
from kernel.registry import agent_key

__all__ = [
    "ARTIFACT_PREFIX",
    "EVENT_STREAM",
    "FETCHED_DECODER",
    "HANDSHAKE_PREFIX",
    "INTENT_STREAM",
    "KERNEL_INBOX",
    "PRINCIPAL_HEADER",
    "PROPOSAL_STREAM",
    "RESULT_STREAM",
    "RETRY_S",
    "SIGNATURE_HEADER",
    "STARTED_SUBJECT",
    "VERDICT_STREAM",
    "WORK_STREAM",
    "ArtifactData",
    "ArtifactRefused",
    "BusAuth",
    "Challenge",
    "FetchArtifact",
    "Grants",
    "GuardedClient",
    "Hello",
    "KeyUnusable",
    "Mesh",
    "MeshConfig",
    "Prove",
    "Refused",
    "Relay",
    "RemoteAdapter",
    "Result",
    "Welcome",
    "agent_grants",
    "agent_inbox",
    "agent_key",
    "app_grants",
    "app_inbox",
    "artifact_subject",
    "connect",
    "current_fetcher",
    "executor_grants",
    "executor_inbox",
    "fetch_signature",
    "fetch_signed",
    "handshake_subject",
    "kernel_auth",
    "kernel_grants",
    "load_private_key",
    "nkey_public",
    "nkey_seed",
    "open_mesh",
    "parse_work_id",
    "proof_message",
    "proposal_body",
    "proposal_id",
    "proposal_signature",
    "proposal_signed",
    "public_text",
    "reader_grants",
    "reader_inbox",
    "recorded_result_holds",
    "result_holds",
    "result_subject",
    "safe_token",
    "serve_executor",
    "server_config",
    "sign_proof",
    "sign_result",
    "subject_of",
    "tls_from_env",
    "verdict_subject",
    "work_id",
    "write_private_key",
]
