"""Pure folds over the journal: projections, the domains that plug into them (reservations,
memory and the rulebook, beliefs: see :mod:`kernel.state.domain`), approvals, amendments,
intents and snapshots. Nothing here sends a message or reads a clock.
"""
