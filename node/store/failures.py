"""What the journal says when it cannot do its work, as data: no wire codes here.

Rules:
- `JournalError` is raised where the journal cannot be used at all (a directory, lock or file the
  operator has to fix, a file written by a newer build, a writer that stopped): the node stops.
- `JournalFailure` is reported, not raised: the one batch it names was not written (its records are
  dropped) and later batches are tried as usual. It says what went wrong (`kind`), where (`path`), how
  much was lost (`records_count`, `size_bytes`), who must act (`fault`) and what to do (in its text).
- A JournalFailure is also the text operators and producers have always read ("disk full: ..."), so
  whoever only reports it (durability's refusals, the cluster protocol's replies, logs) passes it on
  as a string; the adapters map `kind` to their wire form in their one table each (AMQP:
  node/amqp/conditions.py).
"""

from __future__ import annotations

import errno

from node.core.errors import GrouperError

DISK_FULL = "disk-full"  # ENOSPC or EDQUOT: freeing space on the volume fixes it
WRITE_FAILED = "write-failed"  # any other error of a write or fsync: the disk or file system is failing
# the first words of a disk-full failure's text, as producers and operators have always read them
DISK_FULL_WORDS = "disk full"


class JournalError(GrouperError):
    """The journal cannot be used: a directory or file problem the operator has to fix."""

    fault = "operator"


class JournalFailure(str):
    """One batch the writer could not write; its text says what happened and what to do next."""

    kind: str
    path: str
    records_count: int
    size_bytes: int
    error: str  # the OS's words for the error (strerror)
    fault = "operator"  # the node's volume needs the operator, not the client and not a retry by the node

    def __new__(cls, kind: str, path: str, records_count: int, size_bytes: int, error: str):
        if kind == DISK_FULL:
            text = f"{DISK_FULL_WORDS}: no space left for journal {path}; free space on its volume"
        else:
            text = f"journal {path} write failed: {error}; check the disk and the node's log"
        failure = super().__new__(cls, text)
        failure.kind, failure.path, failure.error = kind, path, error
        failure.records_count, failure.size_bytes = records_count, size_bytes
        return failure

    @classmethod
    def of(cls, error: OSError, path: str, records_count: int, size_bytes: int) -> JournalFailure:
        kind = DISK_FULL if error.errno in (errno.ENOSPC, errno.EDQUOT) else WRITE_FAILED
        return cls(kind, path, records_count, size_bytes, str(error))

    def __getnewargs__(self) -> tuple:  # so copy and pickle make it again from its fields, not its text
        return self.kind, self.path, self.records_count, self.size_bytes, self.error
