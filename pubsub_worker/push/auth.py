"""The OIDC token of a push request, verified with google-auth before anything else happens.

A push subscription created with ``--push-auth-service-account=SA`` sends
``Authorization: Bearer <JWT>``: an ID token Google signed for that service
account, with the audience the subscription names
(``--push-auth-token-audience``, by default the endpoint's URL).
:class:`TokenVerifier` accepts a request only when, as Pub/Sub's guide asks:

* the signature verifies against Google's certificates, the token is
  not expired nor issued in the future (``clock_skew_s`` of slack), and its
  issuer is ``accounts.google.com`` (:func:`google.oauth2.id_token.verify_oauth2_token`);
* ``aud`` is ``PUBSUB_WORKER_PUSH_AUDIENCE``;
* ``email`` is ``PUBSUB_WORKER_PUSH_SERVICE_ACCOUNT`` and ``email_verified``
  is true: any Google account can mint a token for any audience, so the
  audience alone proves nothing about who sent it.

A missing, malformed, forged, expired or wrong-audience token is
:class:`Refused` with 401; a valid token of another account with 403. The
endpoint answers both before it reads the body (:mod:`pubsub_worker.push.app`).
Certificates that cannot be had are :class:`CertificatesUnavailable` (503:
our side cannot judge the request now; Pub/Sub sends it again), never a 401:
the fetch failed, or the certificate URL answered anything but a JSON object
of key id -> PEM certificate that google-auth can read (an HTML page from a
proxy, an empty object). Such an answer is never remembered, so the next
request asks again; a 401 stays the sender's fault alone.

The certificates are fetched once and kept as long as Google's
``Cache-Control: max-age`` allows (:class:`CachedCertificates`, a
``google.auth.transport.Request`` that remembers valid answers); an unknown
key id fetches them again at most once a minute, so a rotation is picked up
and forged key ids cannot make the endpoint fetch on every request (if that
fetch fails, the certificates in hand are kept). Tests pass their own
transport and sign with their own keys: no network.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import google.auth.exceptions
import google.auth.transport
from google.auth import crypt
from google.oauth2 import id_token

from pubsub_worker._support.distribution import install_line
from pubsub_worker._variables import env_name
from pubsub_worker.errors import ConfigError
from pubsub_worker.settings import Settings

__all__ = [
    "GOOGLE_CERTS_URL",
    "CachedCertificates",
    "CertificatesUnavailable",
    "Refused",
    "TokenVerifier",
    "certificates_problem",
    "verifier_for",
]

_LOGGER = logging.getLogger("pubsub_worker")

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
"""Where Google publishes the certificates its ID tokens are signed with (x509, by key id)."""

_DEFAULT_MAX_AGE_S = 300.0
_LONGEST_MAX_AGE_S = 24 * 3600.0
_REFETCH_UNKNOWN_KEY_S = 60.0
_FETCH_TIMEOUT_S = 10.0
_MAX_AGE = re.compile(r"max-age=(\d+)")
_INSTALL = install_line("push")
_PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"


class Refused(Exception):
    """A request refused for its token: :attr:`status` (401 or 403) and :attr:`reason`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _UnknownKey(Refused):
    """Signed with a key id the certificates in hand do not have."""


class CertificatesUnavailable(Exception):
    """Google's certificates could not be fetched: the request cannot be judged now (503)."""


class _Remembered(google.auth.transport.Response):
    def __init__(self, status: int, headers: Mapping[str, str], data: bytes) -> None:
        self._status, self._headers, self._data = status, dict(headers), data

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    @property
    def data(self) -> bytes:
        return self._data


class _Answer(NamedTuple):
    at: float
    """When it was fetched, or last confirmed (a failed refresh keeps it)."""
    until: float
    """Its ``max-age`` runs out."""
    response: _Remembered
    refresh: bool
    """Fetch again before using it (an unknown key id)."""


