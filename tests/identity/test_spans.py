"""Spans name whom their flow acts for: ``user.id`` (pseudonymised with a key), ``dirk.tenant``."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel import MEMORY_PACK, open_kernel
from kernel.config import KernelConfig, Ports, Supervision
from kernel.core.events import Principal
from kernel.telemetry import Telemetry
from kernel.telemetry._principal import PSEUDONYM_KEY_ENV, pseudonym, user_key_from_env
from kernel.testing import ManualClock, SeededIds
from tests.support.mcp_kernel import require_mcp

require_mcp()

from kernel.mcp import Embedded  # noqa: E402

ALICE = Principal(tenant="acme", user="alice", email="alice@acme.example", vouched_by="host")
KEY = b"a span key never shown"


async def spans_of(
    path: Path, key: bytes | None, principal: Principal | None
) -> list[dict[str, object]]:
    exporter = InMemorySpanExporter()
    config = KernelConfig(
        ports=Ports(clock=ManualClock(), ids=SeededIds(5)),
        supervision=Supervision(inbox_poll_s=None),
        telemetry=Telemetry(SimpleSpanProcessor(exporter), user_key=key),
        principal=principal,
    )
    async with open_kernel(
        path, packs=[MEMORY_PACK], adapters={}, allow=("ide",), config=config
    ) as kernel:
        answer = await Embedded(kernel).propose(
            "ide", {"kind": "memory.query", "topic": "x"}, "", 1.0
        )
        assert answer.verdict == "ACCEPTED"
    return [dict(s.attributes or {}) for s in exporter.get_finished_spans()]


async def test_every_span_carries_the_user_and_tenant_and_never_the_email(tmp_path: Path) -> None:
    spans = await spans_of(tmp_path / "j.db", None, ALICE)
    assert spans and all(s["user.id"] == "alice" and s["dirk.tenant"] == "acme" for s in spans)
    assert not any("alice@acme.example" in str(s) for s in spans)


async def test_a_key_pseudonymises_the_user_and_never_shows_itself(tmp_path: Path) -> None:
    spans = await spans_of(tmp_path / "j.db", KEY, ALICE)
    expected = pseudonym(KEY, "acme", "alice")
    assert len(expected) == 32 and expected != pseudonym(b"another key", "acme", "alice")
    assert all(s["user.id"] == expected and s["dirk.tenant"] == "acme" for s in spans)
    assert not any("alice" in str(s) or KEY.decode() in str(s) for s in spans)


def test_the_key_comes_from_the_environment() -> None:
    assert user_key_from_env({}) is None
    assert user_key_from_env({PSEUDONYM_KEY_ENV: "k"}) == b"k"
