"""Any text at any entry point: refused at the wall with a reason code, never a stopped kernel.

A lone surrogate (``"\\ud800"``, or ``"\\udcff"``: the byte ``\\xff`` of an argument under
``surrogateescape``) is a Python string that does not encode as UTF-8, so no event can
hold it; a control character in an id or a name would be obeyed by a terminal. Before
the wall checked for either, one such string in 18 of these calls stopped the kernel
(the journal then said ``KERNEL_CLOSED``), two raised a bare ``UnicodeEncodeError`` and
two gave ``KERNEL_FAULT`` (trust-and-edges.md, D1). Each call below is made against a
real kernel on a real journal file: it is refused with SCHEMA_INVALID naming the field,
recorded where there is a flow or a principal to name, the kernel goes on (a flow
opened afterwards closes), and the journal verifies.
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kernel import (
    AmendmentInvalid,
    FlowStatus,
    HandshakeRefused,
    InputInvalid,
    Kernel,
    Manifest,
    Outcome,
    ReasonCode,
    Verdict,
    open_kernel,
)
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import open_journal, verify_journal
from kernel.config import KernelConfig, Ports
from kernel.core.events import ExecutionSucceeded, FlowAborted, KernelStopped
from kernel.core.reasons import ExitCode, StopReason
from kernel.policy import (
    ALLOW,
    LimitSpec,
    PackError,
    PolicyKind,
    PolicyPack,
    RuleVerdict,
    View,
)
from kernel.policy import rule as policy_rule
from kernel.policy.packs import PolicyCatalog
from kernel.registry import credential_verifier
from kernel.state.rulebook import RuleNotInForce, RuleNotPending
from kernel.testing import ManualClock, SeededIds, action_of
from tests.cli.test_cli import clean_env
from tests.dim.test_amendments import PACK as DESK
from tests.dim.test_amendments import Desk, trader
from tests.support.helpers import PACK, Bank, ScriptedAgent, configured, kernel_for, transfer
from tests.support.hostile import hostile_scalars, hostile_text, hostile_values
from tests.support.principals import LOCAL

BAD = "a\ud800"
"""A lone surrogate: what json.loads makes of the escape ``"\\ud800"``."""
ARGV_BYTE = "ana\udcff"
"""What Python makes of the argument byte ``\\xff`` (``surrogateescape``)."""
ESC = "pm\x1b]0;pwned\x07"
"""An id that retitles the terminal it is printed on."""


@dataclass(frozen=True)
class Scene:
    """What each call needs: an escalated flow, a live session and its flow."""

    escalated: str
    token: str
    waiting: str


@asynccontextmanager
async def desk(path: Path) -> AsyncIterator[tuple[Kernel, Scene]]:
    """A kernel with the test pack and the desk pack (amendable limits), and a scene."""
    async with open_kernel(
        path,
        packs=[PACK, DESK],
        adapters={"bank": Bank(), "desk": Desk()},
        allow=["clerk", "trader", "other", "payer", BAD, ESC],
        config=configured(
            KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(3))),
            inbox_poll_s=None,
        ),
    ) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2, valid_for_s=600)]))
        [escalated] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(escalated)).status is FlowStatus.ESCALATED
        await kernel.register(trader())
        # An agent thinking about a flow: the token and the DFID a submission names.
        thinking = ScriptedAgent(
            "other", hold=anyio.Event(), capabilities=["test.note"], subscriptions=["hold"]
        )
        session = await kernel.register(thinking)
        [waiting] = await kernel.trigger("hold")
        await thinking.wait_context()
        yield kernel, Scene(escalated=escalated, token=session.token, waiting=waiting)


Call = Callable[[Kernel, Scene], Awaitable[Any]]


def decide(**changes: Any) -> Call:
    def call(kernel: Kernel, scene: Scene) -> Awaitable[Any]:
        fields: dict[str, Any] = {
            "dfid": scene.escalated,
            "decision": "approve",
            "operator": "ana",
            "reason": "checked",
            "action_hash": action_of(kernel, scene.escalated),
        }
        fields.update(changes)
        return kernel.decide(fields.pop("dfid"), fields.pop("decision"), **fields)

    return call


def status(**changes: Any) -> Call:
    fields = {"agent_id": "clerk", "status": "PASSIVE", "operator": "ana", "reason": "r"}
    fields.update(changes)
    return lambda kernel, _: kernel.set_agent_status(
        fields["agent_id"], fields["status"], operator=fields["operator"], reason=fields["reason"]
    )


def amend(**changes: Any) -> Call:
    fields: dict[str, Any] = {"agent_id": "trader", "limit": "max_qty", "value": 8}
    fields |= {"ttl_s": 60, "operator": "ana", "reason": "r"}
    fields.update(changes)
    return lambda kernel, _: kernel.amend_limit(
        fields.pop("agent_id"), fields.pop("limit"), fields.pop("value"), **fields
    )


def credential(**changes: Any) -> Call:
    fields = {"agent_id": "clerk", "verifier": credential_verifier("dirk_x")}
    fields |= {"operator": "ana", "reason": "r"}
    fields.update(changes)
    return lambda kernel, _: kernel.issue_credential(
        fields["agent_id"], fields["verifier"], operator=fields["operator"], reason=fields["reason"]
    )


def trigger(topic: str = "bank.invoice", **kw: Any) -> Call:
    return lambda kernel, _: kernel.trigger(topic, **kw)


def handshake(credential: str | None = None, **changes: Any) -> Call:
    fields: dict[str, Any] = {"agent_id": "clerk", "version": "1.0"}
    fields |= {"capabilities": ["test.transfer"], "subscriptions": ["bank"]}
    fields.update(changes)
    return lambda kernel, _: kernel.handshake(Manifest(**fields), credential=credential)


def rule(**changes: Any) -> Call:
    fields: dict[str, Any] = {"rule": "refunds", "title": "Refunds", "content": "ask first"}
    fields |= {"operator": "ana", "reason": "policy"}
    fields.update(changes)
    return lambda kernel, _: kernel.propose_rule(fields.pop("rule"), **fields)


def submit(token: str | None = None, dfid: str | None = None, **policy: Any) -> Call:
    proposal = {"kind": "test.note", "params": {"text": "hi"}, "valid_until_ns": 2**62}
    proposal.update(policy)
    return lambda kernel, scene: kernel.submit(
        scene.token if token is None else token,
        scene.waiting if dfid is None else dfid,
        proposal,
    )


CALLS: list[tuple[str, Call, str | None]] = [
    # (the call, made with one hostile string; the event that records its refusal)
    ("decide operator", decide(operator=BAD), "DecisionRefused"),
    ("decide operator argv byte", decide(operator=ARGV_BYTE), "DecisionRefused"),
    ("decide operator escape", decide(operator=ESC), "DecisionRefused"),
    ("decide reason", decide(reason=BAD), "DecisionRefused"),
    (
        "decide modify value",
        decide(decision="modify", params={"amount_cents": BAD}),
        "DecisionRefused",
    ),
    ("decide modify key", decide(decision="modify", params={BAD: 1}), "DecisionRefused"),
    ("decide dfid", decide(dfid=BAD), "DecisionRefused"),
    ("decide word", decide(decision=BAD), "DecisionRefused"),
    ("decide action hash", decide(action_hash=BAD), "DecisionRefused"),
    ("status operator", status(operator=BAD), "InputRefused"),
    ("status reason", status(reason=BAD), "InputRefused"),
    ("status agent", status(agent_id=BAD), "InputRefused"),
    ("status word", status(status=BAD), "InputRefused"),
    ("amend reason", amend(reason=BAD), "AmendmentRefused"),
    ("amend value", amend(value=BAD), "AmendmentRefused"),
    ("amend operator", amend(operator=BAD), "AmendmentRefused"),
    ("amend limit", amend(limit=BAD), "AmendmentRefused"),
    ("amend agent", amend(agent_id=BAD), "InputRefused"),
    ("credential operator", credential(operator=BAD), None),
    ("credential verifier", credential(verifier=BAD), None),
    ("credential agent", credential(agent_id=BAD), None),
    ("trigger topic", trigger(BAD), None),
    ("trigger source", trigger(source=BAD), None),
    ("trigger fact value", trigger(facts={"bank.note": BAD}), None),
    ("trigger fact key", trigger(facts={BAD: 1}), None),
    ("trigger parent", trigger(parent=BAD), None),
    ("handshake version", handshake(version="1.0" + BAD), "AgentRefused"),
    ("handshake allowed id", handshake(agent_id=BAD), "AgentRefused"),
    ("handshake other id", handshake(agent_id="mallory" + BAD), "AgentRefused"),
    ("handshake escape id", handshake(agent_id=ESC), "AgentRefused"),
    ("handshake capability", handshake(capabilities=[BAD]), "AgentRefused"),
    ("handshake subscription", handshake(subscriptions=[BAD]), "AgentRefused"),
    ("handshake limits key", handshake(limits={BAD: 1}), "AgentRefused"),
    ("rule title", rule(title=BAD), "InputRefused"),
    ("rule content", rule(content=BAD), "InputRefused"),
    ("rule id", rule(rule=BAD), "InputRefused"),
    ("rule label", rule(labels=[BAD]), "InputRefused"),
    ("submit dfid", submit(dfid=BAD), None),
    ("submit token", submit(token=BAD), None),
    ("submit kind", submit(kind="test." + BAD), None),
    ("submit explanation", submit(explain=BAD), None),
]


async def refusal_code(result: Awaitable[Any]) -> ReasonCode:
    """The reason code a call was refused with, whether it raised or answered."""
    try:
        answer = await result
    except (InputInvalid, HandshakeRefused, AmendmentInvalid) as exc:
        return exc.reason_code
    assert isinstance(answer, Verdict), answer
    assert answer.outcome in (Outcome.REFUSED, Outcome.REJECTED), answer
    assert answer.reason_code is not None
    return answer.reason_code


@pytest.mark.parametrize(("name", "call", "recorded"), CALLS, ids=[c[0] for c in CALLS])
async def test_a_string_that_is_not_text_is_refused_and_the_kernel_goes_on(
    tmp_path: Path, name: str, call: Call, recorded: str | None
) -> None:
    path = tmp_path / "j.db"
    async with desk(path) as (kernel, scene):
        before = kernel.journal.head_seq
        code = await refusal_code(call(kernel, scene))
        assert code is ReasonCode.SCHEMA_INVALID, name
        assert kernel.stopped is None
        if recorded is not None:
            [refused] = await kernel.journal.read(before + 1, types=[recorded])
            payload: Any = refused.payload  # one of the refusals: each has a reason code
            assert payload.reason_code is ReasonCode.SCHEMA_INVALID
        # The kernel goes on: the flow waiting for a human takes a proper decision.
        verdict = await kernel.decide(
            scene.escalated,
            "approve",
            operator="ana",
            reason="checked",
            action_hash=action_of(kernel, scene.escalated),
        )
        assert verdict.outcome is Outcome.ACCEPTED, verdict
        assert (await kernel.wait_flow(scene.escalated)).status is FlowStatus.CLOSED
    report = await verify_journal(path)
    assert report.ok, report
    async with open_journal(path, readonly=True) as journal:
        [*_, stopped] = await journal.read(types=["KernelStopped"])
        assert isinstance(stopped.payload, KernelStopped)
        assert stopped.payload.reason == StopReason.KERNEL_CLOSED


async def test_a_credential_that_is_not_text_is_refused_as_not_the_agents_own(
    tmp_path: Path,
) -> None:
    async with desk(tmp_path / "j.db") as (kernel, _):
        await kernel.issue_credential(
            "clerk", credential_verifier("dirk_x"), operator="ana", reason="provisioned"
        )
        for shown in (BAD, ARGV_BYTE, "dirk_x\x00"):
            with pytest.raises(HandshakeRefused) as caught:
                await handshake(credential=shown)(kernel, Scene("", "", ""))
            assert caught.value.reason_code is ReasonCode.CREDENTIAL_INVALID
        assert kernel.stopped is None
        await handshake(credential="dirk_x")(kernel, Scene("", "", ""))
    assert (await verify_journal(tmp_path / "j.db")).ok


class OddKind(PolicyKind, tag="odd.k"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"

    n: int


class SurrogateKind(PolicyKind, tag="odd.k\ud800"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"

    n: int


def fine(view: View) -> RuleVerdict:
    return ALLOW


def escaped(view: View) -> RuleVerdict:
    return ALLOW


escaped.__name__ = "fine\x1b[2J"  # what the pack's reports would print


@pytest.mark.parametrize("bad", ["name", "version", "kind", "rule", "limit"])
def test_a_pack_whose_names_are_not_ids_is_refused_at_load(bad: str) -> None:
    hostile = "x\ud800" if bad in ("name", "limit") else "x\x1b[2J"
    kind = SurrogateKind if bad == "kind" else OddKind
    check = policy_rule(kind)(escaped if bad == "rule" else fine)
    pack = PolicyPack(
        name="odd" + (hostile if bad == "name" else ""),
        version="1.0.0" + (hostile if bad == "version" else ""),
        kinds=(kind,),
        rules=(check,),
        limits={
            "max" + (hostile if bad == "limit" else ""): LimitSpec(default=1, floor=0, ceiling=2)
        },
    )
    with pytest.raises(PackError) as caught:
        PolicyCatalog([pack])
    message = str(caught.value)
    assert "is no id" in message and message.isprintable()


# --- properties: hostile text at every entry point of the in-process API --------------

SETTINGS = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

text = hostile_text()
word = st.sampled_from(["approve", "reject", "modify", "PASSIVE", "ACTIVE"]) | text


def some(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Draw a subset of ``fields`` to replace in a well-formed call (often one, often all)."""
    return st.fixed_dictionaries({}, optional=fields)


