"""Re-judging history: replay reproduces every verdict; another pack flips an exact list."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import anyio
import pytest

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import open_kernel
from kernel.audit import open_journal
from kernel.audit.reverify import PackPathError, load_packs, rejudge
from kernel.cli import main
from kernel.config import KernelConfig, Ports
from kernel.core.events import (
    FlowEscalated,
    Payload,
    ProposalAccepted,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.memory import MEMORY_PACK
from kernel.policy import LimitSpec
from kernel.testing import ManualClock, SeededIds, action_of
from policies.trading import TRADING
from tests.support.helpers import Bank
from tests.support.principals import LOCAL

PRICES = {"market.ACME.price": "100.00", "market.GLOBEX.price": "50.00"}
PRICES["market.INITECH.price"] = "10.00"


Plan = Callable[[WorkingContext], Proposal]
"""One step of the desk's plan: a proposal made on the context given."""


def order(symbol: str, side: str, quantity: int, price: str, confidence: float = 0.9) -> Plan:
    params = {"symbol": symbol, "side": side, "quantity": quantity, "limit_price": price}
    return lambda ctx: ctx.propose(
        {"kind": "trading.place_order", **params},
        explain=f"{side} {quantity} {symbol}",
        confidence=confidence,
    )


def constraint(text: str) -> Plan:
    return lambda ctx: ctx.propose({"kind": "memory.add_constraint", "text": text}, explain=text)


class Desk(Agent):
    """Proposes the next step of its plan in each flow (one attempt per flow)."""

    def __init__(self) -> None:
        self.manifest = Manifest(
            agent_id="trader",
            version="1.0.0",
            capabilities=["trading.place_order", "memory.add_constraint"],
            subscriptions=["market"],
            max_attempts=1,
        )
        self.plan: list[Plan] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        return self.plan.pop(0)(ctx)


async def workload(path: Path) -> dict[str, str]:
    """Accepted, rejected (four reason codes), escalated, approved, modified, reserved flows."""
    async with open_kernel(
        path,
        packs=[TRADING, MEMORY_PACK],
        adapters={"broker": Bank(), "ledger": Bank()},
        allow=["trader"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(3))),
    ) as kernel:
        desk = Desk()
        await kernel.register(desk)
        flows: dict[str, str] = {}
        steps = {
            "small": order("ACME", "buy", 10, "100.00"),
            "mid": order("ACME", "buy", 200, "100.00"),
            "upper": order("ACME", "buy", 240, "100.00"),
            "large": order("ACME", "buy", 300, "100.00"),  # above the human threshold
            "huge": order("ACME", "buy", 600, "100.00"),  # above the notional limit
            "unknown": order("FOO", "buy", 1, "100.00"),
            "drift": order("ACME", "buy", 10, "120.00"),
            "unsure": order("ACME", "buy", 5, "100.00", confidence=0.3),
            "sell": order("GLOBEX", "sell", 100, "50.00"),
            "malformed": order("ACME", "buy", "lots", "100.00"),  # type: ignore[arg-type]
            "unauthorized": lambda ctx: ctx.propose(
                {"kind": "trading.set_mandate", "symbols": ["ACME"], "max_notional": "1"}
            ),
            "rule": constraint("never INITECH"),
            "banned": order("INITECH", "buy", 1, "10.00"),
        }
        for name, step in steps.items():
            desk.plan.append(step)
            [flows[name]] = await kernel.trigger("market.tick", PRICES)
            await kernel.wait_flow(flows[name])
        # 30,000.00 USD is above trading 0.4.0's two-person size: a risk officer and a desk head.
        for operator, role in (("ana", "risk"), ("ed", "desk-head")):
            await kernel.decide(
                flows["large"],
                "approve",
                operator=operator,
                reason="known desk",
                action_hash=action_of(kernel, flows["large"]),
                roles=[role],
            )
        await kernel.decide(
            flows["unsure"],
            "modify",
            operator="ana",
            reason="smaller",
            params={"symbol": "ACME", "side": "buy", "quantity": 6, "limit_price": "100.00"},
        )
        await kernel.wait_quiet()
        return flows


