"""Settings, parsed once from environment variables at start-up.

Every variable has the prefix ``PUBSUB_WORKER_`` except the three the Google
client libraries read themselves (``GOOGLE_CLOUD_PROJECT``,
``PUBSUB_EMULATOR_HOST``, ``FIRESTORE_EMULATOR_HOST``). A bad value raises
:class:`~pubsub_worker.errors.ConfigError` naming the variable and what it
accepts; nothing here reads the environment at import time.

:meth:`Settings.from_env` applies the defaults of the platform the worker
runs on (:func:`platform_overrides`): on Cloud Run (:func:`cloud_run`) the
shutdown grace is :data:`CLOUD_RUN_GRACE_S` unless its variable is set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ._attributes import DEFAULT_OUTBOX_KEY_ATTRIBUTE, LIBRARY_ATTRIBUTE_PREFIX
from ._variables import (
    ACCEPTS,
    ENV_PREFIX,
    FULL_PATH,
    PROJECT_ID,
    REPLAY_SUFFIX,
    UNPREFIXED,
    env_name,
    resolve,
)
from .errors import ConfigError

__all__ = [
    "CLOUD_RUN_GRACE_S",
    "Settings",
    "cloud_run",
    "platform_overrides",
]


CLOUD_RUN_GRACE_S = 5.0
"""``SHUTDOWN_GRACE_SECONDS`` on Cloud Run unless set: it sends SIGKILL 10 s after SIGTERM,
and the rest of those 10 s is for jobs to reach a step boundary, be released and close."""

_CLOUD_RUN_MARKERS = ("CLOUD_RUN_WORKER_POOL", "K_SERVICE", "CLOUD_RUN_JOB")
"""Variables Cloud Run sets in a worker pool, a service and a job."""

_EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,255}\.[^@\s]+$")
_SPACE = re.compile(r"\s")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):(\d{1,5})$")


def cloud_run(environ: Mapping[str, str]) -> str | None:
    """The Cloud Run marker variable set in ``environ``, or None off Cloud Run."""
    return next((name for name in _CLOUD_RUN_MARKERS if environ.get(name)), None)


def platform_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """Defaults that differ on the platform the worker runs on; a set variable always wins.

    On Cloud Run the shutdown grace is :data:`CLOUD_RUN_GRACE_S` seconds, so
    that a stop fits its 10 s SIGTERM window. Elsewhere: none.
    """
    if cloud_run(environ) and env_name("shutdown_grace_seconds") not in environ:
        return {"shutdown_grace_seconds": CLOUD_RUN_GRACE_S}
    return {}


class Settings(BaseSettings):
    """Configuration of a worker, from ``PUBSUB_WORKER_*`` environment variables.

    Build it with :meth:`from_env`, which applies the platform's defaults
    (:func:`platform_overrides`); keyword arguments override the environment.
    Built directly, ``Settings(...)`` reads the environment but applies no
    platform default. Instances are frozen. Durations are whole seconds and say so
    in their names.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        validate_default=True,
    )

    subscription: str | None = Field(default=None)
    """The subscription to consume: ``projects/P/subscriptions/S`` or ``S``."""
    project: str | None = Field(
        default=None,
        validation_alias=AliasChoices("project", "GOOGLE_CLOUD_PROJECT"),
    )
    """The Google Cloud project; defaults to the one in ``SUBSCRIPTION``."""
    collection: str = "pubsub_worker_jobs"
    """Firestore collection that holds one document per job."""
    key_attribute: str | None = None
    """Message attribute holding the effect key; unset: the message id is the key."""
    lease_seconds: int = Field(default=150, ge=10, le=600)
    """How long a claim lasts without progress; also the Pub/Sub ack deadline per extension."""
    max_processing_seconds: int = Field(default=480, ge=10, le=86400)
    """Total processing cap per attempt; past it the job is abandoned cooperatively."""
    max_attempts: int = Field(default=5, ge=1, le=100)
    """Claims allowed before a job that keeps failing goes to the failure path."""
    failure_topic: str | None = None
    """Topic that receives failed jobs for review (original data, attributes and the error)."""
    allow_at_least_once: bool = False
    """Accept a subscription without exactly-once delivery (acks then prove nothing)."""
    max_messages: int = Field(default=20, ge=1, le=1000)
    """Jobs run at once in :func:`pubsub_worker.run` (its callback threads).

    20 by default: each job holds its flow-control slot for two Firestore
    round trips and the ack's besides its own work, and with production's
    round trips 10 threads (20 admitted) kept ``run()`` to 47-79% of the stock
    client at its defaults, 20 (40 admitted) to 88-138%
    (``docs/benchmarks-history.md``).
    """
    prefetch_messages: int | None = Field(default=None, ge=0, le=1000)
    """Messages :func:`pubsub_worker.run` admits beyond ``MAX_MESSAGES``; unset: as many.

    They wait for a thread (leased, their processing cap running), or hold the
    flow-control slot of a finished job whose ack is not answered yet, so a
    thread never waits for an ack. ``0``: one message per thread, for jobs that
    take more than half the cap (a message may wait one job's time for a thread).
    """
    ack_timeout_seconds: float = Field(default=60.0, ge=1, le=600)
    """Upper bound on waiting for a publish (outbox, failure path, replay)."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0, le=3600)
    """On SIGTERM, how long in-flight jobs may keep running before they are released."""
    retention_days: int = Field(default=30, ge=1, le=3650)
    """Job documents carry ``expire_at`` this far ahead, for a Firestore TTL policy."""
    outbox_key_attribute: str = DEFAULT_OUTBOX_KEY_ATTRIBUTE
    """Attribute that carries the effect key on messages published through the outbox."""
    log_format: Literal["text", "json"] = "text"
    """Log line format of the ``pubsub-worker`` command."""
    push_audience: str | None = None
    """Push subscriptions: the ``aud`` claim a request's OIDC token must carry."""
    push_verify_token: bool = True
    """Push subscriptions: refuse a request without a valid OIDC token (401/403) before
    anything is read or written. ``false`` starts only against the emulators (:attr:`emulated`)
    or with ``push_allow_unverified``."""
    push_allow_unverified: bool = False
    """Push subscriptions: let ``push_verify_token=false`` start off the emulators. Only
    behind something else that authenticates every request (Cloud Run's IAM invoker check
    of a service deployed with ``--no-allow-unauthenticated``)."""
    push_service_account: str | None = None
    """Push subscriptions: the ``email`` claim a request's OIDC token must carry (verified)."""
    pubsub_emulator_host: str | None = Field(
        default=None,
        validation_alias=AliasChoices("pubsub_emulator_host", "PUBSUB_EMULATOR_HOST"),
    )
    firestore_emulator_host: str | None = Field(
        default=None,
        validation_alias=AliasChoices("firestore_emulator_host", "FIRESTORE_EMULATOR_HOST"),
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from exc

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Read the environment; ``overrides`` win over variables. Raises ``ConfigError``.

        Where a variable is unset, the platform's default applies before the
        library's (:func:`platform_overrides`: a shutdown grace of
        :data:`CLOUD_RUN_GRACE_S` seconds on Cloud Run); a set variable or an
        override wins over it. An unknown ``PUBSUB_WORKER_*`` variable is an
        error too: a typo must not silently fall back to a default.
        """
        known = {env_name(name) for name in cls.model_fields}
        known.add("PUBSUB_WORKER_UNSAFE_DISABLE_FENCES")  # read by _support/fences, not a setting
        unknown = sorted(
            name for name in os.environ if name.startswith(ENV_PREFIX) and name not in known
        )
        if unknown:
            raise ConfigError(
                f"unknown variable(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**{**platform_overrides(os.environ), **overrides})

    # -- validation ---------------------------------------------------------------

    @field_validator("collection")
    @classmethod
    def _check_collection(cls, value: str) -> str:
        raw = value.encode("utf-8", "surrogatepass")
        if (
            not value
            or "/" in value
            or value in {".", ".."}
            or (value.startswith("__") and value.endswith("__"))
            or len(raw) > 1500
        ):
            raise ValueError("not a valid Firestore collection id")
        return value

    @field_validator("key_attribute", "outbox_key_attribute")
    @classmethod
    def _check_attribute_name(cls, value: str | None) -> str | None:
        if value is not None and not (1 <= len(value.encode("utf-8", "surrogatepass")) <= 256):
            raise ValueError("attribute names are 1 to 256 bytes")
        if value is not None and value.startswith("goog"):
            raise ValueError("attribute names may not start with 'goog'")
        return value

    @field_validator("outbox_key_attribute")
    @classmethod
    def _check_outbox_key(cls, value: str) -> str:
        if value.startswith(LIBRARY_ATTRIBUTE_PREFIX):
            raise ValueError(
                f"{LIBRARY_ATTRIBUTE_PREFIX}* attributes are set by pubsub-worker itself"
            )
        return value

    @field_validator("push_audience")
    @classmethod
    def _check_audience(cls, value: str | None) -> str | None:
        if value is not None and (not 1 <= len(value) <= 2048 or _SPACE.search(value)):
            raise ValueError("not a token audience")
        return value

    @field_validator("push_service_account")
    @classmethod
    def _check_service_account(cls, value: str | None) -> str | None:
        if value is not None and not _EMAIL.match(value):
            raise ValueError("not a service account email")
        return value

    @field_validator("project")
    @classmethod
    def _check_project(cls, value: str | None) -> str | None:
        if value is not None and not PROJECT_ID.match(value):
            raise ValueError("not a valid project id")
        return value

    @field_validator("pubsub_emulator_host", "firestore_emulator_host")
    @classmethod
    def _check_host(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        match = _HOST_PORT.match(value)
        if not match or not 0 < int(match.group(2)) < 65536:
            raise ValueError("expected HOST:PORT")
        return value

    @model_validator(mode="after")
    def _check_together(self) -> Settings:
        if self.max_processing_seconds < self.lease_seconds:
            raise ValueError(
                f"max_processing_seconds: must be at least LEASE_SECONDS ({self.lease_seconds})"
            )
        if self.prefetch_messages is not None and self.prefetch_messages > self.max_messages:
            raise ValueError(
                f"prefetch_messages: must be at most MAX_MESSAGES ({self.max_messages}), so "
                "that a message waits for one job at most"
            )
        for name in ("subscription", "failure_topic"):
            value = getattr(self, name)
            if value is not None:
                kind = "subscriptions" if name == "subscription" else "topics"
                resolve(value, kind, self.project, name)
        return self

    # -- derived values -----------------------------------------------------------

    @property
    def admitted_messages(self) -> int:
        """Messages :func:`pubsub_worker.run`'s flow control lets in: running plus prefetched."""
        prefetch = self.max_messages if self.prefetch_messages is None else self.prefetch_messages
        return self.max_messages + prefetch

    @property
    def emulated(self) -> bool:
        """Both emulators are set (``PUBSUB_EMULATOR_HOST`` and ``FIRESTORE_EMULATOR_HOST``,
        each a HOST:PORT): nothing reaches Google's services."""
        return bool(self.pubsub_emulator_host) and bool(self.firestore_emulator_host)

    @property
    def project_id(self) -> str:
        """The project: ``GOOGLE_CLOUD_PROJECT``, else the one in ``SUBSCRIPTION``."""
        if self.project:
            return self.project
        if self.subscription and (match := FULL_PATH.match(self.subscription)):
            return match.group("project")
        raise ConfigError(f"GOOGLE_CLOUD_PROJECT is not set (accepted: {ACCEPTS['project']})")

    @property
    def subscription_path(self) -> str:
        """The full subscription path; ``ConfigError`` when ``SUBSCRIPTION`` is unset."""
        if not self.subscription:
            raise ConfigError(
                f"{env_name('subscription')} is not set (accepted: {ACCEPTS['subscription']})"
            )
        return resolve(self.subscription, "subscriptions", self.project, "subscription")

    @property
    def replay_subscription_path(self) -> str:
        """Where replays of this subscription's failed jobs arrive: ``<SUBSCRIPTION>-replay``.

        A subscription of its own topic (``<SUBSCRIPTION ID>-replay`` too), which the same
        worker consumes beside its own, so that a replay reaches this subscription and no
        sibling of its topic (``pubsub-worker jobs replay-setup`` makes both).
        """
        return self.subscription_path + REPLAY_SUFFIX

    @property
    def replay_topic_path(self) -> str:
        """The topic of :attr:`replay_subscription_path`: ``projects/P/topics/<ID>-replay``."""
        project, _, sub_id = self.subscription_path.split("/")[1:4]
        return f"projects/{project}/topics/{sub_id}{REPLAY_SUFFIX}"

    @property
    def failure_topic_path(self) -> str | None:
        """The full failure topic path, or ``None`` when no failure topic is configured."""
        if not self.failure_topic:
            return None
        return resolve(self.failure_topic, "topics", self.project_id, "failure_topic")

    def topic_path(self, topic: str) -> str:
        """A topic ID or path, resolved against this project."""
        return resolve(topic, "topics", self.project_id, "topic")


def _describe(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        field = loc[0] if loc else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        if not field and ":" in message:  # model-level check names its field first
            field, _, message = message.partition(": ")
        if field in UNPREFIXED.values():
            field = next(k for k, v in UNPREFIXED.items() if v == field)
        if error["type"] == "extra_forbidden":
            lines.append(f"unknown setting {field!r}")
            continue
        shown = error.get("input")
        accepts = ACCEPTS.get(field, "")
        where = env_name(field) if field else "settings"
        value = f"={shown!r}" if shown is not None and not isinstance(shown, dict) else ""
        lines.append(f"{where}{value}: {message} (accepted: {accepts})")
    return "invalid configuration: " + "; ".join(lines)
