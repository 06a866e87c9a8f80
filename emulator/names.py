"""Resource names: validity rules and unique ids for test isolation.

Pub/Sub state is not reset between tests; each test gets its own topics and
subscriptions instead, named with :func:`unique_id`.
"""

from __future__ import annotations

import itertools
import os
import re
import uuid

__all__ = [
    "is_valid_project_id",
    "is_valid_resource_id",
    "subscription_path",
    "topic_path",
    "unique_id",
]

# Topic and subscription ids, as Pub/Sub documents them: 3-255 characters,
# starting with a letter, no "goog" prefix.
_RESOURCE_ID = re.compile(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")
# Project ids: 6-30 lowercase letters, digits, hyphens; letter first, no trailing hyphen.
_PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")

_COUNTER = itertools.count()


def is_valid_resource_id(value: str) -> bool:
    """Return whether ``value`` is a valid Pub/Sub topic or subscription id."""
    return bool(_RESOURCE_ID.fullmatch(value)) and not value.lower().startswith("goog")


def is_valid_project_id(value: str) -> bool:
    """Return whether ``value`` is a valid Google Cloud project id."""
    return bool(_PROJECT_ID.fullmatch(value))


def unique_id(prefix: str = "t") -> str:
    """Return ``<prefix>-<pid>-<n>-<random>``: unique across tests, workers and runs.

    The result is a valid topic, subscription and Firestore collection id as
    long as ``prefix`` starts with a letter and is short (it is truncated to 200
    characters).
    """
    return f"{prefix[:200]}-{os.getpid()}-{next(_COUNTER)}-{uuid.uuid4().hex[:8]}"


def topic_path(project: str, topic_id: str) -> str:
    """Return ``projects/{project}/topics/{topic_id}``."""
    return f"projects/{project}/topics/{topic_id}"


def subscription_path(project: str, subscription_id: str) -> str:
    """Return ``projects/{project}/subscriptions/{subscription_id}``."""
    return f"projects/{project}/subscriptions/{subscription_id}"