async def verdicts(path: Path) -> list[tuple[ProposalSubmitted, Payload, int]]:
    """(proposal, recorded verdict, seq) of every recorded judgement, read independently."""
    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
    waiting: dict[str, tuple[ProposalSubmitted, int]] = {}
    out: list[tuple[ProposalSubmitted, Payload, int]] = []
    for event in events:
        if isinstance(event.payload, ProposalSubmitted):
            assert event.dfid is not None  # a proposal is always in a flow
            waiting[event.dfid] = (event.payload, event.seq)
        elif isinstance(event.payload, ProposalAccepted | ProposalRejected | FlowEscalated):
            if event.dfid in waiting:
                submitted, seq = waiting.pop(event.dfid)
                out.append((submitted, event.payload, seq))
    return out


async def rechecks(path: Path) -> dict[int, str]:
    """Seq -> DFID of every approved action judged again before it executed (and accepted)."""
    async with open_journal(path, readonly=True) as journal:
        events = await journal.read(types=["ProposalAccepted"])
    return {
        e.seq: str(e.dfid)
        for e in events
        if isinstance(e.payload, ProposalAccepted) and e.payload.rechecked
    }


def notional(params: dict[str, Any]) -> int:
    cents = Decimal(params["limit_price"]) * params["quantity"] * 100
    return int(cents.to_integral_value(rounding=ROUND_CEILING))


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    path = tmp_path / "desk.db"
    anyio.run(workload, path)
    return path


STRICT_LIMIT = 1_500_000
PACK_FILE = f"""
import dataclasses

from kernel.policy import ALLOW, LimitSpec, RuleVerdict, View, deny, rule
from policies.trading import TRADING, PlaceOrder, notional_minor, position_limit

STRICT = dataclasses.replace(
    TRADING,
    limits={{**TRADING.limits, "max_order_notional": LimitSpec({STRICT_LIMIT}, 0, 20_000_000)}},
)
LOOSE = dataclasses.replace(
    TRADING,
    limits={{**TRADING.limits, "max_order_notional": LimitSpec(10_000_000, 0, 20_000_000)}},
)


@rule(PlaceOrder, fields=("limit_price", "quantity"))
def notional_limit(view: View) -> RuleVerdict:
    if notional_minor(view.params) > 1_000_000:
        return deny("quietly tightened", field="quantity", limit=1_000_000)
    return ALLOW


# The same name and version as the recorded pack, one rule changed.
TAMPERED = dataclasses.replace(TRADING, rules=(notional_limit, position_limit))
"""


@pytest.fixture
def pack_file(tmp_path: Path) -> Path:
    path = tmp_path / "desk_packs.py"
    path.write_text(PACK_FILE)
    return path


async def test_replay_reproduces_every_recorded_verdict(journal_path: Path) -> None:
    recorded = await verdicts(journal_path)
    kinds = {type(v).__name__ for _, v, _ in recorded}
    codes = {str(v.feedback.reason_code) for _, v, _ in recorded if isinstance(v, ProposalRejected)}
    # The workload is mixed: every outcome, several rejection codes, escalations, a human.
    assert kinds == {"ProposalAccepted", "ProposalRejected", "FlowEscalated"}
    assert len(codes) >= 4 and "CONSTRAINT_VIOLATION" in codes
    assert any(s.by_human for s, _, _ in recorded)
    async with open_journal(journal_path, readonly=True) as journal:
        assert await journal.read(types=["ResourceReserved"])
        head = journal.head_hash
        result = await rejudge(journal, [TRADING, MEMORY_PACK])
        assert journal.head_hash == head
    assert result.changes == [] and result.mismatches == []
    # Each verdict, and the approval judged again before it executed.
    again = await rechecks(journal_path)
    assert len(again) == 1
    assert result.judged == len(recorded) + len(again) and result.skipped == 0


async def test_a_stricter_pack_flips_exactly_the_verdicts_above_its_limit(
    journal_path: Path, pack_file: Path
) -> None:
    [strict] = load_packs(f"{pack_file}:STRICT")
    expected = {
        seq
        for submitted, verdict, seq in await verdicts(journal_path)
        if submitted.proposal.kind == "trading.place_order"
        and isinstance(verdict, ProposalAccepted | FlowEscalated)
        and notional(submitted.proposal.params) > STRICT_LIMIT
    }
    assert len(expected) >= 3  # accepted and escalated ones both
    # The large order's approval, judged again before it executed, would be superseded.
    [(recheck, _)] = (await rechecks(journal_path)).items()
    async with open_journal(journal_path, readonly=True) as journal:
        result = await rejudge(journal, [strict, MEMORY_PACK], check_hash=False)
    assert {c.seq for c in result.changes} == expected | {recheck}
    now = {c.seq: c.now for c in result.changes}
    assert now.pop(recheck) == "would have been superseded"
    assert set(now.values()) == {"would have been rejected"}
    assert all(c.reason_code == "RISK_LIMIT_EXCEEDED" for c in result.changes)


