"""Delivery trace files: the JSON lines a traced queue's node writes for `grouper audit`, rotated and bounded.

The engine loop builds the lines (node/amqp/tracer.py) and hands each batch's lines to `TraceWriter.submit`,
which never blocks and never touches a file. One writer thread owns the directory. Rules:
- Files are `trace-NNNNNNNN.jsonl` in one directory, numbered in the order they were written, so their
  names sort as the audit must read them. A start always opens a new file: a file a killed node left with a
  torn last line is never appended to (the audit allows one torn line, at a file's end).
- A file is closed once the next batch would take it past `file_max_bytes` (a single line longer than that
  gets a file of its own); past `max_bytes` in all, the oldest files are deleted, never the one being written.
- Each batch is written with one write and no fsync: a trace is evidence, not state, and must never slow
  the broker. A failed write (a full disk) is cut back to where it began, so no torn line is left
  mid-file; its lines are dropped and counted, logged once until a write succeeds again, and the next
  write starts a new file.
- Lines waiting for the writer are bounded by BUFFER_MAX_BYTES: past it, a batch is dropped and counted
  rather than held (the disk is slower than the traffic).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections import deque
from pathlib import Path

from node.store.journal import DIRECTORY_MODE, FILE_MODE

log = logging.getLogger("grouper.trace")

BUFFER_MAX_BYTES = 16 << 20  # encoded lines waiting for the writer thread; more are dropped
LINE_ESTIMATE_BYTES = 200  # what one waiting line is counted as against BUFFER_MAX_BYTES before it is encoded
FILE_PATTERN = re.compile(r"^trace-(\d{8})\.jsonl$")


def file_name(index: int) -> str:
    return f"trace-{index:08d}.jsonl"


class TraceFiles:
    """The directory's files and the one being written: writer thread only (or a test's thread)."""

    def __init__(self, directory: str | Path, file_max_bytes: int, max_bytes: int):
        self.directory = Path(directory)
        self.file_max_bytes = file_max_bytes
        self.max_bytes = max_bytes
        self.directory.mkdir(DIRECTORY_MODE, parents=True, exist_ok=True)
        self.files: list[tuple[int, int]] = sorted(  # (index, size in bytes), oldest first
            (int(match.group(1)), (self.directory / name).stat().st_size)
            for name in os.listdir(self.directory) if (match := FILE_PATTERN.match(name)))
        self._next_index = self.files[-1][0] + 1 if self.files else 1
        self._fd: int | None = None  # the file being written: the last of self.files
        self.files_deleted = 0
        self.lines_written = 0

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    def write(self, lines: list[bytes]) -> None:
        """Append encoded lines (each ending in a newline), rotating and pruning. Raises OSError when the
        disk refuses: the part being written is cut back; `lines_written` counts what was kept."""
        chunk: list[bytes] = []
        chunk_bytes = 0
        for line in lines:
            filled = self._current_bytes() + chunk_bytes
            if filled and filled + len(line) > self.file_max_bytes:
                if chunk:
                    self._append(b"".join(chunk))
                    self.lines_written += len(chunk)
                    chunk, chunk_bytes = [], 0
                self._close()
            chunk.append(line)
            chunk_bytes += len(line)
        if chunk:
            self._append(b"".join(chunk))
            self.lines_written += len(chunk)
        self._prune()

    def close(self) -> None:
        self._close()

    def _current_bytes(self) -> int:
        return self.files[-1][1] if self._fd is not None else 0

    def _append(self, data: bytes) -> None:
        if self._fd is None:
            self._open()
        index, size = self.files[-1]
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError:
            try:
                os.ftruncate(self._fd, size)  # no torn line left before the next one
            finally:
                self._close()
            raise
        self.files[-1] = (index, size + len(data))

    def _open(self) -> None:
        index = self._next_index
        self._next_index += 1
        self._fd = os.open(self.directory / file_name(index), os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
        self.files.append((index, 0))

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _prune(self) -> None:
        total = self.total_bytes
        keep_last = 1 if self._fd is not None else 0  # the file being written stays
        while total > self.max_bytes and len(self.files) > keep_last:
            index, size = self.files.pop(0)
            try:
                os.unlink(self.directory / file_name(index))
            except FileNotFoundError:
                pass  # an operator removed it first
            total -= size
            self.files_deleted += 1


class TraceWriter:
    """The writer thread and the hand-over from the engine loop (`submit`, `stats` from any thread)."""

    def __init__(self, directory: str | Path, file_max_bytes: int, max_bytes: int,
                 buffer_max_bytes: int = BUFFER_MAX_BYTES):
        self.directory = Path(directory)
        self.file_max_bytes = file_max_bytes
        self.max_bytes = max_bytes
        self.buffer_max_bytes = buffer_max_bytes
        self._batches: deque = deque()
        self._waiting_bytes = 0  # estimated, of the batches not yet taken by the writer
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.lines_written = 0
        self.lines_dropped = 0
        self._files: TraceFiles | None = None
        self._failing = False  # a write failed and none has succeeded since: logged once

    def start(self) -> None:
        """Start the writer thread (`submit` does, with the first batch)."""
        self._thread = threading.Thread(target=self._run, name="grouper-trace", daemon=True)
        self._thread.start()

    def submit(self, lines: list[dict]) -> None:
        """One batch of trace lines (plain dicts); never blocks."""
        cost = len(lines) * LINE_ESTIMATE_BYTES
        with self._lock:
            if self._stopping or self._waiting_bytes + cost > self.buffer_max_bytes:
                self.lines_dropped += len(lines)
                return
            self._batches.append(lines)
            self._waiting_bytes += cost
            if self._thread is None:  # the first trace line: a node that traces nothing has no thread
                self.start()
        self._wake.set()

    def close(self, wait_s: float = 5.0) -> None:
        """Write what is waiting, then stop."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(wait_s)

    def stats(self) -> dict:
        files = self._files
        return {"lines_written": self.lines_written, "lines_dropped": self.lines_dropped,
                "files_deleted": files.files_deleted if files is not None else 0}

    def _run(self) -> None:
        try:
            self._files = TraceFiles(self.directory, self.file_max_bytes, self.max_bytes)
        except OSError as error:
            log.error("delivery traces are off: cannot use trace directory %s (%s); fix it and restart the node",
                      self.directory, error)
            self._files = None
        while True:
            self._wake.wait()
            with self._lock:
                self._wake.clear()
                batches, self._batches = self._batches, deque()
                self._waiting_bytes = 0
                stopping = self._stopping
            for lines in batches:
                self._write(lines)
            if stopping:
                break
        if self._files is not None:
            self._files.close()

    def _write(self, lines: list[dict]) -> None:
        if self._files is None:
            self.lines_dropped += len(lines)
            return
        encoded = [(json.dumps(line, separators=(",", ":")) + "\n").encode() for line in lines]
        written_before = self._files.lines_written
        try:
            self._files.write(encoded)
        except OSError as error:
            kept = self._files.lines_written - written_before
            self.lines_written += kept
            self.lines_dropped += len(lines) - kept
            if not self._failing:
                self._failing = True
                log.error("cannot write delivery traces to %s (%s): trace lines are dropped and counted "
                          "(grouper_trace_lines_dropped) until a write succeeds; free space there",
                          self.directory, error)
            return
        self.lines_written += len(lines)
        if self._failing:
            self._failing = False
            log.warning("delivery traces are written again to %s; %d lines dropped so far", self.directory,
                        self.lines_dropped)
