"""The keyring: whose public keys a kernel trusts to sign inbox requests, and as what.

The keyring is a text file outside the journal, one principal a line::

    # dirk keyring: NAME ROLE KEY [ROLES]
    ana      operator  ed25519:3q2-7w...  risk,desk-head
    bo       operator  ed25519:4r3-8x...  risk
    console  door      ed25519:Zm9v...
    pm       agent     ed25519:YmFy...

An operator's line may end with the roles it holds (comma-separated ids): a pack's
quorum counts votes by them (kernel.policy.quorums: "one risk and one desk-head").
The roles are read with the key, so whoever cannot write the keyring cannot give
themselves one; each vote records the roles its operator held when it was taken.

It is the root of trust of the operator inbox: whoever can write the journal (its
SQLite file, or PostgreSQL with the operator role) cannot add a line here, so cannot
act. A kernel reads it when it opens (``KernelConfig.keyring``, else the
``DIRK_KEYRING`` environment variable) and again whenever the file changes; it records
each key the first time it takes a request signed with it (OperatorKeyTrusted) and each
key that left the file (OperatorKeyRevoked: a revoked key is never trusted again on
that journal). ``dirk operator add NAME`` writes a private key (mode 0600) and adds its
public half here; ``dirk operator revoke NAME`` takes a line out.

Roles:

- ``operator``: signs requests that act as itself (its name is the request's operator);
- ``door``: the console or an MCP server. It signs operator requests on behalf of the
  operators it signed in (each request names the operator; the record names the door);
- ``agent``: signs ``propose`` requests for itself only, never a human act.

One more line may set the keyring's policy for the time requests carry (each field
optional; the defaults below)::

    policy  max_valid_s=3600  skew_s=300

A signed request names when it was signed and for how long it may be taken; the
kernel takes it no later than ``max_valid_s`` after its signing, whatever it names,
and refuses one signed more than ``skew_s`` later than the kernel's clock (clocks of
two machines differ by a little, never by days). So whoever can delay inbox rows
cannot hold a signed request and have it applied days later.

Like ssh's ``authorized_keys``, a keyring that others than its owner may write is
refused: whoever could write it could make themselves an operator.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

import msgspec

from kernel.core.keys import fingerprint, is_public_key

Role = Literal["operator", "door", "agent"]
ROLES: tuple[Role, ...] = ("operator", "door", "agent")
ENV = "DIRK_KEYRING"
"""The environment variable that names the keyring when the configuration does not."""
HEADER = "# dirk keyring: NAME ROLE KEY [ROLES] (see kernel.inbox.keyring)\n"
ROLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""What an operator role is spelled as (``risk``, ``desk-head``)."""


class KeyringError(ValueError):
    """A keyring that cannot be used: unreadable, writable by others, or a bad line."""


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the keyring: a name, its role, its public key (``ed25519:...``)."""

    name: str
    role: Role
    key: str
    roles: tuple[str, ...] = ()
    """An operator's roles (what a quorum counts); none for doors and agents."""

    @property
    def fingerprint(self) -> str:
        """A short, stable name for the key (16 hex digits of its SHA-256)."""
        return fingerprint(self.key)


MAX_VALID_S = 3600
"""The longest a signed request is valid for unless the keyring's policy says otherwise."""
SKEW_S = 300
"""How far ahead of the kernel's clock a request's signing time may be, by default."""
_MOST_S = 366 * 24 * 3600
"""The most either policy field may be set to: a year."""


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """What a keyring allows of the time signed requests carry (see the module's text)."""

    max_valid_s: int = MAX_VALID_S
    """A request is taken at most this long after its signing, whatever window it names."""
    skew_s: int = SKEW_S
    """A request signed up to this much later than the kernel's clock is still taken."""


class Keyring(Mapping[str, Principal]):
    """The principals of one keyring file, by name (read-only), and its policy."""

    def __init__(
        self, principals: Mapping[str, Principal] | None = None, policy: Policy | None = None
    ) -> None:
        self._by_name = dict(principals or {})
        self.policy = policy or Policy()

    def __getitem__(self, name: str) -> Principal:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)


def valid_name(name: str) -> bool:
    """Tell whether ``name`` can name a principal: printable, no space, 1 to 256 characters."""
    return (
        0 < len(name) <= 256
        and name.isprintable()
        and not any(c.isspace() for c in name)
        and not name.startswith("#")
        and _encodes(name)
    )


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_keyring(path: str | os.PathLike[str]) -> Keyring:
    """Read the keyring at ``path``.

    Raises:
        KeyringError: the file is missing or unreadable, others than its owner may write
            it, or a line is not ``NAME ROLE ed25519:KEY`` (a name twice counts as bad).
    """
    where = Path(path)
    try:
        mode = where.stat().st_mode
        text = where.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise KeyringError(
            f"keyring {where}: no such file (dirk operator add NAME makes it; or unset {ENV})"
        ) from None
    except OSError as exc:
        raise KeyringError(f"keyring {where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KeyringError(f"keyring {where} is not UTF-8 text") from None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KeyringError(
            f"keyring {where} may be written by others (mode {stat.S_IMODE(mode):o}):"
            " whoever can write it can make themselves an operator; chmod go-w it"
        )
    principals: dict[str, Principal] = {}
    policy: Policy | None = None
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "policy" and all("=" in w for w in words[1:]):
            policy = _policy(where, number, words[1:], policy)
            continue
        principal = _principal(where, number, words)
        if principal.name in principals:
            raise KeyringError(f"keyring {where}, line {number}: {principal.name!r} again")
        principals[principal.name] = principal
    return Keyring(principals, policy)


