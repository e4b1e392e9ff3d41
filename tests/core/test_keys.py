"""Ed25519 keys: sign with a context, verify with the public half, never raise on junk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.core import keys
from tests.support.hostile import hostile_text


def test_a_signature_verifies_for_its_context_and_bytes_only() -> None:
    key = keys.generate()
    public = keys.public_text(key)
    signature = keys.sign(key, "dirk/inbox", b"approve")
    assert keys.verify(public, "dirk/inbox", b"approve", signature)
    assert not keys.verify(public, "dirk/result", b"approve", signature)
    assert not keys.verify(public, "dirk/inbox", b"approvE", signature)
    other = keys.public_text(keys.generate())
    assert not keys.verify(other, "dirk/inbox", b"approve", signature)


@given(public=hostile_text(max_size=100), signature=hostile_text(max_size=100))
def test_junk_keys_and_signatures_do_not_verify_and_never_raise(
    public: str, signature: str
) -> None:
    assert not keys.verify(public, "dirk/inbox", b"x", signature)


def test_a_public_key_round_trips_and_has_a_stable_fingerprint() -> None:
    key = keys.generate()
    text = keys.public_text(key)
    assert keys.is_public_key(text)
    assert keys.public_text(keys.parse_public(text)) == text
    assert keys.fingerprint(text) == keys.fingerprint(text)
    assert len(keys.fingerprint(text)) == 16
    assert not keys.is_public_key("ed25519:AAAA")
    assert not keys.is_public_key(12)


def test_a_key_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "ana.key"
    key = keys.write_private_key(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert keys.public_text(keys.load_private_key(path)) == keys.public_text(key)
    with pytest.raises(keys.KeyUnusable, match="never overwritten"):
        keys.write_private_key(path)
    path.chmod(0o644)
    with pytest.raises(keys.KeyUnusable, match="readable by others"):
        keys.load_private_key(path)
    junk = tmp_path / "junk.key"
    junk.write_bytes(b"not a key")
    junk.chmod(0o600)
    with pytest.raises(keys.KeyUnusable, match="not a private key"):
        keys.load_private_key(junk)
    with pytest.raises(keys.KeyUnusable):
        keys.load_private_key(tmp_path / "missing.key")


@given(st.binary(max_size=64))
def test_any_bytes_sign_and_verify(data: bytes) -> None:
    key = keys.generate()
    assert keys.verify(keys.public_text(key), "c", data, keys.sign(key, "c", data))
