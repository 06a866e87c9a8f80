"""The profile round's breakdown: py-spy stacks -> GIL per message, callback threads' time."""

from __future__ import annotations

import gzip
import inspect
from pathlib import Path
from typing import Any

import pytest

from benchmarks.breakdown import CPU_PARTS, WALL_PARTS, breakdown, classify, profile_tables
from benchmarks.profile import load
from benchmarks.targets import stands

_POOL = "thread (0x1): ThreadPoolExecutor-ThreadScheduler_0"
_BOOT = "Thread._bootstrap (threading.py:1002);_worker (concurrent/futures/thread.py:83)"
_CALL = (
    f"{_BOOT};_WorkItem.run (concurrent/futures/thread.py:58);"
    "ExactlyOnce.__call__ (pubsub_worker/wrapper.py:195);DeliveryFlow.run (pubsub_worker/flow.py:1)"
)

CPU = {
    # the claim's write, sent by the callback thread itself
    f"{_POOL};{_CALL};claim (pubsub_worker/_job/claim.py:9);BatchingFirestoreJobStore.create "
    "(pubsub_worker/stores/batching.py:1);WriteBatcher.submit (pubsub_worker/stores/batching.py:2);"
    "WriteBatcher._run (pubsub_worker/stores/batching.py:3);"
    "WriteBatcher._send (pubsub_worker/stores/batching.py:4)": 30,
    # building the completion's write
    f"{_POOL};{_CALL};JobCore.complete (pubsub_worker/_job/core.py:1);"
    "update_write (pubsub_worker/stores/_writes.py:5)": 20,
    # a step
    f"{_POOL};{_CALL};Job.step (pubsub_worker/job.py:2);dumps (json/__init__.py:1)": 5,
    # the wrapper's own bookkeeping
    f"{_POOL};{_CALL};DeliveryTracker.register (pubsub_worker/deliveries.py:1)": 10,
    # the harness
    "thread (0x2): MainThread;_Consumer.flush_forever (benchmarks/consumer.py:1)": 3,
    # the client's dispatcher
    "thread (0x3): Thread-ConsumeBidirectionalStream;Dispatcher.ack "
    "(google/cloud/pubsub_v1/subscriber/_protocol/dispatcher.py:1)": 12,
}
WALL = {
    f"{_POOL};{_BOOT}": 40,  # idle in the pool, waiting for a message
    f"{_POOL};{_CALL};claim (pubsub_worker/_job/claim.py:9);Event.wait (threading.py:1)": 30,
    f"{_POOL};{_CALL};JobCore.complete (pubsub_worker/_job/core.py:1);"
    "Event.wait (threading.py:1)": 25,
    f"{_POOL};{_CALL};DeliveryTracker.register (pubsub_worker/deliveries.py:1)": 5,
    # not a callback thread: left out of the wall figures
    "thread (0x3): Thread-ConsumeBidirectionalStream;Dispatcher.ack "
    "(google/cloud/pubsub_v1/subscriber/_protocol/dispatcher.py:1)": 99,
}


