"""The set-once flag of a lost delivery or an abandoned job."""

from __future__ import annotations

import threading

from pubsub_worker._support.flag import Flag


def test_a_flag_set_on_another_thread_reads_set_here() -> None:
    flag = Flag()
    assert not flag.is_set()
    setter = threading.Thread(target=flag.set)
    setter.start()
    setter.join()
    assert flag.is_set()
    flag.set()  # setting again changes nothing
    assert flag.is_set()
