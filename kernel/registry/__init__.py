"""The registry actor: manifests, the semver handshake, credentials, session tokens, status."""

from kernel.registry._actor import (
    CONTRACT_VERSION,
    KERNEL_VERSION,
    Registry,
    check_version,
    credential_matches,
    credential_verifier,
    is_verifier,
    new_credential,
)

__all__ = [
    "CONTRACT_VERSION",
    "KERNEL_VERSION",
    "Registry",
    "check_version",
    "credential_matches",
    "credential_verifier",
    "is_verifier",
    "new_credential",
]
