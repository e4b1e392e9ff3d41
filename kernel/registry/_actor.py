"""The agent registry: manifests, the semver handshake, credentials, sessions and status.

The registry is the system of record for what each agent may do. When the DIM
asks "may this agent propose that?", it asks the registry's projection, never
the agent, so no prompt can grant an agent new powers.

Credentials: an operator provisions one secret per agent id (``dirk agent AGENT
--issue-credential``, through the inbox; :func:`new_credential`) and hands it to
whoever runs the agent. The journal records only its verifier
(:func:`credential_verifier`, ``CredentialIssued``); issuing another rotates it. The
verifier is a public key: the credential seeds an Ed25519 key (:func:`agent_key`), so
over the bus an agent proves it holds the credential by signing the kernel's one-time
challenge (a ``CredentialProof``) and never sends it; whoever reads the journal learns
nothing that lets them handshake. Verifiers of older journals (``sha256:<hex>``) still
match the credential shown in process; over the bus they must be issued again.
Once an agent has a credential, every handshake for its id must show it, in
process as over the bus; one without it, or with another, is refused with
CREDENTIAL_INVALID and recorded (``AgentRefused``), and the live session stays
valid: only a handshake that passes replaces it. An agent with no credential
provisioned still handshakes in process without one, as before (the process is
no wall: code in it can reach the kernel's objects anyway); over the bus
(kernel.mesh) a credential is always required.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Collection

import semver
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.core import keys
from kernel.core.events import (
    AgentRefused,
    AgentRegistered,
    AgentStatusChanged,
    CredentialIssued,
    FlowAborted,
    Manifest,
)
from kernel.core.flow import FlowStatus
from kernel.core.ports import IdSource
from kernel.core.reasons import ReasonCode
from kernel.core.wall import clip
from kernel.policy.contracts import HandshakeRefused, Session
from kernel.policy.packs import PolicyCatalog
from kernel.runtime.actors import Outbox, Reply
from kernel.runtime.messages import (
    CredentialProof,
    IssueCredential,
    Register,
    RegistryMessage,
    SetStatus,
)
from kernel.state.projections import AgentStatus, Projections, session_hash

CONTRACT_VERSION = (1, 2)
"""The DIR contract this kernel speaks: manifests 1.0 up to 1.2 are accepted."""

KERNEL_VERSION = "0.2.0"

CREDENTIAL_PREFIX = "dirk_"
VERIFIER_PREFIX = "sha256:"
"""How verifiers were written before they became public keys (still matched in process)."""
PROOF_CONTEXT = "dirk.agent.handshake"
"""What an agent's handshake signature is for (kernel.core.keys contexts keep purposes apart)."""
_KEY_LABEL = b"dirk agent key\x00"


def new_credential() -> str:
    """Return a fresh agent credential: 256 bits from the OS, printable."""
    return CREDENTIAL_PREFIX + secrets.token_urlsafe(32)


def agent_key(credential: str) -> Ed25519PrivateKey:
    """Return the Ed25519 key the credential seeds (what a host signs with).

    A hash is enough to derive it: a credential is 256 random bits, not a password.

    Raises:
        UnicodeEncodeError: the credential is not valid text (a lone surrogate).
    """
    seed = hashlib.sha256(_KEY_LABEL + credential.encode("utf-8")).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def credential_verifier(credential: str) -> str:
    """Return what the kernel stores of ``credential``: the public key it seeds (``ed25519:...``).

    Raises:
        UnicodeEncodeError: the credential is not valid text (a lone surrogate).
    """
    return keys.public_text(agent_key(credential))


def is_verifier(text: str) -> bool:
    """Whether ``text`` has the shape of a verifier (what an inbox row may carry)."""
    if not isinstance(text, str):
        return False
    if text.startswith(keys.PREFIX):
        return keys.is_public_key(text)
    digest = text.removeprefix(VERIFIER_PREFIX)
    return (
        text.startswith(VERIFIER_PREFIX)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )


