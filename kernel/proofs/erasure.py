"""Erasure that keeps the chain: personal fields sealed under a per-subject key, then shredded.

A policy kind names its personal fields and the field that names their data subject
(``personal = {"guest_name": "traveller"}``), and may set how long a subject's data is
kept after its last use (``retention_s``). When a proposal of such a kind is submitted,
:meth:`Sealer.seal` replaces each personal value, before anything judges or records it,
with a token: ``dirk-sealed:v1:<key id>:<base64url(nonce || AES-256-GCM ciphertext)>``.
Everything inside the kernel works on that token: the verdict, the recorded
``ProposalSubmitted``, the approval's action hash, the intent, every projection, span
and narrative. Only the adapter sees the value again (:class:`OpeningAdapter` opens the
tokens of an intent right before the call).

The subject's key (random, 256 bits, never derived from a master key) lives in a key
store outside the journal (:class:`SubjectKeys`: a SQLite file, ``secure_delete`` on,
never hashed, chained, recorded or put in a span). ``dirk erase --subject S`` deletes
the subject's keys and checkpoints the file's WAL so their bytes are gone, and the
kernel records :class:`~kernel.core.events.SubjectErased`. After that:

- the chain, the Merkle tree, every signed checkpoint and every inclusion proof still
  verify: they cover the token, which has not changed;
- ``dirk verify --verdicts`` still re-judges every verdict the same: the verdict was a
  function of the token, never of the value (a kind's rules may not read a personal
  field: :func:`check_personal` refuses such a pack at open);
- every read path shows the token (never the value) and :func:`reveal`, which the
  CLI's ``dirk show --keys`` uses, says ``[erased]``.

The associated data binds a ciphertext to its key, kind and field, so a token copied
into another field or kind does not open. Nonces are 96 random bits per encryption.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kernel.core.events import ExecutionIntent, ProposalRecord, canonical
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack

PREFIX = "dirk-sealed:v1:"
ERASED = "[erased]"
"""What a sealed field reads as once its subject's key is gone."""
KEYS_ENV = "DIRK_SUBJECT_KEYS"
"""The environment variable naming the subject key store's file."""
_TOKEN = re.compile(r"dirk-sealed:v1:([0-9a-f]{32}):([A-Za-z0-9_-]+)")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS subject_keys (
    kid TEXT PRIMARY KEY, subject TEXT NOT NULL, key BLOB NOT NULL,
    created_ns INTEGER NOT NULL, used_ns INTEGER NOT NULL, retention_s REAL
);
CREATE INDEX IF NOT EXISTS subject_keys_subject ON subject_keys (subject);
CREATE TABLE IF NOT EXISTS erasures (
    id INTEGER PRIMARY KEY AUTOINCREMENT, subject TEXT NOT NULL, keys INTEGER NOT NULL,
    operator TEXT NOT NULL, reason TEXT NOT NULL, retention TEXT NOT NULL,
    at_ns INTEGER NOT NULL, recorded_seq INTEGER
);
"""


class ErasureError(ValueError):
    """A key store that cannot be used, or a pack whose personal fields do not hold."""


def keys_location(journal: str, configured: str | None) -> str | None:
    """Return the key store's file: configured, else ``DIRK_SUBJECT_KEYS``, else beside a
    SQLite journal (``<journal>.keys``); None for a PostgreSQL journal with neither."""
    found = configured or os.environ.get(KEYS_ENV)
    if found:
        return found
    if journal.startswith(("postgresql://", "postgres://")):
        return None
    return f"{journal}.keys"


class SubjectKeys:
    """The per-subject keys, in a SQLite file of their own (outside the journal)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode = WAL")
            # A deleted key's bytes are zeroed, not left in a free page (the default varies
            # by build: upstream SQLite leaves them).
            self._db.execute("PRAGMA secure_delete = ON")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise ErasureError(f"the subject key store {path} cannot be used ({exc})") from None
        self._cache: dict[str, tuple[str, bytes]] = {}

    def close(self) -> None:
        self._db.close()

    def key_for(
        self, subject: str, now_ns: int, retention_s: float | None, random: Callable[[int], bytes]
    ) -> tuple[str, bytes]:
        """Return the subject's key id and key, making one if it has none; mark it used."""
        found = self._cache.get(subject)
        if found is None:
            row = self._db.execute(
                "SELECT kid, key FROM subject_keys WHERE subject = ? ORDER BY created_ns LIMIT 1",
                (subject,),
            ).fetchone()
            if row is None:
                row = (random(16).hex(), random(32))
                self._db.execute(
                    "INSERT INTO subject_keys VALUES (?, ?, ?, ?, ?, ?)",
                    (row[0], subject, row[1], now_ns, now_ns, retention_s),
                )
            found = (str(row[0]), bytes(row[1]))
            self._cache[subject] = found
        self._db.execute(
            "UPDATE subject_keys SET used_ns = max(used_ns, ?),"
            " retention_s = min(coalesce(retention_s, ?), coalesce(?, retention_s))"
            " WHERE kid = ?",
            (now_ns, retention_s, retention_s, found[0]),
        )
        return found

    def key(self, kid: str) -> bytes | None:
        """Return the key of ``kid``, or None once erased."""
        row = self._db.execute("SELECT key FROM subject_keys WHERE kid = ?", (kid,)).fetchone()
        return None if row is None else bytes(row[0])

    def subjects(self) -> list[tuple[str, int, float | None]]:
        """Return each subject with keys: (subject, last used ns, retention seconds)."""
        rows = self._db.execute(
            "SELECT subject, max(used_ns), min(retention_s) FROM subject_keys GROUP BY subject"
        )
        return [(str(s), int(u), None if r is None else float(r)) for s, u, r in rows]

    def erase(self, subject: str, operator: str, reason: str, retention: str = "") -> int:
        """Destroy every key of ``subject``; note the erasure for the kernel to record.

        Returns how many keys were destroyed. The WAL is checkpointed so that no copy of
        the deleted page stays in it.
        """
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            gone = self._db.execute("DELETE FROM subject_keys WHERE subject = ?", (subject,))
            count = gone.rowcount
            self._db.execute(
                "INSERT INTO erasures (subject, keys, operator, reason, retention, at_ns)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (subject, count, operator, reason, retention, time.time_ns()),
            )
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._cache.pop(subject, None)
        return count

    def unrecorded(self) -> list[tuple[int, str, int, str, str, str]]:
        """Return the erasures no kernel has recorded yet: (id, subject, keys, operator,
        reason, retention)."""
        rows = self._db.execute(
            "SELECT id, subject, keys, operator, reason, retention FROM erasures"
            " WHERE recorded_seq IS NULL ORDER BY id"
        )
        return [(int(i), str(s), int(k), str(o), str(r), str(t)) for i, s, k, o, r, t in rows]

    def mark_recorded(self, erasure: int, seq: int) -> None:
        """Note that the event at ``seq`` records erasure ``erasure``."""
        self._db.execute("UPDATE erasures SET recorded_seq = ? WHERE id = ?", (seq, erasure))

    def forget(self, subject: str) -> None:
        """Drop a cached key (another process erased it)."""
        self._cache.pop(subject, None)


