"""Tenants at the MCP door: a caller bound to a tenant reads only that tenant's records.

A caller's tenant is the one its door authenticated: a user token's tenant claim, or
the tenant its token-file line binds it to. Rulebook namespaces are
tenants: such a caller's namespace is its tenant's, and naming another is refused
CROSS_TENANT, on record (``InputRefused``, entry ``mcp.<tool>``) beside a kernel. A
flow is read only by a caller of the tenant it was opened for (``FlowCreated.on_behalf``);
another tenant's flow is answered as unknown, so nothing of it leaks, and recorded.

A caller with no tenant (a token-file line that binds none, a stdio server) reads as
before: a single-tenant deployment, whose proposals act for the kernel's default
principal (``KernelConfig.principal``) or are refused PRINCIPAL_MISSING. Give each
token a tenant to partition.
"""

from __future__ import annotations

from typing import Any

from kernel.core.events import Draft, FlowCreated, InputRefused
from kernel.core.reasons import CliError, ReasonCode
from kernel.core.wall import clip
from kernel.mcp._backend import Backend, Embedded, Principal, ToolRefused
from kernel.mcp._records import View
from kernel.state.rulebook import DEFAULT_NS


def tenant_of(who: Principal, backend: Backend) -> str | None:
    """The tenant ``who`` is confined to, or None (none authenticated: unpartitioned)."""
    del backend  # the same for every backend: the door's word alone
    return who.tenant


async def refuse_on_record(
    backend: Backend, who: Principal, tool: str, refusal: ToolRefused, target: str
) -> ToolRefused:
    """Record ``refusal`` of ``who``'s call of ``tool`` (beside a kernel); return it to raise."""
    if isinstance(backend, Embedded):
        refused = InputRefused(
            reason_code=ReasonCode(refusal.code),
            entry=clip(f"mcp.{tool}", 32),
            field=refusal.field,
            detail=clip(refusal.detail),
            operator=clip(f"{who.role}:{who.name}"),
            target=clip(target),
            principal=who.on_behalf,
        )
        agent = who.name if who.role == "agent" else None
        await backend.kernel.journal.append([Draft(payload=refused, agent_id=agent)])
    return refusal


async def refuse_cross_tenant(
    backend: Backend,
    who: Principal,
    tool: str,
    target: str,
    field: str,
    detail: str,
    door: str = "mcp",
) -> ToolRefused:
    """Record a read across tenants (beside a kernel) and return its refusal to raise."""
    if isinstance(backend, Embedded):
        refused = InputRefused(
            reason_code=ReasonCode.CROSS_TENANT,
            entry=clip(f"{door}.{tool}", 32),
            field=field,
            detail=clip(detail),
            operator=clip(f"{who.role}:{who.name}"),
            target=clip(target),
            principal=who.on_behalf,
        )
        agent = who.name if who.role == "agent" else None
        await backend.kernel.journal.append([Draft(payload=refused, agent_id=agent)])
    return ToolRefused(ReasonCode.CROSS_TENANT, detail, field)


async def rule_space(backend: Backend, who: Principal, tool: str, ns: Any) -> str:
    """The rulebook namespace ``who`` reads for ``ns`` (None or ``default``: its own).

    Raises:
        ToolRefused: CROSS_TENANT for another tenant's namespace (recorded).
    """
    tenant = tenant_of(who, backend)
    if tenant is None:
        return DEFAULT_NS if ns is None else str(ns)
    if ns is None or ns in (DEFAULT_NS, tenant):
        return tenant
    raise await refuse_cross_tenant(
        backend, who, tool, ns, "ns", f"namespace {ns!r} is another tenant's; yours is {tenant!r}"
    )


async def flow_tenant(view: View, dfid: str) -> str | None:
    """The tenant flow ``dfid`` was opened for (None: no principal recorded)."""
    for event in await view.journal.read(dfid=dfid, types=["FlowCreated"]):
        if isinstance(event.payload, FlowCreated) and event.payload.on_behalf is not None:
            return event.payload.on_behalf.principal.tenant
    return None


async def check_flow(
    backend: Backend, view: View, who: Principal, tool: str, dfid: str, door: str = "mcp"
) -> None:
    """Refuse ``who`` a flow of another tenant, answered as an unknown flow, recorded.

    A flow with no principal recorded (before tenants) is read by a tenant's caller only
    when the kernel has no tenant of its own either: otherwise it is no tenant's to show.

    Raises:
        ToolRefused: UNKNOWN_FLOW (the same answer as for a flow that does not exist).
    """
    tenant = tenant_of(who, backend)
    if tenant is None:
        return
    owner = await flow_tenant(view, dfid)
    if owner == tenant:
        return
    await refuse_cross_tenant(
        backend, who, tool, dfid, "dfid", f"flow {dfid} is not of tenant {tenant!r}", door
    )
    raise ToolRefused(CliError.UNKNOWN_FLOW, f"no open or recent flow {dfid}", "dfid")
