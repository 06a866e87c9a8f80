"""Who is at the dashboard, behind Identity-Aware Proxy: IAP's signed header, verified.

IAP signs every request it lets through with ``X-Goog-IAP-JWT-Assertion``, an
ES256 JWT whose ``aud`` names the protected resource (on Cloud Run with IAP on
the service: ``/projects/NUMBER/locations/REGION/services/NAME``), whose ``iss``
is ``https://cloud.google.com/iap`` and whose ``email`` is the user. With
``--iap-audience`` the dashboard refuses any request (but ``/livez``) whose
assertion does not verify against IAP's public keys for that audience (401),
so nothing reaches it around IAP, and the action log names the verified user.
The keys are fetched once and kept for their ``max-age``
(:class:`~pubsub_worker.push.auth.CachedCertificates`); keys that cannot be
fetched answer 503, never a 401. Tests sign with their own keys: no network.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import google.auth.exceptions
from google.auth import crypt
from google.oauth2 import id_token

from pubsub_worker.push.auth import CachedCertificates, CertificatesUnavailable, Refused

__all__ = ["IAP_CERTS_URL", "IAP_ISSUER", "IAP_JWT_HEADER", "IapVerifier", "iap_keys_problem"]

IAP_JWT_HEADER = "x-goog-iap-jwt-assertion"
IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
"""IAP's public keys, PEM by key id."""
IAP_ISSUER = "https://cloud.google.com/iap"


def iap_keys_problem(data: bytes) -> str | None:
    """What is wrong with an answer of IAP's key URL, or None if it is its keys.

    IAP publishes a JSON object of key id -> PEM public key (ES256), not x509
    certificates: each must be readable by google-auth's ES256 verifier. Anything
    else is not remembered (:class:`~pubsub_worker.push.auth.CachedCertificates`).
    """
    try:
        keys = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(keys, dict) or not keys:
        return "not a JSON object of key id -> public key"
    for kid, key in keys.items():
        if not isinstance(key, str):
            return f"key id {str(kid)[:64]!r} is not a PEM public key"
        try:
            crypt.ES256Verifier.from_string(key)
        except Exception as exc:  # noqa: BLE001 - any failure to read it: not a key
            return f"key id {str(kid)[:64]!r}: {type(exc).__name__}"
    return None


class IapVerifier:
    """Judges a request's IAP assertion: the user's email, or :class:`Refused` (401)."""

    def __init__(
        self,
        audience: str,
        *,
        certificates: CachedCertificates | None = None,
        clock_skew_s: int = 30,
    ) -> None:
        self.audience = audience
        self._certs = certificates or CachedCertificates(problem=iap_keys_problem)
        self._skew = clock_skew_s

    def user(self, assertion: str | None) -> str:
        """The verified user's email; :class:`Refused` or :class:`CertificatesUnavailable`."""
        if not assertion:
            raise Refused(401, f"no {IAP_JWT_HEADER} header: the dashboard is served through IAP")
        try:
            claims: Mapping[str, Any] = id_token.verify_token(
                assertion,
                self._certs,
                audience=self.audience,
                certs_url=IAP_CERTS_URL,
                clock_skew_in_seconds=self._skew,
            )
        except google.auth.exceptions.TransportError as exc:
            raise CertificatesUnavailable(f"IAP's public keys: {str(exc)[:200]}") from exc
        except (ValueError, TypeError, google.auth.exceptions.GoogleAuthError) as exc:
            raise Refused(401, f"invalid IAP assertion: {str(exc)[:200]}") from None
        if claims.get("iss") != IAP_ISSUER:
            raise Refused(401, f"the assertion's issuer is not {IAP_ISSUER}")
        email = claims.get("email")
        if not isinstance(email, str) or not email:
            raise Refused(401, "the assertion names no user")
        return email
