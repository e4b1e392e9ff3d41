"""What every store checks of a journal it opens: its schema version, meta, key and head.

The SQLite store (:mod:`kernel.journal._sqlite`) and the PostgreSQL store
(:mod:`kernel.journal._postgres`) keep the same meta and the same head record;
both check them here, so a journal is judged alike wherever it is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.core.events import GENESIS_HASH
from kernel.journal.errors import JournalCorrupt, JournalKeyError, JournalVersionError
from kernel.journal.head import KEYED_CHAIN, head_problem, key_problem
from kernel.journal.port import Head
from kernel.journal.sealing import check_row

SCHEMA_VERSION = "5"
"""Version 2: a body may be stored compressed (:mod:`kernel.journal.codec`). Version 3: a
FlowCreated row may stand for its flow's first ContextCompiled too (``FlowCreated.context``).
Version 4: a ProposalAccepted row may stand for its ExecutionStarted too
(``ProposalAccepted.start``). Version 5: a ProposalSubmitted row may stand for its
ProposalAccepted too (``ProposalSubmitted.accepted``). A kernel that writes to an older
journal raises its version first, so an older kernel refuses the journal by its version
instead of misreading a row (msgspec would drop a field it does not know: an execution
started, or a verdict, would go unseen)."""
READABLE_VERSIONS = frozenset({"1", "2", "3", "4", SCHEMA_VERSION})


def check_meta(meta: Mapping[Any, Any], path: str) -> dict[str, str]:
    """Check a journal's meta (schema version, id, kind of chain); return it with str keys.

    Raises:
        JournalVersionError: A schema version or a chain this kernel does not read.
        JournalCorrupt: No journal id.
    """
    version = meta.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise JournalVersionError(
            path,
            f"schema version {version!r}; this kernel reads versions"
            f" {', '.join(sorted(READABLE_VERSIONS))}",
        )
    if not isinstance(meta.get("journal_id"), str):
        raise JournalCorrupt(path, "the meta table has no journal_id")
    if meta.get("chain", KEYED_CHAIN) != KEYED_CHAIN:
        raise JournalVersionError(path, f"a chain of kind {meta['chain']!r}, unknown here")
    return {str(k): v for k, v in meta.items()}


def check_state(
    meta: Mapping[str, str], last: list[Any], path: str, chain_key: bytes | None, readonly: bool
) -> tuple[str, Head, bool]:
    """Check a journal's key and head against its ``meta`` and ``last`` two rows (newest first).

    Returns:
        The journal's id, its checked head, and whether it is (or will be) keyed.
    """
    journal_id = meta["journal_id"]
    # Reading a keyed journal needs no key (its hashes then go unchecked); writing does.
    problem = key_problem(meta, chain_key, events=0, need_key=not readonly)
    if problem:
        raise JournalKeyError(path, problem)
    keyed = meta.get("chain") == KEYED_CHAIN
    checked = chain_key is not None or not keyed
    key = chain_key if keyed else None
    head = Head(journal_id, *check_head(last, path, meta, key, checked))
    # A key given to an unkeyed journal: refused once it has events (a read-only open
    # cannot key it either); a journal without events is keyed from its first on.
    events = head.seq if not readonly else max(head.seq, 1)
    problem = key_problem(meta, chain_key, events=events, need_key=False)
    if problem:
        raise JournalKeyError(path, problem)
    return journal_id, head, keyed or chain_key is not None


def check_head(
    rows: list[Any],
    path: str,
    meta: Mapping[str, str],
    key: bytes | None,
    hashes_checked: bool,
) -> tuple[int, bytes]:
    """Return the last event's seq and hash, after checking it against the head record
    and that it chains to the one before."""
    last_seq = int(rows[0][0]) if rows else 0
    last_hash = rows[0][4] if rows and isinstance(rows[0][4], bytes) else None
    problem, seq = head_problem(meta, last_seq, last_hash, key if hashes_checked else None)
    if problem:
        raise JournalCorrupt(path, f"{problem} (run dirk verify)", seq=seq)
    if not rows:
        return 0, GENESIS_HASH
    before = rows[1] if len(rows) == 2 else None
    expected = before[0] + 1 if before else 1
    prev = before[4] if before and isinstance(before[4], bytes) else GENESIS_HASH
    problem, _ = check_row(rows[0], expected, prev, key, hashes_checked)
    if problem:
        raise JournalCorrupt(
            path, f"{problem} (run dirk verify to find the first bad event)", seq=expected
        )
    return rows[0][0], rows[0][4]
