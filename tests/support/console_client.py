"""A console client signed in as ``ana`` (import after ``console_extra()``: it needs the extra)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from starlette.testclient import TestClient

from kernel.console._app import Settings, create_app
from kernel.console._auth import Gate


def signed_in(db: Path, name: str = "ana") -> Iterator[TestClient]:
    """Yield a client of a console over ``db``, signed in with the run's token."""
    gate = Gate(None)
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        client.get("/login")
        nonce = client.cookies["dirk_console_login"]
        client.post("/login", data={"nonce": nonce, "name": name, "secret": gate.token})
        yield client
