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

An application may add principals of its own (``extra``: a name and its :class:`Grants`),
each with its own nkey and reply inbox (``_INBOX.app.<name>``), on subjects of its own:
every subject it is granted must start with a plain token that is not the kernel's
(``dirk``, ``_INBOX``, a ``$`` API or a wildcard), so no grant of an application reaches
a handshake, a context, a proposal, a result, the relay or another principal's replies.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

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
APP_INBOX = "_INBOX.app"
_APP_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")
_KERNEL_ROOTS = frozenset({"dirk", "_inbox"})
"""First tokens of the kernel's subjects (compared in lower case: no look-alike either)."""
_MAX_SUBJECTS = 64
_NKEY = re.compile(r"U[A-Z2-7]{55}")
_LISTEN = re.compile(r"[A-Za-z0-9.:\[\]-]{1,253}:(-1|[0-9]{1,5})")
"""HOST:PORT (``-1``: a port the server picks); nothing else may reach the file's text."""
_MAX_TOKENS = 16


class Grants(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one principal of an application may do on the bus, beside the kernel's.

    Attributes:
        key: its public key (``ed25519:...`` or an nkey ``U...``): its own, no other
            principal's.
        publish: the subjects it may publish on (``*`` and a last ``>`` allowed).
        subscribe: the subjects it may subscribe to; its reply inbox
            (:func:`app_inbox`) is added.
        responses: whether it may answer requests it received, once each
            (``allow_responses``): a responder needs it, a requester does not.
    """

    key: str
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    responses: bool = False


def app_inbox(name: str) -> str:
    """The reply inbox only the application principal ``name`` may read."""
    return f"{APP_INBOX}.{name}"


def _app_subject(name: str, subject: object) -> str:
    """Return ``subject`` if an application principal may be granted it, else raise."""
    if not isinstance(subject, str) or not subject.isascii() or len(subject) > 512:
        raise ValueError(f"principal {name!r}: {subject!r} is not a subject")
    tokens = subject.split(".")
    if len(tokens) > _MAX_TOKENS:
        raise ValueError(f"principal {name!r}: {subject!r} has more than {_MAX_TOKENS} tokens")
    for n, token in enumerate(tokens):
        last = n == len(tokens) - 1
        if not (_APP_TOKEN.fullmatch(token) or token == "*" or (token == ">" and last)):
            raise ValueError(
                f"principal {name!r}: {subject!r}: a token is 1-128 of A-Z a-z 0-9 _ -,"
                " or * (or > last)"
            )
    # The first token is plain and not the kernel's: no wildcard or look-alike can then
    # match a subject of the kernel's ($JS/$KV/$SYS APIs cannot be written at all).
    if not _APP_TOKEN.fullmatch(tokens[0]) or tokens[0].lower() in _KERNEL_ROOTS:
        raise ValueError(
            f"principal {name!r}: {subject!r} is not the application's own subject"
            " (it must start with a plain token other than dirk or _INBOX)"
        )
    return subject


def app_grants(name: str, grants: Grants) -> tuple[list[str], list[str]]:
    """What the application principal ``name`` may publish and subscribe to.

    Raises:
        ValueError: the name cannot stand in a subject, or a subject is not the
            application's own (see :class:`Grants`).
    """
    if not safe_token(name):
        raise ValueError(f"principal {name!r}: a name on the bus is 1-128 of A-Z a-z 0-9 _ -")
    if not isinstance(grants, Grants):
        raise ValueError(f"principal {name!r}: its grants are not Grants")
    lists = (grants.publish, grants.subscribe)
    if not all(isinstance(x, tuple | list) for x in lists) or type(grants.responses) is not bool:
        raise ValueError(f"principal {name!r}: publish and subscribe are lists, responses a bool")
    if len(grants.publish) + len(grants.subscribe) > _MAX_SUBJECTS:
        raise ValueError(f"principal {name!r}: more than {_MAX_SUBJECTS} subjects")
    publish = [_app_subject(name, s) for s in grants.publish]
    subscribe = [_app_subject(name, s) for s in grants.subscribe]
    return publish, [f"{app_inbox(name)}.>", *subscribe]


def _is_nkey(public: object) -> bool:
    """Whether ``public`` is an nkey user (``U...``): its prefix, key and checksum all hold."""
    if not isinstance(public, str) or not _NKEY.fullmatch(public):
        return False
    raw = base64.b32decode(public)  # 56 characters: 35 bytes, no padding
    try:
        key = Ed25519PublicKey.from_public_bytes(raw[1:33])
    except ValueError:
        return False
    # Written again from its key bytes, a well-formed nkey is itself (prefix and CRC).
    return nkey_public(keys.public_text(key)) == public


def _nkey(public: str) -> str:
    if _is_nkey(public):
        return public
    return nkey_public(public)


def _checked(role: str, name: str, public: object) -> str:
    """Return the nkey of ``public``, the key of ``role`` ``name``, or raise KeyUnusable."""
    if not isinstance(public, str) or not (keys.is_public_key(public) or _is_nkey(public)):
        raise keys.KeyUnusable(f"{role} {name!r}: {public!r} is not a public key")
    return _nkey(public)


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
    extra: Mapping[str, Grants] | None = None,
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
        extra: an application's own principals, by name: each on its own subjects only
            (:class:`Grants`), replying on ``_INBOX.app.<name>``.
        listen: the address the server listens on.
        store_dir: JetStream's directory (None: the server's default).
        tls: a certificate and key file: every client must then use TLS.
        extra_users: user entries written as they are (for tests and tools).

    Raises:
        KeyUnusable: a public key does not parse.
        ValueError: ``listen`` is not HOST:PORT; an agent, adapter, reader or principal
            name cannot stand in a subject; an application principal is granted a
            subject of the kernel's; two principals share a key (the server would not
            know which one connected).
    """
    if not isinstance(listen, str) or not _LISTEN.fullmatch(listen):
        raise ValueError(f"listen {listen!r}: write HOST:PORT")
    owners = {_checked("kernel", "kernel", kernel): "the kernel"}
    users = [_user(kernel, *kernel_grants(), responses=True)]
    for role, grants, principals in (
        ("agent", agent_grants, agents),
        ("adapter", executor_grants, executors),
        ("reader", reader_grants, readers),
    ):
        for name, public in sorted((principals or {}).items()):
            if not safe_token(name):
                raise ValueError(f"{role} {name!r}: a name on the bus is 1-128 of A-Z a-z 0-9 _ -")
            _own(owners, _checked(role, name, public), f"{role} {name!r}")
            users.append(_user(public, *grants(name), responses=False))
    for name, granted in sorted((extra or {}).items()):
        publish, subscribe = app_grants(name, granted)
        _own(owners, _checked("principal", name, granted.key), f"principal {name!r}")
        users.append(_user(granted.key, publish, subscribe, responses=granted.responses))
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


def _own(owners: dict[str, str], nkey: str, who: str) -> None:
    # One key, one principal: a second user with the same nkey would let one log in as
    # the other's grants (the server takes whichever entry it finds).
    if nkey in owners:
        raise ValueError(f"{who}: its key is already {owners[nkey]}'s")
    owners[nkey] = who
