"""The registry actor: manifests, the semver handshake, session tokens and agent status."""

from kernel.registry._actor import CONTRACT_VERSION, KERNEL_VERSION, Registry, check_version

__all__ = [
    "CONTRACT_VERSION",
    "KERNEL_VERSION",
    "Registry",
    "check_version",
]
