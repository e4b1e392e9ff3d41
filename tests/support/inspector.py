"""The official MCP Inspector's CLI, run on node >= 22 (Debian ships 20).

Where they are: ``DIRK_MCP_INSPECTOR`` names the Inspector's ``mcp-inspector`` (from
``npm install @modelcontextprotocol/inspector``) and ``DIRK_NODE`` a node binary of 22.19
or later (npm's ``node@22`` package installs one into a prefix); .ci/run installs both
under ``.ci/node`` and sets them. Without them the tests that need the Inspector skip
with the reason, and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_DEFAULTS = (
    ROOT / ".ci" / "node" / "node_modules" / ".bin" / "node",
    ROOT / ".ci" / "node" / "node_modules" / ".bin" / "mcp-inspector",
)
MIN_NODE = (22, 19)
"""The oldest node the Inspector 2.x runs on (its package's ``engines``)."""


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


def inspector() -> tuple[list[str], dict[str, str]]:
    """Return the command that starts the Inspector's CLI, and the environment to run it in.

    Skips (outside CI) or fails (under CI) when node >= 22.19 or the Inspector is missing.
    """
    node = Path(os.environ.get("DIRK_NODE", _DEFAULTS[0]))
    cli = Path(os.environ.get("DIRK_MCP_INSPECTOR", _DEFAULTS[1]))
    how = "npm install --prefix .ci/node node@22 @modelcontextprotocol/inspector (see .ci/run)"
    if not node.exists() or not cli.exists():
        _missing(f"no node >= 22 and MCP Inspector: set DIRK_NODE and DIRK_MCP_INSPECTOR, or {how}")
    version = subprocess.run(
        [str(node), "--version"], capture_output=True, text=True, check=False, timeout=60
    ).stdout.strip()
    found = re.match(r"v(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) < MIN_NODE:
        _missing(f"{node} is node {version or '?'}: the Inspector needs >= 22.19 ({how})")
    env = dict(os.environ)
    # The Inspector starts more node processes by name: this node comes first on PATH.
    env["PATH"] = f"{node.parent}{os.pathsep}{env.get('PATH', '')}"
    # Nothing kept between runs, no keychain looked for, no browser opened.
    env["MCP_INSPECTOR_SECRET_STORE"] = "memory"
    env["BROWSER"] = "true"
    return [str(node), str(cli.resolve()), "--cli"], env