def test_dirk_whatif_pack_lists_the_flips_both_ways(
    journal_path: Path, pack_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flows_by_seq = {seq: v for _, v, seq in anyio.run(verdicts, journal_path)}
    judged = len(flows_by_seq) + len(anyio.run(rechecks, journal_path))
    before = journal_path.read_bytes()
    assert main(["whatif", "--db", str(journal_path), "--pack", f"{pack_file}:STRICT"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"whatif: {judged} recorded verdicts judged again,")
    assert any("accepted then, would have been rejected: RISK_LIMIT_EXCEEDED" in x for x in lines)
    # The large order escalated under trading 0.4.0's two-person rule; the line says so.
    escalated = "escalated (APPROVAL_REQUIRED, needing 2 of risk, desk-head) then"
    assert any(f"{escalated}, would have been rejected" in x for x in lines)

    # The reverse: a looser limit turns the rejected order into one a human approves.
    assert main(["whatif", "--db", str(journal_path), "--pack", f"{pack_file}:LOOSE"]) == 0
    [flip, summary] = capsys.readouterr().out.splitlines()
    # 60,000.00 USD: it would wait for two humans, a risk officer and a desk head.
    assert (
        "rejected (RISK_LIMIT_EXCEEDED) then, would have been escalated"
        " (needing 2 of risk, desk-head): APPROVAL_REQUIRED" in flip
    )
    assert summary.endswith("1 change (0 of kinds no given pack defines)")
    assert journal_path.read_bytes() == before


def test_a_tampered_pack_is_detected_and_its_differences_listed(
    journal_path: Path, pack_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "verify",
                "--db",
                str(journal_path),
                "--verdicts",
                "--pack",
                "policies.trading:TRADING",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "verify: verdicts ok:" in out and "0 differ" in out

    tampered = f"{pack_file}:TAMPERED"
    assert main(["verify", "--db", str(journal_path), "--verdicts", "--pack", tampered]) == 1
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if "PACK_MISMATCH" in x]
    assert f"pack trading {TRADING.version}" in line and TRADING.hash[:16] in line
    assert "verify: verdicts FAILED" in out

    # With the hash check bypassed (a what-if) the verdicts the changed rule flips are listed.
    assert main(["whatif", "--db", str(journal_path), "--pack", tampered]) == 0
    out = capsys.readouterr().out
    assert "quietly tightened" in out and "would have been rejected" in out


def test_bad_pack_paths_fail_clearly(
    tmp_path: Path, pack_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (str(tmp_path / "missing.py"), "no such file"),
        (f"{pack_file}:NOPE", "has no attribute 'NOPE'"),
        (f"{pack_file}:dataclasses", "is not a PolicyPack"),
        (str(pack_file), "is defined by both pack"),  # several packs define the same kinds
        ("no_such_module_here", "ModuleNotFoundError"),
    ]
    for spec, words in cases:
        with pytest.raises(PackPathError, match=words):
            load_packs(spec)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(PackPathError, match="RuntimeError: boom"):
        load_packs(str(broken))

    db = tmp_path / "j.db"
    anyio.run(workload, db)
    assert main(["whatif", "--db", str(db), "--pack", str(broken)]) == 2
    assert capsys.readouterr().err.startswith("error: BAD_PACK_PATH:")
    assert main(["verify", "--db", str(db), "--verdicts"]) == 2
    assert "BAD_ARGUMENT" in capsys.readouterr().err


def test_pack_loading_by_module_and_dataclass_copy() -> None:
    [pack] = load_packs("policies.trading:TRADING")
    assert pack is TRADING
    strict = dataclasses.replace(
        TRADING, limits={**TRADING.limits, "max_order_notional": LimitSpec(1, 0, 2)}
    )
    assert strict.hash != TRADING.hash and strict.version == TRADING.version


TRADING_V2 = dataclasses.replace(
    TRADING,
    version=f"{TRADING.version}-tight",
    limits={**TRADING.limits, "max_order_notional": LimitSpec(1_000_000, 0, 20_000_000)},
)


async def amended_then_reloaded(path: Path) -> dict[str, list[str]]:
    """One order judged plain, under an amendment, after it expired; one before and after a load."""
    clock = ManualClock()
    async with open_kernel(
        path,
        packs=[TRADING, MEMORY_PACK],
        adapters={"broker": Bank(), "ledger": Bank()},
        allow=["trader"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=clock, ids=SeededIds(4))),
    ) as kernel:
        desk = Desk()
        await kernel.register(desk)
        flows: dict[str, list[str]] = {"huge": [], "mid": []}

        async def run(name: str, step: Plan) -> None:
            desk.plan.append(step)
            [dfid] = await kernel.trigger("market.tick", PRICES)
            await kernel.wait_flow(dfid)
            flows[name].append(dfid)

        huge = order("ACME", "buy", 600, "100.00")
        mid = order("ACME", "buy", 200, "100.00")
        await run("huge", huge)
        await kernel.amend_limit(
            "trader", "max_order_notional", 8_000_000, ttl_s=60, operator="ana", reason="rebalance"
        )
        await run("huge", huge)
        clock.advance(120)
        await run("huge", huge)
        await run("mid", mid)
        await kernel.load_pack(TRADING_V2, operator="ana", reason="tighter after review")
        await run("mid", mid)
        await kernel.wait_quiet()
        return flows


async def test_replay_follows_amendments_and_pack_loads(tmp_path: Path) -> None:
    path = tmp_path / "desk.db"
    flows = await amended_then_reloaded(path)
    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
        verdict_of = {
            e.dfid: e.payload
            for e in events
            if isinstance(e.payload, ProposalAccepted | ProposalRejected | FlowEscalated)
        }
        # The history is one where the amendment and the load decided something.
        plain, amended, expired = (verdict_of[d] for d in flows["huge"])
        assert isinstance(plain, ProposalRejected) and isinstance(expired, ProposalRejected)
        assert not isinstance(amended, ProposalRejected)
        before, after = (verdict_of[d] for d in flows["mid"])
        assert isinstance(before, ProposalAccepted) and isinstance(after, ProposalRejected)
        assert after.pack == TRADING_V2.hash != before.pack

        both = await rejudge(journal, [TRADING, TRADING_V2, MEMORY_PACK])
        first_only = await rejudge(journal, [TRADING, MEMORY_PACK])
    assert both.changes == [] and both.mismatches == [] and both.skipped == 0
    assert both.judged == len(verdict_of)
    # Without the loaded version, the verdict it gave cannot be vouched for, and says so.
    assert first_only.skipped == 1 and len(first_only.mismatches) == 1


def installed_dirk(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it: its own directory on the path, not cwd."""
    script = Path(sys.executable).with_name("dirk")
    assert script.is_file(), "dirk is installed with the package (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(script), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_pack_module_is_found_from_the_current_directory(
    tmp_path: Path, journal_path: Path
) -> None:
    """`dirk --pack MODULE` imports MODULE the way `python -m` finds it: the current directory."""
    here = tmp_path / "checkout"
    here.mkdir()
    (here / "tight_desk_packs.py").write_text(PACK_FILE)
    ran = installed_dirk(
        "whatif", "--db", journal_path, "--pack", "tight_desk_packs:TAMPERED", cwd=here
    )
    assert ran.returncode == 0, ran.stderr
    assert "quietly tightened" in ran.stdout and "would have been rejected" in ran.stdout

    # From any other directory the module is not there: one clear line, no traceback.
    ran = installed_dirk("whatif", "--db", journal_path, "--pack", "tight_desk_packs", cwd=tmp_path)
    assert ran.returncode == 2
    assert ran.stderr.startswith("error: BAD_PACK_PATH:") and "ModuleNotFoundError" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_loading_a_pack_module_leaves_the_path_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "strict_desk_packs.py").write_text(PACK_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    [strict] = load_packs("strict_desk_packs:STRICT")
    assert strict.limits["max_order_notional"].default == STRICT_LIMIT
    assert sys.path == before
    monkeypatch.delitem(sys.modules, "strict_desk_packs")
