"""The principal a mesh host vouches for on a proposal: checked before the DIM sees it.

A host's credential proves which agent proposes (``Dirk-Sig``). A host that acts for
a user says so with ``Dirk-Principal``: a compact JWS its agent key signed, bound to
this kernel's journal and to the proposal's work id and body
(kernel.identity.AssertionSigner). The kernel believes it only if it verifies with
the key the session was proven with, and only if it names the principal the flow was
opened for (``FlowCreated.on_behalf``): a flow's principal is fixed when it opens, so
an assertion can confirm it, never change it. One that does not verify is refused
PRINCIPAL_INVALID, one for another principal CROSS_TENANT (another tenant's) or
PRINCIPAL_INVALID (another user's), on record. A proposal without the header is judged
as before: the flow acts for the principal it records.
"""

from __future__ import annotations

from kernel.core import keys
from kernel.core.events import FlowCreated, Principal
from kernel.core.reasons import ReasonCode
from kernel.identity import AssertionVerifier, PrincipalInvalid
from kernel.journal.store import Journal

PRINCIPAL_HEADER = "Dirk-Principal"
"""The header of a proposal that carries its host's signed principal assertion."""


async def assertion_problem(
    journal: Journal, agent_id: str, public: str, work: str, body: bytes, assertion: object
) -> tuple[ReasonCode, str] | None:
    """Why a proposal's principal assertion is refused (code and detail), or None.

    ``work`` is the proposal's work id (``<journal>:<dfid>:<attempt>``), ``public`` the
    key the agent's session was proven with.
    """
    try:
        asserted = AssertionVerifier(journal.journal_id).verify(
            assertion, agent_id, keys.parse_public(public), work, body
        )
    except PrincipalInvalid as exc:
        return ReasonCode.PRINCIPAL_INVALID, exc.detail
    except ValueError:
        return ReasonCode.PRINCIPAL_INVALID, "the session's key is not an Ed25519 key"
    recorded = await _recorded_principal(journal, work)
    if recorded is None:
        return ReasonCode.PRINCIPAL_INVALID, "the flow records no principal to vouch for"
    if recorded.tenant != asserted.tenant:
        return ReasonCode.CROSS_TENANT, f"the flow is tenant {recorded.tenant!r}'s"
    if recorded.user != asserted.user:
        return ReasonCode.PRINCIPAL_INVALID, "the assertion names another user than the flow's"
    return None


async def _recorded_principal(journal: Journal, work: str) -> Principal | None:
    """Return whom the work's flow was recorded acting for (None: nobody, or no flow)."""
    dfid = work.split(":")[1] if work.count(":") == 2 else ""
    recorded = None
    for event in await journal.read(dfid=dfid, types=["FlowCreated"]) if dfid else []:
        if isinstance(event.payload, FlowCreated) and event.payload.on_behalf is not None:
            recorded = event.payload.on_behalf.principal
    return recorded
