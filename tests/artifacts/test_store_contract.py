"""One contract for every artifact store: a SQLite file, a directory, a PostgreSQL table.

Each test runs against all three (PostgreSQL on the run's throwaway server,
tests/support/postgres.py), as the journal's stores share tests/journal/test_store_contract.py:
the same bytes give the same reference, a put is idempotent, reads and deletes of what
is not held answer None and False, and bytes past the limit are refused.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.artifacts import (
    MAX_ARTIFACT_BYTES,
    ArtifactStoreError,
    ArtifactTooLarge,
    artifacts_beside,
    is_ref,
    open_artifacts,
    ref_of,
)
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

STORES = ["sqlite", "directory", "postgres"]


@pytest.fixture(params=STORES)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a fresh store goes: a file, a directory, or an empty PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "a.artifacts.db")
    if request.param == "directory":
        return f"dir:{tmp_path / 'artifacts'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.new_url()


async def test_put_is_content_addressed_and_idempotent(location: str) -> None:
    doc = b"Step-free entrance on Rua Augusta; lift to every floor.\n" * 50
    async with open_artifacts(location) as store:
        ref = await store.put(doc)
        assert ref == f"sha256:{hashlib.sha256(doc).hexdigest()}" == ref_of(doc)
        assert await store.put(doc) == ref  # the same bytes: the same reference, once
        assert await store.get(ref) == doc
        assert await store.size(ref) == len(doc)
        assert await store.refs() == [ref]
    async with open_artifacts(location, readonly=True) as again:
        assert await again.get(ref) == doc  # durable, and readable by another opener


async def test_what_is_not_held_is_never_found(location: str) -> None:
    absent = ref_of(b"never put")
    async with open_artifacts(location) as store:
        assert await store.get(absent) is None
        assert await store.size(absent) is None
        assert await store.delete(absent) is False
        # Not a reference at all: nothing is looked up, nothing is found.
        for bogus in ("", "sha256:", "sha256:../../etc/passwd", "md5:abc", "SHA256:" + "a" * 64):
            assert await store.get(bogus) is None
            assert await store.delete(bogus) is False
        assert await store.refs() == []


async def test_delete_removes_one_artifact(location: str) -> None:
    async with open_artifacts(location) as store:
        a, b = await store.put(b"a"), await store.put(b"b")
        assert await store.delete(a) is True
        assert await store.get(a) is None and await store.get(b) == b"b"
        assert await store.refs() == [b]
        assert await store.delete(a) is False


async def test_too_large_or_not_bytes_is_refused_and_nothing_is_kept(location: str) -> None:
    async with open_artifacts(location) as store:
        with pytest.raises(ArtifactTooLarge):
            await store.put(b"x" * (MAX_ARTIFACT_BYTES + 1))
        with pytest.raises(ArtifactTooLarge):
            await store.put("text, not bytes")  # type: ignore[arg-type]
        assert await store.refs() == []
        empty = await store.put(b"")  # an empty document is still a document
        assert await store.get(empty) == b""


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(docs=st.lists(st.binary(max_size=2048), min_size=1, max_size=5))
async def test_any_bytes_read_back_exactly(location: str, docs: list[bytes]) -> None:
    async with open_artifacts(location) as store:
        for doc in docs:
            ref = await store.put(doc)
            assert is_ref(ref) and await store.get(ref) == doc


async def test_a_store_that_is_not_there_is_an_error_when_read_only(tmp_path: Path) -> None:
    with pytest.raises(ArtifactStoreError):
        async with open_artifacts(tmp_path / "missing.db", readonly=True):
            pass
    with pytest.raises(ArtifactStoreError):
        async with open_artifacts(f"dir:{tmp_path / 'nowhere'}", readonly=True):
            pass


def test_the_default_store_sits_beside_its_journal() -> None:
    assert artifacts_beside("/x/booking.db") == "/x/booking.artifacts.db"
    assert artifacts_beside("/x/j") == "/x/j.artifacts.db"
    url = "postgresql://dirk@127.0.0.1:5432/j"
    assert artifacts_beside(url) == url
