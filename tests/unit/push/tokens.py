"""Test keys for push tokens: an RSA key, its certificate, and ID tokens signed with it.

:class:`TestKeys` signs tokens as Google would (RS256, a ``kid`` header) and
serves its certificate through a fake ``google.auth.transport.Request``, so
the endpoint's verifier runs on google-auth's real code with no network.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Mapping
from typing import Any

import google.auth.transport
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

from pubsub_worker.push.auth import GOOGLE_CERTS_URL, CachedCertificates, TokenVerifier
from pubsub_worker.push.auth import _Remembered as Response  # the transport answer it caches

AUDIENCE = "https://orders-push-abc123-ew.a.run.app/"
SERVICE_ACCOUNT = "push-invoker@orders-demo.iam.gserviceaccount.com"


class CertServer(google.auth.transport.Request):
    """Answers Google's certificate URL with the certificates given; counts requests.

    ``down``: answer 503 instead; ``answer``: a 200 with this body instead (what a
    proxy or a captive portal might send).
    """

    def __init__(self, certs: dict[str, str], max_age_s: int = 3600) -> None:
        self.certs = certs
        self.max_age_s = max_age_s
        self.requests = 0
        self.down = False
        self.answer: bytes | None = None

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> google.auth.transport.Response:
        self.requests += 1
        if self.down:
            return Response(503, {}, b"unavailable")
        assert url == GOOGLE_CERTS_URL, url
        control = {"Cache-Control": f"public, max-age={self.max_age_s}, must-revalidate"}
        if self.answer is not None:
            return Response(200, control, self.answer)
        return Response(200, control, json.dumps(self.certs).encode())


class TestKeys:
    """A signing key with a key id, and its self-signed certificate."""

    __test__ = False  # not a test class

    def __init__(self, kid: str = "test-key-1") -> None:
        self.kid = kid
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256())
        )
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()

    def certs(self) -> dict[str, str]:
        return {self.kid: self.cert_pem}

    def token(self, *, kid: str | None = None, **overrides: object) -> str:
        """An ID token as Pub/Sub sends it; ``overrides`` replace claims (None removes one)."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "aud": AUDIENCE,
            "azp": "113774264463038321964",
            "email": SERVICE_ACCOUNT,
            "email_verified": True,
            "exp": now + 3600,
            "iat": now,
            "iss": "https://accounts.google.com",
            "sub": "113774264463038321964",
        }
        for name, value in overrides.items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        signer = crypt.RSASigner.from_string(  # type: ignore[no-untyped-call]
            self.private_pem, key_id=kid or self.kid
        )
        token: bytes = jwt.encode(signer, claims)  # type: ignore[no-untyped-call]
        return token.decode()


def verifier(*keys: TestKeys, server: CertServer | None = None) -> tuple[TokenVerifier, CertServer]:
    """A verifier for :data:`AUDIENCE` and :data:`SERVICE_ACCOUNT` trusting ``keys``."""
    certs: dict[str, str] = {}
    for key in keys:
        certs.update(key.certs())
    server = server or CertServer(certs)
    found = TokenVerifier(
        audience=AUDIENCE,
        service_account=SERVICE_ACCOUNT,
        certificates=CachedCertificates(server),
    )
    return found, server
