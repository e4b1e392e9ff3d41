"""Adapter calls fail closed: an intent whose validity cannot be checked is never carried out."""

from __future__ import annotations

from kernel.adapters import Receipt
from kernel.core.events import ExecutionIntent
from kernel.execution._calls import AdapterCalls
from kernel.runtime.actors import Mailbox
from kernel.runtime.messages import AdapterDone, ExecutionMessage
from kernel.testing import ManualClock


class Counting:
    """An adapter that counts its calls (each would be an effect)."""

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls += 1
        return Receipt(external_id=f"tx-{self.calls}")


INTENT = ExecutionIntent(key="k1", kind="test.transfer", adapter="bank", valid_until_ns=2**62)


async def done_of(calls: AdapterCalls, mailbox: Mailbox[ExecutionMessage]) -> AdapterDone:
    try:
        await calls.call("f1", INTENT, attempt=1, fresh=True, at_ns=None)
        answer = await mailbox.receive()
    finally:
        mailbox.close()
    assert isinstance(answer, AdapterDone)
    return answer


async def test_without_a_clock_an_intent_is_refused_never_called_unchecked() -> None:
    adapter = Counting()
    mailbox: Mailbox[ExecutionMessage] = Mailbox("execution")
    done = await done_of(AdapterCalls({"bank": adapter}, mailbox, None, {}), mailbox)
    assert adapter.calls == 0
    assert done.violation is not None and done.violation.bound == "valid_until_ns"
    assert done.receipt is None


async def test_with_a_clock_a_valid_intent_is_called_once() -> None:
    adapter = Counting()
    mailbox: Mailbox[ExecutionMessage] = Mailbox("execution")
    done = await done_of(AdapterCalls({"bank": adapter}, mailbox, ManualClock(), {}), mailbox)
    assert adapter.calls == 1
    assert done.violation is None and done.receipt is not None
