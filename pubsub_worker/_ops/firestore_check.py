"""``pubsub-worker config``'s checks of Firestore: that it answers, and the set-up the job
layout needs on real Firestore (TTL policy, composite indexes, index exemptions), read
through the Admin API, or given as hints with their commands
(:mod:`pubsub_worker.stores.layout`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as gexc

from pubsub_worker._support import clients
from pubsub_worker.errors import Unreachable
from pubsub_worker.settings import Settings
from pubsub_worker.stores.layout import (
    DASHBOARD_INDEXES,
    EXEMPT_FIELDS,
    dashboard_index_hints,
    exemption_hints,
    index_command,
    index_commands,
    index_hints,
    ttl_command,
)

from .findings import Check, Level

__all__ = ["firestore_answers", "firestore_setup"]

_TIMEOUT_S = 10.0


def firestore_answers(settings: Settings, client: Any) -> Check:
    try:
        clients.check_firestore(client, settings)
    except Unreachable as exc:
        return Check("Firestore", Level.PROBLEM, str(exc))
    except gexc.GoogleAPICallError as exc:
        return Check("Firestore", Level.PROBLEM, f"{type(exc).__name__}: {exc}")
    where = settings.firestore_emulator_host or os.environ.get("FIRESTORE_EMULATOR_HOST")
    at = f"the emulator at {where}" if where else f"project {settings.project_id}"
    return Check("Firestore", Level.OK, f"answers ({at}, collection {settings.collection})")


def firestore_setup(settings: Settings, admin: Callable[[], Any] | None) -> list[Check]:
    """TTL policy, listing indexes and index exemptions: read through the Admin API, else hints."""
    collection = settings.collection
    ttl_hint = (
        f"documents carry expire_at ({settings.retention_days} days after their last claim); "
        f"point a TTL policy at it: {ttl_command(collection)}"
    )
    index_hint = "`jobs list` needs two composite indexes: " + "; ".join(index_commands(collection))
    ui_hint = "`pubsub-worker ui`'s review queue needs one more: " + "; ".join(
        index_command(collection, i) for i in DASHBOARD_INDEXES
    )
    exempt_hint = (
        f"{len(EXEMPT_FIELDS)} fields no query reads should be exempt from single-field "
        "indexing (docs/operations.md, Capacity)"
    )
    if admin is None:
        return [
            Check("TTL policy", Level.HINT, ttl_hint + " (not checked: the emulator has no TTL)"),
            Check("indexes", Level.HINT, index_hint + " (the emulator needs none)"),
            Check("dashboard indexes", Level.HINT, ui_hint + " (the emulator needs none)"),
            Check(
                "index exemptions",
                Level.HINT,
                "does not apply to the emulator, which enforces none of Firestore's write "
                f"limits; on real Firestore {exempt_hint}",
            ),
        ]
    parent = f"projects/{settings.project_id}/databases/(default)/collectionGroups/{collection}"
    try:
        client = admin()
        field = client.get_field(name=f"{parent}/fields/expire_at", timeout=_TIMEOUT_S)
        indexes = list(client.list_indexes(parent=parent, timeout=_TIMEOUT_S))
        overrides = list(
            client.list_fields(
                request={"parent": parent, "filter": "indexConfig.usesAncestorConfig:false"},
                timeout=_TIMEOUT_S,
            )
        )
    except (gexc.GoogleAPICallError, gexc.RetryError, ImportError, ValueError) as exc:
        why = f" (could not check: {type(exc).__name__}: {exc})"
        return [
            Check("TTL policy", Level.HINT, ttl_hint + why),
            Check("indexes", Level.HINT, index_hint + why),
            Check("dashboard indexes", Level.HINT, ui_hint + why),
            Check("index exemptions", Level.HINT, exempt_hint + why),
        ]
    state = getattr(getattr(getattr(field, "ttl_config", None), "state", None), "name", "")
    ttl = (
        Check("TTL policy", Level.OK, f"on expire_at ({state.lower()})")
        if state in ("ACTIVE", "CREATING")
        else Check("TTL policy", Level.HINT, ttl_hint)
    )
    # A hint per missing index or exemption, each with its command; one ok when none.
    indexed = [Check("indexes", Level.HINT, hint) for hint in index_hints(collection, indexes)]
    exempt = [
        Check("index exemptions", Level.HINT, hint)
        for hint in exemption_hints(collection, overrides)
    ]
    hints = dashboard_index_hints(collection, indexes)
    dashboard = [Check("dashboard indexes", Level.HINT, hint) for hint in hints]
    all_exempt = f"the {len(EXEMPT_FIELDS)} fields no query reads are not indexed"
    ui_ok = "the composite index of `pubsub-worker ui` exists"
    return [
        ttl,
        *(indexed or [Check("indexes", Level.OK, "both composite indexes of `jobs list` exist")]),
        *(dashboard or [Check("dashboard indexes", Level.OK, ui_ok)]),
        *(exempt or [Check("index exemptions", Level.OK, all_exempt)]),
    ]
