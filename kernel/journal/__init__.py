"""The source of truth: the append-only, hash-chained event log, its reads,
subscriptions, head record and chain verification.
"""
