"""The raft member's memory: what its raft log holds, bounded, and given back after each snapshot.

Owns, in the raft member process:
- The bound on the log: pysyncobj compacts only past 5,000 entries or 300 s, and a claim entry carries
  up to a thousand routes, so the member asks for a compaction itself once LOG_ROUTES_BEFORE_COMPACTION
  route changes were applied since it last asked (`LogBound`): the log then holds at most ~100 bytes
  (heap and mapping) times that.
- Giving back what the log held after pysyncobj compacted it into a snapshot (raft.dump replaced): the
  freed heap (glibc's malloc_trim; free() keeps it otherwise) and the pages of the raft journal file's
  mapping (pysyncobj mmaps it and reuses it from the start after a compaction, so its pages from before
  stay in the resident set). A million routes claimed a thousand to a command left ~50 bytes a route in
  each (bench/route_memory.py, "member"); see `return_freed_memory`.
- The names of pysyncobj's files in raft_dir (handler/raft_setup.py configures pysyncobj with them).
Threads: `LogBound` on pysyncobj's tick thread; `return_memory_after_snapshots` on a thread of its own.
Never imports pysyncobj (handler/member.py, which imports this, is imported by the node process too).
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("grouper.handler")

RAFT_JOURNAL_FILE = "raft.journal"  # in raft_dir: pysyncobj's log
RAFT_DUMP_FILE = "raft.dump"  # in raft_dir: its snapshot (the journal alone loses state after compaction)
# route changes applied (claimed, refreshed, moved, removed) after which the member asks pysyncobj to compact
# its log: ~20 MB of log at ~100 bytes a change; a compaction pickles the table in a forked child (a
# million routes: ~3 s of its CPU at nice 10), so at most one per this many changes
LOG_ROUTES_BEFORE_COMPACTION = 200_000
SNAPSHOT_CHECK_S = 2.0  # how often the member looks for a new raft snapshot, after which it returns memory
MADV_DONTNEED = 4  # madvise(2), Linux: on a shared file mapping it only unmaps pages; the file keeps the data


class LogBound:
    """The route changes applied since the member last asked for a compaction (tick thread only)."""

    def __init__(self):
        self.routes_since_compaction = 0

    def applied(self, routes: int) -> bool:
        """Count `routes` changes; True when a compaction is due."""
        self.routes_since_compaction += routes
        return self.routes_since_compaction >= LOG_ROUTES_BEFORE_COMPACTION

    def asked(self) -> None:
        self.routes_since_compaction = 0


def return_memory_after_snapshots(raft_dir: str, stopped) -> None:
    """Own thread, until `stopped` (an Event) is set: once a new snapshot has been seen for one check
    (pysyncobj drops the compacted log entries on its next tick after the dump is written), return what
    they held."""
    dump = os.path.join(raft_dir, RAFT_DUMP_FILE)
    journal = os.path.realpath(os.path.join(raft_dir, RAFT_JOURNAL_FILE))
    seen, pending = _modified_ns(dump), False
    while not stopped.wait(SNAPSHOT_CHECK_S):
        if pending:
            pending = False
            returned = return_freed_memory(journal)
            log.info("raft member: log compacted into a snapshot; %s", returned)
        modified = _modified_ns(dump)
        if modified != seen:
            seen, pending = modified, True


def _modified_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def return_freed_memory(mapped_path: str) -> str:
    """Give the kernel back the heap glibc holds free (malloc_trim) and unmap the resident pages of every
    mapping of `mapped_path` (MADV_DONTNEED: a shared file mapping faults them back from the page cache
    when next touched, so nothing is lost). Returns what it did, for the log; never raises."""
    done = []
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as error:
        return f"no C library to call ({error})"
    try:
        libc.malloc_trim(0)
        done.append("malloc_trim")
    except AttributeError:
        done.append("no malloc_trim (not glibc)")
    try:
        with open("/proc/self/maps") as maps:
            ranges = [line.split()[0] for line in maps if line.rstrip("\n").endswith(" " + mapped_path)]
    except OSError as error:
        return f"{', '.join(done)}; /proc/self/maps unreadable ({error})"
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    unmapped = 0
    for address_range in ranges:
        start, end = (int(part, 16) for part in address_range.split("-"))
        if libc.madvise(start, end - start, MADV_DONTNEED) == 0:
            unmapped += end - start
    done.append(f"{unmapped >> 20} MiB of {os.path.basename(mapped_path)}'s mapping released")
    return ", ".join(done)
