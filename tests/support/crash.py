"""How the crash tests' worker processes die: SIGKILL, at a seeded point."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from kernel import Kernel
from kernel.audit import Event


def die() -> None:
    """Die as a crash does: no cleanup, no flush, no exception handlers."""
    os.kill(os.getpid(), signal.SIGKILL)


def die_after_commit(kernel: Kernel, kill: str) -> None:
    """For ``kill`` = ``commit:N``, die right after the Nth journal commit of this process."""
    if not kill.startswith("commit:"):
        return
    commits = [0]
    wanted = int(kill.partition(":")[2])

    def count(_: Sequence[Event]) -> None:
        commits[0] += 1
        if commits[0] == wanted:
            die()

    kernel.journal.add_listener(count)