class CachedCertificates(google.auth.transport.Request):
    """A transport for certificate URLs that remembers each valid answer for its ``max-age``.

    Only a 200 whose body :func:`certificates_problem` accepts is answered
    and remembered; anything else raises ``google.auth.exceptions.TransportError``
    (which the verifier turns into :class:`CertificatesUnavailable`) and is
    forgotten. Thread-safe. ``transport`` makes the real requests (default:
    google-auth's ``requests`` transport, from the ``push`` extra); ``clock``
    is ``time.monotonic``.
    """

    def __init__(
        self,
        transport: google.auth.transport.Request | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        problem: Callable[[bytes], str | None] | None = None,
    ) -> None:
        self._transport = transport
        self._clock = clock
        self._problem = problem or certificates_problem
        """What is wrong with an answer (None: keep it); IAP's keys are public keys."""
        self._lock = threading.Lock()  # guards _answers; held while fetching (one fetch at once)
        self._answers: dict[str, _Answer] = {}
        self.fetches = 0
        """Requests actually sent (for tests and the curious)."""

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> google.auth.transport.Response:
        """The remembered answer while fresh, else a new valid one; else ``TransportError``."""
        with self._lock:
            now = self._clock()
            found = self._answers.get(url)
            if found is not None and now < found.until and not found.refresh:
                return found.response
            try:
                response = self._fetch(url, method, timeout or _FETCH_TIMEOUT_S)
            except google.auth.exceptions.TransportError as exc:
                if found is None or now >= found.until:
                    self._answers.pop(url, None)
                    raise
                _LOGGER.warning("refreshing %s failed, the certificates in hand kept: %s", url, exc)
                self._answers[url] = found._replace(at=now, refresh=False)
                return found.response
            self._answers[url] = _Answer(now, now + _max_age_s(response.headers), response, False)
            return response

    def refetch_if_older(self, url: str, older_than_s: float) -> bool:
        """Fetch ``url`` again on its next use if its answer is older than ``older_than_s``;
        whether it will be. Should that fetch fail, the answer in hand is kept."""
        with self._lock:
            found = self._answers.get(url)
            if found is None or self._clock() - found.at < older_than_s:
                return False
            self._answers[url] = found._replace(refresh=True)
            return True

    def _fetch(self, url: str, method: str, timeout: float) -> _Remembered:
        response = self._inner()(url, method=method, timeout=timeout)
        self.fetches += 1
        if response.status != http.client.OK:
            raise google.auth.exceptions.TransportError(  # type: ignore[no-untyped-call]
                f"{url} answered {response.status}"
            )
        data = bytes(response.data)
        problem = self._problem(data)
        if problem is not None:
            raise google.auth.exceptions.TransportError(  # type: ignore[no-untyped-call]
                f"{url} answered 200 with no certificates: {problem}"
            )
        return _Remembered(response.status, response.headers, data)

    def _inner(self) -> google.auth.transport.Request:
        if self._transport is None:
            try:
                import google.auth.transport.requests as transport_requests  # noqa: PLC0415
            except ImportError as exc:
                raise ImportError(f"verifying push tokens needs requests: {_INSTALL}") from exc
            self._transport = transport_requests.Request()
        return self._transport


def certificates_problem(data: bytes) -> str | None:
    """What is wrong with a certificate URL's answer, or None if it is certificates.

    Google's answer is a JSON object of key id -> PEM x509 certificate
    (``-----BEGIN CERTIFICATE-----``), each readable by google-auth's RSA
    verifier (Google signs ID tokens RS256). Anything else would make every
    token fail to verify, so it is refused here, before it is remembered.
    """
    try:
        certs = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return f"not JSON: {_clip(data[:64])}"
    if not isinstance(certs, dict) or not certs:
        return "not a JSON object of key id -> certificate"
    if "keys" in certs:  # google-auth would read the whole answer as a JWK set
        return 'a JWK set ("keys"), not key id -> certificate'
    for kid, cert in certs.items():
        if not isinstance(cert, str) or _PEM_CERTIFICATE not in cert:
            return f"key id {_clip(kid, 64)!r} is not a PEM certificate"
        try:
            crypt.RSAVerifier.from_string(cert)  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - any failure to read it: not a certificate
            return f"key id {_clip(kid, 64)!r}: {type(exc).__name__}: {_clip(exc, 100)}"
    return None


def _max_age_s(headers: Mapping[str, str]) -> float:
    control = next((v for k, v in headers.items() if k.lower() == "cache-control"), "")
    found = _MAX_AGE.search(control)
    age = float(found.group(1)) if found else _DEFAULT_MAX_AGE_S
    return min(age, _LONGEST_MAX_AGE_S)


