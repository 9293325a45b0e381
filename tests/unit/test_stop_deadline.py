"""A node's stop deadline (node/stop_deadline.py): a stop that finishes disarms it; one that hangs past it
logs every thread's stack and exits with EXIT_FAILED. No clock bound: the deadline is 0 or never reached,
and the test waits on the events the watcher sets."""

from __future__ import annotations

import threading

from node import stop_deadline
from node.exit_codes import EXIT_FAILED


def test_a_stop_that_hangs_past_its_deadline_exits_failed_after_logging_the_stacks(caplog):
    exited = threading.Event()
    codes = []

    def fake_exit(code):
        codes.append(code)
        exited.set()

    stop_deadline.arm(deadline_s=0, exit=fake_exit)
    assert exited.wait(30)
    assert codes == [EXIT_FAILED]
    assert "stopping took longer than 0 s" in caplog.text
    assert "Thread MainThread:" in caplog.text and "Thread stop-deadline:" in caplog.text  # every thread's stack


def test_a_stop_that_finishes_disarms_the_deadline():
    codes = []
    done = stop_deadline.arm(deadline_s=3600, exit=codes.append)
    done.set()
    [watcher] = [thread for thread in threading.enumerate() if thread.name == "stop-deadline"]
    watcher.join(30)
    assert not watcher.is_alive() and codes == []
