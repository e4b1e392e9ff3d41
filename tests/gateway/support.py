"""Upstream MCP servers the gateway's tests start, and the gateway's configuration over them.

The upstream is tests/support/gateway_upstream.py, a real process: over stdio the
gateway starts it; over HTTP the test starts it on a free 127.0.0.1 port. It logs
every call it carries out, so a test counts the upstream's effects.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tests.support import SUPPORT
from tests.support.mcp_kernel import require_mcp

require_mcp()

from mcp import Client  # noqa: E402
from mcp_types import CallToolResult, RequestParamsMeta  # noqa: E402

from kernel import KernelConfig  # noqa: E402
from kernel.config import Supervision  # noqa: E402
from kernel.gateway import (  # noqa: E402
    CALL_META,
    CONVERSATION_META,
    Gateway,
    GatewayConfig,
    config_of,
    open_gateway,
)
from kernel.mcp import Identity, Principal  # noqa: E402
from tests.support.operators import suite_keys  # noqa: E402
from tests.support.principals import LOCAL  # noqa: E402

UPSTREAM = SUPPORT / "gateway_upstream.py"
AGENT = "ide"

TOOLS: dict[str, Any] = {
    "notes.add_note": {"impact": "LOW_IMPACT", "one_of": {"tag": ["misc", "work"]}},
    "notes.transfer": {
        "limit": {"amount_cents": "max_transfer"},
        "approve_above": {"amount_cents": 50_000},
        "min": {"amount_cents": 1},
    },
    "notes.fail": {"impact": "LOW_IMPACT"},
    "notes.garbage": {"impact": "LOW_IMPACT"},
    "notes.die": {"impact": "LOW_IMPACT"},
}
"""What the tests' pack says: ``delete_all`` and ``hang`` are tools it does not name."""
LIMITS = {"max_transfer": {"default": 100_000, "floor": 0, "ceiling": 1_000_000}}


@dataclass(frozen=True)
class Upstream:
    """Where an upstream logs its calls and writes its pid."""

    log: Path
    pid: Path

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """The calls the upstream carried out (of ``tool``), in order."""
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [line for line in lines if tool is None or line["tool"] == tool]

    def env(self) -> dict[str, str]:
        return {"UPSTREAM_LOG": str(self.log), "UPSTREAM_PID": str(self.pid)}


def upstream_in(tmp: Path, name: str = "up") -> Upstream:
    return Upstream(log=tmp / f"{name}.log", pid=tmp / f"{name}.pid")


def stdio_config(up: Upstream, **spec: Any) -> GatewayConfig:
    """The gateway over the upstream as a stdio command (the gateway starts it)."""
    upstream = {"command": [sys.executable, str(UPSTREAM)], "env": up.env(), **spec}
    return config_of({"upstreams": {"notes": upstream}, "tools": TOOLS, "limits": LIMITS})


def http_config(url: str, **spec: Any) -> GatewayConfig:
    """The gateway over the upstream at ``url`` (streamable HTTP)."""
    upstream = {"url": url, **spec}
    return config_of({"upstreams": {"notes": upstream}, "tools": TOOLS, "limits": LIMITS})


@contextmanager
def http_upstream(up: Upstream) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Start the upstream over HTTP on a free port; yield its URL and its process."""
    env = {**subprocess_env(), **up.env()}
    proc = subprocess.Popen(
        [sys.executable, str(UPSTREAM), "--http"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "port N" once the socket is bound
        assert line.startswith("port "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp", proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def subprocess_env() -> dict[str, str]:
    import os

    return dict(os.environ)


def kernel_config() -> KernelConfig:
    """The kernel trusts the suite's operators' keys and reads the inbox often."""
    return KernelConfig(
        principal=LOCAL,
        keyring=str(suite_keys().keyring),
        supervision=Supervision(inbox_poll_s=0.05),
    )


@asynccontextmanager
async def gateway(
    config: GatewayConfig, db: Path, who: Principal | None = None
) -> AsyncIterator[Gateway]:
    """The gateway on ``db``, its callers ``who`` (the agent by default)."""
    principal = who or Principal(role="agent", name=AGENT)
    async with open_gateway(
        config,
        db,
        identity=Identity(principal),
        agents=[AGENT],
        kernel_config=kernel_config(),
    ) as gw:
        yield gw


def body(result: CallToolResult) -> Mapping[str, Any]:
    """The structured answer of a call that was not executed (or the upstream's of one that was)."""
    found = result.structured_content
    assert isinstance(found, dict), result
    return found


def meta(conversation: str, call: str) -> RequestParamsMeta:
    """The ``_meta`` that names a call's conversation and id."""
    return cast(RequestParamsMeta, {CONVERSATION_META: conversation, CALL_META: call})


__all__ = [
    "AGENT",
    "Client",
    "Upstream",
    "body",
    "gateway",
    "http_config",
    "http_upstream",
    "meta",
    "stdio_config",
    "upstream_in",
]