hostile_calls: st.SearchStrategy[Call] = st.one_of(
    some(
        operator=text,
        reason=text,
        decision=word,
        params=st.none() | hostile_values(),
        dfid=text,
        action_hash=text,
    ).map(lambda c: decide(**c)),
    some(agent_id=text, status=word, operator=text, reason=text).map(lambda c: status(**c)),
    some(agent_id=text, limit=text, value=hostile_scalars(), operator=text, reason=text).map(
        lambda c: amend(**c)
    ),
    some(agent_id=text, verifier=text, operator=text, reason=text).map(lambda c: credential(**c)),
    st.builds(
        lambda topic, kw: trigger(topic, **kw),
        st.just("bank.invoice") | text,
        some(
            source=text,
            parent=text,
            facts=st.dictionaries(text, hostile_values(max_leaves=4), max_size=3),
        ),
    ),
    st.builds(
        lambda credential, fields: handshake(credential, **fields),
        st.none() | text,
        some(
            agent_id=text,
            version=text,
            capabilities=st.lists(text, max_size=3),
            subscriptions=st.lists(text, max_size=3),
            limits=st.dictionaries(text, hostile_values(max_leaves=4), max_size=3),
        ),
    ),
    some(rule=text, title=text, content=text, operator=text, reason=text).map(lambda c: rule(**c)),
    st.builds(
        lambda token, dfid, policy: submit(token, dfid, **policy),
        st.none() | text,
        st.none() | text,
        some(kind=text, explain=text, params=hostile_values(max_leaves=6), context_ref=text),
    ),
    some(operator=text, reason=text, decision=word).map(
        lambda c: (
            lambda kernel, _: kernel.decide_rule(
                1,
                c.get("decision", "skip"),
                operator=c.get("operator", "a"),
                reason=c.get("reason", "r"),
            )
        )
    ),
    some(agent_id=text, version=text, subscriptions=st.lists(text, max_size=2)).map(
        lambda c: (
            lambda kernel, _: kernel.register(
                ScriptedAgent(
                    c.get("agent_id", "other"),
                    version=c.get("version", "1.0"),
                    subscriptions=c.get("subscriptions", ["hold"]),
                    capabilities=["test.note"],
                )
            )
        )
    ),
    some(operator=text, reason=text).map(
        lambda c: (
            lambda kernel, _: kernel.load_pack(
                PACK, operator=c.get("operator", "ana"), reason=c.get("reason", "r")
            )
        )
    ),
    some(rule=text, operator=text, reason=text).map(
        lambda c: (
            lambda kernel, _: kernel.retract_rule(
                c.get("rule", "refunds"),
                operator=c.get("operator", "a"),
                reason=c.get("reason", "r"),
            )
        )
    ),
)


