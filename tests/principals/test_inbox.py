"""A tenant declared and its policy changed by signed inbox rows (``dirk tenant``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from kernel.core.events import Event, TenantDeclared, TenantPolicyChanged
from kernel.core.reasons import ReasonCode
from tests.cli.test_cli import dirk
from tests.principals.kit import ACME, ANN, BOB, call, people
from tests.support.operators import Keys

R = ReasonCode


async def _opened(db: Path) -> None:
    async with people(db):
        pass


def test_dirk_tenant_declares_and_sets_a_layer(tmp_path: Path, operator_keys: Keys) -> None:
    db, spec = tmp_path / "j.db", tmp_path / "acme.json"
    anyio.run(_opened, db)
    spec.write_bytes(msgspec.json.encode(ACME))
    who = ("--operator", "ana", "--reason", "onboarding", "--db", db)
    declared = dirk("tenant", "declare", "--file", spec, *who)
    assert declared.returncode == 0, declared.stderr
    changed = dirk("tenant", "policy", "acme", "--user", "bob", "--permission", "deny", *who)
    assert changed.returncode == 0, changed.stderr
    bad = dirk("tenant", "policy", "acme", "--rate", "-1", *who)
    assert bad.returncode == 2 and "rate_per_minute" in bad.stderr
    anyio.run(_applied, db)


async def _applied(db: Path) -> None:
    seen = anyio.Event()
    taken: list[Event] = []

    def committed(events: Sequence[Event]) -> None:
        taken.extend(e for e in events if isinstance(e.payload, TenantPolicyChanged))
        if taken:
            seen.set()

    async with people(db, inbox_poll_s=0.05) as kernel:
        kernel.journal.add_listener(committed)
        with anyio.fail_after(30):
            await seen.wait()
        [declared] = await kernel.journal.read(types=["TenantDeclared"])
        assert isinstance(declared.payload, TenantDeclared)
        assert declared.payload.operator == "ana" and declared.payload.inbox_id is not None
        assert (await call(kernel, "people.pay", ANN)).reason_code is None
        assert (await call(kernel, "people.look", BOB)).reason_code is R.POLICY_DENIED
