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

Failed sign-ins are throttled per operator name and per client address
(:class:`Throttle`): after ``FREE_FAILURES`` failures in a row, each further
attempt under that name or from that address is refused, without checking
anything, for a delay that doubles with every failure, up to ``MAX_DELAY_S``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import math
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# scrypt's cost: 2**14 x 8 blocks is 16 MiB and about 50 ms a check here (OWASP's minimum
# for scrypt is N=2**17 with r=8, p=1 at 128 MiB; a console with a few operators can afford
# the stronger setting, so that is the default).
_N, _R, _P = 2**17, 8, 1
_MAXMEM = 256 * 1024 * 1024
_SCHEME = "scrypt"

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}\Z")
"""An operator's name: what the journal records as who decided. (``\\Z``, not ``$``, which
would let a name end in a line feed.)"""

IDLE_S = 8 * 3600.0
"""A session unused this long ends: an unattended browser does not stay signed in for ever."""
SESSION_COOKIE = "dirk_console"
LOGIN_COOKIE = "dirk_console_login"


FREE_FAILURES = 5
"""Failed sign-ins in a row, under one name or from one address, before any is refused."""
FIRST_DELAY_S = 2.0
"""The refusal after the ``FREE_FAILURES``-th failure; each further failure doubles it."""
MAX_DELAY_S = 900.0
"""The longest refusal: a quarter of an hour (an operator locked out waits no longer)."""
FORGET_S = 3600.0
"""Failures this old (counted from the last one, once its refusal ended) are forgotten."""
MAX_KEYS = 10_000
"""The most names and addresses the throttle remembers; the least recently failed go first."""


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


class Throttled(Exception):
    """Too many failed sign-ins under this name or from this address; try again later."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        super().__init__(
            f"too many failed sign-ins under this name or from this address:"
            f" try again in {math.ceil(wait_s)} s"
        )


@dataclass
class _Strikes:
    failures: int
    last: float
    until: float


class Throttle:
    """Failed sign-ins per key (an operator's name, a client's address), in a bounded table.

    Time comes from ``clock`` (seconds, monotonic). Not thread-safe by itself: the
    :class:`Gate` holds a lock around it.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        free: int = FREE_FAILURES,
        first_delay_s: float = FIRST_DELAY_S,
        max_delay_s: float = MAX_DELAY_S,
        forget_s: float = FORGET_S,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.clock = clock
        self.free = free
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.forget_s = forget_s
        self.max_keys = max_keys
        self._table: OrderedDict[str, _Strikes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def wait_s(self, keys: tuple[str, ...]) -> float:
        """How long any of ``keys`` is still refused (0.0: not refused)."""
        now = self.clock()
        waits = [self._table[key].until - now for key in keys if key in self._table]
        return max([0.0, *waits])

    def failed(self, keys: tuple[str, ...]) -> None:
        """Count one failure against each of ``keys``."""
        now = self.clock()
        for key in keys:
            strikes = self._table.pop(key, None)
            if strikes is None or now - max(strikes.last, strikes.until) > self.forget_s:
                strikes = _Strikes(failures=0, last=now, until=now)
            strikes.failures += 1
            strikes.last = now
            beyond = strikes.failures - self.free
            if beyond >= 0:
                delay = self.first_delay_s * 2.0 ** min(beyond, 64)
                strikes.until = now + min(delay, self.max_delay_s)
            self._table[key] = strikes  # the most recently failed last
        while len(self._table) > self.max_keys:
            self._table.popitem(last=False)

    def forgive(self, keys: tuple[str, ...]) -> None:
        """Forget the failures of ``keys`` (a sign-in under them succeeded)."""
        for key in keys:
            self._table.pop(key, None)


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
    """Seconds, monotonic: idle sessions and the sign-in throttle run on it."""
    _seen: dict[str, float] = field(default_factory=dict)
    throttle: Throttle = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.throttle = Throttle(lambda: self.clock())

    @property
    def named(self) -> bool:
        """Whether operators sign in with a name and password from the operators file."""
        return self.operators is not None

    def sign_in(self, name: str, secret: str, address: str = "") -> str | None:
        """Return a new session id for valid credentials, else None.

        With an operators file ``secret`` is the operator's password; without, it
        is this run's token and ``name`` is whatever name the holder gives.
        ``address`` is the client's; failures are counted under it and the name.

        Raises:
            Throttled: too many failures under ``name`` or from ``address``; nothing
                was checked (a right password is refused too, until the delay ends).
        """
        keys = (f"name:{name[:64]}", f"address:{address[:64]}")
        with self._lock:
            wait = self.throttle.wait_s(keys)
            if wait > 0:
                raise Throttled(wait)
            if not NAME_RE.match(name):
                return None
            # Counted before the check, so attempts in flight together cannot all pass.
            self.throttle.failed(keys)
        if self.operators is None:
            ok = hmac.compare_digest(secret.encode("utf-8", "surrogatepass"), self.token.encode())
        else:
            stored = self.operators.get(name)
            # A missing name costs a check too, so timing does not tell names apart.
            ok = check_password(secret, stored or _dummy()) and stored is not None
        if not ok:
            return None
        with self._lock:
            self.throttle.forgive(keys)
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
    # surrogatepass: a token with a lone surrogate is a wrong token, never an exception.
    return isinstance(sent, str) and hmac.compare_digest(
        sent.encode("utf-8", "surrogatepass"), session.csrf.encode()
    )
