"""Which tools an agent is offered: the kinds its manifest and its principal's scopes allow.

An agent's tools are proposals of policy kinds (``add_fact`` is ``memory.add_fact``,
``propose`` any kind). ``tools/list`` shows an agent only the tools of the kinds it may
propose, and ``propose``'s schema only those kinds; a call of any other kind, listed or
not, is refused before any flow opens, and recorded (``InputRefused``, entry
``mcp.<tool>``) beside a kernel. A kind is the agent's when

- its manifest names it (``Embedded(capabilities=...)``; following a journal, the
  manifest the kernel recorded for the agent, else every kind the packs define), and
- the caller's principal holds every scope the kind requires (``PolicyKind.scopes``):
  the member scopes its tenant declares, narrowed by the scopes its door claims, as the
  DIM's principal layer intersects them (kernel.dim._principal.effective_scopes).

A caller bound to no user (stdio, a token-file line without one) is judged by the
manifest alone here; the DIM still judges its calls against the kernel's default principal.
Operators are offered their tools by role (kernel.mcp._tools.CodedServer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kernel.core.reasons import ReasonCode
from kernel.dim._principal import effective_scopes
from kernel.mcp._backend import Backend, Embedded, Principal, ToolRefused
from kernel.mcp._records import View
from kernel.state.principals import Principals
from kernel.state.projections import Projections

TOOL_KINDS: Mapping[str, str] = {
    "add_fact": "memory.add_fact",
    "add_constraint": "memory.add_constraint",
    "record_decision": "memory.record_decision",
    "query_memory": "memory.query",
}
"""The kind each of the agent's memory tools proposes (``propose`` takes any)."""

KIND_TOOLS = ("propose", *TOOL_KINDS)
"""The agent's tools that propose a kind: listed only when the agent may propose it."""


class Offer:
    """What one agent may propose, and why each other kind is refused.

    Attributes:
        kinds: the kinds it may propose.
        refusals: each kind it may not, with the refusal's code and detail.
    """

    def __init__(self, kinds: frozenset[str], refusals: Mapping[str, tuple[str, str]]) -> None:
        self.kinds = kinds
        self.refusals = dict(refusals)

    def hidden(self) -> set[str]:
        """The tools ``tools/list`` leaves out for this agent."""
        hidden = {tool for tool, kind in TOOL_KINDS.items() if kind not in self.kinds}
        if not self.kinds:
            hidden.add("propose")
        return hidden

    def refusal(self, kind: str) -> ToolRefused | None:
        """Why ``kind`` is refused to this agent (None: it may propose it)."""
        found = self.refusals.get(kind)
        if found is None:
            return None  # its own, or a kind no pack defines: the kernel judges it, on record
        return ToolRefused(found[0], found[1], "kind")


def offer_of(backend: Backend, view: View, who: Principal) -> Offer:
    """Return what agent ``who`` may propose, read from ``view`` (see the module's text)."""
    manifest = set(_capabilities(backend, view, who.name))
    scopes = principal_scopes(view.projections, who)
    required = backend.scopes
    kinds: set[str] = set()
    refusals: dict[str, tuple[str, str]] = {}
    for kind in backend.kinds:
        if kind not in manifest:
            refusals[kind] = (
                ReasonCode.UNAUTHORIZED,
                f"kind {kind} is not in agent {who.name}'s manifest",
            )
            continue
        lacking = [s for s in required.get(kind, ()) if scopes is not None and s not in scopes]
        if lacking:
            user = who.on_behalf.user if who.on_behalf is not None else ""
            refusals[kind] = (
                ReasonCode.SCOPE_MISSING,
                f"user {user!r} lacks scope {lacking[0]!r}, which kind {kind} requires",
            )
            continue
        kinds.add(kind)
    return Offer(frozenset(kinds), refusals)


def _capabilities(backend: Backend, view: View, agent_id: str) -> Sequence[str]:
    """The kinds ``agent_id``'s manifest names (every kind, where none is given)."""
    if isinstance(backend, Embedded):
        return backend.capabilities_of(agent_id)
    agent = view.projections.agents.get(agent_id)
    if agent is not None:
        # The kernel never gives an inbox session more kinds than the agent's manifest had.
        return agent.manifest.capabilities
    return list(backend.kinds)


def principal_scopes(projections: Projections, who: Principal) -> frozenset[str] | None:
    """The scopes ``who``'s principal holds in its tenant (None: unrestricted)."""
    user = who.on_behalf
    if user is None:
        return None
    tenants = projections.domain(Principals).tenants
    tenant = tenants.get(user.tenant)
    if tenant is None:
        # No tenant declared: the door's claim alone; a tenant the kernel does not know,
        # while others are declared: nothing (the DIM refuses TENANT_NOT_MEMBER).
        return effective_scopes(None, user.scopes, ()) if not tenants else frozenset()
    member = tenant.members.get(user.user)
    if member is None:
        return frozenset()
    return effective_scopes(member.scopes, user.scopes, ())
