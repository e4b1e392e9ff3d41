"""The registry actor: manifests, the semver handshake, credentials, session tokens, status."""

from kernel.registry._actor import (
    CONTRACT_VERSION,
    KERNEL_VERSION,
    PROOF_CONTEXT,
    Registry,
    agent_key,
    check_version,
    credential_matches,
    credential_verifier,
    is_verifier,
    new_credential,
)

__all__ = [
    "CONTRACT_VERSION",
    "KERNEL_VERSION",
    "PROOF_CONTEXT",
    "Registry",
    "agent_key",
    "check_version",
    "credential_matches",
    "credential_verifier",
    "is_verifier",
    "new_credential",
]
