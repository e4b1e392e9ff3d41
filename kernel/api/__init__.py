"""The Kernel and its parts: the API an agent process embeds, and what it is made of.

:class:`Kernel` (:mod:`kernel.api.facade`) is the facade; each part is named for
what it does. Its life (:mod:`kernel.api.lifetime`); the operator's acts, offered as
its methods (:mod:`kernel.api.operating`), applied as typed requests
(:mod:`kernel.api.acts`) after the wall's checks (:mod:`kernel.api.admission`); the
one entry for a given proposal and its conversations (:mod:`kernel.api.proposals`,
:mod:`kernel.api.decisions`, :mod:`kernel.api.conversations`); the agents' answers on
their way to the DIM (:mod:`kernel.api.answers`) and their sessions
(:mod:`kernel.api.sessions`). Below them: the calls into the actors and the flows
waited on (:mod:`kernel.api.calls`), the actors (:mod:`kernel.api.wiring`), what a
proposal goes through before its verdict (:mod:`kernel.api.edge`) and the artifacts
kept (:mod:`kernel.api.documents`). A contract in pyproject.toml keeps the layers.
"""

from kernel.api.facade import Kernel

__all__ = ["Kernel"]
