"""Checkpoints published where the writer cannot take them back: a directory, a real
PostgreSQL server, a real NATS JetStream key-value bucket; a place that is down never stops
the kernel."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import pytest

from kernel.core.notes import open_note, parse_checkpoint
from kernel.proofs.check import read_keys
from kernel.proofs.publish import open_publishers
from kernel.proofs.signing import Signing
from tests.support.nats import started_server
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401
from tests.support.proofs import KeyFiles, run_flows, signing_kernel


async def sign_into(tmp_path: Path, places: list[str]) -> tuple[KeyFiles, str, int]:
    key = KeyFiles(tmp_path / "k", "log")
    path = tmp_path / "j.db"
    signing = Signing(key_file=str(key.private), publish=tuple(places), origin="example.com/desk")
    async with signing_kernel(path, key, signing=signing) as kernel:
        await run_flows(kernel, [10])
        head = kernel.journal.head_seq
    # The closing checkpoint covers the KernelStopped too.
    return key, "example.com/desk", head + 1


async def check_latest(places: list[str], key: KeyFiles, origin: str, size: int) -> None:
    async with open_publishers(places) as publishers:
        for publisher in publishers:
            note = await publisher.latest(origin)
            assert note is not None, publisher.where
            text, _ = open_note(note, read_keys(key.public_text).for_log(origin))
            assert parse_checkpoint(text).size == size


async def test_a_directory(tmp_path: Path) -> None:
    place = str(tmp_path / "published")
    key, origin, size = await sign_into(tmp_path, [place])
    await check_latest([place], key, origin, size)
    assert any(p.name == f"checkpoint.{size}" for p in (tmp_path / "published").rglob("*"))


async def test_a_postgresql_table(tmp_path: Path, postgres_server: PostgresServer) -> None:  # noqa: F811
    place = postgres_server.new_url()
    key, origin, size = await sign_into(tmp_path, [place])
    await check_latest([place], key, origin, size)
    rows = postgres_server.admin("SELECT count(*) FROM dirk_checkpoints", place.rsplit("/", 1)[1])
    assert rows[0][0] >= 1


def publisher_only(secret: str) -> Callable[[int, Path], str]:
    """A server whose one user may keep the checkpoints bucket and nothing else."""

    def configure(port: int, store: Path) -> str:
        return f"""listen: 127.0.0.1:{port}
jetstream {{ store_dir: "{store / "js"}" }}
authorization {{
  users = [
    {{ user: checkpoints, password: "{secret}", permissions: {{
        publish: ["$JS.API.>", "$KV.dirk-checkpoints.>"], subscribe: ["_INBOX.>"] }} }}
  ]
}}
"""

    return configure


async def test_a_nats_key_value_bucket(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = secrets.token_hex(16)
    with started_server(publisher_only(secret)) as server:
        hostport = server.url.removeprefix("nats://")
        place = f"nats://checkpoints:{secret}@{hostport}/dirk-checkpoints"
        key, origin, size = await sign_into(tmp_path / "a", [place])
        await check_latest([place], key, origin, size)

        # A client with no credential publishes nothing, and the kernel runs on.
        anonymous = f"nats://{hostport}/dirk-checkpoints"
        await sign_into(tmp_path / "b", [anonymous])
        assert f"not published to {anonymous}" in caplog.text
        assert secret not in caplog.text
        await check_latest([place], key, origin, size)  # still the first kernel's


async def test_a_place_that_is_down_is_skipped_and_the_kernel_runs_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = "nats://127.0.0.1:9/nowhere"
    key, origin, size = await sign_into(tmp_path, [dead, str(tmp_path / "up")])
    await check_latest([str(tmp_path / "up")], key, origin, size)
    assert "not published to nats://127.0.0.1:9/nowhere" in caplog.text
