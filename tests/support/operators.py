"""Operators, doors and agents with keys, for tests that write the operator inbox.

:func:`provision` makes a key pair per name, writes the private keys (mode 0600) into
one directory as ``<name>.key`` and their public halves into a keyring file: what
``dirk operator add`` does, without the CLI. Point a kernel and the clients at them
with ``DIRK_KEYRING`` and ``DIRK_KEY`` (:meth:`Keys.env`), or pass the paths.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import closing
from pathlib import Path

import anyio
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel import Kernel
from kernel.core.keys import load_private_key, public_text, write_private_key
from kernel.inbox import InboxRequest, Signer
from kernel.inbox.keyring import ENV as KEYRING_ENV
from kernel.inbox.keyring import Principal, Role, add_principal
from kernel.inbox.proof import new_request_id, sign
from kernel.inbox.requests import VALID_S

OPERATORS = ("ana", "bo", "bob", "rui", "a", "o", "ops", "cy", "dana", "x", "kim")
"""The operator names the suite's tests act as."""
DOORS = ("console", "mcp")
AGENTS = ("ide", "stranger")
"""The agents the suite's MCP tests propose through the inbox as."""


class Keys(msgspec.Struct, frozen=True, kw_only=True):
    """Where the provisioned keys are: the keyring file and the directory of private keys."""

    keyring: Path
    keys: Path

    def env(self) -> dict[str, str]:
        """The environment that points kernels and clients at these keys."""
        return {KEYRING_ENV: str(self.keyring), "DIRK_KEY": str(self.keys)}

    def key(self, name: str) -> Ed25519PrivateKey:
        """The private key of ``name``."""
        return load_private_key(self.keys / f"{name}.key")

    def signer(self, location: str | os.PathLike[str], journal_id: str, name: str) -> Signer:
        """A signer for ``name`` on the journal at ``location`` (whose id is ``journal_id``)."""
        return Signer(str(location), journal_id, self.key(name), name)

    def row(
        self,
        request: InboxRequest,
        journal_id: str,
        name: str,
        *,
        request_id: str | None = None,
        signed_ns: int | None = None,
    ) -> bytes:
        """The signed row of ``request`` by ``name`` for journal ``journal_id``.

        Signed at ``signed_ns`` (None: now, on this machine's clock).
        """
        return sign(
            request,
            key=self.key(name),
            signer=name,
            journal_id=journal_id,
            request_id=request_id,
            signed_ns=time.time_ns() if signed_ns is None else signed_ns,
        )


@functools.cache
def suite_keys() -> Keys:
    """The suite's own keys, made once per run in a temporary directory (removed at exit).

    Tests and the kernels, consoles and CLIs they start share them (``operator_keys``,
    tests.support.browser), so a decision posted by one is trusted by the other.
    """
    root = Path(tempfile.mkdtemp(prefix="dirk-keys-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return provision(root)


def with_keys(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (the process's by default) with the suite's keys where it names none."""
    base = dict(os.environ if env is None else env)
    return {**suite_keys().env(), **base}


def provision(
    root: Path,
    operators: Iterable[str] = OPERATORS,
    *,
    doors: Iterable[str] = DOORS,
    agents: Iterable[str] = AGENTS,
) -> Keys:
    """Make keys for ``operators``, ``doors`` and ``agents`` under ``root``; return where."""
    root.mkdir(parents=True, exist_ok=True)
    keys = Keys(keyring=root / "keyring", keys=root / "keys")
    keys.keys.mkdir(exist_ok=True)
    roles: Mapping[str, Role] = {
        **{name: "operator" for name in operators},
        **{name: "door" for name in doors},
        **{name: "agent" for name in agents},
    }
    for name, role in roles.items():
        add(keys, name, role)
    return keys


def add(keys: Keys, name: str, role: Role = "operator", roles: Iterable[str] = ()) -> None:
    """Give ``name`` a key and put its public half in the keyring (with its operator roles)."""
    private = write_private_key(keys.keys / f"{name}.key")
    add_principal(
        keys.keyring,
        Principal(name=name, role=role, key=public_text(private), roles=tuple(roles)),
    )


def journal_id_of(location: str | os.PathLike[str]) -> str:
    """Read the id of the journal at ``location`` (a file or a server URL), synchronously."""
    where = str(location)
    if where.startswith(("postgresql:", "postgres:")):
        import psycopg

        with psycopg.connect(where) as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
    else:
        with closing(sqlite3.connect(where)) as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
    assert row is not None, f"{where} holds no journal id"
    return str(row[0])


def post(
    keys: Keys,
    location: str | os.PathLike[str],
    request: InboxRequest,
    name: str,
    now_ns: int | None = None,
) -> int:
    """Sign ``request`` as ``name`` and post it to the inbox at ``location``; return the row id.

    Signed and posted at ``now_ns`` (None: now, on this machine's clock).
    """
    at = time.time_ns() if now_ns is None else now_ns
    return keys.signer(location, journal_id_of(location), name).post(request, at)


def raw_row(
    keys: Keys, name: str, journal_id: str, request: Mapping[str, object], request_id: str = ""
) -> bytes:
    """A row signed by ``name`` over ``request`` as given, unchecked: what a broken client sends.

    The kernel decodes a row before it checks its signature, so a request it cannot
    decode is refused at its wall whoever signed it.
    """
    from kernel.core.keys import sign as sign_bytes
    from kernel.inbox.proof import CONTEXT

    envelope = {
        "journal_id": journal_id,
        "request": dict(request),
        "request_id": request_id or new_request_id(),
        "signer": name,
        "signed_ns": time.time_ns(),
        "valid_s": VALID_S,
        "signature": "",
    }
    body = msgspec.json.encode(envelope, order="sorted")
    envelope["signature"] = sign_bytes(keys.key(name), CONTEXT, body)
    return msgspec.json.encode(envelope, order="sorted")


def insert(location: str | os.PathLike[str], body: bytes, now_ns: int = 0) -> int:
    """Insert ``body`` as a row of the inbox at ``location``, as any writer of the table can."""
    from kernel.journal.inbox_store import open_inbox

    with open_inbox(str(location)) as store:
        return store.insert(body, now_ns)


async def wait_until(kernel: Kernel, done: Callable[[], bool], bound_s: float = 60.0) -> None:
    """Wait until ``done()`` holds, looked at after each commit of ``kernel``'s journal.

    Woken by the journal's commits (a subscription), never by a sleep.
    """
    with anyio.fail_after(bound_s):
        async with kernel.journal.subscribe(kernel.journal.head_seq + 1) as batches:
            if done():
                return
            async for _ in batches:
                if done():
                    return
    raise AssertionError("the journal closed first")


async def wait_taken(kernel: Kernel, row: int, bound_s: float = 60.0) -> int:
    """Wait until an event of ``kernel``'s journal takes inbox row ``row``; return its seq."""
    await wait_until(kernel, lambda: row in kernel.projections.inbox_taken, bound_s)
    return kernel.projections.inbox_taken[row]
