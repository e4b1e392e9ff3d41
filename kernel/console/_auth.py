"""Who may use the console: named operators, their credentials, sessions and CSRF tokens.

Two ways to sign in:

- an operators file (``--operators FILE``): one operator a line, ``name:scrypt$N$r$p$salt$hash``,
  written by ``dirk console --add-operator NAME``. Passwords are hashed with scrypt (the
  standard library's, from OpenSSL): a memory-hard function made for passwords, no new
  dependency. The operator's name comes from the file, never from a form.
- without a file (loopback only): a token made for this run and printed once, as Jupyter
  does; whoever holds it signs in and names themselves, as ``dirk decide --operator`` does.

A session is a random id in an HttpOnly, SameSite=Strict cookie, kept in this process's
memory only (a restart signs everyone out); each session has its own CSRF token, which
every form carries back and every POST must match.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# scrypt's cost: 2**14 x 8 blocks is 16 MiB and about 50 ms a check here (OWASP's minimum
# for scrypt is N=2**17 with r=8, p=1 at 128 MiB; a console with a few operators can afford
# the stronger setting, so that is the default).
_N, _R, _P = 2**17, 8, 1
_MAXMEM = 256 * 1024 * 1024
_SCHEME = "scrypt"

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
"""An operator's name: what the journal records as who decided."""

IDLE_S = 8 * 3600.0
"""A session unused this long ends: an unattended browser does not stay signed in for ever."""
SESSION_COOKIE = "dirk_console"
LOGIN_COOKIE = "dirk_console_login"


class OperatorsFileError(Exception):
    """The operators file cannot be read or has a line that is not an operator."""


def hash_password(password: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    """Return ``scrypt$N$r$p$salt$hash`` for ``password`` with a fresh random salt."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM)
    return "$".join(
        [_SCHEME, str(n), str(r), str(p), _b64(salt), _b64(digest)],
    )


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches a ``hash_password`` result (False for anything malformed)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != _SCHEME:
            return False
        expected = base64.urlsafe_b64decode(digest + "==")
        got = hashlib.scrypt(
            password.encode(),
            salt=base64.urlsafe_b64decode(salt + "=="),
            n=int(n),
            r=int(r),
            p=int(p),
            maxmem=_MAXMEM,
            dklen=len(expected),
        )
    except (ValueError, TypeError, MemoryError):
        return False
    return hmac.compare_digest(got, expected)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_operators(path: Path) -> dict[str, str]:
    """Return ``{name: stored hash}`` from an operators file.

    Raises:
        OperatorsFileError: the file cannot be read, or a line is not ``name:hash``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OperatorsFileError(f"cannot read {path}: {exc}") from None
    operators = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, stored = line.partition(":")
        if not NAME_RE.match(name) or not stored.startswith(_SCHEME + "$"):
            raise OperatorsFileError(f"{path} line {number} is not NAME:scrypt$...")
        operators[name] = stored
    return operators


def add_operator(path: Path, name: str, password: str) -> None:
    """Add (or replace) operator ``name`` in the operators file at ``path``.

    Raises:
        OperatorsFileError: a bad name, an empty password, or a file that cannot be read.
    """
    if not NAME_RE.match(name):
        raise OperatorsFileError(f"{name!r} is not a name (letters, digits, . _ @ -; 64 at most)")
    if not password:
        raise OperatorsFileError("an empty password")
    operators = read_operators(path) if path.exists() else {}
    operators[name] = hash_password(password)
    body = "".join(f"{who}:{stored}\n" for who, stored in sorted(operators.items()))
    path.touch(mode=0o600, exist_ok=True)
    path.write_text("# dirk console operators: NAME:scrypt$N$r$p$salt$hash\n" + body, "utf-8")


@dataclass(frozen=True)
class Session:
    """A signed-in operator."""

    operator: str
    csrf: str


@dataclass
class Gate:
    """Checks credentials and keeps the sessions of one console process."""

    operators: dict[str, str] | None
    """Named operators and their hashes; None: the per-run ``token`` signs in."""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    sessions: dict[str, Session] = field(default_factory=dict)
    idle_s: float = IDLE_S
    """A session unused this long ends (the operator signs in again)."""
    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, float] = field(default_factory=dict)

    @property
    def named(self) -> bool:
        """Whether operators sign in with a name and password from the operators file."""
        return self.operators is not None

    def sign_in(self, name: str, secret: str) -> str | None:
        """Return a new session id for valid credentials, else None.

        With an operators file ``secret`` is the operator's password; without, it
        is this run's token and ``name`` is whatever name the holder gives.
        """
        if not NAME_RE.match(name):
            return None
        if self.operators is None:
            ok = hmac.compare_digest(secret.encode(), self.token.encode())
        else:
            stored = self.operators.get(name)
            # A missing name costs a check too, so timing does not tell names apart.
            ok = check_password(secret, stored or _dummy()) and stored is not None
        if not ok:
            return None
        sid = secrets.token_urlsafe(32)
        self.sessions[sid] = Session(operator=name, csrf=secrets.token_urlsafe(32))
        self._seen[sid] = self.clock()
        return sid

    def session(self, sid: str | None) -> Session | None:
        """The session of a cookie's value, if it is one and was used within ``idle_s``."""
        session = self.sessions.get(sid) if sid else None
        if session is None or sid is None:
            return None
        now = self.clock()
        if now - self._seen.get(sid, now) > self.idle_s:
            self.sign_out(sid)
            return None
        self._seen[sid] = now
        return session

    def sign_out(self, sid: str | None) -> None:
        """End a session."""
        if sid:
            self.sessions.pop(sid, None)
            self._seen.pop(sid, None)


@functools.cache
def _dummy() -> str:
    return hash_password(secrets.token_urlsafe(16))


def csrf_ok(session: Session, sent: object) -> bool:
    """Whether a form's CSRF field matches its session's token."""
    return isinstance(sent, str) and hmac.compare_digest(sent.encode(), session.csrf.encode())
