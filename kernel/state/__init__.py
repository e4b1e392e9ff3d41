"""Pure folds over the journal: projections, approvals, amendments, memory, the rulebook,
intents and snapshots. Nothing here sends a message or reads a clock.
"""
