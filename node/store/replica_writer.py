"""The replica writer: the one thread that owns every replica journal of this node (issue 28), one per owner
it backs up (node/store/replica_journal.py).

Threads:
- `start()` starts the thread, which first opens the journals already under <data_dir>/replicas (reading
  them back), then runs jobs in the order they came. Only it touches the journals.
- `submit`, `live` and `stats` are called on any thread (gRPC pool threads, the admin API, tests): each
  queues a job and waits for its answer, at most `timeout_ms`; a job not answered in time stays queued
  and is done later (a batch made durable after its caller gave up is a resend's skip next time).

Rules:
- What waits to be written is bounded: batches queued hold at most `queued_bytes_max` frame bytes (one
  batch is always taken, whatever its size, so a batch larger than the bound is not refused for ever;
  gRPC's message limit bounds it). Beyond, a batch is refused (ResourceLimitExceeded naming this backup:
  RESOURCE_EXHAUSTED, the owner retries).
- An owner's epoch in the route table (raft), once told (`know_epochs`, from the cluster's replicas feed),
  is a floor too: a batch of an older epoch is refused before it is queued (StaleEpoch), as the
  journal refuses one older than its own mark.
- A journal that cannot be opened (its directory locked by another process, a newer build's format)
  answers every job of its owner with that JournalError, and is tried again by the next job.
- Errors are data: a GrouperError goes back to the caller; anything else is a bug, logged here with its
  traceback and handed back to the caller (INTERNAL), and the thread goes on with the next job.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable, Iterable

from node.core.errors import GrouperError, ResourceLimitExceeded
from node.store.replica_journal import (COMPACT_MIN_BYTES_DEFAULT, ReplicaJournal, ReplicaRecord, StaleEpoch,
                                        owners_in)

log = logging.getLogger("node.store.replicas")

QUEUED_BYTES_MAX_DEFAULT = 64 << 20  # frame bytes of batches waiting for the replica writer


class ReplicasUnavailable(GrouperError):
    """The writer is not running (the node is starting or stopping): UNAVAILABLE, the owner retries."""

    retriable = True


class _Job:
    __slots__ = ("owner", "work", "size_bytes", "creates", "done", "result", "error", "answer")

    def __init__(self, owner: str, work: Callable[[ReplicaJournal | None], object], size_bytes: int,
                 creates: bool = True, answer: Callable | None = None):
        self.answer = answer  # answer(result, error), called on the writer thread: nobody waits (`post`)
        self.owner = owner
        self.work = work  # called with the owner's journal, None when it has none and `creates` is False
        self.size_bytes = size_bytes
        self.creates = creates
        self.done = threading.Event()
        self.result = self.error = None


class ReplicaWriter:
    def __init__(self, data_dir: str, node_id: str = "", *, fsync: bool = True,
                 compact_min_bytes: int = COMPACT_MIN_BYTES_DEFAULT,
                 queued_bytes_max: int = QUEUED_BYTES_MAX_DEFAULT):
        self.data_dir = data_dir
        self.node_id = node_id  # named in refusals, so the owner's log says which backup
        self.fsync = fsync
        self.compact_min_bytes = compact_min_bytes
        self.queued_bytes_max = queued_bytes_max
        self._wake = threading.Condition()  # over _jobs, _queued_bytes, _closing
        self._jobs: deque[_Job] = deque()
        self._queued_bytes = 0
        self._closing = False
        self._thread: threading.Thread | None = None
        self._journals: dict[str, ReplicaJournal] = {}  # the writer thread's
        self._table_epochs: dict[str, int] = {}  # owner -> its epoch in the route table; replaced whole, never mutated

    # ---- any thread ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("ReplicaWriter.start() was already called")
        self._thread = threading.Thread(target=self._run, name="replica-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Finish the jobs queued, close every journal, stop the thread. Idempotent."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        else:
            self._close_journals()

    def know_epochs(self, epochs: dict[str, int]) -> None:
        """The route table's owner epochs, as the cluster's replicas feed last said (any thread)."""
        self._table_epochs = dict(epochs)

    def submit(self, owner: str, epoch: int, batch: list[ReplicaRecord], timeout_ms: int) -> tuple[int, int]:
        """(high water, epoch) once the batch is durable in `owner`'s replica journal."""
        table_epoch = self._table_epochs.get(owner, 0)
        if epoch < table_epoch:
            raise StaleEpoch(f"replica batch from owner {owner!r} is of epoch {epoch}, older than epoch {table_epoch} "
                             f"the route table gives it: that owner was replaced; it serves none of those groups "
                             f"and catches up as a replica")
        size_bytes = sum(len(record.frame) for record in batch)
        return self._call(_Job(owner, lambda journal: (journal.append(epoch, batch), journal.epoch), size_bytes),
                          timeout_ms)

    def live(self, owner: str, groups: Iterable[tuple[str, str | None]], timeout_ms: int) -> dict:
        """ReplicaJournal.live of `owner`'s journal."""
        groups = list(groups)
        return self._call(_Job(owner, lambda journal: journal.live(groups) if journal is not None
                               else {group: [] for group in groups}, 0, creates=False), timeout_ms)

    def stats(self, timeout_ms: int) -> list[dict]:
        """Each replica journal's figures (ReplicaJournal.stats), by owner."""
        return self._call(_Job("", lambda _: [journal.stats() for _, journal in sorted(self._journals.items())],
                               0, creates=False), timeout_ms)

    def live_of(self, owner: str, queues, answer: Callable, epoch_max: int | None = None) -> None:
        """A takeover's read (ReplicaJournal.live_of; {queue: []} when the owner has no journal, or one of a
        newer epoch than `epoch_max`: a later stream, not what was taken), answered with `answer(result, error)`
        on the writer thread, which must only hand it on (the engine loop's bridge)."""
        queues = list(queues)
        self.post(_Job(owner, lambda journal: journal.live_of(queues) if journal is not None and (
            epoch_max is None or journal.epoch <= epoch_max) else {queue: [] for queue in queues}, 0,
            creates=False, answer=answer))

    def discard(self, owner: str, epoch: int, seqs, answer: Callable) -> None:
        """ReplicaJournal.discard, answered as `live_of` is."""
        seqs = list(seqs)
        self.post(_Job(owner, lambda journal: journal.discard(epoch, seqs) if journal is not None else 0, 0,
                       creates=False, answer=answer))

    def post(self, job: _Job) -> None:
        """Queue a job nobody waits for; its answer comes through job.answer (ReplicasUnavailable at once
        when the writer is not running)."""
        with self._wake:
            if self._closing or self._thread is None:
                job.answer(None, ReplicasUnavailable(f"node {self.node_id} is not running its replica writer"))
                return
            self._jobs.append(job)
            self._wake.notify()

    def _call(self, job: _Job, timeout_ms: int):
        with self._wake:
            if self._closing or self._thread is None:
                raise ReplicasUnavailable(f"node {self.node_id} is not taking replicas now (it is starting or stopping); "
                                   f"retry shortly")
            if self._jobs and self._queued_bytes + job.size_bytes > self.queued_bytes_max:
                raise ResourceLimitExceeded(
                    f"backup {self.node_id}: {self._queued_bytes} bytes of replica batches wait for its disk "
                    f"(limit {self.queued_bytes_max} bytes); retry once it has caught up")
            self._jobs.append(job)
            self._queued_bytes += job.size_bytes
            self._wake.notify()
        if not job.done.wait(timeout_ms / 1000):
            raise TimeoutError(f"backup {self.node_id} did not make the replica batch of owner {job.owner!r} durable "
                               f"within {timeout_ms} ms; resend it (what it already holds is skipped)")
        if job.error is not None:
            raise job.error
        return job.result

    # ---- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        for owner in owners_in(self.data_dir):
            try:
                self._journal(owner)
            except GrouperError as error:
                log.error("replica journal of owner %r cannot be opened: %s", owner, error)
        while True:
            with self._wake:
                while not self._jobs and not self._closing:
                    self._wake.wait()
                if not self._jobs:
                    break
                job = self._jobs.popleft()
            self._do(job)
            with self._wake:
                self._queued_bytes -= job.size_bytes
        self._close_journals()

    def _do(self, job: _Job) -> None:
        try:
            journal = self._journal(job.owner, job.creates) if job.owner else None
            job.result = job.work(journal)
        except GrouperError as error:
            job.error = error
        except Exception as error:  # a bug: logged with its traceback, the caller gets INTERNAL
            log.exception("replica writer job for owner %r failed", job.owner)
            job.error = error
        job.done.set()
        if job.answer is not None:
            job.answer(job.result, job.error)

    def _journal(self, owner: str, creates: bool = True) -> ReplicaJournal | None:
        journal = self._journals.get(owner)
        if journal is None:
            if not creates and owner not in owners_in(self.data_dir):
                return None
            journal = ReplicaJournal(self.data_dir, owner, fsync=self.fsync,
                                     compact_min_bytes=self.compact_min_bytes).open()
            self._journals[owner] = journal
            if journal.cut_bytes or journal.high_water:
                log.info("replica journal of owner %r: epoch %d, high water %d%s", owner, journal.epoch,
                         journal.high_water, f", {journal.cut_bytes} torn bytes cut" if journal.cut_bytes else "")
        return journal

    def _close_journals(self) -> None:
        while self._journals:
            self._journals.popitem()[1].close()
