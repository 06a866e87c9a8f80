"""The push token check: google-auth's verification on test keys, certificates cached."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from google.auth import crypt
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_worker.errors import ConfigError
from pubsub_worker.push.auth import (
    CachedCertificates,
    CertificatesUnavailable,
    Refused,
    TokenVerifier,
    certificates_problem,
    verifier_for,
)
from pubsub_worker.settings import Settings

from .tokens import AUDIENCE, SERVICE_ACCOUNT, CertServer, TestKeys, verifier

KEYS = TestKeys()


def refused(check: TokenVerifier, header: str | None) -> Refused:
    with pytest.raises(Refused) as caught:
        check.verify(header)
    return caught.value


def test_a_token_pubsub_signed_for_the_audience_and_account_is_accepted() -> None:
    check, _ = verifier(KEYS)
    claims = check.verify("Bearer " + KEYS.token())
    assert claims["email"] == SERVICE_ACCOUNT
    assert claims["aud"] == AUDIENCE


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (None, "no Authorization header"),
        ("", "no Authorization header"),
        ("Basic dXNlcjpwYXNz", "not 'Bearer <token>'"),
        ("Bearer", "not 'Bearer <token>'"),
        ("Bearer not.a.jwt", "invalid token"),
        ("Bearer garbage", "invalid token"),
    ],
)
def test_a_missing_or_malformed_header_is_401(header: str | None, why: str) -> None:
    check, _ = verifier(KEYS)
    found = refused(check, header)
    assert found.status == 401
    assert why in found.reason


def test_a_forged_token_is_401() -> None:
    forger = TestKeys(kid=KEYS.kid)  # the right key id, another private key
    check, _ = verifier(KEYS)
    found = refused(check, "Bearer " + forger.token())
    assert (found.status, found.reason) == (401, "invalid token: Could not verify token signature.")


def test_an_expired_token_is_401() -> None:
    check, _ = verifier(KEYS)
    old = int(time.time()) - 7200
    found = refused(check, "Bearer " + KEYS.token(iat=old, exp=old + 3600))
    assert found.status == 401
    assert "Token expired" in found.reason


def test_a_token_from_the_future_is_401() -> None:
    check, _ = verifier(KEYS)
    later = int(time.time()) + 600
    found = refused(check, "Bearer " + KEYS.token(iat=later, exp=later + 3600))
    assert found.status == 401
    assert "used too early" in found.reason


def test_a_wrong_audience_is_401() -> None:
    check, _ = verifier(KEYS)
    found = refused(check, "Bearer " + KEYS.token(aud="https://elsewhere.example/"))
    assert found.status == 401
    assert "wrong audience" in found.reason


def test_a_wrong_issuer_is_401() -> None:
    check, _ = verifier(KEYS)
    found = refused(check, "Bearer " + KEYS.token(iss="https://evil.example"))
    assert found.status == 401
    assert "issuer" in found.reason


def test_an_unsigned_token_is_401() -> None:
    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {"aud": AUDIENCE, "email": SERVICE_ACCOUNT, "email_verified": True}
    unsigned = f"{part({'alg': 'none', 'kid': KEYS.kid})}.{part(claims)}."
    check, _ = verifier(KEYS)
    assert refused(check, "Bearer " + unsigned).status == 401


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"email": "someone@example.com"}, "not the push subscription's service account"),
        ({"email": None}, "not the push subscription's service account"),
        ({"email_verified": False}, "not verified"),
        ({"email_verified": None}, "not verified"),
    ],
)
def test_a_valid_token_of_another_account_is_403(claims: dict[str, Any], why: str) -> None:
    check, _ = verifier(KEYS)
    found = refused(check, "Bearer " + KEYS.token(**claims))
    assert found.status == 403
    assert why in found.reason


def test_certificates_are_fetched_once_while_fresh() -> None:
    check, server = verifier(KEYS)
    for _ in range(5):
        check.verify("Bearer " + KEYS.token())
    assert server.requests == 1


def on_clock(server: CertServer, now: list[float]) -> TokenVerifier:
    """A verifier trusting what ``server`` answers, on the clock ``now[0]`` (seconds)."""
    return TokenVerifier(
        audience=AUDIENCE,
        service_account=SERVICE_ACCOUNT,
        certificates=CachedCertificates(server, clock=lambda: now[0]),
    )


def test_certificates_are_fetched_again_after_their_max_age() -> None:
    now = [1000.0]
    server = CertServer(KEYS.certs(), max_age_s=60)
    check = on_clock(server, now)
    check.verify("Bearer " + KEYS.token())
    now[0] += 59
    check.verify("Bearer " + KEYS.token())
    assert server.requests == 1
    now[0] += 2
    check.verify("Bearer " + KEYS.token())
    assert server.requests == 2


def test_a_rotated_key_is_picked_up_and_unknown_key_ids_fetch_at_most_once_a_minute() -> None:
    now = [1000.0]
    rotated = TestKeys(kid="test-key-2")
    server = CertServer(KEYS.certs())
    check = on_clock(server, now)
    check.verify("Bearer " + KEYS.token())
    server.certs = {**KEYS.certs(), **rotated.certs()}  # Google rotates
    found = refused(check, "Bearer " + rotated.token())  # within the minute: not fetched
    assert "not found" in found.reason
    assert server.requests == 1
    now[0] += 61
    assert check.verify("Bearer " + rotated.token())["email"] == SERVICE_ACCOUNT
    assert server.requests == 2
    for _ in range(3):  # a forged key id right after: no fetch storm
        refused(check, "Bearer " + KEYS.token(kid="made-up"))
    assert server.requests == 2


def test_certificates_that_cannot_be_fetched_are_not_a_401() -> None:
    server = CertServer(KEYS.certs())
    server.down = True
    check, _ = verifier(KEYS, server=server)
    with pytest.raises(CertificatesUnavailable):
        check.verify("Bearer " + KEYS.token())
    server.down = False
    assert check.verify("Bearer " + KEYS.token())["email"] == SERVICE_ACCOUNT


_PEM = KEYS.cert_pem
BAD_ANSWERS = {
    "HTML": b"<html><body>Sign in to the network</body></html>",
    "empty": b"",
    "not UTF-8": b"\xff\xfe{}",
    "a number": b"5",  # google-auth's own check ("keys" in 5) raised TypeError: a 500
    "a string": json.dumps(_PEM).encode(),
    "an array": json.dumps([_PEM]).encode(),
    "an empty object": b"{}",
    "a number for a key": json.dumps({KEYS.kid: 5}).encode(),
    "text for a key": json.dumps({KEYS.kid: "not a certificate"}).encode(),
    "a broken PEM": json.dumps(
        {KEYS.kid: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}
    ).encode(),
    "a JWK set": json.dumps({"keys": [{"kid": KEYS.kid, "kty": "RSA"}]}).encode(),
    "a good key beside a bad one": json.dumps({**KEYS.certs(), "other": "junk"}).encode(),
}


@pytest.mark.parametrize("answer", list(BAD_ANSWERS.values()), ids=list(BAD_ANSWERS))
def test_a_200_that_is_not_certificates_is_unavailable_and_not_remembered(answer: bytes) -> None:
    server = CertServer(KEYS.certs())
    server.answer = answer
    check, _ = verifier(KEYS, server=server)
    for attempt in (1, 2):
        with pytest.raises(CertificatesUnavailable) as caught:
            check.verify("Bearer " + KEYS.token())
        assert "no certificates" in str(caught.value)
        assert server.requests == attempt  # asked again: the answer was not kept
    assert certificates_problem(answer) is not None
    server.answer = None  # the URL answers certificates again
    assert check.verify("Bearer " + KEYS.token())["email"] == SERVICE_ACCOUNT
    check.verify("Bearer " + KEYS.token())
    assert server.requests == 3  # and those are kept


def test_googles_answer_is_certificates() -> None:
    both = {**KEYS.certs(), **TestKeys(kid="test-key-2").certs()}
    assert certificates_problem(json.dumps(both).encode()) is None


def test_a_failed_refresh_for_an_unknown_key_keeps_the_certificates_in_hand() -> None:
    now = [1000.0]
    server = CertServer(KEYS.certs())
    check = on_clock(server, now)
    check.verify("Bearer " + KEYS.token())
    now[0] += 61
    server.answer = b"<html>proxy error</html>"
    found = refused(check, "Bearer " + KEYS.token(kid="rotated"))  # refreshes, and fails
    assert (found.status, server.requests) == (401, 2)
    assert check.verify("Bearer " + KEYS.token())["email"] == SERVICE_ACCOUNT  # still judged
    server.down = True  # a 503 on refresh: the same
    now[0] += 61
    refused(check, "Bearer " + KEYS.token(kid="rotated"))
    assert check.verify("Bearer " + KEYS.token())["email"] == SERVICE_ACCOUNT
    assert server.requests == 3
    now[0] += 3600  # past max-age, with nothing valid to fetch: unavailable, not 401
    with pytest.raises(CertificatesUnavailable):
        check.verify("Bearer " + KEYS.token())


_SIGNER = crypt.RSASigner.from_string(KEYS.private_pem)  # type: ignore[no-untyped-call]


def _signed(header: dict[str, Any], claims: dict[str, Any]) -> str:
    """A token signed with the trusted key, whatever its header and claims."""

    def part(value: Any) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")

    signed = part(header) + b"." + part(claims)
    signature = base64.urlsafe_b64encode(_SIGNER.sign(signed)).rstrip(b"=")
    return (signed + b"." + signature).decode()


@pytest.mark.parametrize(
    "claims",
    [
        {"iss": None},  # no issuer: google-auth's idinfo["iss"] raised KeyError
        {"iat": "yesterday"},  # arithmetic on text: TypeError
        {"exp": [1]},
    ],
    ids=["no issuer", "text iat", "array exp"],
)
def test_a_signed_token_with_a_broken_claim_is_401_not_a_crash(claims: dict[str, Any]) -> None:
    check, _ = verifier(KEYS)
    found = refused(check, "Bearer " + KEYS.token(**claims))  # None removes the claim
    assert found.status == 401
    assert found.reason.startswith("invalid token: ")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


_JUDGE, _ = verifier(KEYS)


@settings(max_examples=100, deadline=None)
@given(
    header=st.fixed_dictionaries(
        {}, optional={"alg": st.sampled_from(["RS256", "ES256", "none"]) | _JSON, "kid": _JSON}
    ),
    claims=st.dictionaries(
        st.sampled_from(["aud", "iss", "iat", "exp", "email", "email_verified", "azp"]),
        _JSON,
    ),
    mangle=st.sampled_from(["none", "signature", "text"]),
    text=st.text(max_size=40),
)
def test_any_token_is_judged_401_403_or_accepted_never_a_crash(
    header: dict[str, Any], claims: dict[str, Any], mangle: str, text: str
) -> None:
    token = _signed({"alg": "RS256", "kid": KEYS.kid, **header}, claims)
    if mangle == "signature":
        token = token.rsplit(".", 1)[0] + "." + text
    elif mangle == "text":
        token = text
    try:
        _JUDGE.verify("Bearer " + token)
    except Refused as exc:
        status = exc.status
        assert status in (401, 403)


def _off(**values: Any) -> Settings:
    """Verification off; no emulator unless ``values`` name one, whatever the environment."""
    base: dict[str, Any] = {
        "subscription": "projects/p/subscriptions/jobs",
        "push_verify_token": False,
        "pubsub_emulator_host": None,
        "firestore_emulator_host": None,
    }
    return Settings(**{**base, **values})


def test_verification_off_is_accepted_only_against_both_emulators(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = {
        "none": {},
        "pubsub only": {"pubsub_emulator_host": "127.0.0.1:8085"},
        "firestore only": {"firestore_emulator_host": "127.0.0.1:8086"},
        "empty placeholders": {"pubsub_emulator_host": "", "firestore_emulator_host": ""},
    }
    for name, emulators in refused.items():
        with pytest.raises(ConfigError) as caught:
            verifier_for(_off(**emulators))
        message = str(caught.value)
        assert "PUBSUB_WORKER_PUSH_VERIFY_TOKEN=false" in message, name
        assert "PUBSUB_WORKER_PUSH_ALLOW_UNVERIFIED=true" in message, name
        assert "PUBSUB_EMULATOR_HOST and FIRESTORE_EMULATOR_HOST" in message, name
    # A placeholder that is no HOST:PORT ("x") is refused by the settings themselves.
    emulated = _off(pubsub_emulator_host="127.0.0.1:8085", firestore_emulator_host="firestore:8086")
    assert verifier_for(emulated) is None
    assert "accepted without a token (the emulators send none)" in caplog.text


def test_verification_off_with_allow_unverified_gives_no_verifier_anywhere(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert verifier_for(_off(push_allow_unverified=True)) is None
    assert "PUBSUB_WORKER_PUSH_ALLOW_UNVERIFIED=true" in caplog.text
    monkeypatch.setenv("PUBSUB_WORKER_PUSH_ALLOW_UNVERIFIED", "true")  # a known variable
    monkeypatch.setenv("PUBSUB_WORKER_SUBSCRIPTION", "projects/p/subscriptions/jobs")
    assert Settings.from_env().push_allow_unverified is True


def test_verification_on_needs_audience_and_service_account() -> None:
    settings = Settings(subscription="projects/p/subscriptions/jobs")
    with pytest.raises(ConfigError) as caught:
        verifier_for(settings)
    assert "PUBSUB_WORKER_PUSH_AUDIENCE and PUBSUB_WORKER_PUSH_SERVICE_ACCOUNT" in str(caught.value)
    made = verifier_for(
        Settings(
            subscription="projects/p/subscriptions/jobs",
            push_audience=AUDIENCE,
            push_service_account=SERVICE_ACCOUNT,
        )
    )
    assert made is not None
    assert (made.audience, made.service_account) == (AUDIENCE, SERVICE_ACCOUNT)


@pytest.mark.parametrize(
    ("field", "value", "variable"),
    [
        ("push_audience", "has a space", "PUBSUB_WORKER_PUSH_AUDIENCE"),
        ("push_audience", "", "PUBSUB_WORKER_PUSH_AUDIENCE"),
        ("push_service_account", "not-an-email", "PUBSUB_WORKER_PUSH_SERVICE_ACCOUNT"),
        ("push_verify_token", "maybe", "PUBSUB_WORKER_PUSH_VERIFY_TOKEN"),
        ("push_allow_unverified", "maybe", "PUBSUB_WORKER_PUSH_ALLOW_UNVERIFIED"),
    ],
)
def test_bad_push_settings_name_their_variable(field: str, value: str, variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(subscription="projects/p/subscriptions/jobs", **{field: value})
    assert variable in str(caught.value)
    assert "accepted:" in str(caught.value)
