"""The examples' OpenAI-compatible client, against a stand-in endpoint on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from examples import booking
from examples.llm import ModelError, OpenAIChat, conversation
from tests.support import ROOT, SUPPORT
from tests.test_examples import read_events_of, run_example, without_paths

ENDPOINT = SUPPORT / "openai_endpoint.py"


@contextmanager
def endpoint(seed: int) -> Iterator[tuple[str, list[dict[str, object]]]]:
    """Start the stand-in endpoint; yield its base URL and, after the block, its request log."""
    proc = subprocess.Popen(
        [sys.executable, str(ENDPOINT), str(seed)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    log: list[dict[str, object]] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().removeprefix("PORT "))
        yield f"http://127.0.0.1:{port}/v1", log
        out, _ = proc.communicate(timeout=30)  # closing stdin stops it
        log.extend(json.loads(line) for line in out.splitlines())
    finally:
        proc.kill()


def openai_env(base_url: str, key: str = "test-key", model: str = "travel-sim") -> dict[str, str]:
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key, "OPENAI_MODEL": model}


def test_the_travel_desk_runs_the_same_through_an_openai_compatible_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The endpoint answers as the scripted model would: the journal must come out the same."""
    scripted = run_example(booking, tmp_path / "scripted.db", "--seed", "1", capsys=capsys)
    db = tmp_path / "openai.db"
    with endpoint(seed=1) as (base_url, log):
        args = ["--seed", "1", "--llm", "openai", "--db", str(db), "--json"]
        run = subprocess.run(
            [sys.executable, "-m", "examples.booking", *args],
            cwd=ROOT,
            env={**os.environ, **openai_env(base_url)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 0, run.stderr
    over_http = json.loads(run.stdout.strip().splitlines()[-1])
    assert without_paths(over_http) == without_paths(scripted)
    assert log and all(r == {"model": "travel-sim", "status": 200} for r in log)
    # Every agent step went over HTTP: one request per context the desk reasoned on.
    contexts = [e for e in read_events_of(db) if e.type == "ContextCompiled"]
    assert len(log) == len(contexts)


@pytest.mark.parametrize(
    ("key", "model", "expected"),
    [("wrong", "travel-sim", "401"), ("test-key", "broken", "500")],
    ids=["unauthorised", "server-error"],
)
async def test_an_endpoint_that_refuses_is_a_model_error(
    key: str, model: str, expected: str
) -> None:
    with endpoint(seed=1) as (base_url, _):
        client = OpenAIChat(openai_env(base_url, key, model), timeout_s=30)
        task = {"task": "travel", "id": "x"}
        with pytest.raises(ModelError, match=expected):
            await client.complete(conversation("You are a travel agent.", task))


def test_a_missing_environment_names_what_is_missing() -> None:
    with pytest.raises(ModelError, match="OPENAI_MODEL"):
        OpenAIChat({"OPENAI_API_KEY": "k"})
