"""docs/embedding.md's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

DOC = ROOT / "docs" / "embedding.md"


async def test_the_example_runs_and_prints_what_the_page_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [example] = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    run = 'anyio.run(main, "trip.db")'
    assert example.rstrip().endswith(run)
    namespace: dict[str, Any] = {"__name__": "embedding_example"}
    exec(compile(example.rstrip().removesuffix(run), str(DOC), "exec"), namespace)
    await namespace["main"](str(tmp_path / "trip.db"))
    refused, executed = capsys.readouterr().out.splitlines()
    shown = DOC.read_text().split("It prints")[1].split("```\n")[1].splitlines()
    assert refused == shown[0]
    assert executed.startswith("EXECUTED (flow ") and '"hotel":"Miramar"' in executed
