"""The agent mesh: agents hosted in other processes, over NATS JetStream (``dirk[nats]``).

Topology (``KernelConfig(bus="nats://...")`` or ``DIRK_BUS``): the kernel stays
the one writer of its journal; agent hosts (``python -m agents_sdk.serve``) are
separate processes that reach it only through the bus, which makes the process
boundary the wall between untrusted agent code and the kernel.

Subjects and streams (JetStream carries messages derived from the journal, it
is never the record):

- ``dirk.mesh.handshake`` (core request/reply): a host sends the manifest and
  the agent's credential (kernel.registry); the kernel answers with the
  session. A credential is always required here. A kernel that (re)starts says
  so on ``dirk.mesh.started``, and running hosts handshake again. Several hosts of one agent
  share its session; a handshake that fails never touches it.
- ``DIRK_WORK`` (work queue) on ``dirk.work.<agent_id>``: each WorkingContext,
  ``Nats-Msg-Id = <journal_id>:<dfid>:<attempt>``; one durable pull consumer ``pool-<agent_id>``
  per agent pool, explicit ack (sent by the host only once the kernel has recorded
  its proposal), ``ack_wait`` at least the reasoning timeout with in-progress acks,
  and a ``max_deliver`` bound.
- ``DIRK_PROPOSALS`` on ``dirk.proposals.<agent_id>``: proposals (or withdrawals)
  with ``Nats-Msg-Id = <journal_id>:<dfid>:<attempt>`` and a ``Dirk-Auth`` header, an HMAC of
  the message under the session token (the token itself never travels in a
  stored message). The kernel records each through the same DIM as an
  in-process submission, then publishes the verdict and acks.
- ``DIRK_EVENTS`` on ``dirk.evt.<type>.<dfid>``: every committed journal event,
  ``Nats-Msg-Id = <journal_id>:<seq>``, published by the relay (kernel.mesh._relay)
  from its stored position, so other services can react to decisions.
- ``DIRK_INTENTS`` (work queue) on ``dirk.intents.<adapter>`` and ``DIRK_RESULTS``:
  remote executors (kernel.mesh._executor, :class:`RemoteAdapter`); an executor sends
  in-progress acks while its adapter runs, so a slow adapter keeps its intent.
- ``DIRK_VERDICTS`` on ``dirk.verdicts.<journal_id>.<dfid>.<attempt>`` (one kept per subject):
  the verdict with its feedback. A host redelivered a context whose proposal was
  already recorded reads the verdict from here: it is never judged twice.

The kernel never imports ``nats`` unless a bus is configured.
"""

from kernel.mesh._bridge import (
    HANDSHAKE_SUBJECT,
    PROPOSAL_STREAM,
    RETRY_S,
    STARTED_SUBJECT,
    VERDICT_STREAM,
    WORK_STREAM,
    Mesh,
    MeshConfig,
    auth_tag,
    open_mesh,
    proposal_body,
    safe_token,
    verdict_subject,
    work_id,
)
from kernel.mesh._executor import RemoteAdapter, serve_executor
from kernel.mesh._relay import EVENT_STREAM, Relay, subject_of

__all__ = [
    "EVENT_STREAM",
    "HANDSHAKE_SUBJECT",
    "PROPOSAL_STREAM",
    "RETRY_S",
    "STARTED_SUBJECT",
    "VERDICT_STREAM",
    "WORK_STREAM",
    "Mesh",
    "MeshConfig",
    "Relay",
    "RemoteAdapter",
    "auth_tag",
    "open_mesh",
    "proposal_body",
    "safe_token",
    "serve_executor",
    "subject_of",
    "verdict_subject",
    "work_id",
]
