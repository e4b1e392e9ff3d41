"""The README's embedding example runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

README = ROOT / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


async def test_the_embedding_example_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [example] = python_blocks()
    assert example.rstrip().endswith("anyio.run(main)")
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(example.rstrip().removesuffix("anyio.run(main)"), "README.md", "exec"), namespace)
    await namespace["main"](str(tmp_path / "desk.db"))
    assert capsys.readouterr().out.startswith("CLOSED order-")


def test_the_readme_opens_with_the_two_commands() -> None:
    text = README.read_text()
    commands = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    # The first installs the core alone: what the main example needs, nothing of the suite's.
    assert "pip install -e . &&" in commands[0] and "python -m examples.trading" in commands[0]
    assert commands[1].strip() == "pip install -e '.[test]' && python -m pytest -n auto"
