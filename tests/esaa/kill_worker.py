"""Work a roadmap on a real repository, and SIGKILL this process at a chosen point.

Usage: ``kill_worker.py WORKDIR MODE KILL`` where WORKDIR holds ``repo`` (the
repository under work, made by the test) and ``j.db``; MODE is ``run`` (open the
roadmap and work T-1 then T-3: claims, patches, checks, completions) or ``recover``
(only open the kernel and let it finish what an earlier run left); KILL is ``none``,
``commit:N`` (after the Nth journal commit of this process), ``made:N`` (after the
Nth commit object is written, before the branch moves to it) or ``effect:N`` (after
the Nth effect of the git adapter is durable, before its answer reaches the kernel).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from kernel import FlowStatus
from kernel.adapters import ExecutionIntent
from policies.esaa import GitWorkTree
from tests.esaa.kit import claim, complete, desk, run
from tests.support.crash import die, die_after_commit

ONE = "def one() -> int:\n    return 1\n"
THREE = "def three() -> int:\n    return 3\n"
INIT_ONE = '"""pkg."""\n\nfrom pkg.one import one\n'
INIT_BOTH = INIT_ONE + "from pkg.three import three\n"


class Killing(GitWorkTree):
    """The git adapter, dying (SIGKILL) at the seeded point."""

    def __init__(self, path: Path, kill: str) -> None:
        super().__init__(path)
        what, _, n = kill.partition(":")
        self.kill = (what, int(n or 0))
        self.made = self.effects = 0

    async def _commit(self, intent: ExecutionIntent, tree: str, head: str) -> str:
        made = await super()._commit(intent, tree, head)
        self.made += 1
        if self.kill == ("made", self.made):
            die()  # the commit exists as an object; the branch does not name it
        return made

    def after_effect(self, intent: ExecutionIntent, external_id: str) -> None:
        self.effects += 1
        if self.kill == ("effect", self.effects):
            die()  # the branch moved (or the run is stored); nobody was told


async def main(workdir: str, mode: str, kill: str) -> None:
    where = Path(workdir)
    async with desk(where, adapter=Killing(where / "repo", kill)) as d:
        die_after_commit(d.kernel, kill)
        if mode == "run":
            await d.open()
            await d.act("ada", claim("T-1"))
            await d.patch("ada", "T-1", {"pkg/one.py": ONE, "pkg/__init__.py": INIT_ONE})
            await d.act("ada", run("T-1", "ok"))
            await d.act("ada", complete("T-1"))
            await d.act("bo", claim("T-3"))
            await d.patch("bo", "T-3", {"pkg/three.py": THREE, "pkg/__init__.py": INIT_BOTH})
            await d.act("bo", run("T-3", "ok"))
            await d.act("bo", complete("T-3"))
        else:
            for flow in d.kernel.flows():
                if flow.status in (FlowStatus.ACCEPTED, FlowStatus.EXECUTING):
                    await d.kernel.wait_flow(flow.dfid)
    print("DONE", flush=True)


if __name__ == "__main__":
    workdir, mode, kill = sys.argv[1:4]
    anyio.run(main, workdir, mode, kill)
