"""The scenarios a benchmark run compares, all on the same emulators and settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BASELINE", "DEFAULT_SCENARIOS", "SCENARIOS", "Scenario"]

Kind = Literal["stock-ack", "stock-eod", "wrapped"]
StoreKind = Literal["default", "direct", "batched"]


@dataclass(frozen=True)
class Scenario:
    """One consumer configuration."""

    name: str
    kind: Kind
    eod: bool
    """The subscription has exactly-once delivery."""
    label: str
    """How the report names it."""
    steps: int = 0
    """Steps of the wrapped handler."""
    store: StoreKind = "default"
    """``default``: what ``exactly_once`` builds; ``direct``: one RPC per write;
    ``batched``: concurrent writes coalesced into BatchWrite RPCs."""
    batching: Mapping[str, Any] = field(default_factory=dict)
    """Options of ``BatchingFirestoreJobStore`` for ``store="batched"``."""


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("stock-ack", "stock-ack", eod=False, label="stock, `message.ack()`, no EOD"),
        Scenario(
            "stock-eod", "stock-eod", eod=True, label="stock, EOD, awaited `ack_with_response()`"
        ),
        Scenario("wrapped-1", "wrapped", eod=True, steps=1, label="`exactly_once`, 1 step, EOD"),
        Scenario("wrapped-3", "wrapped", eod=True, steps=3, label="`exactly_once`, 3 steps, EOD"),
        Scenario(
            "wrapped-1-direct",
            "wrapped",
            eod=True,
            steps=1,
            store="direct",
            label="`exactly_once`, 1 step, EOD, `FirestoreJobStore` (one RPC per write)",
        ),
        Scenario(
            "wrapped-1-batched",
            "wrapped",
            eod=True,
            steps=1,
            store="batched",
            label="`exactly_once`, 1 step, EOD, `BatchingFirestoreJobStore` defaults",
        ),
        Scenario(
            "wrapped-1-batched-1",
            "wrapped",
            eod=True,
            steps=1,
            store="batched",
            batching={"max_in_flight": 1},
            label="`exactly_once`, 1 step, EOD, BatchWrite, 1 batch in flight",
        ),
        Scenario(
            "wrapped-1-batched-linger",
            "wrapped",
            eod=True,
            steps=1,
            store="batched",
            batching={"linger_s": 0.001},
            label="`exactly_once`, 1 step, EOD, BatchWrite, 1 ms linger",
        ),
    )
}

BASELINE = "stock-eod"
"""Ratios are against this scenario, measured in the same repeat."""

DEFAULT_SCENARIOS = ("stock-ack", "stock-eod", "wrapped-1", "wrapped-1-direct", "wrapped-3")
