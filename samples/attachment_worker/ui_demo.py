"""The demo, then its worker and emulators kept running for ``pubsub-worker ui``.

``python -m samples.attachment_worker.ui_demo`` (or ``nox -s ui-demo``) runs
the demo (:mod:`samples.attachment_worker.demo`: five attachments transcoded,
a duplicate skipped, a malformed one sent to review), then starts its worker
again on the same emulators and keeps both running until Ctrl-C. It prints
the ``export`` lines for another shell, where ``pubsub-worker ui
--allow-actions`` shows the demo's jobs; a replay from the dashboard's review
queue is then run by this worker (docs/ui.md).
"""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Sequence

from google.cloud import firestore

import pubsub_worker
from emulator import EmulatorError, load_topology, start_emulators

from .demo import JOBS_COLLECTION, PROJECT, TOPOLOGY, run_demo
from .worker import OUTPUT_COLLECTION, OUTPUT_TOPIC, card_settings, make_handler

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    logging.basicConfig(level=logging.ERROR, format="  log: %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pubsub_worker._job.failure").setLevel(logging.CRITICAL)
    print("starting the local Pub/Sub and Firestore emulators...", flush=True)
    try:
        emu = start_emulators(PROJECT)
    except EmulatorError as exc:
        print(f"cannot start the emulators: {exc}", file=sys.stderr)
        return 2
    with emu:
        emu.export_env()
        summary = run_demo(emu, out=lambda line: print(line, flush=True))
        made = emu.bootstrap(load_topology(TOPOLOGY))  # the demo's topology: nothing new
        settings = card_settings(
            project=emu.project,
            subscription=made.subscriptions["attachments-worker"],
            failure_topic=made.topics["attachments-failed"],
            collection=JOBS_COLLECTION,
            shutdown_grace_seconds=5,
        )
        variables = {
            **emu.env(),
            "PUBSUB_WORKER_SUBSCRIPTION": settings.subscription_path,
            "PUBSUB_WORKER_COLLECTION": settings.collection,
            "PUBSUB_WORKER_KEY_ATTRIBUTE": settings.key_attribute or "",
            "PUBSUB_WORKER_FAILURE_TOPIC": settings.failure_topic_path or "",
        }
        print("")
        print("the worker runs again and the emulators stay up (Ctrl-C stops both);")
        print("in another shell:")
        for name, value in variables.items():
            print(f"  export {name}={shlex.quote(value)}")
        print("  pubsub-worker ui --allow-actions   # then open http://127.0.0.1:8000", flush=True)
        client = firestore.Client(project=emu.project)
        handler = make_handler(client.collection(OUTPUT_COLLECTION), made.topics[OUTPUT_TOPIC])
        # run() returns on SIGINT or SIGTERM, after its graceful stop.
        pubsub_worker.run(handler, settings=settings, firestore_client=client)
        client.close()  # type: ignore[no-untyped-call]
    print("emulators stopped")
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
