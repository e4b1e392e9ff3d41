"""The guard runner actor: soft guards beside the pipeline, recording what they flag."""

from kernel.guards._runner import GUARD_TIMEOUT_S, GuardRunner

__all__ = [
    "GUARD_TIMEOUT_S",
    "GuardRunner",
]
