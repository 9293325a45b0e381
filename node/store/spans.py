"""Spans: one queue's index of live STOREs in the journal, seq -> (offset, length), packed in arrays.

The journal's index (node/store/index.py) keeps one per queue; whoever owns the journal's index owns it
(the caller before Journal.start(), the writer thread after). Pure: no threads, files or clocks.

A queue's STOREs reach the journal almost always in increasing seq order (seqs are node-wide and
increase at enqueue; compaction rewrites in seq order), so the index is three parallel `array`
columns appended in that order and searched by bisection:
- seq ('q'), offset ('q'), length ('I': a frame is at most 1 GiB plus its header). 20 bytes a
  record, plus the arrays' growth slack: tracemalloc shows 20.5 bytes per live record for a
  1,000,000-record index appended in order (tests/unit/test_spans.py checks at most 24).
- A removal leaves a tombstone (length 0; no frame is empty). Once tombstones are more than half
  the columns they are rebuilt without them; tombstones all before the first live record (a queue
  drained in order) are cut with one slice deletion. Amortized O(1) per removal.
- A STORE of a seq already indexed (live or tombstoned) replaces it in place. A STORE of a seq below
  the last one indexed goes to a small overflow dict, merged into the columns by the next rebuild,
  which also runs once the overflow passes OVERFLOW_SHARE of the columns. A seq is in one or the other.
- `tagged`: an extra 'I' column of one small number per record (recovery keeps the length of each
  record's group id there while it scans, see Journal.recover(cold=True)); `untag()` drops it.
- `live_bytes` is always the exact sum of the live records' lengths.
- `seqs_after(seq, count)`: the next live seqs above `seq`, what a cold tail (node/core/dispatch/cold.py) reads
  back; it merges the overflow first, so the columns alone answer in order.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from heapq import merge
from itertools import compress, repeat

REBUILD_DEAD_MIN = 16  # tombstones below this many are never worth a rebuild
OVERFLOW_SHARE = 16  # the overflow is merged once it holds more than 1/16 of the columns (and 64)
OVERFLOW_MIN = 64


class Spans:
    __slots__ = ("_seqs", "_offsets", "_lengths", "_tags", "_dead", "_head", "_overflow",
                 "live_count", "live_bytes")

    def __init__(self, tagged: bool = False):
        self._seqs = array("q")
        self._offsets = array("q")
        self._lengths = array("I")
        self._tags = array("I") if tagged else None
        self._dead = 0  # tombstones in the columns
        self._head = 0  # every column entry before this one is a tombstone
        self._overflow: dict[int, tuple[int, int, int]] = {}  # seq -> (offset, length, tag)
        self.live_count = 0
        self.live_bytes = 0

    def __len__(self) -> int:
        return self.live_count

    def add(self, seq: int, offset: int, length: int, tag: int = 0) -> int:
        """Index the STORE of `seq`; returns the length of the live record it replaces (0: none)."""
        if length <= 0:
            raise ValueError(f"a STORE frame has a positive length, got {length} for seq {seq}")
        seqs = self._seqs
        overflow = self._overflow
        if (not seqs or seq > seqs[-1]) and not overflow:  # the usual case: the next seq in order
            seqs.append(seq)
            self._offsets.append(offset)
            self._lengths.append(length)
            if self._tags is not None:
                self._tags.append(tag)
            self.live_count += 1
            self.live_bytes += length
            return 0
        old = overflow.get(seq)
        if old is not None:
            overflow[seq] = (offset, length, tag)
            self.live_bytes += length - old[1]
            return old[1]
        index = self._find(seq)
        if index >= 0:
            old_length = self._lengths[index]
            self._offsets[index] = offset
            self._lengths[index] = length
            if self._tags is not None:
                self._tags[index] = tag
            if old_length:
                self.live_bytes += length - old_length
                return old_length
            self._dead -= 1  # a tombstone brought back
        elif not seqs or seq > seqs[-1]:
            seqs.append(seq)
            self._offsets.append(offset)
            self._lengths.append(length)
            if self._tags is not None:
                self._tags.append(tag)
        else:
            overflow[seq] = (offset, length, tag)
            if len(overflow) > max(OVERFLOW_MIN, len(seqs) // OVERFLOW_SHARE):
                self.live_count += 1
                self.live_bytes += length
                self._rebuild()
                return 0
        self.live_count += 1
        self.live_bytes += length
        return 0

    def remove(self, seq: int) -> int:
        """Forget the STORE of `seq`; returns its length (0: it was not live)."""
        if self._overflow:
            old = self._overflow.pop(seq, None)
            if old is not None:
                self.live_count -= 1
                self.live_bytes -= old[1]
                return old[1]
        index = self._find(seq)
        if index < 0:
            return 0
        lengths = self._lengths
        length = lengths[index]
        if not length:
            return 0
        lengths[index] = 0
        self._dead += 1
        self.live_count -= 1
        self.live_bytes -= length
        if index == self._head:
            head = index + 1
            end = len(lengths)
            while head < end and not lengths[head]:
                head += 1
            self._head = head
        if not self.live_count:
            self._clear()
        elif self._dead >= REBUILD_DEAD_MIN and 2 * self._dead > len(lengths):
            self._rebuild()
        return length

    def get(self, seq: int) -> tuple[int, int] | None:
        """(offset, length) of the live STORE of `seq`, or None."""
        if self._overflow:
            old = self._overflow.get(seq)
            if old is not None:
                return old[0], old[1]
        index = self._find(seq)
        if index < 0 or not self._lengths[index]:
            return None
        return self._offsets[index], self._lengths[index]

    def __iter__(self):
        """(seq, offset, length) of every live record, in ascending seq order."""
        live = zip(compress(self._seqs, self._lengths), compress(self._offsets, self._lengths),
                   compress(self._lengths, self._lengths))
        if not self._overflow:
            return live
        return merge(live, sorted((seq, entry[0], entry[1]) for seq, entry in self._overflow.items()))

    def seqs_after(self, seq: int, count: int) -> list[int]:
        """The first `count` live seqs above `seq`, ascending (a cold tail's next records)."""
        if self._overflow:
            self._rebuild()
        seqs, lengths = self._seqs, self._lengths
        index = max(bisect_right(seqs, seq), self._head)
        end = len(seqs)
        found: list[int] = []
        while index < end and len(found) < count:
            if lengths[index]:
                found.append(seqs[index])
            index += 1
        return found

    def live_seqs(self) -> array:
        """The live seqs, ascending, in a new array('q')."""
        if self._overflow:
            self._rebuild()
        return array("q", compress(self._seqs, self._lengths))

    def tag_sum(self) -> int:
        """The live records' tags added up (a tagged index only)."""
        if self._tags is None:
            raise RuntimeError("tag_sum() of an index made without tagged=True")
        return sum(compress(self._tags, self._lengths)) + sum(tag for _, _, tag in self._overflow.values())

    def untag(self) -> None:
        self._tags = None
        if self._overflow:
            self._overflow = {seq: (offset, length, 0) for seq, (offset, length, _) in self._overflow.items()}

    # ---- inside ------------------------------------------------------------------------------

    def _find(self, seq: int) -> int:
        """The column index of `seq` (live or tombstone) at or after the head, or -1."""
        seqs = self._seqs
        index = bisect_left(seqs, seq, self._head)
        if index < len(seqs) and seqs[index] == seq:
            return index
        return -1

    def _clear(self) -> None:
        self._seqs = array("q")
        self._offsets = array("q")
        self._lengths = array("I")
        if self._tags is not None:
            self._tags = array("I")
        self._dead = self._head = 0

    def _rebuild(self) -> None:
        """The columns without tombstones, the overflow merged in."""
        lengths = self._lengths
        if self._overflow:
            # merged as streams: a list of tuples would cost ~100 bytes a record for the moment
            tags = compress(self._tags, lengths) if self._tags is not None else repeat(0)
            live = zip(compress(self._seqs, lengths), compress(self._offsets, lengths),
                       compress(lengths, lengths), tags)
            extra = sorted((seq, *entry) for seq, entry in self._overflow.items())
            seqs, offsets, new_lengths = array("q"), array("q"), array("I")
            new_tags = array("I") if self._tags is not None else None
            for seq, offset, length, tag in merge(live, extra):
                seqs.append(seq)
                offsets.append(offset)
                new_lengths.append(length)
                if new_tags is not None:
                    new_tags.append(tag)
            self._seqs, self._offsets, self._lengths, self._tags = seqs, offsets, new_lengths, new_tags
            self._overflow = {}
        elif self._dead == self._head:  # every tombstone is before the first live record
            head = self._head
            del self._seqs[:head], self._offsets[:head], self._lengths[:head]
            if self._tags is not None:
                del self._tags[:head]
        else:
            self._seqs = array("q", compress(self._seqs, lengths))
            self._offsets = array("q", compress(self._offsets, lengths))
            if self._tags is not None:
                self._tags = array("I", compress(self._tags, lengths))
            self._lengths = array("I", compress(lengths, lengths))
        self._dead = self._head = 0

