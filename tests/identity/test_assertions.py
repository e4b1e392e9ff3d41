"""A mesh host's signed principal assertion: it verifies for its own message only."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from kernel.core.events import Principal
from kernel.identity import AssertionSigner, AssertionVerifier, PrincipalInvalid

ALICE = Principal(tenant="acme", user="alice", email="a@acme.example", scopes=["rules:read"])
HOST_KEY = Ed25519PrivateKey.generate()
STRANGER = Ed25519PrivateKey.generate()


def _signed(msg_id: str = "m1", body: bytes = b"{}", **kw: object) -> str:
    return AssertionSigner("host-a", HOST_KEY, "journal-1", **kw).sign(ALICE, msg_id, body)  # type: ignore[arg-type]


def test_an_assertion_is_its_principal_vouched_by_the_host() -> None:
    got = AssertionVerifier("journal-1").verify(
        _signed(), "host-a", HOST_KEY.public_key(), "m1", b"{}"
    )
    assert (got.tenant, got.user, got.scopes) == ("acme", "alice", ["rules:read"])
    assert got.vouched_by == "bus:host-a"


@pytest.mark.parametrize(
    ("host", "key", "audience", "msg_id", "body", "why"),
    [
        ("host-a", STRANGER.public_key(), "journal-1", "m1", b"{}", "signature"),
        ("host-b", HOST_KEY.public_key(), "journal-1", "m1", b"{}", "trust"),
        ("host-a", HOST_KEY.public_key(), "journal-2", "m1", b"{}", "audience"),
        ("host-a", HOST_KEY.public_key(), "journal-1", "m2", b"{}", "another message"),
        ("host-a", HOST_KEY.public_key(), "journal-1", "m1", b"{1}", "another message"),
    ],
)
def test_an_assertion_off_its_message_or_host_is_refused(
    host: str, key: object, audience: str, msg_id: str, body: bytes, why: str
) -> None:
    with pytest.raises(PrincipalInvalid, match=why):
        AssertionVerifier(audience).verify(_signed(), host, key, msg_id, body)  # type: ignore[arg-type]


def test_an_old_assertion_is_refused() -> None:
    old = _signed(now=lambda: int(time.time()) - 3600)
    with pytest.raises(PrincipalInvalid, match="expired"):
        AssertionVerifier("journal-1").verify(old, "host-a", HOST_KEY.public_key(), "m1", b"{}")


@given(st.one_of(st.none(), st.integers(), st.text(), st.binary()))
def test_anything_else_is_refused(assertion: object) -> None:
    with pytest.raises(PrincipalInvalid):
        AssertionVerifier("journal-1").verify(
            assertion, "host-a", HOST_KEY.public_key(), "m1", b"{}"
        )
