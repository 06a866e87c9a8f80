"""``python -m benchmarks.chaos``: see :mod:`benchmarks.chaos` and ``--help``."""

from __future__ import annotations

import dataclasses
import functools
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from benchmarks.chaos.options import Options, parse_args
from benchmarks.chaos.parallel import Prefixed, run_threads
from benchmarks.chaos.report import render, write_json
from benchmarks.chaos.run import PROJECT, STOP, run_chaos

__all__ = ["main"]


def _run_all(runs: list[Options], emulators: Any, parallel: bool) -> list[dict[str, Any]]:
    if not parallel or len(runs) == 1:
        reports = []
        for options in runs:
            print(f"chaos: seed {options.seed} ({options.command})", file=sys.stderr, flush=True)
            reports.append(run_chaos(options, emulators=emulators))
            sys.stdout.write(render(reports[-1]) + "\n")
            sys.stdout.flush()
        return reports
    runs = [dataclasses.replace(o, live=False) for o in runs]
    for options in runs:
        print(f"chaos: seed {options.seed} ({options.command})", file=sys.stderr, flush=True)
    calls = [
        functools.partial(
            run_chaos, o, emulators=emulators, out=Prefixed(sys.stderr, f"[seed {o.seed}] ")
        )
        for o in runs
    ]
    reports = run_threads(calls, [f"chaos-{o.seed}" for o in runs], STOP)
    for report in reports:
        sys.stdout.write(render(report) + "\n")
    sys.stdout.flush()
    return reports


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run each seed on the same emulators; print the summaries; 1 if any run failed."""
    from emulator import start_emulators  # noqa: PLC0415
    from emulator.errors import EmulatorError  # noqa: PLC0415

    runs = parse_args(argv)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # clean up as on Ctrl-C
    try:
        emulators = start_emulators(project=PROJECT)
    except EmulatorError as exc:
        print(f"chaos: the emulators cannot start: {exc}", file=sys.stderr)
        return 2
    try:
        with emulators:
            emulators.export_env()  # the orchestrator's own clients talk to them directly
            print(f"chaos: emulators ready in {emulators.startup_s:.1f} s", file=sys.stderr)
            reports = _run_all(runs, emulators, runs[0].parallel)
    except KeyboardInterrupt as exc:
        # Every run's clean-up has run by now: workers, proxies, emulators are gone.
        print(f"\nchaos: interrupted ({exc or 'SIGINT'}); every process stopped", file=sys.stderr)
        return 130
    json_path = runs[0].json_path
    if json_path is not None:
        write_json(json_path, reports)
        print(f"chaos: wrote {json_path}", file=sys.stderr)
    failed = [r["seed"] for r in reports if not r["ok"]]
    total = time.monotonic() - started
    if failed:
        print(f"chaos: FAILED for seed(s) {failed} in {total:.0f} s", file=sys.stderr)
        return 1
    seeds = [r["seed"] for r in reports]
    print(f"chaos: every invariant held for seed(s) {seeds} in {total:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