def _write(folder: Path, label: str, mode: str, stacks: dict[str, int], zipped: bool) -> None:
    text = "".join(f"{stack} {count}\n" for stack, count in stacks.items())
    if zipped:
        (folder / f"{label}-{mode}.txt.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (folder / f"{label}-{mode}.txt").write_text(text)


def test_gil_time_per_message_and_callback_threads_time_by_part(tmp_path: Path) -> None:
    _write(tmp_path, "profile-wrapped-1-p0", "cpu", CPU, zipped=False)
    _write(tmp_path, "profile-wrapped-1-p0", "wall", WALL, zipped=False)
    found = breakdown(tmp_path, "profile-wrapped-1-p0", messages=100)
    assert found is not None
    assert found["dropped"] == {"cpu": None, "wall": None}  # py-spy's words not kept
    assert found["samples"] == {"cpu": 80, "wall": 100}
    # 10 ms a sample, over 100 messages
    assert found["cpu"] == pytest.approx(
        {
            "send": 3.0,
            "writes": 2.0,
            "handler": 0.5,
            "bookkeeping": 1.0,
            "harness": 0.3,
            "client": 1.2,
            "total": 8.0,
        }
    )
    assert found["wall"] == pytest.approx(
        {"idle": 0.40, "claim": 0.30, "complete": 0.25, "steps": 0.0, "ack": 0.0, "other": 0.05}
    )


def test_a_missing_profile_or_no_message_gives_no_breakdown(tmp_path: Path) -> None:
    _write(tmp_path, "p", "cpu", CPU, zipped=False)
    assert breakdown(tmp_path, "p", messages=100) is None  # no wall profile
    _write(tmp_path, "p", "wall", WALL, zipped=False)
    assert breakdown(tmp_path, "p", messages=0) is None


def test_a_published_gzipped_profile_reads_like_the_raw_one(tmp_path: Path) -> None:
    _write(tmp_path, "raw", "cpu", CPU, zipped=False)
    _write(tmp_path, "published", "cpu", CPU, zipped=True)
    raw = load(tmp_path / "raw-cpu.txt")
    published = load(tmp_path / "published-cpu.txt.gz")
    assert published.stacks == raw.stacks
    assert raw.samples == 80


def test_the_stock_callback_counts_as_the_handler_and_its_ack() -> None:
    stack = ["_worker (concurrent/futures/thread.py)", "_wrap_callback_errors (x.py)", "f (a.py)"]
    assert classify(stack, CPU_PARTS) == "handler"
    waiting = [*stack, "Future.result (concurrent/futures/_base.py)"]
    assert classify(waiting, WALL_PARTS) == "ack"


def _report(**profiled: dict[str, Any]) -> dict[str, Any]:
    return {"profiled": {n: {"breakdown": b} for n, b in profiled.items()}, "summary": {}}


def test_what_stands_in_the_way_quotes_the_session_profiles() -> None:
    wall = {"idle": 0.35, "claim": 0.33, "complete": 0.31, "steps": 0.0, "ack": 0.0, "other": 0.01}
    cpu = {
        "send": 0.3,
        "writes": 0.4,
        "handler": 0.1,
        "bookkeeping": 0.3,
        "harness": 0.1,
        "client": 0.4,
        "total": 1.6,
    }
    stock = {**dict.fromkeys(cpu, 0.0), "client": 0.3, "total": 0.4}
    report = _report(
        **{
            "wrapped-1": {"wall": wall, "cpu": cpu},
            "stock-eod": {"wall": wall, "cpu": stock},
            "wrapped-1-c100": {"wall": wall, "cpu": cpu},
            "stock-eod-c100": {"wall": wall, "cpu": stock},
        }
    )
    assert stands(report, "ten") == (
        "`wrapped-1`'s callback threads (wall profile): waiting for a message 35%, "
        "claim's write 33%, completion's write 31% (a slot is held until the ack is answered)"
    )
    assert "`wrapped-1` 1.60 ms" in stands(report, "cpu")
    assert "against `stock-eod` 0.40 ms" in stands(report, "cpu")
    assert stands(report, "best").endswith("one process tops out near 625 msg/s")
    assert stands(report, "default") == "(no profile in this session)"


def test_the_profile_tables_show_each_profiled_scenario_and_skip_a_missing_profile(
    tmp_path: Path,
) -> None:
    _write(tmp_path, "profile-wrapped-1-p0", "cpu", CPU, zipped=False)
    _write(tmp_path, "profile-wrapped-1-p0", "wall", WALL, zipped=False)
    (tmp_path / "profile-wrapped-1-p0-cpu.sampling").write_text(
        "py-spy> Stopped sampling because Control-C pressed\n"
        "py-spy> Wrote raw flamegraph data to 'x.txt'. Samples: 80 Errors: 57\n"
    )
    found = breakdown(tmp_path, "profile-wrapped-1-p0", messages=100)
    assert found is not None
    assert found["dropped"] == {"cpu": 57, "wall": None}
    phases = {"backlog": {"consumer_cpu_s": [0.25], "messages": 100, "msgs_per_s": 1234.0}}
    report = {
        "profiled": {
            "wrapped-1": {"breakdown": found, "phases": phases},
            "stock-eod": {"breakdown": None, "phases": phases},  # py-spy wrote nothing
        }
    }
    lines = profile_tables(report)
    assert "| | `wrapped-1` |" in lines
    assert not any("stock-eod" in line for line in lines)
    assert "| **GIL in all** | **8.00** |" in lines
    assert "| consumer CPU in this run (all threads) | 2.50 |" in lines
    assert "| msg/s in this run | 1,234 |" in lines
    assert "| samples holding the GIL (dropped), messages | 80 (57), 100 |" in lines
    assert "| GIL in all, dropped samples included | 13.70 |" in lines  # 137 samples
    assert found["samples"]["cpu"] == 80  # 8.00 ms a message of 10 ms samples, 100 messages
    assert "| the claim's write | 30.0% |" in lines
    assert profile_tables({"profiled": {}}) == []


def test_run_defaults_are_bound_by_their_slots() -> None:
    """`run()`'s slots are held from receipt to the ack's answer: their count over that time."""
    row = {"slot_mean_ms": 40.0, "in_flight_limit": 20, "msgs_per_s": {"median": 450.0}}
    report = {"profiled": {}, "summary": {"run-1": row}}
    assert stands(report, "ten", "run-1") == (
        "its 20 flow-control slots, each held 40.0 ms from receipt to the ack's answer: "
        "at most 500 msg/s, measured 450"
    )
    assert stands(report, "ten") == "(no profile in this session)"  # the fixed setup's own


def test_a_fleet_that_stops_growing_names_the_cpu_the_cores_allow() -> None:
    row = {
        "cpu_ms_per_msg": {"consumer": 2.0, "firestore_emulator": 0.4, "pubsub_emulator": 0.1},
        "msgs_per_s": {"median": 700.0},
        "machine_busy": 0.89,
    }
    report = {"profiled": {}, "summary": {"wrapped-1-p4": row}, "machine": {"cpus": 2}}
    assert stands(report, "fleet") == (
        "the cores: `wrapped-1-p4` used 2.50 ms of CPU per message (consumers 2.00, "
        "emulators 0.50), so 2 cores allow at most 800 msg/s; measured 700 with the machine "
        "89% busy"
    )


def _frame(fn: Any) -> str:
    """A py-spy frame of ``fn``, as the profiles name it: ``Qual.name (package/path.py:1)``."""
    path = Path(inspect.getsourcefile(fn) or "").resolve()
    return f"{fn.__qualname__} ({path.relative_to(Path(__file__).resolve().parents[2])}:1)"


def test_the_parts_match_the_library_s_functions_where_they_are() -> None:
    """The parts match py-spy frames by name and file: a function renamed or moved would leave
    its part at 0% without an error (the claim's did, after the package's layout moved)."""
    from pubsub_worker._job import claim
    from pubsub_worker._job.core import JobCore
    from pubsub_worker._job.job import Job
    from pubsub_worker._worker import claiming
    from pubsub_worker._worker.flow import DeliveryFlow
    from pubsub_worker._worker.wrapper import ExactlyOnce
    from pubsub_worker.stores._batcher import WriteBatcher

    call = _frame(ExactlyOnce.__call__)
    claimed = [call, _frame(DeliveryFlow._claim), _frame(claiming.claim_job), _frame(claim.claim)]
    assert classify(claimed, WALL_PARTS) == "claim"
    completed = [call, _frame(DeliveryFlow.conclude), _frame(JobCore.complete)]
    assert classify(completed, WALL_PARTS) == "complete"
    assert classify([call, _frame(Job.step), _frame(JobCore.run_step)], WALL_PARTS) == "steps"
    completer = [_frame(DeliveryFlow._conclude_guarded), _frame(JobCore.complete)]
    assert classify(completer, CPU_PARTS) == "bookkeeping"
    assert classify([*completer, _frame(WriteBatcher.submit)], CPU_PARTS) == "writes"
    assert classify([_frame(WriteBatcher._send)], CPU_PARTS) == "send"
