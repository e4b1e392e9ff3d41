"""What ``dirk verify`` checks, in one read of the journal: its chain, then its projections.

:func:`kernel.journal.verify.verify_journal` checks every hash from genesis, the head
record and an anchor; :func:`kernel.state.snapshots.verify_projections` folds every
projection from scratch and compares it with each recorded checkpoint and snapshot.
Run one after the other they read and decode every event twice; :func:`verify_all`
hands the projections the events the chain check decoded, as it goes, so each is read,
inflated and decoded once. Nothing is checked less: every hash, the head, the anchor,
every checkpoint and snapshot.
"""

from __future__ import annotations

import contextlib
import os

import anyio

from kernel.core.events import Event
from kernel.core.flow import IllegalTransition
from kernel.journal.errors import JournalError
from kernel.journal.opening import open_journal
from kernel.journal.verify import Anchor, VerifyReport, verify_journal
from kernel.state.collector import collector_paused
from kernel.state.snapshots import ProjectionReport, verify_projections


async def verify_all(
    path: str | os.PathLike[str],
    *,
    chain_key: bytes | None = None,
    anchor: Anchor | None = None,
    public_only: bool = False,
) -> tuple[VerifyReport, ProjectionReport | None]:
    """Verify the journal at ``path`` and replay its projections; never raise for a bad file.

    Returns:
        The chain's report, and the projections' report (None when the journal does not
        open; then the chain's report says why). The projections' report means
        something only when the chain's is ok: a bad event ends the fold before it.

    Raises:
        JournalError, IllegalTransition, ValueError: The chain checked out but what lies
            outside it (a stored snapshot) could not be read.
    """
    location = os.fspath(path)
    with collector_paused():
        return await _verify_all(location, chain_key, anchor, public_only)


async def _verify_all(
    location: str, chain_key: bytes | None, anchor: Anchor | None, public_only: bool
) -> tuple[VerifyReport, ProjectionReport | None]:
    async with contextlib.AsyncExitStack() as stack:
        try:
            journal = await stack.enter_async_context(open_journal(location, readonly=True))
        except Exception:
            # An untrusted file that does not even open (damaged in ways opening does not
            # name, too): the chain check alone, which never raises, says what is wrong.
            report = await verify_journal(
                location, chain_key=chain_key, anchor=anchor, public_only=public_only
            )
            return report, None
        send, receive = anyio.create_memory_object_stream[list[Event]](1)
        chain: list[VerifyReport] = []

        async def fold(batch: list[Event]) -> None:
            # A fold that stopped early (an illegal transition) takes no more batches,
            # and the chain is checked to its end all the same.
            with contextlib.suppress(anyio.BrokenResourceError):
                await send.send(batch)

        async def check_chain() -> None:
            async with send:
                chain.append(
                    await verify_journal(
                        location,
                        chain_key=chain_key,
                        anchor=anchor,
                        fold=fold,
                        public_only=public_only,
                    )
                )

        replay: ProjectionReport | None = None
        failed: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(check_chain)
            async with receive:
                try:
                    replay = await verify_projections(journal, batches=receive)
                except (JournalError, IllegalTransition, ValueError) as exc:
                    failed = exc  # raised below, unless the chain has a problem to report
        if failed is not None and chain[0].ok:
            raise failed
        return chain[0], replay
    raise AssertionError("unreachable")  # pragma: no cover
