"""Journal compaction: the live records copied to a new file that replaces the journal.

Runs on the writer thread, between batches (node/store/writer.py), never while a batch is written.

Rules:
- Due once the file is above `compact_min_bytes` and more than four times its live bytes (and, after a
  failed try, once it has grown by another compact_min_bytes or doubled).
- The new file starts with the FORMAT marker of records.FORMAT_VERSION, then every queue's live DECLARE,
  then every live STORE in one seq order (merged from each queue's ascending index); adjacent frames
  are copied in runs of up to COPY_CHUNK_BYTES.
- The new file is fsynced before the rename, even with fsync=False: renaming an unsynced file can lose
  everything on power loss, not just the last batch. The directory is fsynced after it.
- A compaction that fails leaves the old file the journal, appended to as before; its temporary file
  is removed.
"""

from __future__ import annotations

import heapq
import logging
import os
import time

from node.store import records
from node.store.files import (COMPACT_SUFFIX, COPY_CHUNK_BYTES, FILE_MODE, fsync_directory, unlink_quietly,
                              write_all)
from node.store.index import LiveIndex
from node.store.spans import Spans

log = logging.getLogger("node.store.journal")  # the journal's one logger, whichever module speaks


class Compaction:
    """When to compact, and the compaction itself; owned by the writer thread."""

    def __init__(self, path: str, directory: str, compact_min_bytes: int):
        self.path = path
        self.directory = directory
        self.compact_min_bytes = compact_min_bytes  # file size below which compaction is never tried
        self._retry_at_bytes = 0

    def due(self, end: int, live_bytes: int) -> bool:
        return end > max(self.compact_min_bytes, 4 * live_bytes, self._retry_at_bytes)

    def run(self, fd: int, index: LiveIndex, end: int) -> tuple[int, LiveIndex, int] | None:
        """(the new file's fd, its index, its end), the old fd still open; None if it failed."""
        temporary = self.path + COMPACT_SUFFIX
        began_ns = time.perf_counter_ns()
        try:
            compacted = self._write_compacted(fd, index, temporary)
        except OSError as error:
            # try again only once the file has grown by another compact_min_bytes (or doubled)
            self._retry_at_bytes = end + max(self.compact_min_bytes, end)
            log.warning("journal %s: compaction failed (%s); still appending to the old file, next "
                        "try above %d bytes", self.path, error, self._retry_at_bytes)
            unlink_quietly(temporary)
            return None
        self._retry_at_bytes = 0
        log.info("journal %s compacted from %d to %d bytes in %d ms", self.path, end, compacted[2],
                 (time.perf_counter_ns() - began_ns) // 1_000_000)
        return compacted

    def _write_compacted(self, source_fd: int, index: LiveIndex, temporary: str) -> tuple[int, LiveIndex, int]:
        """Copy live frames into `temporary`, fsync it and rename it over the journal."""
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            copier = _FrameCopier(source_fd, fd, write_all(fd, records.encode_format(), 0))
            declares = {queue: copier.copy(offset, length) for queue, (offset, length) in index.declares.items()}
            # every queue's records in one seq order, merged from each queue's ascending index
            live = heapq.merge(*(_tagged(queue, spans) for queue, spans in index.stores.items() if spans))
            stores: dict[str, Spans] = {}  # queues left empty are dropped here
            for seq, queue, offset, length in live:
                spans = stores.get(queue)
                if spans is None:
                    spans = stores[queue] = Spans()
                spans.add(seq, *copier.copy(offset, length))
            end = copier.finish()
            os.fsync(fd)
            os.replace(temporary, self.path)
        except BaseException:
            os.close(fd)
            raise
        try:  # the rename is done; from here the new file is the journal whatever happens
            fsync_directory(self.directory)
        except OSError as error:
            log.error("journal %s: fsync of directory %s after compaction failed (%s); a crash "
                      "before the next successful sync may bring back the old file", self.path,
                      self.directory, error)
        return fd, LiveIndex(declares, stores, index.live_bytes), end


class _FrameCopier:
    """Copies frames from one file to the end of another, merging runs that are adjacent."""

    def __init__(self, source_fd: int, target_fd: int, start_offset: int):
        self._source = source_fd
        self._target = target_fd
        self._run_offset = 0
        self._run_bytes = 0
        self._written = start_offset  # the target offset of the next frame

    def copy(self, offset: int, length: int) -> tuple[int, int]:
        target_offset = self._written + self._run_bytes
        if self._run_bytes and offset == self._run_offset + self._run_bytes \
                and self._run_bytes < COPY_CHUNK_BYTES:
            self._run_bytes += length
        else:
            self._copy_run()
            self._run_offset, self._run_bytes = offset, length
        return target_offset, length

    def finish(self) -> int:
        self._copy_run()
        return self._written

    def _copy_run(self) -> None:
        if not self._run_bytes:
            return
        data = os.pread(self._source, self._run_bytes, self._run_offset)
        if len(data) != self._run_bytes:
            raise AssertionError(f"journal index points past the end of the file "
                                 f"({self._run_offset}+{self._run_bytes})")
        self._written = write_all(self._target, data, self._written)
        self._run_bytes = 0


def _tagged(queue: str, spans: Spans):
    for seq, offset, length in spans:
        yield seq, queue, offset, length
