"""Declared Pub/Sub topology: topics and subscriptions, from TOML or Python.

A topology file, every key shown (only ``name`` and ``topic`` are required)::

    [[topics]]
    name = "jobs"

    [[topics]]
    name = "jobs-dead"

    [[subscriptions]]
    name = "jobs-worker"
    topic = "jobs"
    exactly_once = true             # default false
    ordering = true                 # message ordering (ordering keys); default false
    ack_deadline_seconds = 10       # 10..600, default 10
    dead_letter = { topic = "jobs-dead", max_delivery_attempts = 5 }   # 5..100
    retry = { min_backoff_seconds = 1, max_backoff_seconds = 60 }      # 0..600

    [[subscriptions]]
    name = "jobs-push"
    topic = "jobs"
    # A push subscription: the emulator POSTs each message to the endpoint (no token).
    push = { endpoint = "http://127.0.0.1:8080/", no_wrapper = false, write_metadata = false }

Validation is strict: unknown keys, wrong types, values out of range,
invalid or duplicate names and references to undeclared topics raise
:class:`~emulator.errors.TopologyError` naming the field path (such as
``subscriptions[1].ack_deadline_seconds``) and, for files, the line.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator.errors import TopologyError
from emulator.names import is_valid_resource_id

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    try:
        import tomli as tomllib  # type: ignore[import-not-found, no-redef, unused-ignore]
    except ImportError as exc:
        raise ImportError(
            "Reading topology files on Python 3.10 needs tomli: pip install tomli"
        ) from exc

__all__ = [
    "DeadLetterSpec",
    "PushSpec",
    "RetrySpec",
    "SubscriptionSpec",
    "TopicSpec",
    "Topology",
    "load_topology",
    "parse_topology",
]

MIN_ACK_DEADLINE_S = 10
MAX_ACK_DEADLINE_S = 600
MIN_DELIVERY_ATTEMPTS = 5
MAX_DELIVERY_ATTEMPTS = 100
MAX_BACKOFF_S = 600.0


@dataclass(frozen=True)
class TopicSpec:
    """A topic, by id (not full path)."""

    name: str


@dataclass(frozen=True)
class DeadLetterSpec:
    """Forward a message to ``topic`` after ``max_delivery_attempts`` (5..100) deliveries."""

    topic: str
    max_delivery_attempts: int = 5


@dataclass(frozen=True)
class RetrySpec:
    """Redelivery back-off after a nack or an expired deadline, in seconds (0..600)."""

    min_backoff_seconds: float = 10.0
    max_backoff_seconds: float = 600.0


@dataclass(frozen=True)
class PushSpec:
    """Deliver by push: POST each message to ``endpoint`` (``http://`` or ``https://``).

    ``no_wrapper``: the message data is the body (``--push-no-wrapper``);
    ``write_metadata``: with it, the message id, publish time and attributes
    travel as headers (``--push-no-wrapper-write-metadata``). The emulator
    sends no OIDC token.
    """

    endpoint: str
    no_wrapper: bool = False
    write_metadata: bool = False

    def config(self) -> dict[str, object]:
        """The subscription's ``push_config`` for this spec."""
        config: dict[str, object] = {"push_endpoint": self.endpoint}
        if self.no_wrapper:
            config["no_wrapper"] = {"write_metadata": self.write_metadata}
        return config


@dataclass(frozen=True)
class SubscriptionSpec:
    """A pull subscription on a declared topic.

    Attributes:
        name: Subscription id.
        topic: Id of a topic declared in the same :class:`Topology`.
        exactly_once: Enable exactly-once delivery.
        ack_deadline_seconds: Initial ack deadline, 10..600.
        dead_letter: Dead-letter policy; its topic must be declared too.
        retry: Retry policy; None means immediate redelivery.
        ordering: Enable message ordering: messages published with the same
            ordering key are delivered in publish order (the publisher must
            enable message ordering too).
        push: Deliver by push to an endpoint instead of being pulled; None
            for a pull subscription. Not with ``exactly_once`` (Pub/Sub
            offers exactly-once delivery to pull subscriptions only).
    """

    name: str
    topic: str
    exactly_once: bool = False
    ack_deadline_seconds: int = 10
    dead_letter: DeadLetterSpec | None = None
    retry: RetrySpec | None = None
    ordering: bool = False
    push: PushSpec | None = None


@dataclass(frozen=True)
class Topology:
    """Topics and subscriptions to create; validated on construction.

    Raises:
        TopologyError: Naming the path of the first invalid field.
    """

    topics: tuple[TopicSpec, ...] = ()
    subscriptions: tuple[SubscriptionSpec, ...] = ()
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Accept lists from Python callers; store tuples so the value is hashable.
        object.__setattr__(self, "topics", tuple(self.topics))
        object.__setattr__(self, "subscriptions", tuple(self.subscriptions))
        _validate(self)

    def topic(self, name: str) -> TopicSpec:
        """Return the topic declared as ``name``."""
        for topic in self.topics:
            if topic.name == name:
                return topic
        raise KeyError(name)

    def subscription(self, name: str) -> SubscriptionSpec:
        """Return the subscription declared as ``name``."""
        for sub in self.subscriptions:
            if sub.name == name:
                return sub
        raise KeyError(name)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_name(value: object, path: str) -> None:
    if not isinstance(value, str):
        raise TopologyError(f"must be a string, got {value!r}", path=path)
    if not is_valid_resource_id(value):
        raise TopologyError(
            f"{value!r} is not a valid id (3-255 characters: letters, digits and -_.~+%, "
            "starting with a letter, not with 'goog')",
            path=path,
        )


def _validate(topology: Topology) -> None:
    topic_names: set[str] = set()
    for i, topic in enumerate(topology.topics):
        path = f"topics[{i}]"
        if not isinstance(topic, TopicSpec):
            raise TopologyError(f"must be a TopicSpec, got {topic!r}", path=path)
        _check_name(topic.name, f"{path}.name")
        if topic.name in topic_names:
            raise TopologyError(f"topic {topic.name!r} is declared twice", path=f"{path}.name")
        topic_names.add(topic.name)
    sub_names: set[str] = set()
    for i, sub in enumerate(topology.subscriptions):
        path = f"subscriptions[{i}]"
        if not isinstance(sub, SubscriptionSpec):
            raise TopologyError(f"must be a SubscriptionSpec, got {sub!r}", path=path)
        _check_name(sub.name, f"{path}.name")
        if sub.name in sub_names:
            raise TopologyError(f"subscription {sub.name!r} is declared twice", path=f"{path}.name")
        sub_names.add(sub.name)
        _validate_subscription(sub, path, topic_names)


def _validate_subscription(sub: SubscriptionSpec, path: str, topics: set[str]) -> None:
    _check_name(sub.topic, f"{path}.topic")
    if sub.topic not in topics:
        raise TopologyError(f"topic {sub.topic!r} is not declared in topics", path=f"{path}.topic")
    for flag in ("exactly_once", "ordering"):
        value = getattr(sub, flag)
        if not isinstance(value, bool):
            raise TopologyError(f"must be true or false, got {value!r}", path=f"{path}.{flag}")
    deadline = sub.ack_deadline_seconds
    if not _is_int(deadline) or not MIN_ACK_DEADLINE_S <= deadline <= MAX_ACK_DEADLINE_S:
        raise TopologyError(
            f"must be an integer from {MIN_ACK_DEADLINE_S} to {MAX_ACK_DEADLINE_S}, "
            f"got {deadline!r}",
            path=f"{path}.ack_deadline_seconds",
        )
    if sub.dead_letter is not None:
        dl_path = f"{path}.dead_letter"
        if not isinstance(sub.dead_letter, DeadLetterSpec):
            raise TopologyError(f"must be a DeadLetterSpec, got {sub.dead_letter!r}", path=dl_path)
        _check_name(sub.dead_letter.topic, f"{dl_path}.topic")
        if sub.dead_letter.topic not in topics:
            raise TopologyError(
                f"topic {sub.dead_letter.topic!r} is not declared in topics",
                path=f"{dl_path}.topic",
            )
        if sub.dead_letter.topic == sub.topic:
            raise TopologyError(
                "the dead-letter topic must differ from the subscription's topic",
                path=f"{dl_path}.topic",
            )
        attempts = sub.dead_letter.max_delivery_attempts
        if not _is_int(attempts) or not MIN_DELIVERY_ATTEMPTS <= attempts <= MAX_DELIVERY_ATTEMPTS:
            raise TopologyError(
                f"must be an integer from {MIN_DELIVERY_ATTEMPTS} to {MAX_DELIVERY_ATTEMPTS}, "
                f"got {attempts!r}",
                path=f"{dl_path}.max_delivery_attempts",
            )
    if sub.retry is not None:
        _validate_retry(sub.retry, f"{path}.retry")
    if sub.push is not None:
        _validate_push(sub, f"{path}.push")


def _validate_push(sub: SubscriptionSpec, path: str) -> None:
    push = sub.push
    if not isinstance(push, PushSpec):
        raise TopologyError(f"must be a PushSpec, got {push!r}", path=path)
    if not isinstance(push.endpoint, str) or not re.match(r"^https?://[^\s/]+", push.endpoint):
        raise TopologyError(
            f"must be an http:// or https:// URL, got {push.endpoint!r}", path=f"{path}.endpoint"
        )
    for flag in ("no_wrapper", "write_metadata"):
        value = getattr(push, flag)
        if not isinstance(value, bool):
            raise TopologyError(f"must be true or false, got {value!r}", path=f"{path}.{flag}")
    if push.write_metadata and not push.no_wrapper:
        raise TopologyError("needs no_wrapper = true", path=f"{path}.write_metadata")
    if sub.exactly_once:
        raise TopologyError(
            "a push subscription cannot have exactly-once delivery (Pub/Sub refuses it)",
            path=f"{path}",
        )


def _validate_retry(retry: RetrySpec, path: str) -> None:
    if not isinstance(retry, RetrySpec):
        raise TopologyError(f"must be a RetrySpec, got {retry!r}", path=path)
    for key in ("min_backoff_seconds", "max_backoff_seconds"):
        value = getattr(retry, key)
        if not _is_number(value) or not 0 <= value <= MAX_BACKOFF_S:
            raise TopologyError(
                f"must be a number of seconds from 0 to {MAX_BACKOFF_S:g}, got {value!r}",
                path=f"{path}.{key}",
            )
    if retry.min_backoff_seconds > retry.max_backoff_seconds:
        raise TopologyError(
            f"must not exceed max_backoff_seconds ({retry.max_backoff_seconds:g})",
            path=f"{path}.min_backoff_seconds",
        )


# --- TOML ----------------------------------------------------------------------

_TOP_KEYS = {"topics", "subscriptions"}
_TOPIC_KEYS = {"name"}
_SUB_KEYS = {
    "name",
    "topic",
    "exactly_once",
    "ordering",
    "ack_deadline_seconds",
    "dead_letter",
    "retry",
    "push",
}
_PUSH_KEYS = {"endpoint", "no_wrapper", "write_metadata"}
_DEAD_LETTER_KEYS = {"topic", "max_delivery_attempts"}
_RETRY_KEYS = {"min_backoff_seconds", "max_backoff_seconds"}


def _table(value: object, path: str, allowed: set[str], required: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TopologyError(f"must be a table, got {type(value).__name__}", path=path)
    for key in value:
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            prefix = f"{path}." if path else ""
            raise TopologyError(f"unknown key (allowed: {known})", path=f"{prefix}{key}")
    for key in required:
        if key not in value:
            raise TopologyError(f"required key {key!r} is missing", path=path)
    return value


def _array(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise TopologyError(
            f"must be an array of tables ([[{path}]]), got {type(value).__name__}", path=path
        )
    return value


def topology_from_dict(data: Mapping[str, Any], *, source: str | None = None) -> Topology:
    """Build a :class:`Topology` from parsed TOML (or equivalent) data, strictly."""
    top = _table(dict(data), "", _TOP_KEYS, ())
    topics: list[TopicSpec] = []
    for i, raw in enumerate(_array(top.get("topics", []), "topics")):
        t = _table(raw, f"topics[{i}]", _TOPIC_KEYS, ("name",))
        topics.append(TopicSpec(name=t["name"]))
    subs: list[SubscriptionSpec] = []
    for i, raw in enumerate(_array(top.get("subscriptions", []), "subscriptions")):
        path = f"subscriptions[{i}]"
        s = _table(raw, path, _SUB_KEYS, ("name", "topic"))
        dead_letter = None
        if "dead_letter" in s:
            d = _table(s["dead_letter"], f"{path}.dead_letter", _DEAD_LETTER_KEYS, ("topic",))
            dead_letter = DeadLetterSpec(**d)
        retry = None
        if "retry" in s:
            retry = RetrySpec(**_table(s["retry"], f"{path}.retry", _RETRY_KEYS, ()))
        push = None
        if "push" in s:
            push = PushSpec(**_table(s["push"], f"{path}.push", _PUSH_KEYS, ("endpoint",)))
        fields = {k: v for k, v in s.items() if k not in ("dead_letter", "retry", "push")}
        subs.append(SubscriptionSpec(**fields, dead_letter=dead_letter, retry=retry, push=push))
    return Topology(topics=tuple(topics), subscriptions=tuple(subs), source=source)


def parse_topology(text: str, *, source: str | None = None) -> Topology:
    """Parse a topology from TOML text.

    Raises:
        TopologyError: The text is not TOML or not a valid topology; the message
            names ``source`` and the line where it could be found.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Python 3.14 adds exc.lineno; before, the line is only in the message.
        found = re.search(r"at line (\d+)", str(exc))
        line = int(found.group(1)) if found else None
        raise TopologyError(f"not valid TOML: {exc}", line=line, source=source) from None
    try:
        return topology_from_dict(data, source=source)
    except TopologyError as exc:
        raise exc.located(line=_locate(text, exc.path), source=source) from None


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology TOML file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"cannot read topology file: {exc}", source=str(file)) from exc
    return parse_topology(text, source=str(file))


_SEGMENT = re.compile(r"([A-Za-z0-9_-]+)(?:\[(\d+)\])?")
_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\s]+?)\s*\]\]?")


def _locate(text: str, path: str) -> int | None:
    """Best-effort 1-based line of ``path`` (``subscriptions[1].retry.x``) in ``text``."""
    segments = [_SEGMENT.fullmatch(s) for s in path.split(".")] if path else []
    if not segments or any(m is None for m in segments):
        return None
    lines = text.splitlines()
    first = segments[0]
    assert first is not None
    name, index = first.group(1), first.group(2)
    keys = [m.group(1) for m in segments[1:] if m is not None]
    if index is None:
        keys, start, end = [name], 0, len(lines)
        for n, line in enumerate(lines):  # top-level keys come before any header
            if _HEADER.match(line):
                end = n
                break
    else:
        headers = [
            n for n, line in enumerate(lines) if re.match(rf"^\s*\[\[\s*{name}\s*\]\]", line)
        ]
        if int(index) >= len(headers):
            return None
        start = headers[int(index)]
        end = len(lines)
        for n in range(start + 1, len(lines)):
            header = _HEADER.match(lines[n])
            if header and not header.group(1).replace(" ", "").startswith(f"{name}."):
                end = n
                break
        if not keys:
            return start + 1
    for key in keys:
        found = _find_key(lines, key, start, end)
        if found is None:
            return start + 1 if index is not None else None
        start = found
        if not re.match(r"^\s*\[", lines[found]):
            return found + 1  # "key = ..." (an inline table holds the rest)
    return start + 1


def _find_key(lines: list[str], key: str, start: int, end: int) -> int | None:
    assign = re.compile(rf"^\s*{re.escape(key)}\s*=")
    header = re.compile(rf"^\s*\[\s*[A-Za-z0-9_.\-]*\b{re.escape(key)}\s*\]")
    for n in range(start, end):
        if assign.match(lines[n]) or header.match(lines[n]):
            return n
    return None
