"""Push endpoint: requests per second and CPU per request, against a bare handler.

``python -m benchmarks.push`` starts the real emulators, then, for each
scenario, a uvicorn server in a process of its own (one worker, the same
settings), and POSTs Pub/Sub's wrapped envelopes to it from this process:
``--concurrency`` requests in flight, ``--requests`` of them after a
warm-up, each a new message (its own job key). The server's CPU comes from
``/proc`` (user + system, its whole process), the emulators' likewise.

=================  ===========================================================================
scenario           the server
=================  ===========================================================================
``bare``           an ASGI app that reads the envelope (:func:`pubsub_worker.push.envelope.parse`)
                   and calls the handler's work directly: what a hand-written endpoint does
``push-memory``    :func:`pubsub_worker.push.create_app` on the in-memory store: the library's
                   own cost (claim, step record, completion), no RPC
``push-firestore``  the same on the Firestore emulator (the default batching store): the cost
                   as deployed, two writes per one-step job
=================  ===========================================================================

::

    python -m benchmarks.push                            # 3 repeats of 2000 requests each
    python -m benchmarks.push --requests 500 --repeats 1 # a smoke run
    python -m benchmarks.push serve bare --port 8080     # one server, by hand
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from benchmarks.machine import machine, process_cpu_s

__all__ = ["SCENARIOS", "main", "make_app", "run_scenario"]

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("bare", "push-memory", "push-firestore")
SUBSCRIPTION = "bench-push"
PROJECT = "pubsub-worker-bench"


def work(data: bytes) -> int:
    """The handler's work, the same in every scenario: trivial, so the overhead shows."""
    return len(data)


def handle(message: Any, job: Any) -> None:
    """The job-style handler the push scenarios serve: one step doing :func:`work`."""
    job.step("work", lambda: work(message.data))


# -- the servers -------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def bare_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Parse the envelope, do the work, answer 200: the baseline."""
    from pubsub_worker.push.envelope import parse  # noqa: PLC0415

    if scope["type"] != "http":
        return
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            break
    headers = {bytes(k).decode().lower(): bytes(v).decode() for k, v in scope["headers"]}
    work(parse(headers, b"".join(chunks)).data)
    body = b'{"outcome": "complete"}'
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def make_app(scenario: str) -> Any:
    """The ASGI app of ``scenario`` (settings from the environment for the push ones)."""
    if scenario == "bare":
        return bare_app
    import pubsub_worker  # noqa: PLC0415
    from pubsub_worker.push import create_app  # noqa: PLC0415

    settings = pubsub_worker.Settings.from_env()
    if scenario == "push-memory":
        return create_app(handle, settings=settings, store=pubsub_worker.MemoryJobStore())
    return create_app(handle, settings=settings)


def serve(scenario: str, port: int) -> None:
    """Serve ``scenario`` on 127.0.0.1:``port`` until SIGTERM."""
    import uvicorn  # noqa: PLC0415

    uvicorn.run(
        make_app(scenario), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )


# -- the load ----------------------------------------------------------------------------


def envelope(n: int, run: str) -> bytes:
    message_id = f"{run}-{n}"
    return json.dumps(
        {
            "message": {
                "data": base64.b64encode(b'{"order_id": "%d"}' % n).decode(),
                "attributes": {"op": message_id},
                "messageId": message_id,
                "publishTime": "2026-12-01T09:35:32.123Z",
            },
            "subscription": f"projects/{PROJECT}/subscriptions/{SUBSCRIPTION}",
        }
    ).encode()


async def load(port: int, requests: int, concurrency: int, run: str) -> tuple[float, list[float]]:
    """POST ``requests`` envelopes, ``concurrency`` at once; (seconds, latencies in s)."""
    import httpx  # noqa: PLC0415

    latencies: list[float] = []
    counter = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=60
    ) as client:

        async def worker() -> None:
            for n in counter:
                started = time.perf_counter()
                answer = await client.post(
                    "/", content=envelope(n, run), headers={"content-type": "application/json"}
                )
                if answer.status_code != 200:
                    raise RuntimeError(f"answered {answer.status_code}: {answer.text}")
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, latencies


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not listen within 30 s")


