"""IAP's signed header, verified with google-auth's real code against keys of our own (ES256).

:class:`IapKeys` signs assertions as IAP does and serves its public key at
IAP's key URL through a fake transport: no network. The dashboard refuses
every request but ``/livez`` without a valid assertion, and its action log
names the verified user.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import google.auth.transport
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.auth import crypt, jwt

from benchmarks.ui_support import serving
from pubsub_worker import Settings
from pubsub_worker.push.auth import CachedCertificates, CertificatesUnavailable, Refused
from pubsub_worker.push.auth import _Remembered as Response
from pubsub_worker.ui import Jobs, create_app
from pubsub_worker.ui.iap import (
    IAP_CERTS_URL,
    IAP_ISSUER,
    IAP_JWT_HEADER,
    IapVerifier,
    iap_keys_problem,
)

AUDIENCE = "/projects/123456789/locations/europe-west1/services/jobs-dashboard"


class IapKeys(google.auth.transport.Request):
    """An ES256 key with a key id; answers IAP's key URL with its public key."""

    def __init__(self, kid: str = "iap-key-1") -> None:
        self.kid = kid
        key = ec.generate_private_key(ec.SECP256R1())
        self.private_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self.public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.down = False

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> google.auth.transport.Response:
        if self.down:
            return Response(503, {}, b"unavailable")
        assert url == IAP_CERTS_URL, url
        keys = {self.kid: self.public_pem.decode()}
        return Response(200, {"Cache-Control": "max-age=3600"}, json.dumps(keys).encode())

    def sign(self, **claims: Any) -> str:
        now = int(time.time())
        payload = {
            "iss": IAP_ISSUER,
            "aud": AUDIENCE,
            "sub": "accounts.google.com:1234",
            "email": "alice@example.com",
            "iat": now,
            "exp": now + 600,
            **claims,
        }
        signer = crypt.ES256Signer.from_string(self.private_pem, key_id=self.kid)
        token: bytes = jwt.encode(signer, payload)  # type: ignore[no-untyped-call]
        return token.decode()


def verifier(keys: IapKeys) -> IapVerifier:
    return IapVerifier(AUDIENCE, certificates=CachedCertificates(keys, problem=iap_keys_problem))


def test_an_assertion_iap_signed_for_the_audience_names_its_user() -> None:
    keys = IapKeys()
    assert verifier(keys).user(keys.sign()) == "alice@example.com"


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"aud": "/projects/123456789/locations/europe-west1/services/other"}, "audience"),
        ({"iss": "https://accounts.google.com"}, "issuer"),
        ({"exp": int(time.time()) - 120, "iat": int(time.time()) - 900}, "xpired"),
        ({"email": ""}, "names no user"),
    ],
)
def test_an_assertion_not_for_this_dashboard_is_refused(claims: dict[str, Any], why: str) -> None:
    keys = IapKeys()
    with pytest.raises(Refused) as refused:
        verifier(keys).user(keys.sign(**claims))
    assert refused.value.status == 401
    assert why in refused.value.reason


def test_a_missing_or_forged_assertion_is_refused_and_keys_out_of_reach_are_no_401() -> None:
    keys, forger = IapKeys(), IapKeys()
    with pytest.raises(Refused, match="no x-goog-iap-jwt-assertion header"):
        verifier(keys).user(None)
    with pytest.raises(Refused, match="invalid IAP assertion"):
        verifier(keys).user(forger.sign())  # same key id, another key
    keys.down = True
    with pytest.raises(CertificatesUnavailable):
        verifier(keys).user(keys.sign())


class _Client:
    def collection(self, name: str) -> object:
        return object()


@pytest.fixture
def iap_dashboard() -> Iterator[tuple[str, IapKeys]]:
    keys = IapKeys()
    settings = Settings(subscription="orders", project="proj", collection="jobs")
    jobs = Jobs(settings, client=_Client())
    app = create_app(jobs, loopback=False, iap=verifier(keys))
    with serving(app) as url:
        yield url, keys
    jobs.close()


def test_behind_iap_only_signed_requests_are_answered(iap_dashboard: tuple[str, IapKeys]) -> None:
    url, keys = iap_dashboard
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/livez").text == "ok"  # the platform's probe carries no assertion
        unsigned = http.get("/static/ui.css")
        assert unsigned.status_code == 401
        assert "x-goog-iap-jwt-assertion" in unsigned.text
        assert unsigned.headers["x-frame-options"] == "DENY"
        forged = http.get("/static/ui.css", headers={IAP_JWT_HEADER: IapKeys().sign()})
        assert forged.status_code == 401
        signed = http.get("/static/ui.css", headers={IAP_JWT_HEADER: keys.sign()})
        assert signed.status_code == 200
        assert signed.text.startswith("/* pubsub-worker jobs dashboard")