def _principal(where: Path, number: int, words: list[str]) -> Principal:
    """The principal a ``NAME ROLE KEY [ROLES]`` line names, checked."""
    if len(words) not in (3, 4):
        raise KeyringError(f"keyring {where}, line {number}: not NAME ROLE KEY [ROLES]")
    name, role, key = words[:3]
    roles = _roles(where, number, role, words[3] if len(words) == 4 else "")
    if not valid_name(name):
        raise KeyringError(f"keyring {where}, line {number}: {name[:40]!r} is no name")
    if role not in ROLES:
        raise KeyringError(
            f"keyring {where}, line {number}: role {role[:20]!r} is not one of {', '.join(ROLES)}"
        )
    if not is_public_key(key):
        raise KeyringError(f"keyring {where}, line {number}: not an ed25519: public key")
    return Principal(name=name, role=role, key=key, roles=roles)


def _policy(where: Path, number: int, settings: list[str], before: Policy | None) -> Policy:
    """The policy a ``policy NAME=SECONDS ...`` line sets, checked (once in a keyring)."""
    if before is not None:
        raise KeyringError(f"keyring {where}, line {number}: a second policy line")
    values: dict[str, int] = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if name not in Policy.__struct_fields__ or name in values:
            raise KeyringError(
                f"keyring {where}, line {number}: policy sets max_valid_s and skew_s, each once"
            )
        if not value.isdigit() or not 0 <= int(value) <= _MOST_S:
            raise KeyringError(
                f"keyring {where}, line {number}: {name} is whole seconds, 0 to {_MOST_S}"
            )
        values[name] = int(value)
    return Policy(**values)


def _roles(where: Path, number: int, role: str, text: str) -> tuple[str, ...]:
    """The roles a line names, checked: ids, no repeats, on an operator's line only."""
    if not text:
        return ()
    if role != "operator":
        raise KeyringError(f"keyring {where}, line {number}: only an operator holds roles")
    roles = tuple(text.split(","))
    if any(not ROLE_NAME.match(r) for r in roles) or len(set(roles)) != len(roles):
        raise KeyringError(
            f"keyring {where}, line {number}: roles are comma-separated ids, each once"
        )
    return roles


def keyring_problem(path: str | os.PathLike[str] | None = None) -> str | None:
    """Return why the keyring a kernel would open (``path``, else ``DIRK_KEYRING``) is unusable.

    None when it reads, or when none is named. A program that makes files before it opens
    its kernel asks first, so a bad keyring stops it before anything is half made.
    """
    where = path or os.environ.get(ENV) or None
    if where is None:
        return None
    try:
        read_keyring(where)
    except KeyringError as exc:
        return str(exc)
    return None


def roles_of(keyring: Keyring | None, name: str) -> tuple[str, ...]:
    """Return the roles the keyring gives operator ``name`` (none if it names no such operator)."""
    principal = keyring.get(name) if keyring is not None else None
    return principal.roles if principal is not None and principal.role == "operator" else ()


def add_principal(path: str | os.PathLike[str], principal: Principal) -> None:
    """Add ``principal`` to the keyring at ``path`` (created, mode 0644, if missing).

    Raises:
        KeyringError: the keyring is unusable, or already names the principal (revoke
            it first: a name's key never changes silently).
    """
    where = Path(path)
    keyring = read_keyring(where) if where.exists() else Keyring()
    if principal.name in keyring:
        raise KeyringError(f"keyring {where} already names {principal.name!r}: revoke it first")
    _write(where, [*keyring.values(), principal], keyring.policy)


def remove_principal(path: str | os.PathLike[str], name: str) -> Principal:
    """Take ``name`` out of the keyring at ``path``; return the line that went.

    Raises:
        KeyringError: the keyring is unusable or does not name ``name``.
    """
    where = Path(path)
    keyring = read_keyring(where)
    if name not in keyring:
        raise KeyringError(f"keyring {where} names no {name[:64]!r}")
    _write(where, [p for p in keyring.values() if p.name != name], keyring.policy)
    return keyring[name]


def _write(where: Path, principals: list[Principal], policy: Policy) -> None:
    """Replace the keyring in one rename, so a kernel never reads half a file."""
    width = max((len(p.name) for p in principals), default=0)
    kept = (
        ""
        if policy == Policy()
        else (f"policy  max_valid_s={policy.max_valid_s}  skew_s={policy.skew_s}\n")
    )
    body = (
        HEADER
        + kept
        + "".join(
            f"{p.name:<{width}}  {p.role:<8}  {p.key}"
            + (f"  {','.join(p.roles)}" if p.roles else "")
            + "\n"
            for p in principals
        )
    )
    fd, tmp = tempfile.mkstemp(prefix=".keyring-", dir=where.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(body)
        os.chmod(tmp, 0o644)
        os.replace(tmp, where)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
