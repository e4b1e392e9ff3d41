"""The agent registry: manifests, the semver handshake, session tokens and agent status.

The registry is the system of record for what each agent may do. When the DIM
asks "may this agent propose that?", it asks the registry's projection, never
the agent, so no prompt can grant an agent new powers.
"""

from __future__ import annotations

from collections.abc import Collection

import semver

from kernel.core.events import AgentRefused, AgentRegistered, AgentStatusChanged, Manifest
from kernel.core.ports import IdSource
from kernel.core.reasons import ReasonCode
from kernel.core.wall import clip
from kernel.policy.contracts import HandshakeRefused, Session
from kernel.policy.packs import PolicyCatalog
from kernel.runtime.actors import Outbox, Reply
from kernel.runtime.messages import Register, RegistryMessage, SetStatus
from kernel.state.projections import AgentStatus, Projections, session_hash

CONTRACT_VERSION = (1, 2)
"""The DIR contract this kernel speaks: manifests 1.0 up to 1.2 are accepted."""

KERNEL_VERSION = "0.1.0"


def check_version(version: str) -> str | None:
    """Return why a manifest's contract version is not supported, or None if it is."""
    # A real parser, not a regex: "01.0", "1.0\n" or full-width digits are not versions.
    # Major.minor is enough (1.0 means 1.0.0), a bare major is not.
    core = version.split("+", 1)[0].split("-", 1)[0]
    try:
        if "." not in core:
            raise ValueError(version)
        parsed = semver.Version.parse(version, optional_minor_and_patch=True)
    except (ValueError, TypeError):
        return f"{clip(version)!r} is not a semantic version (MAJOR.MINOR[.PATCH])"
    major, minor = parsed.major, parsed.minor
    supported = f"{CONTRACT_VERSION[0]}.x up to {CONTRACT_VERSION[0]}.{CONTRACT_VERSION[1]}"
    if major != CONTRACT_VERSION[0] or minor > CONTRACT_VERSION[1]:
        return f"manifest speaks contract {version}; this kernel supports {supported}"
    return None


class Registry:
    """The registry actor: answers handshakes and status changes."""

    def __init__(
        self,
        projections: Projections,
        catalog: PolicyCatalog,
        ids: IdSource,
        allowlist: Collection[str],
    ) -> None:
        self._projections = projections
        self._catalog = catalog
        self._ids = ids
        self._allowlist = frozenset(allowlist)

    async def handle(self, msg: RegistryMessage, out: Outbox) -> None:
        match msg:
            case Register(manifest=manifest, reply=reply, invalid=str() as invalid):
                code = ReasonCode.SCHEMA_INVALID
                out.emit(
                    AgentRefused(reason_code=code, detail=invalid, version=manifest.version),
                    agent_id=manifest.agent_id,
                )
                out.reply(reply, HandshakeRefused(code, invalid))
            case Register(manifest=manifest, reply=reply):
                self._register(manifest, reply, out)
            case SetStatus():
                agent = self._projections.agents.get(msg.agent_id)
                if agent is None:
                    out.reply(msg.reply, ReasonCode.UNKNOWN_AGENT)
                    return
                out.emit(
                    AgentStatusChanged(
                        status=msg.status,
                        reason=msg.reason,
                        operator=msg.operator,
                        inbox_id=msg.inbox_id,
                    ),
                    agent_id=msg.agent_id,
                )
                out.reply(msg.reply, None)

    def _register(
        self, manifest: Manifest, reply: Reply[Session | HandshakeRefused], out: Outbox
    ) -> None:
        refusal = self._refusal(manifest)
        if refusal is not None:
            code, detail = refusal
            out.emit(
                AgentRefused(reason_code=code, detail=detail, version=manifest.version),
                agent_id=manifest.agent_id,
            )
            out.reply(reply, HandshakeRefused(code, detail))
            return
        token = self._ids.new_token()
        out.emit(
            AgentRegistered(manifest=manifest, session_hash=session_hash(token)),
            agent_id=manifest.agent_id,
        )
        schemas = {kind: self._catalog.schemas[kind] for kind in manifest.capabilities}
        out.reply(
            reply,
            Session(
                agent_id=manifest.agent_id,
                token=token,
                schemas=schemas,
                kernel_version=KERNEL_VERSION,
            ),
        )

    def _refusal(self, manifest: Manifest) -> tuple[ReasonCode, str] | None:
        if manifest.agent_id not in self._allowlist:
            return ReasonCode.UNKNOWN_AGENT, f"agent {manifest.agent_id!r} is not in the allowlist"
        problem = check_version(manifest.version)
        if problem is not None:
            return ReasonCode.VERSION_MISMATCH, problem
        unknown = [k for k in manifest.capabilities if k not in self._catalog.kinds]
        if unknown:
            return (
                ReasonCode.SCHEMA_INVALID,
                f"capabilities name policy kinds no loaded pack defines: {', '.join(unknown)}",
            )
        if manifest.max_attempts < 1:
            return ReasonCode.SCHEMA_INVALID, "max_attempts must be at least 1"
        known = self._projections.agents.get(manifest.agent_id)
        if known is not None and known.status is AgentStatus.SUSPENDED:
            return ReasonCode.AGENT_SUSPENDED, f"agent {manifest.agent_id!r} is suspended"
        if known is not None and known.status is AgentStatus.RETIRED:
            return ReasonCode.AGENT_RETIRED, f"agent {manifest.agent_id!r} is retired"
        return None