def credential_matches(verifier: str | None, credential: str | CredentialProof | None) -> bool:
    """Whether ``credential`` is (or proves holding) the one ``verifier`` was made from.

    Never raises: a credential that is not valid text, or a proof that does not parse,
    does not match.
    """
    if not isinstance(verifier, str):
        return False
    if isinstance(credential, CredentialProof):
        # A proof needs a public key: a hash verifier cannot check a signature.
        return verifier.startswith(keys.PREFIX) and keys.verify(
            verifier, PROOF_CONTEXT, credential.message, credential.signature
        )
    if not isinstance(credential, str):
        return False
    try:
        shown = credential.encode("utf-8")
    except UnicodeEncodeError:
        return False
    if verifier.startswith(VERIFIER_PREFIX):
        expected = VERIFIER_PREFIX + hashlib.sha256(shown).hexdigest()
    else:
        expected = credential_verifier(credential)
    # Bytes, not str: compare_digest raises on non-ASCII text.
    return hmac.compare_digest(verifier.encode("utf-8", "replace"), expected.encode("ascii"))


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
                self._register(msg, reply, out)
            case IssueCredential():
                if msg.agent_id not in self._allowlist and msg.agent_id not in (
                    self._projections.agents
                ):
                    out.reply(msg.reply, ReasonCode.UNKNOWN_AGENT)
                    return
                if not is_verifier(msg.verifier):
                    out.reply(msg.reply, ReasonCode.SCHEMA_INVALID)
                    return
                out.emit(
                    CredentialIssued(
                        verifier=msg.verifier,
                        reason=msg.reason,
                        operator=msg.operator,
                        inbox_id=msg.inbox_id,
                    ),
                    agent_id=msg.agent_id,
                )
                out.reply(msg.reply, None)
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
        self, msg: Register, reply: Reply[Session | HandshakeRefused], out: Outbox
    ) -> None:
        manifest = msg.manifest
        refusal = self._refusal(manifest) or self._unproven(msg)
        if refusal is not None:
            code, detail = refusal
            out.emit(
                AgentRefused(reason_code=code, detail=detail, version=manifest.version),
                agent_id=manifest.agent_id,
            )
            out.reply(reply, HandshakeRefused(code, detail))
            return
        token = self._ids.new_token()
        registered = out.emit(
            AgentRegistered(manifest=manifest, session_hash=session_hash(token)),
            agent_id=manifest.agent_id,
        )
        if msg.hosted:
            self._end_displaced(manifest.agent_id, registered, out)
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

    def _end_displaced(self, agent_id: str, registered: int, out: Outbox) -> None:
        """End the flows a hosted agent was thinking about when a handshake replaced it.

        In process, the agent's reasoning lives in the crew that hosts it; the new
        session either brings a new crew or leaves the agent to submit on its own, and
        the old crew's submissions would be refused (their token is no longer live). A
        flow waiting on it would stay ACTIVE for good: it ends here, in the same append
        as the registration, saying why. (Over the bus a new session picks up the
        contexts still queued for the agent, so nothing ends there.)
        """
        detail = (
            f"agent {agent_id!r} was displaced by a new handshake before it proposed:"
            " its session, and the reasoning held under it, ended"
        )
        for dfid in sorted(self._projections.moving):
            flow = out.flow(dfid)
            if (
                flow is not None
                and flow.agent_id == agent_id
                and flow.status in (FlowStatus.CREATED, FlowStatus.ACTIVE)
            ):
                out.emit(
                    FlowAborted(reason_code=ReasonCode.INVALID_SESSION, detail=detail),
                    dfid=dfid,
                    after=registered,
                )

    def _unproven(self, msg: Register) -> tuple[ReasonCode, str] | None:
        agent_id = msg.manifest.agent_id
        verifier = self._projections.credentials.get(agent_id)
        if verifier is None and not msg.require_credential and msg.credential is None:
            return None  # in process, nothing provisioned: as before credentials existed
        if verifier is None:
            detail = f"no credential is provisioned for agent {agent_id!r}"
        elif msg.credential is None:
            detail = f"agent {agent_id!r} must show its credential"
        elif isinstance(msg.credential, CredentialProof) and not verifier.startswith(keys.PREFIX):
            detail = f"agent {agent_id!r}'s credential predates keys: issue it again"
        elif not credential_matches(verifier, msg.credential):
            detail = f"the credential shown for agent {agent_id!r} is not its own"
        else:
            return None
        return ReasonCode.CREDENTIAL_INVALID, detail

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
        if known is None:
            return None
        if known.status is AgentStatus.SUSPENDED:
            return ReasonCode.AGENT_SUSPENDED, f"agent {manifest.agent_id!r} is suspended"
        if known.status is AgentStatus.RETIRED:
            return ReasonCode.AGENT_RETIRED, f"agent {manifest.agent_id!r} is retired"
        return None
