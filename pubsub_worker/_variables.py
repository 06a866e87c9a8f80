"""The environment variables: their names, what each accepts, and resource names.

Every variable has the prefix ``PUBSUB_WORKER_`` except the three the Google
client libraries read themselves (``GOOGLE_CLOUD_PROJECT``,
``PUBSUB_EMULATOR_HOST``, ``FIRESTORE_EMULATOR_HOST``). :data:`ACCEPTS` says
what each accepts, for the error that names it; :func:`resolve` turns a
subscription or topic ID into its full, checked path.
"""

from __future__ import annotations

import functools
import re

from ._attributes import LIBRARY_ATTRIBUTE_PREFIX
from .errors import ConfigError

__all__ = [
    "ACCEPTS",
    "ENV_PREFIX",
    "FULL_PATH",
    "PROJECT_ID",
    "REPLAY_SUFFIX",
    "UNPREFIXED",
    "env_name",
    "resolve",
]

ENV_PREFIX = "PUBSUB_WORKER_"
"""The prefix of every variable but the three the Google client libraries read."""

RESOURCE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}$")
PROJECT_ID = re.compile(r"^[a-z][a-z0-9\-:.]{1,61}[a-z0-9]$|^[a-z][a-z0-9\-]{0,4}$")
REPLAY_SUFFIX = "-replay"
"""What names a subscription's replay topic and subscription after it."""

FULL_PATH = re.compile(
    r"^projects/(?P<project>[^/]+)/(?P<kind>subscriptions|topics)/(?P<id>[^/]+)$"
)

# What each variable accepts, for error messages.
ACCEPTS: dict[str, str] = {
    "subscription": "projects/PROJECT/subscriptions/ID, or an ID with GOOGLE_CLOUD_PROJECT set",
    "project": "a Google Cloud project id (lowercase letters, digits, hyphens)",
    "collection": (
        "a Firestore collection id: no '/', not '.', '..' or __name__, at most 1500 bytes"
    ),
    "key_attribute": "a message attribute name, 1 to 256 characters",
    "lease_seconds": "whole seconds from 10 to 600 (Pub/Sub's ack deadline range)",
    "max_processing_seconds": "whole seconds from 10 to 86400, at least LEASE_SECONDS",
    "max_attempts": "a whole number from 1 to 100",
    "failure_topic": "projects/PROJECT/topics/ID, or a topic ID with GOOGLE_CLOUD_PROJECT set",
    "allow_at_least_once": "true or false",
    "max_messages": "a whole number from 1 to 1000",
    "prefetch_messages": "a whole number from 0 to 1000, at most MAX_MESSAGES",
    "ack_timeout_seconds": "seconds from 1 to 600",
    "shutdown_grace_seconds": "seconds from 0 to 3600",
    "retention_days": "whole days from 1 to 3650",
    "outbox_key_attribute": (
        "a message attribute name, 1 to 256 bytes, not starting with 'goog' or "
        f"{LIBRARY_ATTRIBUTE_PREFIX!r} (the library's own attributes)"
    ),
    "log_format": "text or json",
    "push_audience": (
        "the audience of the push subscription's OIDC token (its --push-auth-token-audience, "
        "by default the push endpoint's URL): 1 to 2048 characters, no spaces"
    ),
    "push_verify_token": (
        "true or false (false only against the emulators, or with "
        "PUBSUB_WORKER_PUSH_ALLOW_UNVERIFIED=true)"
    ),
    "push_allow_unverified": (
        "true or false (true only where something else authenticates every request, such as "
        "Cloud Run's IAM invoker check)"
    ),
    "push_service_account": (
        "the email of the service account the push subscription signs its tokens as "
        "(its --push-auth-service-account)"
    ),
    "pubsub_emulator_host": "HOST:PORT",
    "firestore_emulator_host": "HOST:PORT",
}

UNPREFIXED: dict[str, str] = {
    "project": "GOOGLE_CLOUD_PROJECT",
    "pubsub_emulator_host": "PUBSUB_EMULATOR_HOST",
    "firestore_emulator_host": "FIRESTORE_EMULATOR_HOST",
}


def env_name(field: str) -> str:
    """The environment variable that sets ``field``."""
    return UNPREFIXED.get(field, ENV_PREFIX + field.upper())


@functools.lru_cache(maxsize=128)
def resolve(value: str, kind: str, project: str | None, field: str) -> str:
    """The full path of ``value`` (an ID or a path), validated; cached: read per message."""
    match = FULL_PATH.match(value)
    if match:
        if match.group("kind") != kind or not RESOURCE_ID.match(match.group("id")):
            raise ConfigError(f"{env_name(field)}={value!r}: accepted: {ACCEPTS.get(field, kind)}")
        return value
    if not RESOURCE_ID.match(value):
        raise ConfigError(f"{env_name(field)}={value!r}: accepted: {ACCEPTS.get(field, kind)}")
    if not project:
        raise ConfigError(
            f"{env_name(field)}={value!r} is an ID, so GOOGLE_CLOUD_PROJECT must be set "
            f"(accepted: {ACCEPTS.get(field, kind)})"
        )
    return f"projects/{project}/{kind}/{value}"
