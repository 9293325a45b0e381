"""The one door from other threads into the engine loop.

Rules: callers on any thread `post(fn)` a closure or `call(fn, timeout_ms)` and wait for its result;
the closure runs on the loop's thread, which owns every proton object and the node core. `wake` is
called only when the loop is not already due to drain the queue below, so a burst of posts costs
one wake-up. A post from the loop's own thread (the raft member's channel is read there) is queued
behind the others alike but wakes the loop with `wake_here`: no signal across threads, so no
syscall and no extra turn of the loop for it.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading

from node.core.errors import ResourceLimitExceeded

BACKLOG_MAX_CLOSURES = 100_000  # posts waiting for the loop; beyond it callers get an error


class BridgeFull(ResourceLimitExceeded):
    pass


class Bridge:
    def __init__(self, wake, wake_here=None):
        self._wake = wake  # any thread: make the loop call `drain` soon
        self._wake_here = wake_here or wake  # the same, called on the loop's thread
        self.loop_thread_id: int | None = None  # the loop's thread, once it runs
        self._closures: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._signalled = False
        self._backlog = 0
        self.closed = False

    def post(self, fn) -> None:
        with self._lock:
            if self._backlog >= BACKLOG_MAX_CLOSURES:
                raise BridgeFull(f"the node is overloaded: {BACKLOG_MAX_CLOSURES} calls wait for its engine loop; "
                                 f"retry later")
            self._backlog += 1
            self._closures.put(fn)
            if self._signalled or self.closed:
                return
            self._signalled = True
        if threading.get_ident() == self.loop_thread_id:
            self._wake_here()
        else:
            self._wake()

    def call(self, fn, timeout_ms: int):
        """Run `fn()` on the loop's thread and return its result (or raise its exception)."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as error:  # handed to the waiting thread, which re-raises it
                future.set_exception(error)

        self.post(run)
        try:
            return future.result(timeout=timeout_ms / 1000)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the node did not answer within {timeout_ms} ms; it may be overloaded") from None

    def drain(self) -> None:
        """Loop thread only: run every closure posted so far."""
        with self._lock:
            self._signalled = False
        while True:
            try:
                fn = self._closures.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                self._backlog -= 1
            fn()

    def close(self) -> None:
        self.closed = True
