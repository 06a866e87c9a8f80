"""What keeps the dashboard safe to leave open: read-only by default, CSRF, hosts, headers.

* **Read-only unless asked.** Without ``--allow-actions`` no page offers an
  action and every POST is refused (403), whatever it carries.
* **CSRF.** Each browser gets a random cookie (``HttpOnly``,
  ``SameSite=Strict``); every form carries ``HMAC(secret, cookie)``, which a
  POST must echo. A page of another site can neither read the token nor send
  the cookie. The secret is random per process, or
  ``PUBSUB_WORKER_UI_SECRET`` (at least 32 characters) when several instances
  serve one address (Cloud Run). A POST whose ``Origin`` is another host is
  refused too.
* **Hosts.** Bound to loopback, only ``Host: 127.0.0.1``, ``localhost`` or
  ``[::1]`` is answered: a page of another site that rebinds its name to
  127.0.0.1 gets 400.
* **Headers.** A content security policy of ``'self'`` only (no inline script
  or style: htmx is served from here), no framing, no referrer.
* **Who.** Behind Identity-Aware Proxy with ``--iap-audience``, the user of
  IAP's verified assertion (:mod:`pubsub_worker.ui.iap`); without it, IAP's
  ``X-Goog-Authenticated-User-Email`` marked unverified; otherwise
  "anonymous". Every action is logged with who, from where, and what
  (:func:`actor`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

from pubsub_worker.errors import ConfigError

__all__ = [
    "COOKIE",
    "IAP_USER_HEADER",
    "LOOPBACK_HOSTS",
    "SECRET_VARIABLE",
    "Guard",
    "actor",
    "is_loopback",
    "security_headers",
]

COOKIE = "pubsub_worker_ui"
IAP_USER_HEADER = "x-goog-authenticated-user-email"
SECRET_VARIABLE = "PUBSUB_WORKER_UI_SECRET"  # noqa: S105 - the name of the variable
_SECRET_MIN = 32


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
"""The ``Host`` names (without the port) a loopback-bound dashboard answers."""


def security_headers() -> dict[str, str]:
    """Headers of every answer."""
    return {
        "content-security-policy": (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
            "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        ),
        "x-frame-options": "DENY",
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-store",
    }


class Guard:
    """The CSRF token of a browser, and the judgment of a POST."""

    def __init__(self, *, allow_actions: bool, secret: bytes | None = None) -> None:
        self.allow_actions = allow_actions
        self._secret = secret if secret is not None else _secret_from_env()

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_urlsafe(32)

    def token(self, cookie: str) -> str:
        """The token forms carry for the browser holding ``cookie``."""
        return hmac.new(self._secret, cookie.encode(), hashlib.sha256).hexdigest()

    def refusal(self, request: Request, form_token: str | None) -> str | None:
        """Why a POST is refused (None: it may act)."""
        if not self.allow_actions:
            return "read-only: this dashboard was started without --allow-actions"
        origin = request.headers.get("origin")
        if origin and origin != "null":
            host = request.headers.get("host", "")
            if urlsplit(origin).netloc.lower() != host.lower():
                return f"the request came from another site ({origin})"
        cookie = request.cookies.get(COOKIE)
        if not cookie or not form_token:
            return "no CSRF token: reload the page and try again"
        if not hmac.compare_digest(self.token(cookie), form_token):
            return "the CSRF token does not match: reload the page and try again"
        return None


def _secret_from_env() -> bytes:
    value = os.environ.get(SECRET_VARIABLE)
    if value is None:
        return secrets.token_bytes(32)
    if len(value) < _SECRET_MIN:
        raise ConfigError(
            f"{SECRET_VARIABLE}: at least {_SECRET_MIN} characters (a random string shared by "
            f"every instance of the dashboard), got {len(value)}"
        )
    return value.encode()


def actor(request: Request) -> str:
    """Who sent ``request``, as the action log names them.

    The user IAP's assertion names, verified (``request.state.user``, set with
    ``--iap-audience``); else IAP's plain user header
    (``accounts.google.com:alice@example.com``), which anyone who reaches the
    dashboard around IAP could send, so marked unverified; else "anonymous".
    """
    verified = getattr(request.state, "user", None)
    header = request.headers.get(IAP_USER_HEADER, "")
    if verified:
        name = str(verified)
    elif header:
        name = f"{header.split(':', 1)[-1]} (unverified)"
    else:
        name = "anonymous"
    where = request.client.host if request.client is not None else "?"
    return f"{name} from {where}"
