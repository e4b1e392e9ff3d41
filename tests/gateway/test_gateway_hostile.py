"""Whatever a client sends the gateway, it answers with a reason code and the kernel runs on.

One gateway (its kernel and a real stdio upstream) serves every example: it runs in a
portal's event loop, and each example is a client connecting in process. What the
SDK's client cannot send (a lone surrogate: JSON carries none, and the client refuses
to encode one) is handed to the gateway where the SDK would hand it over, after
decoding (``GatewayServer.answer_call``), so the gateway meets it all the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.server.context import ServerRequestContext

from kernel.core.reasons import CliError, ReasonCode
from kernel.gateway import Gateway
from tests.gateway.support import Client, body, gateway, meta, stdio_config, upstream_in
from tests.support.hostile import hostile_text, hostile_values, is_utf8

CODES = {str(c) for c in ReasonCode} | {str(c) for c in CliError}
NAMES = ["notes_add_note", "notes_transfer", "notes_delete_all", "wait_flow", "notes_fail"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BlockingPortal, Gateway]]:
    """One gateway for the module, in a portal's event loop."""
    tmp: Path = tmp_path_factory.mktemp("hostile")
    config = stdio_config(upstream_in(tmp))
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(gateway(config, tmp / "j.db")) as gw:
            yield portal, gw


arguments = st.dictionaries(
    st.one_of(
        st.sampled_from(["text", "tag", "amount_cents", "to", "dfid", "why"]), hostile_text()
    ),
    hostile_values(max_leaves=6),
    max_size=4,
)
calls = st.tuples(
    st.one_of(st.sampled_from(NAMES), hostile_text(max_size=300)),
    arguments,
    st.one_of(st.none(), st.tuples(hostile_text(max_size=300), hostile_text(max_size=300))),
)


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(calls, min_size=1, max_size=3))
def test_hostile_calls_get_a_coded_answer_and_never_stop_the_kernel(
    served: tuple[BlockingPortal, Gateway],
    sequence: list[tuple[str, dict[str, Any], tuple[str, str] | None]],
) -> None:
    portal, gw = served

    async def scenario() -> list[Any]:
        answers = []
        async with Client(gw.server) as c:
            for n, (name, args, keys) in enumerate(sequence):
                given_meta = meta(*keys) if keys is not None else None
                if sendable((name, args, keys)):
                    answers.append(await c.call_tool(name, args, meta=given_meta))
                    continue
                ctx = ServerRequestContext(
                    session=c,  # type: ignore[arg-type]  # what names the connection here
                    lifespan_context=None,
                    protocol_version="2025-11-25",
                    method="tools/call",
                    request_id=f"direct-{n}",
                    meta=given_meta,
                )
                answers.append(await gw.server.answer_call(ctx, name, args))
        return answers

    for result in portal.call(scenario):
        if result.is_error:
            answer = body(result)
            assert answer["reason_code"] in CODES, answer
            assert answer["reason_code"] != "KERNEL_FAULT", answer
        else:
            assert result.meta is not None
            assert result.meta["dirk/verdict"] in ("EXECUTED", "ESCALATED", "PENDING")
    assert gw.kernel.stopped is None


def sendable(value: Any) -> bool:
    """Whether the SDK's client can send ``value``: every string in it is UTF-8."""
    if isinstance(value, str):
        return is_utf8(value)
    if isinstance(value, dict):
        return all(sendable(k) and sendable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(sendable(v) for v in value)
    return True


def test_after_hostile_calls_a_good_call_still_runs(served: tuple[BlockingPortal, Gateway]) -> None:
    portal, gw = served

    async def good() -> Any:
        async with Client(gw.server) as c:
            return await c.call_tool("notes_add_note", {"text": "still fine"})

    result = portal.call(good)
    assert not result.is_error, result
    assert gw.kernel.stopped is None
