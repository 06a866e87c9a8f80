"""The jobs of a run, and the publisher that feeds them to the fleet at a steady rate."""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from typing import Any

from benchmarks.chaos.options import Options

__all__ = ["KEY_ATTRIBUTE", "Feeder", "job_specs"]

KEY_ATTRIBUTE = "job"
"""The message attribute that carries the job key (``PUBSUB_WORKER_KEY_ATTRIBUTE``)."""


def job_specs(options: Options) -> dict[str, dict[str, Any]]:
    """The jobs, by key: durations and poison, drawn from the seed."""
    rng = random.Random(f"{options.seed}:jobs")
    width = len(str(options.jobs))
    specs: dict[str, dict[str, Any]] = {}
    for index in range(options.jobs):
        specs[f"job-{index:0{width}d}"] = {
            "prepare_ms": rng.randint(*options.prepare_ms),
            "emit_ms": rng.randint(*options.emit_ms),
            "poison": rng.random() < options.poison_ratio,
        }
    return specs


class Feeder:
    """Publishes the jobs on a daemon thread, ``rate`` per second (all at once for 0).

    A steady arrival is also what spreads the work over the fleet: the
    emulator ignores the subscriber's flow control and hands a backlog out
    in batches of 100 to whichever streams come first, which then hold what
    they cannot run yet while the other workers idle.
    """

    def __init__(self, topic: str, specs: dict[str, dict[str, Any]], rate: float) -> None:
        self._topic = topic
        self._specs = specs
        self._rate = rate
        self._lock = threading.Lock()  # guards _published
        self._published: dict[str, str] = {}  # message id -> job key
        self._failure: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-feeder", daemon=True)

    def start(self) -> None:
        """Start publishing."""
        self._thread.start()

    def stop(self) -> None:
        """Stop publishing; wait for what was sent to be confirmed. Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=70)

    def published(self) -> dict[str, str]:
        """Message id to job key, of every job published so far."""
        with self._lock:
            return dict(self._published)

    @property
    def failure(self) -> BaseException | None:
        """What made publishing fail, if it did."""
        return self._failure[0] if self._failure else None

    def _run(self) -> None:
        import google.cloud.pubsub_v1 as pubsub_v1  # noqa: PLC0415

        publisher = pubsub_v1.PublisherClient()
        futures = []
        started = time.monotonic()
        try:
            for index, (key, spec) in enumerate(self._specs.items()):
                if self._rate > 0:
                    delay = started + index / self._rate - time.monotonic()
                    if delay > 0 and self._stop.wait(delay):
                        break
                future = publisher.publish(
                    self._topic, json.dumps(spec).encode(), **{KEY_ATTRIBUTE: key}
                )
                future.add_done_callback(functools.partial(self._done, key))
                futures.append(future)
            for future in futures:
                future.result(timeout=60)
        except Exception as exc:  # noqa: BLE001 - the run's main loop reports it
            self._failure.append(exc)
        finally:
            publisher.stop()

    def _done(self, key: str, future: Any) -> None:
        if future.exception() is None:
            with self._lock:
                self._published[future.result()] = key
