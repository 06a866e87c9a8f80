"""``python -m benchmarks.inprocess --threads N --store firestore``: on the emulator."""

from __future__ import annotations

import re
from typing import Any

import pytest

from benchmarks import inprocess
from benchmarks.inprocess import run_threaded


def test_the_wrapper_on_firestore_writes_every_message_in_shared_rpcs(
    firestore_client: Any,
) -> None:
    # run_threaded raises unless every message was acked and every ack answered
    run = run_threaded(40, 4, side="wrapped", client=firestore_client)
    assert run.cpu_ms > 0
    assert run.switches > 0  # each message waits for its writes at least
    # two writes a message (claim, completion), at most one RPC each, and some share one
    assert 0 < run.rpcs <= 2
    if run.cpu_ms_by_role:  # Linux: the callbacks build and wait for the writes
        assert run.cpu_ms_by_role["callbacks"] > 0


def test_the_floor_on_firestore_writes_both_writes_of_every_message(
    firestore_client: Any,
) -> None:
    # the floor waits for each of its two writes: at most one RPC each, every message acked
    run = run_threaded(40, 4, side="floor", client=firestore_client)
    assert 0 < run.rpcs <= 2


def test_the_side_by_side_report_names_the_store_and_the_rpcs(
    firestore_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert inprocess._side_by_side(30, 2, 1, firestore_client, floor=True) == 0
    out = capsys.readouterr().out
    assert "\nthe floor (the same writes" in out
    assert re.search(r" context switches, BatchWrite RPCs \d+\.\d\d$", out.rstrip())
    assert "on the batching Firestore store" in out
    assert "context switches per message: stock " in out
    assert "BatchWrite RPCs per message " in out
    assert "the wrapper by thread, CPU ms / context switches per message: " in out


def test_firestore_needs_callback_threads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        inprocess.main(["--store", "firestore"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--store firestore runs callbacks side by side: give --threads" in error