def _aad(kid: str, kind: str, field: str) -> bytes:
    # Not stored: rebuilt from where the token sits, so one moved to another kind or
    # field does not open.
    return canonical(["dirk-seal/v1", kid, kind, field])


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def is_sealed(value: object) -> bool:
    """Tell whether ``value`` is a sealed field's token."""
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


def personal_fields(kind: Any) -> Mapping[str, str]:
    """Return a policy kind's personal fields, each with the field naming its subject."""
    fields = getattr(kind, "personal", None)
    return fields if isinstance(fields, Mapping) else {}


def check_personal(catalog: PolicyCatalog) -> None:
    """Refuse a pack whose personal fields could change a verdict once erased.

    A personal field must be a string field of its kind, name a subject field of the
    kind, and be read by none of the pack's rules, invariants or templates: a verdict
    never depends on what erasure can take away, so re-judging after it gives the same.

    Raises:
        PackError: with the kind, the field and why.
    """
    for pack in catalog.packs:
        for kind in pack.kinds:
            fields = getattr(kind, "__struct_fields__", ())
            for field, subject in personal_fields(kind).items():
                _check_personal_field(pack, kind, field, subject in fields, fields)


def _check_personal_field(
    pack: PolicyPack, kind: Any, field: str, has_subject: bool, fields: tuple[str, ...]
) -> None:
    """Refuse one personal field that is no field of its kind, or that a verdict reads."""
    where = f"pack {pack.name}: {kind.__name__}.{field} is personal"
    if field not in fields or not has_subject:
        raise PackError(f"{where} but {kind.__name__} has no such field (or subject)")
    readers = _readers(pack, kind, field)
    if readers:
        raise PackError(
            f"{where} and read by {', '.join(readers)}: a verdict may not depend"
            " on a field that can be erased"
        )


def _readers(pack: PolicyPack, kind: Any, field: str) -> list[str]:
    """The pack's rules, invariants and pools that read ``kind``'s ``field``."""
    readers = [r.fn.__name__ for r in pack.rules if r.kind is kind and field in r.fields]
    readers += [
        type(i).__name__
        for i in pack.invariants
        if getattr(i, "kind", None) is kind and getattr(i, "field", None) == field
    ]
    readers += [c.pool for c in pack.consumes if c.kind is kind and "{" + field + "}" in c.pool]
    return readers


