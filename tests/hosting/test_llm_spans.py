"""The examples' OpenAI mode, traced: every LLM call is a GenAI client span whose parent is
the reasoning span of the flow it reasons for, in the flow's own trace. Real processes: the
example, the stand-in OpenAI endpoint and an OTLP receiver, all on 127.0.0.1."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernel.audit import open_journal
from kernel.core.events import ContextCompiled
from kernel.telemetry import span_id_for, trace_id_for
from tests.hosting.test_llm import endpoint, openai_env
from tests.support import ROOT
from tests.support.otlp import otlp_receiver


async def test_each_llm_call_of_the_openai_mode_nests_under_its_reasoning_span(
    tmp_path: Path,
) -> None:
    db = tmp_path / "traced.db"
    with anyio.fail_after(120):
        async with otlp_receiver() as received:
            with endpoint(seed=1) as (base_url, log):
                env = {
                    **os.environ,
                    **openai_env(base_url),
                    "OTEL_EXPORTER_OTLP_ENDPOINT": received.endpoint,
                    "OTEL_BSP_SCHEDULE_DELAY": "20",
                    "OTEL_METRICS_EXPORTER": "none",
                }
                example = ["-m", "examples.booking", "--seed", "1", "--llm", "openai"]
                run = await anyio.run_process(
                    [sys.executable, *example, "--db", str(db)],
                    cwd=ROOT,
                    env=env,
                    check=False,
                )
                assert run.returncode == 0, run.stderr.decode()
            async with open_journal(db, readonly=True) as journal:
                contexts = [
                    e for e in await journal.read() if isinstance(e.payload, ContextCompiled)
                ]

            # One call per context the agent reasoned on, each under that attempt's
            # reasoning span.
            expected = sorted(
                (
                    f"{trace_id_for(e.dfid or ''):032x}",
                    f"{span_id_for(e.dfid or '', 'reason', n):016x}",
                )
                for e in contexts
                if isinstance(e.payload, ContextCompiled) and (n := e.payload.attempt)
            )

            def calls() -> list[dict[str, Any]]:
                return [s for s in received.spans() if s["name"] == "chat travel-sim"]

            def ids() -> set[tuple[str, str]]:
                return {(s["trace_id"], s["span_id"]) for s in received.spans()}

            # The example exited, so its provider was flushed: everything is on its way.
            await received.until(lambda _: len(calls()) >= len(log) and set(expected) <= ids())
    assert len(log) == len(contexts) == len(calls()) > 0
    assert sorted((c["trace_id"], c["parent_span_id"]) for c in calls()) == expected
    for call in calls():
        attrs = call["attributes"]
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai"
        assert attrs["gen_ai.request.model"] == "travel-sim"
        assert attrs["server.address"] == "127.0.0.1"


def test_without_an_endpoint_the_openai_mode_installs_no_tracing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from examples.llm import host_tracing

    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    assert host_tracing({}) is False
