"""The journal units an admin call waits for before it answers: "purged", "moved", "deleted" mean on disk.

Rules:
- A call registers a wait (`after`) on the engine loop thread, inside the bridge call that journalled its
  records, through the engine loop's own `after_flush` (node/amqp/loop.py), the one a producer's
  durable send waits on: the unit that batch ends with is the one waited for, written at once rather
  than with the next tick's batch, and a failed write is reported as it is to a send.
- It waits (`wait`) on the admin's own thread, never on the engine loop, for every registered unit,
  within one deadline. The count of units is read there only after the bridge calls that registered
  them returned, so it is final.
- A batch that journalled nothing (a non-durable queue, nothing removed) registers nothing: there is
  nothing to wait for.
- What the call changed in memory stays changed whatever the journal says: the error names what a
  restart may undo and what to do.
"""

from __future__ import annotations

import threading
import time

from node.core.effects import Removed, Stored
from node.core.errors import GrouperError

JOURNAL_RECORDS = (Removed, Stored)  # effects the engine loop turns into journal records (AmqpServer.apply)


class JournalFailed(GrouperError):
    """The journal could not write what an admin call changed: the node's disk is at fault."""

    fault = "node"
    retriable = True


def journals(effects: list) -> bool:
    """Whether applying `effects` writes journal records."""
    return any(type(effect) in JOURNAL_RECORDS for effect in effects)


class Flushes:
    def __init__(self):
        self.registered = 0  # units waited for: the engine loop thread counts, the admin thread reads after
        self._outcomes: list = []  # one per unit reported: None once on disk, else why its write failed
        self._reported = threading.Semaphore(0)

    def after(self, server, effects: list | None = None) -> None:
        """Engine loop thread: wait for the journal unit this batch ends with (with `effects`: only if
        they journal something; call it after `server.apply(effects)`)."""
        if effects is not None and not journals(effects):
            return
        self.registered += 1
        server.after_flush(self._report)

    def _report(self, reason: str | None) -> None:  # engine loop thread
        self._outcomes.append(reason)
        self._reported.release()

    def wait(self, timeout_ms: int, what: str, meanwhile: str) -> None:
        """Admin thread: return once every registered unit is on disk. Raises TimeoutError when the
        journal has not reported them all within `timeout_ms`, JournalFailed when a write failed; both
        name `what` ("the purge of queue 'q'") and `meanwhile` (what memory holds, what a restart does)."""
        deadline_s = time.monotonic() + timeout_ms / 1000
        for _ in range(self.registered):
            if not self._reported.acquire(timeout=max(0.0, deadline_s - time.monotonic())):
                raise TimeoutError(f"the journal did not report {what} written within {timeout_ms} ms "
                                   f"(admin_timeout_ms): {meanwhile}; check the node's disk and 'grouper queue "
                                   f"list'")
        failure = next((reason for reason in self._outcomes if reason is not None), None)
        if failure is not None:
            raise JournalFailed(f"the journal could not write {what} ({failure}): {meanwhile}; free the node's "
                                f"disk, then check 'grouper queue list' and run the command again if need be")
