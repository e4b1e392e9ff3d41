"""The MCP host configuration the README and docs/mcp.md show, launched as a host does.

The configuration is read from the documents themselves, its example paths pointed at a
journal and a key directory made here; the server is started over stdio with an
environment of the host's own (no ``DIRK_KEY``, no ``DIRK_KEYRING``), and a write through
it is ACCEPTED by the application's kernel running on the journal.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_kernel import require_mcp

require_mcp()

from mcp import Client, StdioServerParameters  # noqa: E402

from kernel import MEMORY_PACK, SystemClock, open_kernel  # noqa: E402
from kernel.config import KernelConfig, Ports, Supervision  # noqa: E402
from tests.support.browser import ROOT  # noqa: E402
from tests.support.operators import provision  # noqa: E402
from tests.support.principals import LOCAL  # noqa: E402


def configuration(document: Path, heading: str) -> dict[str, Any]:
    """The first JSON block under ``heading`` in ``document``: a host's ``mcpServers``."""
    text = document.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None, f"no JSON block under {heading!r} in {document}"
    servers: dict[str, Any] = json.loads(block.group(1))["mcpServers"]
    return dict(servers["dirk"])


def host_env() -> dict[str, str]:
    """What a host passes its servers: a PATH, a HOME, none of the shell's DIRK_ variables.

    PYTHONPATH points at this checkout only so that the code under test is what runs.
    """
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.parametrize(
    ("document", "heading"),
    [(ROOT / "README.md", "## Use it from an MCP host"), (ROOT / "docs/mcp.md", "## A host's")],
)
async def test_the_documented_host_configuration_writes(
    tmp_path: Path, document: Path, heading: str
) -> None:
    server = configuration(document, heading)
    command = shutil.which(server["command"])
    if command is None:
        pytest.fail(f"{server['command']!r} is not on PATH: install the package (pip install -e .)")
    keys = provision(tmp_path / "k", operators=(), doors=("mcp",), agents=("travel-agent",))
    db = tmp_path / "booking.db"
    args = [
        str(db) if a == "/srv/desk/booking.db" else str(keys.keys) if a == "/srv/desk/keys" else a
        for a in server["args"]
    ]
    config = KernelConfig(
        principal=LOCAL,
        keyring=str(keys.keyring),
        ports=Ports(clock=SystemClock()),
        supervision=Supervision(inbox_poll_s=0.05),
    )
    async with open_kernel(
        db, packs=[MEMORY_PACK], adapters={}, allow=("travel-agent",), config=config
    ) as kernel:
        params = StdioServerParameters(command=command, args=args, env=host_env())
        async with Client(params) as host:
            result = await host.call_tool("add_fact", {"name": "guest.diet", "value": "vegan"})
        assert result.structured_content is not None
        assert result.structured_content["verdict"] == "ACCEPTED", result.structured_content
        assert kernel.projections.memory.facts["guest.diet"].value == "vegan"
