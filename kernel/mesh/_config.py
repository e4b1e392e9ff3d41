"""The nats-server configuration the mesh needs: one nkey user per principal, least privilege.

:func:`server_config` writes it from the principals' public keys (``ed25519:...``, or
nkeys ``U...``); ``python -m kernel.mesh.config`` prints it (docs/mesh.md). The agents'
keys are the verifiers the journal records (``CredentialIssued``): an operator who
issues or rotates a credential writes the config again and reloads the server
(``nats-server --signal reload``); connected principals keep their connections.

Every principal gets a publish *and* a subscribe allow list (a user without a
subscribe list reads everything, other principals' inboxes included), and its own
reply inbox. Subjects name their owner, so each grant names one agent or adapter:

- the kernel owns the streams (``$JS.API.>``), answers handshakes once each
  (``allow_responses``), reads proposals and results, publishes contexts, verdicts,
  intents and the relay;
- the hosts of agent A handshake on ``dirk.mesh.handshake.A``, pull their own
  contexts (consumer ``pool-A``), ask for artifacts on ``dirk.mesh.artifact.A``,
  publish on ``dirk.proposals.A`` and read ``dirk.verdicts.A.>`` only;
- the executors of adapter B pull intents from ``exec-B``, publish on
  ``dirk.results.B.>`` and read their own stored results;
- a reader of the relay reads ``dirk.evt.>`` and the ``DIRK_EVENTS`` stream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from kernel.core import keys
from kernel.mesh._protocol import safe_token
from kernel.mesh._wire import (
    KERNEL_INBOX,
    agent_inbox,
    executor_inbox,
    nkey_public,
    reader_inbox,
)

EVENT_STREAM = "DIRK_EVENTS"
_ACCOUNT = "DIRK"


def _nkey(public: str) -> str:
    if public.startswith("U") and len(public) == 56:
        return public
    return nkey_public(public)


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def _user(public: str, publish: Sequence[str], subscribe: Sequence[str], *, responses: bool) -> str:
    lines = [
        f"      {{ nkey: {_nkey(public)}, permissions: {{",
        f"          publish: {{ allow: {_list(publish)} }}",
        f"          subscribe: {{ allow: {_list(subscribe)} }}",
    ]
    if responses:
        lines.append("          allow_responses: true")
    lines.append("      } }")
    return "\n".join(lines)


def kernel_grants() -> tuple[list[str], list[str]]:
    """What the kernel (and its RemoteAdapters) may publish and subscribe to."""
    publish = [
        "$JS.API.>",  # it creates and owns every stream, consumer and the relay's bucket
        "$JS.ACK.DIRK_PROPOSALS.>",
        "dirk.work.>",
        "dirk.verdicts.>",
        "dirk.intents.>",
        "dirk.evt.>",
        "dirk.mesh.started",
        "$KV.DIRK_RELAY.>",
    ]
    subscribe = [
        f"{KERNEL_INBOX}.>",
        "dirk.mesh.handshake.*",
        "dirk.mesh.artifact.*",
        "dirk.results.>",
    ]
    return publish, subscribe


def agent_grants(agent_id: str) -> tuple[list[str], list[str]]:
    """What the hosts of ``agent_id`` may publish and subscribe to."""
    publish = [
        f"dirk.mesh.handshake.{agent_id}",
        f"dirk.mesh.artifact.{agent_id}",
        f"dirk.proposals.{agent_id}",
        f"$JS.API.CONSUMER.MSG.NEXT.DIRK_WORK.pool-{agent_id}",
        f"$JS.ACK.DIRK_WORK.pool-{agent_id}.>",
        f"$JS.API.DIRECT.GET.DIRK_VERDICTS.dirk.verdicts.{agent_id}.>",
    ]
    subscribe = [f"{agent_inbox(agent_id)}.>", "dirk.mesh.started", f"dirk.verdicts.{agent_id}.>"]
    return publish, subscribe


def executor_grants(adapter: str) -> tuple[list[str], list[str]]:
    """What the executors of ``adapter`` may publish and subscribe to."""
    publish = [
        f"$JS.API.CONSUMER.MSG.NEXT.DIRK_INTENTS.exec-{adapter}",
        f"$JS.ACK.DIRK_INTENTS.exec-{adapter}.>",
        f"dirk.results.{adapter}.>",
        f"$JS.API.DIRECT.GET.DIRK_RESULTS.dirk.results.{adapter}.>",
    ]
    return publish, [f"{executor_inbox(adapter)}.>"]


def reader_grants(name: str) -> tuple[list[str], list[str]]:
    """What a reader of the relay (committed events) may publish and subscribe to."""
    publish = [
        f"$JS.API.STREAM.INFO.{EVENT_STREAM}",
        f"$JS.API.STREAM.MSG.GET.{EVENT_STREAM}",
        f"$JS.API.DIRECT.GET.{EVENT_STREAM}.>",
    ]
    return publish, [f"{reader_inbox(name)}.>", "dirk.evt.>"]


def server_config(
    *,
    kernel: str,
    agents: Mapping[str, str] | None = None,
    executors: Mapping[str, str] | None = None,
    readers: Mapping[str, str] | None = None,
    listen: str = "127.0.0.1:4222",
    store_dir: str | None = None,
    tls: tuple[str, str] | None = None,
    extra_users: Sequence[str] = (),
) -> str:
    """Return a nats-server configuration for the mesh.

    Args:
        kernel: the kernel's public key (``ed25519:...`` or an nkey ``U...``).
        agents: each agent id's public key: its credential's verifier.
        executors: each remote adapter's executor public key.
        readers: principals allowed to read the committed-events relay, by name.
        listen: the address the server listens on.
        store_dir: JetStream's directory (None: the server's default).
        tls: a certificate and key file: every client must then use TLS.
        extra_users: user entries written as they are (for tests and tools).

    Raises:
        KeyUnusable: a public key does not parse.
        ValueError: an agent, adapter or reader name cannot stand in a subject.
    """
    users = [_user(kernel, *kernel_grants(), responses=True)]
    for role, grants, principals in (
        ("agent", agent_grants, agents),
        ("adapter", executor_grants, executors),
        ("reader", reader_grants, readers),
    ):
        for name, public in sorted((principals or {}).items()):
            if not safe_token(name):
                raise ValueError(f"{role} {name!r}: a name on the bus is 1-128 of A-Z a-z 0-9 _ -")
            nkey = public.startswith("U") and len(public) == 56
            if not keys.is_public_key(public) and not nkey:
                raise keys.KeyUnusable(f"{role} {name!r}: {public!r} is not a public key")
            users.append(_user(public, *grants(name), responses=False))
    users.extend(f"      {entry}" for entry in extra_users)
    js = f"jetstream {{ store_dir: {json.dumps(store_dir)} }}" if store_dir else "jetstream {}"
    parts = [f"listen: {listen}", js]
    if tls is not None:
        cert, key = tls
        parts.append(f"tls {{ cert_file: {json.dumps(cert)}, key_file: {json.dumps(key)} }}")
    parts.append(
        "accounts {\n"
        f"  {_ACCOUNT} {{\n"
        "    jetstream: enabled\n"
        "    users = [\n" + "\n".join(users) + "\n    ]\n"
        "  }\n"
        "}"
    )
    return "\n".join(parts) + "\n"