EXAMPLES = itertools.count()


async def answered(result: Awaitable[Any]) -> None:
    """The call was accepted, or refused with a reason code (never anything else)."""
    try:
        answer = await result
    except (InputInvalid, HandshakeRefused, AmendmentInvalid) as exc:
        assert isinstance(exc.reason_code, ReasonCode)
        return
    except (RuleNotPending, RuleNotInForce, PackError, ValueError):
        # A rule act the rulebook refuses (a rule that is not there, a word that is not
        # override or skip: ValueError, as decide_rule documents): nothing happened.
        return
    if isinstance(answer, Verdict) and answer.outcome in (Outcome.REFUSED, Outcome.REJECTED):
        assert isinstance(answer.reason_code, ReasonCode)


@SETTINGS
@given(calls=st.lists(hostile_calls, min_size=1, max_size=5))
async def test_no_text_at_any_api_entry_point_stops_the_kernel(
    tmp_path: Path, calls: list[Call]
) -> None:
    path = tmp_path / f"j{next(EXAMPLES)}.db"  # tmp_path is shared by the examples
    async with desk(path) as (kernel, scene):
        payer = ScriptedAgent("payer", subscriptions=["pay"])
        await kernel.register(payer)
        for call in calls:
            await answered(call(kernel, scene))
            assert kernel.stopped is None
        [dfid] = await kernel.trigger("pay")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
    report = await verify_journal(path)
    assert report.ok, report
    async with open_journal(path, readonly=True) as journal:
        [*_, stopped] = await journal.read(types=["KernelStopped"])
        assert isinstance(stopped.payload, KernelStopped)
        assert stopped.payload.reason == StopReason.KERNEL_CLOSED
        for event in await journal.read():
            # Whatever was refused is recorded printable; what was accepted is UTF-8 text.
            if event.type in ("AgentRefused", "InputRefused", "DecisionRefused"):
                assert (event.agent_id or "").isprintable()


