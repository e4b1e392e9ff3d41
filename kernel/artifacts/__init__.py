"""The artifact store: documents too large for a context, kept by content reference.

See :mod:`kernel.artifacts.port`; the kernel records references (``ArtifactStored``),
agents fetch what their context names (``kernel.state.artifacts``).
"""

from kernel.artifacts.port import (
    MAX_ARTIFACT_BYTES,
    ArtifactStore,
    ArtifactStoreError,
    ArtifactTooLarge,
    artifacts_beside,
    checked,
    connect_artifacts,
    is_ref,
    open_artifacts,
    ref_of,
)

__all__ = [
    "MAX_ARTIFACT_BYTES",
    "ArtifactStore",
    "ArtifactStoreError",
    "ArtifactTooLarge",
    "artifacts_beside",
    "checked",
    "connect_artifacts",
    "is_ref",
    "open_artifacts",
    "ref_of",
]