def run_scenario(
    scenario: str, *, requests: int, concurrency: int, env: dict[str, str], run: str
) -> dict[str, Any]:
    """One server, a warm-up, then ``requests`` measured; its figures."""
    port = _free_port()
    command = [sys.executable, "-m", "benchmarks.push", "serve", scenario, "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env})
    try:
        _wait_listening(port, process)
        asyncio.run(load(port, min(200, requests), concurrency, f"{run}-warm"))
        cpu_before = process_cpu_s(process.pid)
        seconds, latencies = asyncio.run(load(port, requests, concurrency, run))
        cpu_s = process_cpu_s(process.pid) - cpu_before
    finally:
        process.terminate()
        process.wait(timeout=30)
    latencies.sort()
    return {
        "scenario": scenario,
        "requests": requests,
        "per_s": requests / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "cpu_ms": 1000 * cpu_s / requests,
    }


def report(rows: list[dict[str, Any]], concurrency: int) -> str:
    """The markdown table: medians over the repeats, each against ``bare``."""
    by: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault(row["scenario"], []).append(row)

    def median(scenario: str, field: str) -> float:
        return float(statistics.median(float(r[field]) for r in by[scenario]))

    lines = [
        f"| scenario ({concurrency} in flight) | requests/s | vs bare | p50 ms | p99 ms "
        "| server CPU ms/request | vs bare | Firestore emulator CPU ms/request |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scenario in by:
        per_s, cpu = median(scenario, "per_s"), median(scenario, "cpu_ms")
        lines.append(
            f"| `{scenario}` | {per_s:.0f} | {per_s / median('bare', 'per_s'):.0%} "
            f"| {median(scenario, 'p50_ms'):.1f} | {median(scenario, 'p99_ms'):.1f} "
            f"| {cpu:.2f} | {cpu / median('bare', 'cpu_ms'):.1f}x "
            f"| {median(scenario, 'firestore_cpu_ms'):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or ``serve`` one scenario)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.push", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    serve_p = commands.add_parser("serve", help="serve one scenario")
    serve_p.add_argument("scenario", choices=SCENARIOS)
    serve_p.add_argument("--port", type=int, default=8080)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.scenario, args.port)
        return 0
    from emulator import start_emulators  # noqa: PLC0415

    scenarios = [s for s in args.scenarios.split(",") if s]
    rows: list[dict[str, Any]] = []
    with start_emulators(project=PROJECT) as emu:
        env = {
            **emu.env(),
            "PUBSUB_WORKER_SUBSCRIPTION": SUBSCRIPTION,
            "PUBSUB_WORKER_COLLECTION": f"bench_push_{os.getpid()}",
            "PUBSUB_WORKER_KEY_ATTRIBUTE": "op",
            "PUBSUB_WORKER_LEASE_SECONDS": "60",
            "PUBSUB_WORKER_MAX_MESSAGES": str(args.concurrency),
            "PUBSUB_WORKER_PUSH_VERIFY_TOKEN": "false",
        }
        firestore_pid = emu.pids.get("firestore")
        for repeat in range(1, args.repeats + 1):
            for scenario in scenarios:
                before = process_cpu_s(firestore_pid) if firestore_pid else 0.0
                row = run_scenario(
                    scenario,
                    requests=args.requests,
                    concurrency=args.concurrency,
                    env=env,
                    run=f"r{repeat}-{scenario}",
                )
                if firestore_pid:
                    used = process_cpu_s(firestore_pid) - before
                    row["firestore_cpu_ms"] = 1000 * used / args.requests
                rows.append(row)
                print(
                    f"r{repeat} {scenario}: {row['per_s']:.0f} req/s, p50 {row['p50_ms']:.1f} ms, "
                    f"p99 {row['p99_ms']:.1f} ms, server CPU {row['cpu_ms']:.2f} ms/request",
                    flush=True,
                )
    facts = machine()
    print(f"\n{facts['cpus']} CPUs, {facts['cpu_model']}, Python {facts['python']}")
    print(report(rows, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
