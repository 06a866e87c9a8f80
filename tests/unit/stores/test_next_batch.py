"""Which queued writes one ``BatchWrite`` request takes, and the queue they wait in."""

from __future__ import annotations

from collections import deque

from pubsub_worker.stores._queued import QueuedWrite, WriteQueue, next_batch


def _queue(*writes: tuple[str, int]) -> deque[QueuedWrite]:
    return deque(QueuedWrite(doc, b"", size) for doc, size in writes)


def _docs(writes: list[QueuedWrite] | deque[QueuedWrite]) -> list[tuple[str, int]]:
    return [(w.doc_path, w.size) for w in writes]


def test_one_write_a_document_none_to_a_busy_one_the_rest_left_in_order() -> None:
    queue = _queue(("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2))
    batch, left = next_batch(queue, {"c"}, max_writes=10, room=100)
    assert _docs(batch) == [("a", 1), ("b", 1)]
    assert _docs(left) == [("a", 2), ("c", 1), ("b", 2)]


def test_at_most_max_writes_and_room_bytes_the_oldest_always_goes() -> None:
    batch, left = next_batch(_queue(("a", 5), ("b", 5), ("c", 5)), set(), max_writes=2, room=100)
    assert _docs(batch) == [("a", 5), ("b", 5)]
    assert _docs(left) == [("c", 5)]
    # Too big for the room: the oldest goes alone all the same (production refuses it alone).
    batch, left = next_batch(_queue(("big", 50), ("b", 5)), set(), max_writes=10, room=10)
    assert _docs(batch) == [("big", 50)]
    assert _docs(left) == [("b", 5)]


def test_a_write_left_for_its_size_keeps_its_document_s_later_writes_behind_it() -> None:
    queue = _queue(("a", 6), ("b", 6), ("c", 3), ("b", 1))
    batch, left = next_batch(queue, set(), max_writes=10, room=10)
    assert _docs(batch) == [("a", 6), ("c", 3)]  # "b" did not fit; its second write waits too
    assert _docs(left) == [("b", 6), ("b", 1)]


def test_the_write_queue_counts_what_waits_and_what_flies() -> None:
    queue = WriteQueue()
    claim, update, later = (
        QueuedWrite("a", b"", 3, create=True),
        QueuedWrite("b", b"", 5),
        QueuedWrite("a", b"", 7),
    )
    for write in (claim, update, later):
        queue.append(write)
    assert (len(queue), queue.bytes, queue.creates, queue.writing()) == (3, 15, 1, 3)
    batch = queue.pop_batch(max_writes=10, room=100)
    assert batch == [claim, update]  # one write a document: "a" again waits
    assert claim.sent
    assert update.sent
    assert not later.sent
    assert (len(queue), queue.bytes, queue.creates, queue.busy) == (1, 7, 0, {"a", "b"})
    assert queue.writing() == 3
    assert not queue.ready()  # its document is in flight
    assert queue.pop_batch(max_writes=10, room=100) == []
    queue.answered(batch)
    assert queue.ready()
    assert queue.oldest_queued_at() == later.queued_at


def test_a_write_is_withdrawn_only_while_it_waits() -> None:
    queue = WriteQueue()
    sent, waiting = QueuedWrite("a", b"", 3, create=True), QueuedWrite("b", b"", 5, create=True)
    queue.append(sent)
    queue.append(waiting)
    assert queue.pop_batch(max_writes=1, room=100) == [sent]
    assert not queue.withdraw(sent)  # in flight: its RPC settles it
    assert queue.withdraw(waiting)
    assert (len(queue), queue.bytes, queue.creates, queue.writing()) == (0, 0, 0, 1)
