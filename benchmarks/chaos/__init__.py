"""A seeded chaos run: a fleet of exactly-once workers under mixed faults, every effect counted.

``python -m benchmarks.chaos`` (or ``nox -s chaos``) starts the real
emulators, publishes the jobs, starts the workers with ``pubsub-worker run
benchmarks.chaos.handler:handle`` and kills, freezes, cuts and slows them
from a seeded schedule while work remains. When the fleet is drained it
counts every job, business write, output and message left on the
subscription, prints a summary and writes a JSON report; a broken
invariant exits 1 and names the jobs and the seed. With ``--baseline`` the
same seed runs again against the stock client with a create-only Firestore
marker per message id, and the counts are printed side by side. See
``docs/chaos.md``.

Modules: :mod:`~benchmarks.chaos.handler` (the workers' handler: the
jobs, their effects and counters), :mod:`~benchmarks.chaos.options` (command line),
:mod:`~benchmarks.chaos.schedule` (the seeded faults),
:mod:`~benchmarks.chaos.fleet` (worker processes and their links),
:mod:`~benchmarks.chaos.grpc_proxy` (RPC-level faults),
:mod:`~benchmarks.chaos.ledger` (deliveries and acks at the proxy),
:mod:`~benchmarks.chaos.injector` (carrying the schedule out),
:mod:`~benchmarks.chaos.downstream` (the keyed consumer),
:mod:`~benchmarks.chaos.run` (one run), :mod:`~benchmarks.chaos.parallel`
(runs at the same time), :mod:`~benchmarks.chaos.collect` (reading back),
:mod:`~benchmarks.chaos.verify` (the invariants),
:mod:`~benchmarks.chaos.baseline` (the stock client with a marker per
message id, run instead of the handler), :mod:`~benchmarks.chaos.compare`
(the library and the baseline counted alike), :mod:`~benchmarks.chaos.report`
(the summary).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.chaos.options import CI_SEED, Options, parse_args
    from benchmarks.chaos.run import run_chaos

__all__ = ["CI_SEED", "Options", "main", "parse_args", "run_chaos"]

# The orchestrator's names are imported on first use: a worker process that
# imports benchmarks.chaos.handler loads this package, and not the orchestrator.
_HOMES = {"CI_SEED": "options", "Options": "options", "parse_args": "options", "run_chaos": "run"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def main(argv: list[str] | None = None) -> int:
    """Run every seed of the command line on one pair of emulators; 1 if any run failed."""
    from benchmarks.chaos.__main__ import main as run_main  # noqa: PLC0415

    return run_main(argv)
