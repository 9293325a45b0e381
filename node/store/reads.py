"""Reading records back through the index: the bodies and records the engine loop paged out or left
cold (node/core/dispatch/paging.py, node/core/dispatch/cold.py), and the outbound store's bodiless records.

Runs on the writer thread between batches (node/store/writer.py), or on the journal's caller's thread
before start (Journal.read_records_after_now). Owns nothing: the caller passes the file and the index.

Rules:
- Read through the index, never by remembered offsets, so a compaction that moved a record is no
  matter; a seq that is not live in the index (its queue deleted or the message removed meanwhile)
  comes back as None.
- A run of adjacent frames is one pread (up to COPY_CHUNK_BYTES); a frame that is not the seq the index
  says is a broken invariant, an AssertionError.
- `read_after` reads the next live records above a seq, stopping after the record whose body brings
  the bodies read to `max_bytes`: so fewer come back only past that bound or at the index's last record
  (node/core/dispatch/cold.py's read_missing relies on it). Each pass reads no more frames than the bytes still
  wanted (a frame is never smaller than its body).
"""

from __future__ import annotations

import os

from node.store.files import COPY_CHUNK_BYTES
from node.store.index import LiveIndex


def read_frames(fd: int, index: LiveIndex, queue: str, seqs, decode) -> tuple[dict, int]:
    """(decode(frame) -> (seq, value) by seq, how many frames were read): a seq not live is None."""
    queue_index = index.stores.get(queue)
    values: dict = {}
    spans = []
    for seq in seqs:
        span = queue_index.get(seq) if queue_index is not None else None
        if span is None:
            values[seq] = None
        else:
            spans.append((span[0], span[1], seq))
    spans.sort()
    position = 0
    while position < len(spans):
        run_start, run_end = spans[position][0], spans[position][0] + spans[position][1]
        last = position + 1
        while last < len(spans) and spans[last][0] == run_end and run_end - run_start < COPY_CHUNK_BYTES:
            run_end += spans[last][1]
            last += 1
        data = os.pread(fd, run_end - run_start, run_start)
        for offset, length, seq in spans[position:last]:
            start = offset - run_start
            read_seq, value = decode(memoryview(data)[start:start + length])
            if read_seq != seq:
                raise AssertionError(f"journal index of {queue!r} points seq {seq} at seq {read_seq}'s frame")
            values[seq] = value
        position = last
    return values, len(spans)


def read_after(index: LiveIndex, queue: str, after_seq: int, count: int, max_bytes: int, read_records) -> dict:
    """The next `count` live records above `after_seq` as Messages by seq; read_records(queue, seqs)
    reads a pass (read_frames with records.store_message, counted by the caller)."""
    spans = index.stores.get(queue)
    seqs = spans.seqs_after(after_seq, count) if spans is not None else []
    found: dict = {}
    body_bytes = start = 0
    while start < len(seqs) and body_bytes < max_bytes:
        end, frame_bytes = start, 0
        while end < len(seqs) and (end == start or body_bytes + frame_bytes < max_bytes):
            frame_bytes += spans.get(seqs[end])[1]
            end += 1
        read = read_records(queue, seqs[start:end])
        found.update(read)
        body_bytes += sum(message.size_bytes for message in read.values() if message is not None)
        start = end
    return found
