"""The journal's files: their names and modes, the directory lock, whole positional writes, syncs.

Owns nothing: the caller holds the descriptors these functions open and write.

Rules:
- `<directory>/journal.lock` is held (flock) from open_journal until the journal closes, so two nodes
  never share a directory; `<directory>/journal.dat` is the journal, `journal.dat.compact` a
  compaction under way. All are the node's user's only (FILE_MODE, node/file_modes.py).
- open_journal removes a compaction cut short (the old file is whole) and fsyncs the directory when
  it creates the file, so a new file survives a power loss.
- A write here is whole: a short pwrite is continued, never returned. `write_all_synced` is on disk
  when it returns (RWF_DSYNC: fdatasync's promise for the bytes written).
"""

from __future__ import annotations

import fcntl
import os

from node.store.failures import JournalError

JOURNAL_FILE = "journal.dat"
LOCK_FILE = "journal.lock"
FILE_MODE = 0o600  # the journal, its lock and compaction files: the node's user only (node/file_modes.py)
DIRECTORY_MODE = 0o700  # a data directory the journal makes
COMPACT_SUFFIX = ".compact"
COPY_CHUNK_BYTES = 1 << 20  # recovery and compaction read the file in pieces of about this size


def open_journal(directory: str, path: str) -> tuple[int, int]:
    """(journal fd, lock fd): the directory made if need be and locked, the journal opened read-write."""
    try:
        os.makedirs(directory, DIRECTORY_MODE, exist_ok=True)
        lock_fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, FILE_MODE)
    except OSError as error:
        raise JournalError(f"journal directory {directory} is not usable ({error.strerror}); "
                           f"point data_dir at a writable directory") from error
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(lock_fd)
        raise JournalError(f"journal directory {directory} is in use by another process; "
                           f"stop it or give this node its own data_dir") from error
    try:
        unlink_quietly(path + COMPACT_SUFFIX)  # a compaction cut short: the old file is whole
        existed = os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        if not existed:
            try:
                fsync_directory(directory)
            except OSError:
                os.close(fd)
                raise
    except OSError as error:
        os.close(lock_fd)
        raise JournalError(f"journal file {path} cannot be opened for writing "
                           f"({error.strerror}); fix its permissions or point data_dir elsewhere") from error
    return fd, lock_fd


def write_all(fd: int, data: bytes, offset: int) -> int:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
    return offset


def write_all_synced(fd: int, data: bytes, offset: int) -> int:
    """`write_all`, each write on disk when it returns (fdatasync's promise for the bytes written)."""
    view = memoryview(data)
    while view:
        written = os.pwritev(fd, [view], offset, os.RWF_DSYNC)
        view = view[written:]
        offset += written
    return offset


def fsync_directory(directory: str) -> None:
    """So a file created or renamed in `directory` survives a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
