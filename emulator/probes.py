"""Readiness probes: one real RPC against each emulator.

An open port is not enough: the Firestore emulator accepts connections
about a second before it can serve its first write. Each probe opens a
fresh insecure channel, so a failed attempt leaves no reconnect back-off
behind, and raises on any failure.

The Firestore probe writes one document in a separate project
(:data:`PROBE_PROJECT`), so the project under test stays empty.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]

__all__ = ["PROBE_PROJECT", "firestore_ready", "pubsub_ready", "reset_firestore"]

PROBE_PROJECT = "emulator-ready-probe"
"""Project the Firestore probe writes its document in."""


def pubsub_ready(address: str, timeout_s: float) -> None:
    """Call ``Publisher.ListTopics`` on the Pub/Sub emulator at ``address``."""
    from google.pubsub_v1.types import ListTopicsRequest, ListTopicsResponse  # noqa: PLC0415

    with grpc.insecure_channel(address) as channel:
        call: Any = channel.unary_unary(
            "/google.pubsub.v1.Publisher/ListTopics",
            request_serializer=ListTopicsRequest.serialize,
            response_deserializer=ListTopicsResponse.deserialize,
        )
        call(ListTopicsRequest(project=f"projects/{PROBE_PROJECT}"), timeout=timeout_s)


def firestore_ready(address: str, timeout_s: float) -> None:
    """Commit one document write on the Firestore emulator at ``address``."""
    from google.cloud.firestore_v1.types import (  # noqa: PLC0415 - keeps `import emulator` light
        CommitRequest,
        CommitResponse,
        Document,
        Write,
    )

    database = f"projects/{PROBE_PROJECT}/databases/(default)"
    request = CommitRequest(
        database=database,
        writes=[Write(update=Document(name=f"{database}/documents/ready/probe"))],
    )
    with grpc.insecure_channel(address) as channel:
        call: Any = channel.unary_unary(
            "/google.firestore.v1.Firestore/Commit",
            request_serializer=CommitRequest.serialize,
            response_deserializer=CommitResponse.deserialize,
        )
        call(request, timeout=timeout_s, metadata=[("authorization", "Bearer owner")])


def reset_firestore(address: str, project: str, timeout_s: float = 10.0) -> None:
    """Delete every document of ``project``'s default database on the emulator.

    Uses the emulator's own endpoint
    ``DELETE /emulator/v1/projects/{project}/databases/(default)/documents``.
    Other projects on the same emulator are untouched.
    """
    url = f"http://{address}/emulator/v1/projects/{project}/databases/(default)/documents"
    request = urllib.request.Request(url, method="DELETE")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
        response.read()
