"""Certificates made in the test (trustme): a CA, a server certificate for this machine.

``certificates`` writes a fresh CA and a certificate it signed for ``127.0.0.1`` and
``localhost`` (PEM files) and gives what clients need to trust it: an SSL context
that trusts only that CA (httpx, the MCP SDK's client), and the certificate's public
key pin for chromium (``--ignore-certificate-errors-spki-list``: Debian's chromium
reads its CAs from an NSS database that no tool here can write, so the browser is
told to accept exactly this key, and refuses any other certificate). trustme is in
the ``test`` extra; without it a test skips, or fails under ``CI=true``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Certificates:
    """A server's certificate and key, and how a client trusts them."""

    cert: Path
    key: Path
    ca: Path
    spki: str
    """The base64 SHA-256 of the certificate's SubjectPublicKeyInfo (chromium's pin)."""

    def client_context(self) -> ssl.SSLContext:
        """An SSL context that trusts this CA only (and checks host names)."""
        return ssl.create_default_context(cafile=str(self.ca))


def certificates(where: Path) -> Certificates:
    """Make a CA and a certificate for 127.0.0.1 and localhost in ``where``."""
    try:
        import trustme
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    except ImportError as exc:
        why = f"trustme is not installed ({exc}): pip install -e '.[test]'"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, root = where / "cert.pem", where / "key.pem", where / "ca.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(root))
    public = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    der = public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    spki = base64.b64encode(hashlib.sha256(der).digest()).decode()
    return Certificates(cert=cert, key=key, ca=root, spki=spki)