# --- beyond the wall: text from adapters and agents' errors is recorded printable -----


class GarbledBank(Bank):
    """A bank whose receipts carry an id that is not UTF-8 text (its effect did happen)."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        await super().execute(intent)
        return Receipt(external_id="tx\ud800\x1b[2J")


async def test_an_adapters_receipt_that_is_not_text_is_recorded_escaped(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    bank = GarbledBank()
    async with kernel_for(path, bank=bank) as kernel:
        await kernel.register(ScriptedAgent())
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        [done] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
        assert isinstance(done.payload, ExecutionSucceeded)
        assert done.payload.external_id == "tx\\ud800\\x1b[2J"
        assert len(bank.calls) == 1
    assert (await verify_journal(path)).ok


async def test_an_agents_error_that_is_not_text_ends_its_flow_with_agent_error(
    tmp_path: Path,
) -> None:
    def fails(ctx: Any) -> None:
        raise RuntimeError("no \ud800 idea \x1b]0;pwned\x07")

    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent(steps=[fails]))
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.AGENT_ERROR
        [aborted] = await kernel.journal.read(dfid=dfid, types=["FlowAborted"])
        assert isinstance(aborted.payload, FlowAborted)
        assert "no \\ud800 idea \\x1b]0;pwned\\x07" in aborted.payload.detail
        assert kernel.stopped is None
    assert (await verify_journal(path)).ok


# --- the command line: argument bytes that are not UTF-8 ------------------------------

argv_bytes = st.binary(min_size=1, max_size=12).filter(lambda b: b"\x00" not in b) | st.builds(
    # A lone surrogate as CESU bytes (ED A0 80): what a broken encoder writes.
    lambda text: text.encode("utf-8", "surrogatepass").replace(b"\x00", b""),
    hostile_text(min_size=1, max_size=12),
).filter(bool)


async def dirk_bytes(*args: str | bytes | Path) -> tuple[int, str, str]:
    """Run ``dirk`` in a subprocess with arguments given as bytes where wanted."""
    argv: list[str | bytes] = [sys.executable, "-m", "kernel"]
    argv += [str(a) if isinstance(a, Path) else a for a in args]
    with anyio.fail_after(60):
        done = await anyio.run_process(argv, check=False, env=clean_env())
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode("utf-8")


@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    # Each example runs four processes: a failure is reported as found, not shrunk.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operator=argv_bytes, reason=argv_bytes, other=argv_bytes)
async def test_no_argument_bytes_stop_a_running_kernel_or_dirk(
    tmp_path: Path, operator: bytes, reason: bytes, other: bytes
) -> None:
    path = tmp_path / f"cli{next(EXAMPLES)}.db"
    async with kernel_for(path, inbox_poll_s=0.05) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2, valid_for_s=600)]))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
        decide = ("decide", dfid, "--reject", "--operator", operator, "--reason", reason)
        for args in (
            (*decide, "--db", path),
            ("flows", "--agent", other, "--db", path),
            ("show", other, "--db", path),
            ("why", other, "--db", path),
        ):
            code, _, err = await dirk_bytes(*args)
            # A refusal is one line with a code, never a traceback; what was queued is
            # applied (or refused on record) by the running kernel.
            assert code in (ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE), err
            assert "Traceback" not in err
            if not err.startswith("usage: "):  # argparse's own (an argument like "-:")
                assert all(re.match(r"error: [A-Z_]+: ", line) for line in err.splitlines()), err
            assert kernel.stopped is None
        # A proper decision is still taken after whatever those rows were.
        verdict = await kernel.decide(dfid, "reject", operator="ana", reason="enough")
        assert verdict.outcome in (Outcome.ABORTED, Outcome.REFUSED)  # rejected, or already
        assert kernel.stopped is None
    report = await verify_journal(path)
    assert report.ok, report
