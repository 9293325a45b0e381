"""The audit job's progress on a terminal: its steps on a bar, the running Spark stage's tasks beside it.

Rules:
- The bar counts the job's own steps (reading the lines, each aggregate it collects), so the estimate
  of the time left comes from steps done; Spark alone cannot say how many jobs a query will start.
- The running stage's tasks (done / all) are read from Spark's status tracker by a poller thread,
  every POLL_INTERVAL_S, and only while a bar is shown: off a terminal nothing polls and nothing is
  drawn (node.tools.progress).
"""

from __future__ import annotations

import threading

from node.tools.progress import Progress

POLL_INTERVAL_S = 0.5


class AuditProgress:
    def __init__(self, spark, steps: int, *, stream=None):
        self.progress = Progress(steps, "audit", "step", stream=stream)
        self._tracker = spark.sparkContext.statusTracker()
        self._step = ""
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="audit-progress", daemon=True)
        if self.progress.shown:
            self._poller.start()

    def step(self, name: str) -> None:
        """Step `name` begins (the one before it, if any, is done)."""
        if self._step:
            self.progress.advance()
        self._step = name
        self.progress.note(name)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            stages = [self._tracker.getStageInfo(stage_id) for stage_id in self._tracker.getActiveStageIds()]
            done = sum(stage.numCompletedTasks for stage in stages if stage is not None)
            total = sum(stage.numTasks for stage in stages if stage is not None)
            self.progress.note(f"{self._step}: {done}/{total} tasks" if total else self._step)

    def close(self) -> None:
        self._stop.set()
        if self._poller.is_alive():
            self._poller.join()
        if self._step:
            self.progress.advance()
        self.progress.close()

    def __enter__(self) -> "AuditProgress":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
