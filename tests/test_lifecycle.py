"""The Kernel owns its lifecycle: entering it starts it, leaving it stops it, once.

``open_kernel`` only reads the configuration, restores and constructs; these tests
do the same by hand, so what a Kernel does on entering and leaving is its own.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import pytest

from kernel import (
    FlowStatus,
    Kernel,
    KernelConfig,
    KernelShutdown,
    Outcome,
    StopReason,
    SystemClock,
)
from kernel.audit import open_journal
from kernel.config import Ports
from kernel.core import events as ev
from kernel.hosting import DirectRun
from kernel.journal.store import Journal
from kernel.policy.packs import PolicyCatalog
from kernel.state.projections import Projections
from kernel.state.snapshots import restore
from kernel.testing import ManualClock, SeededIds, action_of
from tests.support.approvals_domain import TWO_ROLES, pack, pay_kernel, sender
from tests.support.helpers import PACK, Bank, ScriptedAgent
from tests.support.operators import Keys, add
from tests.support.principals import LOCAL


def built(journal: Journal, projections: Projections, bank: Bank) -> Kernel:
    return Kernel(
        journal,
        projections,
        PolicyCatalog([PACK]),
        {"bank": bank},
        ["clerk"],
        KernelConfig(principal=LOCAL),
        clock=ManualClock(),
        ids=SeededIds(3),
    )


async def test_a_kernel_built_by_hand_starts_runs_and_stops_itself(tmp_path: Path) -> None:
    bank = Bank()
    async with open_journal(tmp_path / "j.db") as journal:
        kernel = built(journal, await restore(journal, 10), bank)
        assert kernel.stopped is None
        async with kernel as running:
            assert running is kernel
            await kernel.register(ScriptedAgent())
            [dfid] = await kernel.trigger("bank.invoice")
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert kernel.stopped is not None
        assert kernel.stopped.reason == StopReason.KERNEL_CLOSED
        kinds = [type(e.payload) for e in await journal.read()]
        assert kinds[0] is ev.KernelStarted and kinds[-1] is ev.KernelStopped
    assert len(bank.calls) == 1


async def test_a_kernel_runs_once(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        kernel = built(journal, await restore(journal, 10), Bank())
        async with kernel:
            pass
        with pytest.raises(RuntimeError, match="runs once"):
            async with kernel:
                pass


async def test_a_call_after_the_stop_raises_why_it_stopped(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        kernel = built(journal, await restore(journal, 10), Bank())
        async with kernel:
            pass
        with pytest.raises(KernelShutdown) as stopped:
            await kernel.trigger("bank.invoice")
        assert stopped.value.reason == StopReason.KERNEL_CLOSED


async def test_the_body_raising_stops_the_kernel_on_record_and_reaches_the_caller(
    tmp_path: Path,
) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        kernel = built(journal, await restore(journal, 10), Bank())
        with pytest.raises(LookupError, match="the embedding code's own"):
            async with kernel:
                raise LookupError("the embedding code's own")
        [stopped] = await journal.read(types=["KernelStopped"])
        assert isinstance(stopped.payload, ev.KernelStopped)
        assert stopped.payload.reason == StopReason.KERNEL_CLOSED


async def test_open_kernel_is_restore_construct_enter(tmp_path: Path) -> None:
    from kernel import open_kernel

    config = KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(3)))
    async with open_kernel(
        tmp_path / "j.db", packs=[PACK], adapters={"bank": Bank()}, allow=["clerk"], config=config
    ) as kernel:
        assert isinstance(kernel, Kernel) and kernel.stopped is None
    assert kernel.stopped is not None


@pytest.mark.parametrize("poll_s", [None, 0.05], ids=["no-poller", "poller"])
async def test_the_embedding_codes_approval_counts_the_roles_the_keyring_gives(
    tmp_path: Path, poll_s: float | None
) -> None:
    # The keyring is read at open (boot) and, with a poller, again as its file changes
    # (the Lifetime's intake): either way Kernel.decide without roles counts its roles.
    keys = Keys(keyring=tmp_path / "keyring", keys=tmp_path / "private")
    keys.keys.mkdir()
    add(keys, "ana", roles=["risk"])
    add(keys, "cy", roles=["desk-head"])
    async with pay_kernel(
        tmp_path / "j.db",
        [pack(quorums=(TWO_ROLES,))],
        clock=SystemClock(),
        keyring=str(keys.keyring),
        inbox_poll_s=poll_s,
    ) as kernel:
        await kernel.register(sender())
        [dfid] = await kernel.trigger("pay.250000")
        await kernel.wait_flow(dfid)
        action = action_of(kernel, dfid)
        first = await kernel.decide(
            dfid, "approve", operator="ana", reason="risk ok", action_hash=action
        )
        assert first.outcome is Outcome.ESCALATED
        assert first.feedback is not None and "waiting for a desk-head" in first.feedback.detail
        await kernel.decide(dfid, "approve", operator="cy", reason="head ok", action_hash=action)
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        voted = [
            e.payload.roles
            for e in await kernel.journal.read(types=["ApprovalVoted"])
            if isinstance(e.payload, ev.ApprovalVoted)
        ]
    assert voted == [["risk"], ["desk-head"]]


def _holders_of(kernel: Kernel) -> list[str]:
    """Where the kernel's parts hold the kernel: a method of it, or a closure or a
    ``functools.partial`` over it."""
    found: list[str] = []
    seen: set[int] = {id(kernel)}
    stack: list[tuple[str, object]] = [(f"kernel.{k}", v) for k, v in vars(kernel).items()]
    while stack:
        path, value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, functools.partial):
            if getattr(value.func, "__self__", None) is kernel or kernel in value.args:
                found.append(f"{path}: a partial over the kernel")
            stack.append((f"{path}.func", value.func))
            stack.extend((f"{path}.args[{n}]", v) for n, v in enumerate(value.args))
            continue
        if inspect.ismethod(value):
            if value.__self__ is kernel:
                found.append(f"{path}: Kernel.{value.__name__}")
            stack.append((f"{path}.__self__", value.__self__))
            continue
        if inspect.isfunction(value):
            for n, cell in enumerate(value.__closure__ or ()):
                contents = cell.cell_contents
                if contents is kernel:
                    found.append(f"{path}: a closure over the kernel")
                stack.append((f"{path}.<cell {n}>", contents))
            continue
        if isinstance(value, dict):
            stack.extend((f"{path}[{k!r}]", v) for k, v in list(value.items()))
            continue
        if isinstance(value, list | tuple | set | frozenset):
            stack.extend((f"{path}[{n}]", v) for n, v in enumerate(value))
            continue
        if not type(value).__module__.startswith("kernel."):
            continue
        fields = dict(vars(value)) if hasattr(value, "__dict__") else {}
        for cls in type(value).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if hasattr(value, name):
                    fields[name] = getattr(value, name)
        stack.extend((f"{path}.{k}", v) for k, v in fields.items())
    return found


class Synchronous(ScriptedAgent):
    synchronous = True


async def test_no_part_of_a_running_kernel_holds_the_kernel(tmp_path: Path) -> None:
    """The parts are given parts (and the effects task group), never the whole: a method of
    the Kernel handed to a part would make the facade the pipeline again (issue 39)."""
    async with open_journal(tmp_path / "j.db") as journal:
        kernel = built(journal, await restore(journal, 10), Bank())
        async with kernel:
            await kernel.register(Synchronous())
            [dfid] = await kernel.trigger("bank.invoice")
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            assert _holders_of(kernel) == []
            # The agent run to completion is a named object, not a partial read back.
            assert isinstance(kernel.route("clerk").direct, DirectRun)
    # The walk does find one: a part handed a method of the kernel.
    kernel.actors.carry = kernel.submit  # type: ignore[assignment]
    [found] = _holders_of(kernel)
    assert found.endswith(".carry: Kernel.submit")
