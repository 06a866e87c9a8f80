"""What keeps the dashboard safe: the read-only refusal, CSRF tokens, origins, hosts, headers."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from pubsub_worker.errors import ConfigError
from pubsub_worker.ui import security
from pubsub_worker.ui.security import COOKIE, Guard, actor, is_loopback

SECRET = b"s" * 32


def request(headers: dict[str, str] | None = None, cookie: str | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    raw.append((b"host", b"127.0.0.1:8000"))
    if cookie is not None:
        raw.append((b"cookie", f"{COOKIE}={cookie}".encode()))
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/review/replay",
        "headers": raw,
        "client": ("127.0.0.1", 50123),
    }
    return Request(scope)


def test_read_only_refuses_every_post_even_with_a_good_token() -> None:
    guard = Guard(allow_actions=False, secret=SECRET)
    why = guard.refusal(request(cookie="c"), guard.token("c"))
    assert why is not None
    assert why.startswith("read-only")


def test_a_post_needs_the_token_of_its_own_cookie() -> None:
    guard = Guard(allow_actions=True, secret=SECRET)
    assert guard.refusal(request(cookie="c"), guard.token("c")) is None
    assert "no CSRF token" in (guard.refusal(request(cookie="c"), None) or "")
    assert "no CSRF token" in (guard.refusal(request(), guard.token("c")) or "")
    assert "does not match" in (guard.refusal(request(cookie="c"), guard.token("other")) or "")
    # Another process's secret makes another token: a token is no use elsewhere.
    stranger = Guard(allow_actions=True, secret=b"t" * 32)
    assert "does not match" in (guard.refusal(request(cookie="c"), stranger.token("c")) or "")


def test_a_post_from_another_site_is_refused_whatever_it_carries() -> None:
    guard = Guard(allow_actions=True, secret=SECRET)
    good = guard.token("c")
    evil = request({"origin": "https://evil.example"}, cookie="c")
    assert "another site" in (guard.refusal(evil, good) or "")
    same = request({"origin": "http://127.0.0.1:8000"}, cookie="c")
    assert guard.refusal(same, good) is None


def test_the_secret_comes_from_the_environment_when_set_and_long_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(security.SECRET_VARIABLE, "k" * 40)
    one, two = Guard(allow_actions=True), Guard(allow_actions=True)
    assert one.token("c") == two.token("c")  # two instances behind one address agree
    monkeypatch.setenv(security.SECRET_VARIABLE, "short")
    with pytest.raises(ConfigError, match="PUBSUB_WORKER_UI_SECRET: at least 32 characters"):
        Guard(allow_actions=True)
    monkeypatch.delenv(security.SECRET_VARIABLE)
    assert Guard(allow_actions=True).token("c") != Guard(allow_actions=True).token("c")


def test_who_acted_is_iap_s_verified_user_else_marked_unverified_else_anonymous() -> None:
    iap = request({security.IAP_USER_HEADER: "accounts.google.com:alice@example.com"})
    assert actor(iap) == "alice@example.com (unverified) from 127.0.0.1"
    iap.state.user = "bob@example.com"  # what the verified assertion named
    assert actor(iap) == "bob@example.com from 127.0.0.1"
    assert actor(request()) == "anonymous from 127.0.0.1"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("::", False),
        ("example.com", False),
    ],
)
def test_loopback_is_what_only_this_machine_reaches(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_every_answer_forbids_inline_script_framing_and_caching() -> None:
    headers = security.security_headers()
    policy = headers["content-security-policy"]
    assert "script-src 'self';" in policy
    assert "unsafe-inline" not in policy
    assert "unsafe-eval" not in policy
    assert "frame-ancestors 'none'" in policy
    assert headers["x-frame-options"] == "DENY"
    assert headers["cache-control"] == "no-store"