class TokenVerifier:
    """Judges a request's ``Authorization`` header (see the module docstring)."""

    def __init__(
        self,
        *,
        audience: str,
        service_account: str,
        certificates: CachedCertificates | None = None,
        certs_url: str = GOOGLE_CERTS_URL,
        clock_skew_s: int = 10,
    ) -> None:
        self.audience = audience
        self.service_account = service_account
        self._certs = certificates or CachedCertificates()
        self._certs_url = certs_url
        self._skew = clock_skew_s

    def verify(self, authorization: str | None) -> Mapping[str, Any]:
        """The token's claims; :class:`Refused` (401/403) or :class:`CertificatesUnavailable`."""
        token = _bearer(authorization)
        try:
            claims = self._decode(token)
        except _UnknownKey:
            if not self._certs.refetch_if_older(self._certs_url, _REFETCH_UNKNOWN_KEY_S):
                raise
            claims = self._decode(token)  # an unknown key id: perhaps a rotation
        email = claims.get("email")
        if email != self.service_account:
            raise Refused(
                403,
                f"the token is for {_clip(email)!s}, not the push subscription's service "
                f"account ({env_name('push_service_account')})",
            )
        if claims.get("email_verified") is not True:
            raise Refused(403, "the token's email is not verified")
        return claims

    def _decode(self, token: str) -> Mapping[str, Any]:
        try:
            claims: Mapping[str, Any] = id_token.verify_oauth2_token(  # type: ignore[no-untyped-call]
                token, self._certs, audience=self.audience, clock_skew_in_seconds=self._skew
            )
            return claims
        except google.auth.exceptions.TransportError as exc:
            raise CertificatesUnavailable(f"Google's certificates: {_clip(exc)}") from exc
        except (ValueError, TypeError, KeyError, google.auth.exceptions.GoogleAuthError) as exc:
            # The certificates were checked before they were kept: what fails now is the
            # token (TypeError, KeyError: a signed token with a claim missing or of the
            # wrong type, such as no "iss" or a text "iat").
            if "Certificate for key id" in str(exc):
                raise _UnknownKey(401, f"invalid token: {_clip(exc)}") from None
            raise Refused(401, f"invalid token: {_describe(exc)}") from None


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Refused(
            401,
            "no Authorization header: the push subscription must send an OIDC token "
            "(gcloud pubsub subscriptions update ... --push-auth-service-account=SA)",
        )
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "the Authorization header is not 'Bearer <token>'")
    return token.strip()


def _describe(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"the claim {_clip(exc.args[0] if exc.args else exc, 64)!s} is missing"
    return _clip(exc)


def _clip(value: object, limit: int = 200) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def verifier_for(
    settings: Settings, certificates: CachedCertificates | None = None
) -> TokenVerifier | None:
    """The verifier the settings ask for; None (with a warning) when verification is off.

    ``ConfigError`` when verification is on and the audience or the service
    account is not set: a push endpoint must not accept tokens it cannot judge.
    Off (``PUSH_VERIFY_TOKEN=false``) is accepted against the emulators only
    (both ``PUBSUB_EMULATOR_HOST`` and ``FIRESTORE_EMULATOR_HOST`` set), or with
    ``PUSH_ALLOW_UNVERIFIED=true`` where something else authenticates every
    request; anywhere else it is a ``ConfigError`` naming both variables.
    """
    verify, allow = env_name("push_verify_token"), env_name("push_allow_unverified")
    if not settings.push_verify_token:
        if settings.push_allow_unverified:
            _LOGGER.warning(
                "%s=false, %s=true: push requests are accepted without a token; only behind "
                "something else that authenticates every request (Cloud Run's IAM invoker check)",
                verify,
                allow,
            )
        elif settings.emulated:
            _LOGGER.warning(
                "%s=false: push requests are accepted without a token (the emulators send none)",
                verify,
            )
        else:
            raise ConfigError(
                f"{verify}=false is accepted only against the emulators (PUBSUB_EMULATOR_HOST "
                f"and FIRESTORE_EMULATOR_HOST both set to HOST:PORT), or with {allow}=true "
                "where something else authenticates every request (Cloud Run's IAM invoker "
                "check); otherwise anyone who can reach the endpoint can submit jobs. Verify "
                f"the token instead: unset {verify}, set {env_name('push_audience')} and "
                f"{env_name('push_service_account')}"
            )
        return None
    missing = [
        env_name(field)
        for field in ("push_audience", "push_service_account")
        if getattr(settings, field) is None
    ]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} must be set to verify push requests' OIDC tokens "
            f"(the subscription's --push-auth-token-audience and --push-auth-service-account), "
            f"or set {verify}=false where Pub/Sub sends no token (the emulators)"
        )
    assert settings.push_audience is not None
    assert settings.push_service_account is not None
    return TokenVerifier(
        audience=settings.push_audience,
        service_account=settings.push_service_account,
        certificates=certificates,
    )
