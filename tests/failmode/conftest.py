"""A PostgreSQL server of this package's own, which its tests stop and start at will.

The suite's shared server (tests.support.postgres.postgres_server) is never stopped
under other tests: an outage here is of this server only. Outside CI a machine without
PostgreSQL skips these tests with the reason; under ``CI=true`` it fails them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.postgres import PostgresServer, server_or_missing


@pytest.fixture(scope="module")
def outage_server() -> Iterator[PostgresServer]:
    """A server for this module's outages, in a temporary directory, stopped at the end."""
    yield from server_or_missing()


@pytest.fixture
def pg(outage_server: PostgresServer) -> Iterator[PostgresServer]:
    """The module's server, running when the test starts (a test may leave it stopped)."""
    _running(outage_server)
    yield outage_server
    _running(outage_server)


def _running(server: PostgresServer) -> None:
    try:
        server.admin("SELECT 1")
    except Exception:
        server.start()
