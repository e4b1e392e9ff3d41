"""What an agent's fetch of an artifact is, wherever its agent runs.

An agent reads an artifact its context references with ``await
ctx.fetch_artifact(ref)`` (:class:`kernel.policy.contracts.WorkingContext`). The
context holds no handle on anything: the fetch goes to whatever serves the agent's
reasoning in this task, found in :data:`current_fetcher` the way a usage report finds
its meter (kernel.core.reasoning). In the kernel's process the agent host sets it to
the kernel's own fetch; on an agent host of the mesh, to a signed request over the bus
(agents_sdk.serve). Either way the kernel decides (kernel.state.artifacts.fetch): only
an artifact a context of the agent's flow referenced, and only bytes that still hash
to their reference.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar

import msgspec

from kernel.core.reasons import ReasonCode


class ArtifactSlice(msgspec.Struct, frozen=True, kw_only=True):
    """What a fetch returns: a range of an artifact's bytes, and how large it is in all."""

    ref: str
    start: int
    data: bytes
    size: int
    media_type: str = "application/octet-stream"

    @property
    def more(self) -> bool:
        """Whether bytes follow this range (fetch again from ``start + len(data)``)."""
        return self.start + len(self.data) < self.size


class FetchRefused(Exception):
    """A fetch the kernel refused, with a reason code and the field at fault."""

    def __init__(self, code: ReasonCode, detail: str, field: str = "ref") -> None:
        super().__init__(f"{code}: {detail}")
        self.reason_code = code
        self.detail = detail
        self.field = field


Fetcher = Callable[[str, str, int, int | None], Awaitable[ArtifactSlice]]
"""Fetches (dfid, ref, start, length) for the agent reasoning in this task."""

current_fetcher: ContextVar[Fetcher | None] = ContextVar("dir_artifact_fetcher", default=None)
"""The fetch of the agent reasoning in this task (set around ``decide``)."""


async def fetch_artifact(dfid: str, ref: str, start: int, length: int | None) -> ArtifactSlice:
    """Fetch a range of artifact ``ref`` for flow ``dfid`` through this task's fetcher.

    Raises:
        FetchRefused: the kernel refused it, or nothing serves fetches here (outside
            ``decide``): UNAUTHORIZED.
    """
    fetcher = current_fetcher.get()
    if fetcher is None:
        raise FetchRefused(
            ReasonCode.UNAUTHORIZED, "artifacts are fetched while the kernel asks for a decision"
        )
    return await fetcher(dfid, ref, start, length)
