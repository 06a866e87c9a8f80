"""Write ids: never repeated, in threads or in a forked child; no system call per id."""

from __future__ import annotations

import os
import string
import subprocess
import sys
import threading
from unittest import mock

import pytest

from pubsub_worker.stores._write_ids import new_write_id


def test_an_id_is_32_hex_digits_and_ids_do_not_repeat() -> None:
    ids = [new_write_id() for _ in range(10_000)]
    assert all(len(i) == 32 and set(i) <= set(string.hexdigits.lower()) for i in ids)
    assert len(set(ids)) == len(ids)


def test_threads_drawing_at_once_get_distinct_ids() -> None:
    drawn: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(into: list[str]) -> None:
        start.wait()
        into.extend(new_write_id() for _ in range(5_000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for into in drawn for i in into]
    assert len(set(every)) == len(every) == 40_000


_FORKED = """
import os
from pubsub_worker.stores._write_ids import new_write_id
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    os.write(write, "".join(new_write_id() for _ in range(3)).encode())
    os._exit(0)
os.close(write)
parent = [new_write_id() for _ in range(3)]
with os.fdopen(read) as pipe:
    text = pipe.read()
os.waitpid(pid, 0)
print(" ".join(parent))
print(" ".join(text[n : n + 32] for n in range(0, len(text), 32)))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_does_not_repeat_its_parent_s_ids() -> None:
    # A fresh interpreter with one thread: fork in a threaded test process warns (3.12+).
    done = subprocess.run(
        [sys.executable, "-c", _FORKED], capture_output=True, text=True, timeout=60, check=True
    )
    parent, child = (line.split() for line in done.stdout.splitlines())
    assert len(parent) == len(child) == 3
    assert not set(child) & set(parent)
    assert {i[:16] for i in child} != {i[:16] for i in parent}  # a prefix of its own


def test_no_system_call_per_id() -> None:
    # os.urandom lets go of the GIL: a hand-off between callback threads per write
    with mock.patch.object(os, "urandom", side_effect=AssertionError("urandom called")):
        assert len({new_write_id(), new_write_id()}) == 2
