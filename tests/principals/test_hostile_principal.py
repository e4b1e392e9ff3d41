"""A principal's text as an outsider's client sends it: refused on record, the kernel runs on."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.core.events import InputRefused, Principal
from kernel.core.flow import FlowStatus
from kernel.core.reasons import ReasonCode
from tests.principals.kit import ANN, call, people

pytestmark = pytest.mark.anyio

HOSTILE = st.sampled_from(["\ud800", "a\udcffb", "\x00", "\x1b[31mred", "\u202e", ""]) | st.text()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tenant=HOSTILE, user=HOSTILE, email=HOSTILE)
async def test_no_principal_text_stops_the_kernel_or_poisons_the_journal(
    tmp_path_factory: pytest.TempPathFactory, tenant: str, user: str, email: str
) -> None:
    path = tmp_path_factory.mktemp("hostile") / "j.db"
    async with people(path) as kernel:
        hostile = Principal(tenant=tenant, user=user, email=email)
        decision = await call(kernel, "people.look", hostile)
        unwritable = any(not _encodes(text) for text in (tenant, user, email))
        if unwritable or not tenant or not user:
            # Refused at the door, on record, with the principal's own code.
            assert decision.reason_code is ReasonCode.PRINCIPAL_INVALID, decision
            refused = await kernel.journal.read(types=["InputRefused"])
            last = refused[-1].payload if refused else None
            assert isinstance(last, InputRefused)
            assert last.reason_code is ReasonCode.PRINCIPAL_INVALID
        else:
            assert decision.verdict.name != "FAILED", decision
        # Whatever came of it, every event reads back and the kernel still judges.
        assert kernel.stopped is None
        await kernel.journal.read()
        after = await call(kernel, "people.look", ANN)
        assert after.verdict.name in {"REFUSED", "EXECUTED"}
    async with people(path) as kernel:  # the journal opens again: nothing unreadable in it
        assert kernel.stopped is None
        assert all(f.status in set(FlowStatus) for f in kernel.flows())


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
