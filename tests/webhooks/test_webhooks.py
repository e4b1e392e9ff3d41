"""Webhooks against a real HTTP receiver (a subprocess on a free port) that fails, is slow,
answers late and hangs: requests, reminders and outcomes arrive signed, are retried with
backoff, each delivery is recorded, the kernel never waits for one, and neither the key
nor the URL is ever recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernel import FlowStatus, Kernel, Outcome
from kernel.core.events import Event, WebhookDelivered, WebhookFailed
from kernel.testing import ManualClock, action_of
from kernel.webhooks import DELIVERY, SIGNATURE, Webhook, notice_of, verify
from tests.support import ROOT
from tests.support.approvals_domain import TWO_ROLES, pack, pay_kernel, sender
from tests.support.helpers import flow_of

SECRET = b"whsec-0123456789abcdef-not-for-the-record"
TOKEN = "T000/B000/XXXXslacktokenXXXX"
"""A path segment standing for what a Slack URL carries: as secret as the key."""


class Receiver:
    """The receiver subprocess: its base URL and what it logged."""

    def __init__(self, log: Path, port: int) -> None:
        self.log = log
        self.base = f"http://127.0.0.1:{port}"

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def release(self) -> None:
        self.log.with_name(self.log.name + ".release").touch()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    log = tmp_path / "received.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.webhook_receiver", str(log)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        yield Receiver(log, port)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def hook(url: str, **kw: Any) -> Webhook:
    settings: dict[str, Any] = {
        "name": "desk",
        "url": url,
        "secret": SECRET,
        "backoff_s": 0.01,
        "max_backoff_s": 0.05,
        "timeout_s": 0.5,
        "remind_after_s": None,
        **kw,
    }
    return Webhook(**settings)


async def recorded(kernel: Kernel, count: int, *, seconds: float = 20) -> list[Event]:
    """Wait (on the journal, not the clock) for ``count`` recorded deliveries; return them."""
    found: list[Event] = []
    with anyio.fail_after(seconds):
        async with kernel.journal.subscribe() as batches:
            async for batch in batches:
                found += [
                    e for e in batch if isinstance(e.payload, WebhookDelivered | WebhookFailed)
                ]
                if len(found) >= count:
                    return found
    return found


def outcomes(events: list[Event]) -> list[WebhookDelivered | WebhookFailed]:
    """The payloads of the deliveries :func:`recorded` returned, delivered or failed."""
    return [e.payload for e in events if isinstance(e.payload, WebhookDelivered | WebhookFailed)]


async def escalate(kernel: Kernel, cents: int = 250_000) -> str:
    [dfid] = await kernel.trigger(f"pay.{cents}")
    assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
    return str(dfid)


async def test_a_request_and_its_outcomes_arrive_signed_and_each_is_recorded(
    tmp_path: Path, receiver: Receiver
) -> None:
    webhooks = [hook(f"{receiver.base}/ok/{TOKEN}")]
    async with pay_kernel(tmp_path / "j.db", [pack(quorums=(TWO_ROLES,))], webhooks=webhooks) as k:
        await k.register(sender())
        dfid = await escalate(k)
        await k.decide(dfid, "approve", operator="ana", reason="ok", action_hash=action_of(k, dfid),
                       roles=["risk"])  # fmt: skip
        await k.decide(dfid, "approve", operator="cy", reason="ok", action_hash=action_of(k, dfid),
                       roles=["desk-head"])  # fmt: skip
        assert (await k.wait_flow(dfid)).status is FlowStatus.CLOSED
        deliveries = await recorded(k, 4)  # the request, two votes, the decision
    got = receiver.requests()
    kinds = [json.loads(r["body"])["notice"] for r in got]
    assert kinds == ["request", "outcome", "outcome", "outcome"]
    request = json.loads(got[0]["body"])
    assert request["dfid"] == dfid and request["reason_code"] == "APPROVAL_REQUIRED"
    assert request["quorum"]["required"] == 2
    assert json.loads(got[1]["body"])["waiting"] == "1 of 2, waiting for a desk-head"
    for r in got:
        header = r["headers"][SIGNATURE]
        assert verify(SECRET, r["body"].encode(), header)
        assert not verify(b"another key", r["body"].encode(), header)
        assert r["headers"][DELIVERY].startswith("desk:")
    assert all(isinstance(d.payload, WebhookDelivered) for d in deliveries)
    assert {d.target for d in outcomes(deliveries)} == {dfid}
    # Neither the key nor the URL's secret part is anywhere in the journal.
    raw = (tmp_path / "j.db").read_bytes()
    assert SECRET not in raw and TOKEN.encode() not in raw


async def test_a_failing_receiver_is_retried_with_backoff(
    tmp_path: Path, receiver: Receiver
) -> None:
    webhooks = [hook(f"{receiver.base}/fail/2")]
    async with pay_kernel(tmp_path / "j.db", webhooks=webhooks) as kernel:
        await kernel.register(sender())
        await escalate(kernel)
        [delivered] = await recorded(kernel, 1)
    assert isinstance(delivered.payload, WebhookDelivered)
    assert (delivered.payload.attempts, delivered.payload.status) == (3, 200)
    assert [r["status"] for r in receiver.requests()] == [503, 503, 200]
    # One notice, one id: a receiver that dedupes sees one delivery.
    assert len({r["headers"][DELIVERY] for r in receiver.requests()}) == 1


async def test_a_receiver_that_never_takes_it_is_recorded_failed(
    tmp_path: Path, receiver: Receiver
) -> None:
    webhooks = [hook(f"{receiver.base}/fail/99", max_attempts=3)]
    async with pay_kernel(tmp_path / "j.db", webhooks=webhooks) as kernel:
        await kernel.register(sender())
        await escalate(kernel)
        [failed] = await recorded(kernel, 1)
    assert isinstance(failed.payload, WebhookFailed)
    assert (failed.payload.attempts, failed.payload.error) == (3, "HTTP 503")


async def test_a_slow_receiver_takes_it_and_a_late_answer_counts_as_a_failure(
    tmp_path: Path, receiver: Receiver
) -> None:
    webhooks = [
        hook(f"{receiver.base}/slow/0.2", name="slow"),
        hook(f"{receiver.base}/late/1/2", name="late"),
    ]
    async with pay_kernel(tmp_path / "j.db", webhooks=webhooks) as kernel:
        await kernel.register(sender())
        await escalate(kernel)
        deliveries = {p.hook: p for p in outcomes(await recorded(kernel, 2))}
    assert deliveries["slow"].attempts == 1
    # The first answer came after the sender stopped waiting: tried again, taken.
    assert deliveries["late"].attempts == 2


async def test_the_kernel_never_waits_for_a_hanging_receiver(
    tmp_path: Path, receiver: Receiver
) -> None:
    webhooks = [hook(f"{receiver.base}/hold", queue=1, timeout_s=30)]
    async with pay_kernel(tmp_path / "j.db", webhooks=webhooks) as kernel:
        await kernel.register(sender())
        # The receiver holds the first request; the kernel escalates, decides, executes on.
        first = await escalate(kernel)
        dfids = [await escalate(kernel) for _ in range(3)]
        verdict = await kernel.decide(
            first, "approve", operator="ana", reason="ok", action_hash=action_of(kernel, first)
        )
        assert verdict.outcome is Outcome.ACCEPTED
        assert (await kernel.wait_flow(first)).status is FlowStatus.CLOSED
        assert all(flow_of(kernel, d).status is FlowStatus.ESCALATED for d in dfids)
        # What found the queue full was dropped, on record; nothing else waited.
        dropped = await recorded(kernel, 1)
        assert all(isinstance(e.payload, WebhookFailed) and e.payload.dropped for e in dropped)
        receiver.release()
        await recorded(kernel, 3)


async def test_a_receiver_that_floods_trickles_or_never_answers_costs_one_bounded_try(
    tmp_path: Path, receiver: Receiver
) -> None:
    # Each socket read would wait 30 s: only the deadline on the whole try can end these.
    bounded = {"max_attempts": 1, "deadline_s": 0.5, "timeout_s": 30, "notices": ("request",)}
    webhooks = [
        hook(f"{receiver.base}/flood", name="flood", max_response_bytes=1024, **bounded),
        hook(f"{receiver.base}/trickle", name="trickle", **bounded),
        hook(f"{receiver.base}/trickle-head", name="trickle-head", **bounded),
        hook(f"{receiver.base}/hold", name="silent", **bounded),
    ]
    async with pay_kernel(tmp_path / "j.db", webhooks=webhooks) as kernel:
        await kernel.register(sender())
        dfid = await escalate(kernel)
        failed = {p.hook: p for p in outcomes(await recorded(kernel, 4))}
        # The kernel runs on: the flow is decided and closes.
        await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=action_of(kernel, dfid)
        )
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        receiver.release()
    assert set(failed) == {"flood", "trickle", "trickle-head", "silent"}
    assert all(isinstance(p, WebhookFailed) and p.attempts == 1 for p in failed.values())
    errors = {name: getattr(p, "error", "") for name, p in failed.items()}
    assert errors["flood"] == "an answer of more than 1024 bytes"
    for name in ("trickle", "trickle-head", "silent"):
        assert errors[name] == "no answer within the deadline (0.5 s)", name


async def test_reminders_follow_the_recorded_clock_and_a_slack_body(
    tmp_path: Path, receiver: Receiver
) -> None:
    clock = ManualClock()
    webhooks = [
        hook(
            f"{receiver.base}/ok",
            style="slack",
            notices=("request", "reminder"),
            remind_after_s=600,
            remind_every_s=600,
            max_reminders=2,
        )
    ]
    async with pay_kernel(tmp_path / "j.db", webhooks=webhooks, clock=clock) as kernel:
        await kernel.register(sender())
        await escalate(kernel)
        await recorded(kernel, 1)
        clock.advance(700)  # past remind_after_s: the first reminder
        await recorded(kernel, 2)
        clock.advance(600)  # another remind_every_s: the second, and the last
        deliveries = await recorded(kernel, 3)
        clock.advance(6000)
        # No third: max_reminders. (A decision now shows nothing was left queued.)
        await kernel.trigger("pay.50000")
    notices = [d.notice for d in outcomes(deliveries)]
    assert notices == ["request", "reminder", "reminder"]
    assert [json.loads(r["body"])["text"][:13] for r in receiver.requests()].count(
        "Still waiting"
    ) == 2
    bodies = [json.loads(r["body"]) for r in receiver.requests()]
    assert all(set(b) == {"text", "blocks"} for b in bodies)
    assert bodies[1]["text"].startswith("Still waiting")


def test_every_approval_event_makes_one_notice_and_others_none() -> None:
    from kernel.core.events import FlowClosed, FlowEscalated, HumanDecided
    from kernel.core.reasons import ReasonCode

    escalated = Event(
        seq=3,
        ts=1,
        dfid="f",
        payload=FlowEscalated(reason_code=ReasonCode.APPROVAL_REQUIRED, action_hash="ab" * 32),
    )
    notice = notice_of(escalated)
    assert notice is not None and (notice.kind, notice.about, notice.id) == (
        "request",
        3,
        "3:request",
    )
    silent = FlowEscalated(reason_code=ReasonCode.AGENT_SILENT)  # nothing to approve
    assert notice_of(Event(seq=4, ts=1, dfid="f", payload=silent)) is None
    decided = Event(seq=5, ts=1, dfid="f", payload=HumanDecided(decision="approve", operator="a"))
    assert notice_of(decided) is not None
    assert notice_of(Event(seq=6, ts=1, dfid="f", payload=FlowClosed())) is None
