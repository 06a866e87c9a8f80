"""Where a delivery's Python calls go, phase by phase: ``python -m benchmarks.phases``.

Hands ``--messages`` one-step deliveries to the wrapper on the in-memory
store, one after another on one thread (as :mod:`benchmarks.inprocess` does),
with a ``sys.setprofile`` hook that counts every call, Python functions and
built-ins alike, and charges it to the innermost phase of the delivery it runs
under: a phase is one of the library's functions listed in :data:`PHASES`
(the claim, the step, the completion's write, settling on Pub/Sub...), and
what runs under none of them is charged to ``receipt`` when it runs in the
wrapper's own frames. It prints the calls per message of each phase, most
first, and their total (the fake message's ack, its future and its callback
are counted under ``settle``, where the wrapper calls them).

Counts are the same from run to run on the same code (within a few calls when an
OpenTelemetry SDK is set and records spans): what a change to the per-message
path removes or adds shows here, phase by phase, where CPU figures need repeats
(``docs/benchmarks-history.md``, "The per-message path, fourth pass"). Nothing here
is a test or a target.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import Any

from pubsub_worker._delivery.generations import DeliveryTracker
from pubsub_worker._delivery.lease import LeaseKeeper
from pubsub_worker._job.core import JobCore
from pubsub_worker._worker import claiming, report, settle, writes
from pubsub_worker._worker.engine import Engine
from pubsub_worker._worker.flow import DeliveryFlow
from pubsub_worker._worker.handler import HandlerCall
from pubsub_worker._worker.wrapper import ExactlyOnce

from .inprocess import _Message, _started_wrapper

__all__ = ["PHASES", "RECEIPT", "main", "phase_calls"]

RECEIPT = "receipt"
"""The phase of everything a delivery runs under none of :data:`PHASES`' functions."""

PHASES: dict[str, tuple[Callable[..., Any], ...]] = {
    RECEIPT: (
        ExactlyOnce.__call__,
        Engine.deliver,
        DeliveryFlow.__init__,
        DeliveryTracker.register,
        LeaseKeeper.watch,
    ),
    "identity": (claiming.identify,),
    "order and gate": (claiming.wait_for_order, claiming.enter_gate),
    "claim": (DeliveryFlow._claim,),
    "start": (DeliveryFlow._start,),
    "handler": (HandlerCall.__call__,),
    "step": (JobCore.run_step,),
    "conclusion": (
        DeliveryFlow.conclude_later,
        DeliveryFlow._conclude_continued,
        DeliveryFlow._completed,
        DeliveryFlow.conclude,
        DeliveryFlow._decided,
        DeliveryFlow.carry_out,
        DeliveryFlow._carried_out,
        DeliveryFlow._write_or_redecide,
    ),
    "completion write": (writes.write_for,),
    "report": (report.count, report.ended),
    "settle": (settle.settle_delivery,),
    "end": (DeliveryFlow.end,),
}
"""Each phase and the library functions that open it (a call under one is charged to the
innermost phase open)."""


def _codes() -> dict[CodeType, str]:
    return {fn.__code__: phase for phase, fns in PHASES.items() for fn in fns}


def phase_calls(messages: int) -> dict[str, float]:
    """Calls per message of each phase, over ``messages`` one-step deliveries (each acked)."""
    wrapped = _started_wrapper()
    try:
        for n in range(min(messages, 200)):  # warm-up: first-time paths out of the count
            wrapped(_Message(-1 - n))
        batch = [_Message(n) for n in range(messages)]
        counts: collections.Counter[str] = collections.Counter()
        opened = _codes()
        stack: list[str] = []

        def hook(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call":
                current = stack[-1] if stack else None
                if current is not None:
                    counts[current] += 1
                stack.append(opened.get(frame.f_code, current or RECEIPT))
                if current is None:  # the delivery's own first call
                    counts[stack[-1]] += 1
            elif event == "return":
                if stack:
                    stack.pop()
            elif event == "c_call" and stack:
                counts[stack[-1]] += 1

        for message in batch:
            sys.setprofile(hook)
            try:
                wrapped(message)
            finally:
                sys.setprofile(None)
            stack.clear()
    finally:
        wrapped.close()
    if not all(message.acked for message in batch):
        raise AssertionError("a message was not acked")
    return {phase: count / messages for phase, count in counts.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.phases", description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error(f"--messages must be at least 1, got {args.messages}")
    logging.getLogger("pubsub_worker").setLevel(logging.WARNING)
    calls = phase_calls(args.messages)
    print(f"Calls per message by phase ({args.messages} one-step deliveries, in-memory store):")
    for phase, count in sorted(calls.items(), key=lambda item: (-item[1], item[0])):
        print(f"{count:8.1f}  {phase}")
    print(f"{sum(calls.values()):8.1f}  in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