class Sealer:
    """Seals personal fields of proposals and opens them for adapters."""

    def __init__(
        self,
        catalog: PolicyCatalog,
        keys: SubjectKeys,
        random: Callable[[int], bytes],
        now_ns: Callable[[], int],
    ) -> None:
        self._kinds = {name: kind for name, kind in catalog.kinds.items() if personal_fields(kind)}
        self.keys = keys
        self._random = random
        self._now_ns = now_ns

    @property
    def active(self) -> bool:
        """Whether any kind has personal fields."""
        return bool(self._kinds)

    def seal(self, record: ProposalRecord) -> ProposalRecord:
        """Return ``record`` with its kind's personal values replaced by tokens."""
        kind = self._kinds.get(record.kind)
        if kind is None:
            return record
        params = dict(record.params)
        retention = getattr(kind, "retention_s", None)
        for field, subject_field in personal_fields(kind).items():
            value, subject = params.get(field), params.get(subject_field)
            if value is None or value == "" or is_sealed(value):
                continue  # nothing to seal (a token handed in opens only if it is ours)
            if not isinstance(value, str) or not isinstance(subject, str) or not subject:
                # Malformed: the schema refuses it, but its record must not hold it in clear.
                params[field] = ERASED
                continue
            kid, key = self.keys.key_for(subject, self._now_ns(), retention, self._random)
            nonce = self._random(12)
            sealed = AESGCM(key).encrypt(nonce, value.encode(), _aad(kid, record.kind, field))
            params[field] = f"{PREFIX}{kid}:{_b64(nonce + sealed)}"
        return ProposalRecord(
            kind=record.kind,
            params=params,
            version=record.version,
            explain=record.explain,
            confidence=record.confidence,
            valid_until_ns=record.valid_until_ns,
            context_ref=record.context_ref,
        )

    def open_params(self, kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Return ``params`` with each token opened (``[erased]`` once its key is gone)."""
        return reveal(self.keys, kind, params)


def open_token(keys: SubjectKeys, token: str, kind: str, field: str) -> str:
    """Return a token's value, or :data:`ERASED` when its key is gone (or it is not ours)."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        return token
    key = keys.key(match[1])
    if key is None:
        return ERASED
    try:
        raw = base64.urlsafe_b64decode(match[2] + "=" * (-len(match[2]) % 4))
        plain = AESGCM(key).decrypt(raw[:12], raw[12:], _aad(match[1], kind, field))
        return plain.decode()
    except (InvalidTag, ValueError, binascii.Error):
        return ERASED


def reveal(keys: SubjectKeys, kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """What a reader with the key store sees of sealed params: values, or ``[erased]``."""
    return {
        name: open_token(keys, value, kind, name) if is_sealed(value) else value
        for name, value in params.items()
    }


class OpeningAdapter:
    """An adapter whose intents' sealed fields are opened right before each call."""

    def __init__(self, inner: Any, sealer: Sealer) -> None:
        self._inner = inner
        self._sealer = sealer

    def __getattr__(self, name: str) -> Any:
        # retry_policy, lookup and the rest: the adapter's own (absent if it has none).
        found = getattr(self._inner, name)
        if name == "quote":

            async def quote(intent: ExecutionIntent) -> Any:
                return await found(self._opened(intent))

            return quote
        return found

    def _opened(self, intent: ExecutionIntent) -> ExecutionIntent:
        params = self._sealer.open_params(intent.kind, intent.params)
        return ExecutionIntent(
            key=intent.key,
            kind=intent.kind,
            adapter=intent.adapter,
            params=params,
            step=intent.step,
            valid_until_ns=intent.valid_until_ns,
            action=intent.action,
            compensation=intent.compensation,
            bounds=intent.bounds,
        )

    async def execute(self, intent: ExecutionIntent) -> Any:
        return await self._inner.execute(self._opened(intent))


async def record_erasures(journal: Any, keys: SubjectKeys) -> int:
    """Record each erasure done in the key store that no kernel recorded yet; return how many.

    ``dirk erase`` destroys the keys at once (erasure cannot wait for a kernel); the
    kernel that runs, or the next one to open, records it as ``SubjectErased``.
    """
    from kernel.core.events import Draft, SubjectErased

    recorded = 0
    for erasure, subject, count, operator, reason, retention in keys.unrecorded():
        keys.forget(subject)
        [event] = await journal.append(
            [
                Draft(
                    payload=SubjectErased(
                        subject=subject,
                        keys=count,
                        operator=operator,
                        reason=reason,
                        retention=retention,
                    )
                )
            ]
        )
        keys.mark_recorded(erasure, event.seq)
        recorded += 1
    return recorded


async def run_erasures(journal: Any, keys: SubjectKeys, clock: Any, every_s: float) -> None:
    """Record erasures as they are done, every ``every_s`` seconds (a kernel task)."""
    while True:
        await clock.sleep(every_s)
        if not journal.failed:
            await record_erasures(journal, keys)
