"""``dirk agent`` and ``dirk rules`` against a live kernel, through the operator inbox."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from kernel import SystemClock
from kernel.audit import payload_of
from kernel.core.events import RuleDecided
from kernel.journal.inbox_store import open_inbox
from tests.cli.test_cli import COMMAND_TIMEOUT_S, clean_env
from tests.support.helpers import ScriptedAgent, kernel_for
from tests.support.operators import Keys, insert, journal_id_of, raw_row

POLL_S = 0.05
WAIT = "30"  # how long the CLI waits for the kernel to take its row


async def dirk(*args: str | Path) -> tuple[int, str, str]:
    """Run ``dirk`` in its own process while the kernel runs in this one."""
    with anyio.fail_after(COMMAND_TIMEOUT_S):
        done = await anyio.run_process(
            [sys.executable, "-m", "kernel", *map(str, args)], check=False, env=clean_env()
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def live(path: Path):  # type: ignore[no-untyped-def]
    return kernel_for(path, clock=SystemClock(), inbox_poll_s=POLL_S)


async def test_an_operator_suspends_and_restores_an_agent_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with live(db) as kernel:
        await kernel.register(ScriptedAgent())
        code, out, _ = await dirk("agent", "clerk", "--db", db)
        assert code == 0 and "clerk 1.0.0: ACTIVE" in out

        change = ("--operator", "ana", "--reason", "audit", "--wait", WAIT, "--db", db)
        code, out, err = await dirk("agent", "clerk", "--set", "SUSPENDED", *change)
        assert code == 0, err
        assert "applied: clerk is SUSPENDED, by ana" in out
        assert kernel.projections.agents["clerk"].status == "SUSPENDED"
        # Suspended: new flows are not opened for it.
        assert await kernel.trigger("bank.invoice") == []

        code, out, err = await dirk("agent", "clerk", "--set", "ACTIVE", *change)
        assert code == 0 and "applied: clerk is ACTIVE" in out, err
        assert len(await kernel.trigger("bank.invoice")) == 1

    # A restart re-reads the inbox: every row was taken once, and only once.
    async with live(db) as kernel:
        with anyio.fail_after(COMMAND_TIMEOUT_S):
            await kernel.register(ScriptedAgent())
        changes = await kernel.journal.read(types=["AgentStatusChanged"])
    assert [(e.payload.status, e.payload.inbox_id) for e in changes] == [
        ("SUSPENDED", 1),
        ("ACTIVE", 2),
    ]


async def test_agent_changes_are_checked_before_they_are_queued(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with kernel_for(db) as kernel:
        await kernel.register(ScriptedAgent())
    code, _, err = await dirk("agent", "nobody", "--db", db)
    assert code == 1 and err.startswith("error: UNKNOWN_AGENT:")
    code, _, err = await dirk("agent", "clerk", "--set", "PASSIVE", "--db", db)
    assert code == 2 and err.startswith("error: SCHEMA_INVALID:")
    code, _, err = await dirk("agent", "clerk", "--set", "ASLEEP", "--db", db)
    assert code == 2 and "invalid choice" in err  # argparse's own refusal
    with open_inbox(str(db)) as store:
        assert store.rows(pending=False) == []


async def test_a_malformed_row_is_refused_on_record_and_never_applied(
    tmp_path: Path, operator_keys: Keys
) -> None:
    db = tmp_path / "j.db"
    async with kernel_for(db) as kernel:
        await kernel.register(ScriptedAgent())
    # Signed by a known operator, but no request the kernel reads: refused at its wall.
    bogus = {"type": "agent_status", "agent_id": "clerk", "status": "ASLEEP", "operator": "x"}
    row_id = insert(db, raw_row(operator_keys, "x", journal_id_of(db), bogus))
    async with live(db) as kernel:
        await kernel.register(ScriptedAgent())
        # Rows are taken in order: once this one is applied, the bogus one was looked at.
        change = ("--operator", "ana", "--reason", "r", "--wait", WAIT, "--db", db)
        code, _, err = await dirk("agent", "clerk", "--set", "PASSIVE", *change)
        assert code == 0, err
        with open_inbox(str(db)) as store:
            rows = store.rows(pending=False)
        changes = await kernel.journal.read(types=["AgentStatusChanged"])
        [refused] = await kernel.journal.read(types=["InputRefused"])
    assert [(r.id, r.taken_seq) for r in rows] == [
        (row_id, refused.seq),
        (row_id + 1, changes[0].seq),
    ]
    assert [e.payload.inbox_id for e in changes] == [row_id + 1]
    assert refused.payload.inbox_id == row_id
    assert refused.payload.reason_code == "SCHEMA_INVALID"
    # The reason is missing, and ASLEEP is no status either: the decoder names one of them.
    assert refused.payload.field in ("request", "request.status", "request.reason")


async def test_an_operator_overrides_a_deferred_rule_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with kernel_for(db) as kernel:
        # No provenance (repository, path, blob): the promoter defers it to a human.
        deferred = await kernel.propose_rule(
            "refunds",
            title="Refunds",
            content="Refund only to the original payment method.",
            operator="bo",
            reason="from the incident review",
        )
        other = await kernel.propose_rule(
            "tone", title="Tone", content="Be brief.", operator="bo", reason="style"
        )
    assert payload_of(deferred, RuleDecided).decision == payload_of(other, RuleDecided).decision
    assert payload_of(deferred, RuleDecided).decision == "defer"
    [proposal, skipped] = (deferred.caused_by, other.caused_by)

    code, out, _ = await dirk("rules", "--db", db)
    assert code == 0
    assert f"deferred #{proposal}: refunds 'Refunds' by bo" in out
    assert f"deferred #{skipped}: tone 'Tone' by bo" in out

    decide = ("--operator", "ana", "--reason", "reviewed", "--wait", WAIT, "--db", db)
    async with live(db) as kernel:
        code, out, err = await dirk("rules", "--override", str(proposal), *decide)
        assert code == 0, err
        assert "applied: rule refunds override by ana, now v1" in out
        code, out, err = await dirk("rules", "--skip", str(skipped), *decide)
        assert code == 0 and "applied: rule tone skip by ana" in out, err
        # Decided: no longer pending, so a second decision is refused before it is queued.
        code, _, err = await dirk("rules", "--skip", str(proposal), *decide)
        assert code == 1 and err.startswith("error: RULE_NOT_PENDING:")

    async with live(db) as kernel:
        decided = await kernel.journal.read(types=["RuleDecided"])
        item = kernel.projections.memory.rulebook.items["refunds"]
    by_ana = [e.payload for e in decided if e.payload.actor == "ana"]
    assert [(d.rule, d.decision, d.inbox_id) for d in by_ana] == [
        ("refunds", "override", 1),
        ("tone", "skip", 2),
    ]
    assert item.current is not None and item.current.version == 1 and item.pinned
    code, out, _ = await dirk("why", "refunds", "--db", db)
    assert code == 0 and "override" in out and "ana" in out


async def test_dirk_rules_lists_one_namespace(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with kernel_for(db) as kernel:
        for ns, content in (("acme", "acme refunds need a receipt"), ("globex", "globex: a PIN")):
            await kernel.propose_rule(
                "refunds",
                title=f"Refunds of {ns}",
                content=content,
                operator="bo",
                reason="tenant",
                override=True,
                ns=ns,
            )
    code, acme, _ = await dirk("rules", "--db", db, "--ns", "acme")
    assert code == 0 and "Refunds of acme" in acme and "globex" not in acme
    code, default, _ = await dirk("rules", "--db", db)
    assert code == 0 and "no rules" in default
