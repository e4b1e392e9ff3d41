"""User tokens at a door: a good one is its principal; every hostile one is PRINCIPAL_INVALID."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from joserfc.jwk import OKPKey

from kernel.core.reasons import ReasonCode
from kernel.identity import KeyFileError, PrincipalInvalid, TokenVerifier, read_keys
from tests.identity.tokens import Provider


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Provider:
    return Provider(tmp_path_factory.mktemp("idp"))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_token_is_the_principal_it_names(idp: Provider) -> None:
    principal = idp.verifier().verify(idp.token("alice", "acme"))
    assert (principal.tenant, principal.user) == ("acme", "alice")
    assert principal.email == "alice@acme.example"
    assert principal.roles == ["staff"]
    assert principal.scopes == ["rules:read", "memory:write"]
    assert principal.vouched_by == "token:ed"


def test_an_rsa_token_verifies_with_its_own_key(idp: Provider) -> None:
    principal = idp.verifier().verify(idp.token(key=idp.rsa, alg="RS256"))
    assert principal.vouched_by == "token:rsa"


def test_no_scope_claim_is_no_claimed_scope(idp: Provider) -> None:
    assert idp.verifier().verify(idp.token(scope=None)).scopes is None


def test_a_tenant_claim_of_another_name(idp: Provider) -> None:
    token = idp.token(tenant=None, org="globex")
    assert idp.verifier(tenant_claim="org").verify(token).tenant == "globex"


def _refusal(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(PrincipalInvalid) as caught:
        verifier.verify(token)
    assert caught.value.reason_code is ReasonCode.PRINCIPAL_INVALID
    return caught.value.detail


def test_expired(idp: Provider) -> None:
    now = int(time.time())
    assert "expired" in _refusal(idp.verifier(), idp.token(exp=now - 3600, iat=now - 7200))


def test_wrong_audience_and_issuer(idp: Provider) -> None:
    assert "audience" in _refusal(idp.verifier(), idp.token(aud="another"))
    assert "issuer" in _refusal(idp.verifier(), idp.token(iss="https://evil.example"))


def test_missing_claims(idp: Provider) -> None:
    verifier = idp.verifier()
    assert "exp" in _refusal(verifier, idp.token(exp=None))
    assert "sub" in _refusal(verifier, idp.token(sub=None))
    assert "tenant" in _refusal(verifier, idp.token(tenant=None))


def test_unknown_key(idp: Provider) -> None:
    stranger = OKPKey.import_key(Ed25519PrivateKey.generate(), parameters={"kid": "stranger"})
    assert "does not trust" in _refusal(idp.verifier(), idp.token(key=stranger))
    # A stranger's key under a trusted kid: the signature is what fails.
    impostor = OKPKey.import_key(Ed25519PrivateKey.generate(), parameters={"kid": "ed"})
    assert "signature" in _refusal(idp.verifier(), idp.token(key=impostor))


def test_alg_none(idp: Provider) -> None:
    header = _b64(json.dumps({"alg": "none", "kid": "ed"}).encode())
    now = int(time.time())
    claims = {"iss": "https://id.example", "aud": "dirk", "sub": "root", "tenant": "acme"}
    body = _b64(json.dumps({**claims, "exp": now + 60}).encode())
    assert "not signed" in _refusal(idp.verifier(), f"{header}.{body}.")


def test_hmac_with_the_public_key_as_secret(idp: Provider) -> None:
    """The classic confusion: HS256 keyed with the RSA public key's bytes."""
    import hashlib
    import hmac

    header = _b64(json.dumps({"alg": "HS256", "kid": "rsa"}).encode())
    body = _b64(json.dumps({"sub": "root", "tenant": "acme"}).encode())
    secret = json.dumps(idp.rsa.as_dict(private=False)).encode()
    mac = hmac.new(secret, f"{header}.{body}".encode(), hashlib.sha256).digest()
    _refusal(idp.verifier(), f"{header}.{body}.{_b64(mac)}")


def test_tampered_claims(idp: Provider) -> None:
    head, body, sig = idp.token("alice", "acme").split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["tenant"] = "globex"
    forged = f"{head}.{_b64(json.dumps(claims).encode())}.{sig}"
    assert "signature" in _refusal(idp.verifier(), forged)


def test_the_door_refuses_hmac_configuration(idp: Provider) -> None:
    with pytest.raises(ValueError, match="asymmetric"):
        idp.verifier(algorithms=["HS256"])


def test_key_files(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "corp.pem"
    pem.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    assert [k.kid for k in read_keys([pem]).keys] == ["corp"]
    private = tmp_path / "private.json"
    jwk = OKPKey.import_key(key, parameters={"kid": "p"})
    private.write_text(json.dumps(jwk.as_dict(private=True)))
    with pytest.raises(KeyFileError, match="private"):
        read_keys([private])
    secret = tmp_path / "oct.json"
    secret.write_text(json.dumps({"kty": "oct", "k": "c2VjcmV0", "kid": "s"}))
    with pytest.raises(KeyFileError, match="symmetric"):
        read_keys([secret])
    with pytest.raises(KeyFileError, match="cannot read"):
        read_keys([tmp_path / "absent.pem"])


_PARTS = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=.")
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(token=st.one_of(st.text(), _PARTS, st.text(st.characters(codec=None)), st.binary()))
def test_any_string_is_refused_with_a_reason(idp: Provider, token: object) -> None:
    """Whatever a caller sends, it is PRINCIPAL_INVALID: never a traceback."""
    with pytest.raises(PrincipalInvalid):
        idp.verifier().verify(token)  # type: ignore[arg-type]


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.text(), _JSONISH, max_size=4), claims=_JSONISH)
def test_hostile_headers_and_claims_unsigned(
    idp: Provider, header: dict[str, object], claims: object
) -> None:
    """Any header and claims, signed with garbage: refused with a reason."""
    head = _b64(json.dumps({"kid": "ed", "alg": "EdDSA", **header}).encode())
    body = _b64(json.dumps(claims).encode())
    with pytest.raises(PrincipalInvalid):
        idp.verifier().verify(f"{head}.{body}.{_b64(b'x' * 64)}")


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    claims=st.dictionaries(
        st.sampled_from(["sub", "tenant", "email", "roles", "scope", "exp", "aud", "iss", "nbf"]),
        _JSONISH,
    )
)
def test_signed_hostile_claims_never_escape(idp: Provider, claims: dict[str, Any]) -> None:
    """Validly signed but hostile claims: a principal with checked names, or PRINCIPAL_INVALID."""
    try:
        token = idp.token(**claims)
    except (TypeError, ValueError):
        return  # not encodable as a JWT at all: nothing to send
    try:
        principal = idp.verifier().verify(token)
    except PrincipalInvalid:
        return
    assert principal.user and principal.tenant
    assert all(isinstance(s, str) for s in principal.scopes or [])
