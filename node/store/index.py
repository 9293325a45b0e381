"""The journal's index of live records: where in the file each queue's DECLARE and live STOREs are.

Owned by whoever runs the file: the journal's caller until Journal.start(), the writer thread after
(node/store/writer.py). Pure: no threads, files or clocks.

Rules:
- A queue's live STOREs are a node/store/spans.py Spans (seq -> offset and length, ~21 bytes a live
  record); its live DECLARE is one (offset, length). A REMOVE or a re-STORE undoes the old STORE, a
  DELETE the queue's DECLARE and all its STOREs; the index keeps no REMOVE or DELETE frame.
- `live_bytes` is always the sum of the live frames' lengths: compaction is due when the file is
  several times larger (node/store/compaction.py).
"""

from __future__ import annotations

from node.store.records import DECLARE, REMOVE, STORE, TXN_BEGIN, TXN_COMMIT
from node.store.spans import Spans


class LiveIndex:
    def __init__(self, declares: dict | None = None, stores: dict | None = None, live_bytes: int = 0):
        self.declares: dict[str, tuple[int, int]] = declares or {}  # queue -> (offset, length) of its live DECLARE
        self.stores: dict[str, Spans] = stores or {}  # queue -> its live STOREs' seq -> (offset, length)
        self.live_bytes = live_bytes

    def apply(self, kind: int, key, offset: int, length: int) -> None:
        """Index one frame just written: key is a queue name or (queue, seq)."""
        if kind == STORE:
            self.store(key[0], key[1], offset, length)
        elif kind == REMOVE:
            self.remove(key[0], key[1])
        elif kind == DECLARE:
            self.declare(key, offset, length)
        elif kind in (TXN_BEGIN, TXN_COMMIT):
            return  # a transaction's batch marks (issue 31): nothing live
        else:
            self.delete(key)

    def store(self, queue: str, seq: int, offset: int, length: int) -> None:
        spans = self.stores.get(queue)
        if spans is None:
            spans = self.stores[queue] = Spans()
        self.live_bytes += length - spans.add(seq, offset, length)

    def store_tagged(self, queue: str, seq: int, offset: int, length: int, group_bytes: int) -> None:
        """A STORE that cold recovery read only the header of: its group id's length goes in the tag."""
        spans = self.stores.get(queue)
        if spans is None:
            spans = self.stores[queue] = Spans(tagged=True)
        self.live_bytes += length - spans.add(seq, offset, length, group_bytes)

    def remove(self, queue: str, seq: int) -> None:
        spans = self.stores.get(queue)
        if spans is not None:
            self.live_bytes -= spans.remove(seq)

    def declare(self, queue: str, offset: int, length: int) -> None:
        old = self.declares.get(queue)
        if old is not None:
            self.live_bytes -= old[1]
        self.declares[queue] = (offset, length)
        self.live_bytes += length

    def delete(self, queue: str) -> None:
        old = self.declares.pop(queue, None)
        if old is not None:
            self.live_bytes -= old[1]
        spans = self.stores.pop(queue, None)
        if spans is not None:
            self.live_bytes -= spans.live_bytes
