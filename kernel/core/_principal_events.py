"""On whose behalf: principals, tenants, their policy layers, and delegations (docs/identity.md).

An agent acts for someone. A :class:`Principal` is that someone: a user in a tenant,
authenticated at the door the call came through (the embedding host vouches for it in
process; a signed user token, an MCP bearer token's subject, or a mesh host's signed
assertion elsewhere). Every flow records the principal it was opened for, with the
agent's tier and the delegation chain it acts under (:class:`OnBehalf`, on
``FlowCreated``), so every verdict, span and audit row names them and replay judges
from the record alone.

A tenant is declared (:class:`TenantDeclared`): its members and their scopes, and the
policy layered by agent tier, kind, user and user x kind (:class:`TenantPolicy`, the
most specific layer that sets a value wins), changed one layer at a time
(:class:`TenantPolicyChanged`). A delegation (:class:`Delegated`) hands a task from one
agent to another for one principal with the scopes it names; the effective scopes of a
call are the intersection along its whole chain, never wider than any hop nor than the
principal's own.

These records are data only: the principals domain (kernel.state.principals) folds them
and the DIM's principal layer judges with them.
"""

from __future__ import annotations

from enum import StrEnum

from kernel.core._records import Payload, Record


class Tier(StrEnum):
    """What kind of caller an agent is, for policy: the layers are set per tier."""

    INTERACTIVE = "interactive"
    """An agent a person is talking to."""
    SUBAGENT = "subagent"
    """An agent another agent delegated a task to."""
    API = "api"
    """A program calling on a user's behalf (a token, no conversation)."""
    BACKGROUND = "background"
    """Scheduled or triggered work nobody is watching."""


class Permission(StrEnum):
    """What a policy layer says of a call: the most specific layer that says anything wins."""

    ALLOW = "allow"
    FLAG = "flag"
    """Allowed only once a human approved it: the call escalates (APPROVAL_REQUIRED)."""
    DENY = "deny"


class FailMode(StrEnum):
    """What a tenant's calls do while the journal's store cannot be reached."""

    CLOSED = "closed"
    """Refused (GOVERNANCE_UNAVAILABLE), on record once the store is back: the default."""
    OPEN = "open"
    """Kinds their pack marks read-only proceed, spooled and recorded as decided without
    the journal once the store is back; everything else is refused as when closed."""


class Principal(Record, frozen=True):
    """The person (or service account) an agent acts for, as its door authenticated it.

    Attributes:
        tenant: the tenant the call is made in.
        user: the user's id within its identity provider.
        email: the user's email, when the door knows it.
        roles: the roles the door vouches for (informational: scopes decide).
        scopes: the scopes the door vouches for (a token's ``scope`` claim). None: the
            door claims none, and the tenant's declared membership decides alone; a list:
            the call never gets more than it, whatever the tenant grants.
        vouched_by: which door authenticated it: ``host`` (the embedding program),
            ``token:<key id>`` (a signed user token), ``mcp:<client>``, ``bus:<host>``.
    """

    tenant: str
    user: str
    email: str = ""
    roles: list[str] = []
    scopes: list[str] | None = None
    vouched_by: str = "host"


class OnBehalf(Record, frozen=True):
    """What a flow records of whom it acts for (``FlowCreated.on_behalf``).

    Attributes:
        principal: the authenticated principal.
        tier: the calling agent's tier (a ``Tier`` value).
        chain: the agents the authority passed through, in order, the flow's own agent
            last; empty for a direct call that no delegation handed on.
        delegation: the id of the delegation the call acts under (``Delegated``), or "".
    """

    principal: Principal
    tier: str = Tier.INTERACTIVE
    chain: list[str] = []
    delegation: str = ""


class Member(Record, frozen=True):
    """A user of a tenant: what the tenant grants it."""

    email: str = ""
    roles: list[str] = []
    scopes: list[str] = []


class Layer(Record, frozen=True):
    """One layer of a tenant's policy: what it sets (None: it leaves it to a wider layer).

    Attributes:
        permission: a ``Permission`` value, or None.
        rate_per_minute: the most allowed calls per (tenant, user, tier) within any 60
            seconds on the kernel's clock, or None.
    """

    permission: str | None = None
    rate_per_minute: int | None = None


