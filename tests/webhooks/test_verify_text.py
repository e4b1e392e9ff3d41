"""``kernel.webhooks.verify`` takes the secret as the configuration writes it: text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kernel.webhooks import verify
from kernel.webhooks._deliver import signature

T = 1_710_500_000


@given(st.text(min_size=1, max_size=64), st.binary(max_size=256))
def test_a_text_secret_verifies_as_its_utf8_bytes(secret: str, body: bytes) -> None:
    header = signature(secret.encode(), body, T)
    assert verify(secret, body, header, now_s=T)
    assert signature(secret, body, T) == header
    assert not verify(secret + "x", body, header, now_s=T)


def test_the_configured_secret_of_the_docs_verifies() -> None:
    header = signature("whsec-from-dirk-toml", b"{}", T)
    assert verify("whsec-from-dirk-toml", b"{}", header, now_s=T)
    assert verify(b"whsec-from-dirk-toml", b"{}", header, now_s=T)
