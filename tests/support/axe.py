"""axe-core, the accessibility engine, from the npm registry, for the console's browser tests.

``axe_script`` installs the package once per run into a temporary directory with
``npm`` (the registry is reachable here and in CI) and returns its ``axe.min.js``, which
a test injects into each page. Outside CI a missing npm (or registry) skips the test
with the reason; under ``CI=true`` it fails it.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support.browser import unavailable

AXE = "axe-core@4"


@functools.cache
def _installed() -> Path | str:
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed (Debian: apt-get install npm): axe-core comes from npm"
    root = Path(tempfile.mkdtemp(prefix="dirk-axe-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    done = subprocess.run(
        [npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", "--silent", AXE],
        capture_output=True,
        text=True,
        timeout=300,
    )
    script = root / "node_modules" / "axe-core" / "axe.min.js"
    if done.returncode != 0 or not script.is_file():
        return f"npm install {AXE} failed: {done.stderr.strip()[-300:]}"
    return script


def axe_script() -> Path:
    """The path of axe.min.js, or skip/fail the test."""
    found = _installed()
    if isinstance(found, str):
        unavailable(found)
        raise AssertionError  # unreachable: unavailable() raises
    return found


def violations(result: dict[str, Any]) -> list[str]:
    """axe's violations, one readable line each (rule, impact, the first nodes)."""
    lines = []
    for v in result.get("violations", []):
        nodes = "; ".join(" ".join(n.get("target", [])) for n in v.get("nodes", [])[:3])
        lines.append(f"{v['id']} ({v.get('impact')}): {v.get('help')} at {nodes}")
    return lines
