"""The source of truth: the append-only, hash-chained event log, its reads,
subscriptions, head record and chain verification.

``store`` is the journal every store shares (sealing, the chain, the head record,
group commit, listeners, subscriptions); ``port`` is what a store must do; the
stores are ``_sqlite`` (a file, the default) and ``_postgres`` (a server, with a
writer lease, behind the ``dir-kernel[postgres]`` extra). ``copy`` moves a journal
between them, ``follow`` follows one from another process, ``verify`` proves it.
``codec`` is how a body is stored: canonical JSON, or deflated with a preset dictionary
(SQLite); the hash is always over the canonical bytes.
"""