class TenantPolicy(Record, frozen=True):
    """A tenant's policy, layered; the most specific layer that sets a value wins.

    From least to most specific: ``tiers`` (tier -> layer), ``kinds`` (kind -> tier ->
    layer), ``users`` (user -> tier -> layer), ``user_kinds`` (user -> kind -> tier ->
    layer). A tier of ``*`` in any of them applies to every tier, below the named tier at
    the same level.
    """

    tiers: dict[str, Layer] = {}
    kinds: dict[str, dict[str, Layer]] = {}
    users: dict[str, dict[str, Layer]] = {}
    user_kinds: dict[str, dict[str, dict[str, Layer]]] = {}
    fail_mode: str = FailMode.CLOSED


class TenantSpec(Record, frozen=True):
    """A tenant as declared: its members and its policy."""

    id: str
    name: str = ""
    members: dict[str, Member] = {}
    policy: TenantPolicy = TenantPolicy()


# --- events ---------------------------------------------------------------------------


class TenantDeclared(Payload, frozen=True, tag=True):
    """A tenant declared, or declared again (the whole spec replaces the one before).

    ``operator`` is who declared it (``host`` in process, else the operator whose signed
    request did).
    """

    tenant: TenantSpec
    operator: str = "host"
    reason: str = ""
    inbox_id: int | None = None


class TenantPolicyChanged(Payload, frozen=True, tag=True):
    """One layer of a tenant's policy set: in force from the next decision on.

    The layer is named by what it targets: ``user`` and ``kind`` empty for a tier's
    default, ``kind`` for a kind's, ``user`` for a user's, both for a user's on a kind;
    ``tier`` ``*`` for every tier at that level. A field left None keeps its value.
    ``scopes``, when set, replaces the user's scopes in the tenant (a revocation).
    """

    tenant: str
    tier: str = "*"
    user: str = ""
    kind: str = ""
    permission: str | None = None
    rate_per_minute: int | None = None
    scopes: list[str] | None = None
    operator: str = "host"
    reason: str = ""
    inbox_id: int | None = None


class Delegated(Payload, frozen=True, tag=True):
    """An agent handed a task to another for one principal, with the scopes it names.

    ``parent`` is the delegation ``from_agent`` acted under (""; a direct delegation by
    the agent the principal called); ``chain`` is the agents the authority passed
    through, ending with ``to_agent``. The scopes a call under it gets are computed when
    it is judged: the principal's, intersected with every hop's ``scopes``.
    """

    delegation: str
    principal: Principal
    from_agent: str
    to_agent: str
    task: str = ""
    scopes: list[str] = []
    parent: str = ""
    chain: list[str] = []


class DecidedWithoutJournal(Payload, frozen=True, tag=True):
    """A call decided while the journal's store could not be reached, appended once it was.

    Its tenant's fail mode decided it (``allowed``: a read-only kind of a tenant that fails
    open; otherwise refused GOVERNANCE_UNAVAILABLE). It was kept in a durable local spool
    meanwhile and is appended in the spool's order, exactly once (``spool_id``). Never
    shown as an ordinary allow: audits mark it decided without the journal.

    Attributes:
        spool_id: the call's place in the spool (unique, increasing).
        decided_ns: when it was decided, on the kernel's clock.
        dfid: the trace id the call was answered with.
        agent_id: the calling agent.
        kind: the policy kind called.
        on_behalf: whom it acted for.
        allowed: whether it proceeded.
        reason_code: why it was refused (None when allowed).
        detail: what the caller was told.
        params_digest: the hex SHA-256 of the call's canonical parameters.
    """

    spool_id: int
    decided_ns: int
    dfid: str
    agent_id: str
    kind: str
    on_behalf: OnBehalf | None = None
    allowed: bool = False
    reason_code: str | None = None
    detail: str = ""
    params_digest: str = ""


PRINCIPAL_PAYLOADS = (TenantDeclared, TenantPolicyChanged, Delegated, DecidedWithoutJournal)
"""The event types of the principals domain (kernel.state.principals)."""
