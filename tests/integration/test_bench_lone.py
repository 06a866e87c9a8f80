"""``python -m benchmarks.lone``: its split of a lone message's time adds up, on the emulator."""

from __future__ import annotations

from typing import Any

from benchmarks.lone import measure


def test_a_lone_message_s_time_splits_into_rpcs_the_store_and_the_wrapper(
    firestore_client: Any,
) -> None:
    times = measure(firestore_client, messages=8, warmup=2, gap_s=0.0)
    assert times.messages == 8
    assert 0 < times.rpc < times.store < times.callback  # the RPCs inside the store's calls
    assert min(times.own, times.store_own, times.wrapper_own) > 0
    # Medians of differences: the parts add up to the whole within the spread of 8 messages.
    assert abs(times.store_own + times.wrapper_own - times.own) < times.own
    assert times.thread_cpu > 0
