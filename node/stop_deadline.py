"""A node's stop has a deadline: past it, the node logs every thread's stack and exits as after a crash.

Rules:
- Armed when the node starts stopping (a signal, or `grouper up` dying: its nodes get SIGTERM), disarmed
  once the stop is done. A stop normally takes seconds: the engine loop's STOP_WAIT_S, the forwarders'
  and replicators' joins, the raft member's STOP_TIMEOUT_MS; STOP_DEADLINE_S is above all of them
  together, and below the 60 s a supervisor (or `grouper up`'s test) waits before it calls a node stuck.
- Exiting then is safe: the journal is written for crashes (what was accepted durable is on disk), and a
  node that never exits would hold its ports and data directory lock for ever.
- Every thread's stack is logged first, so the part that hung is named for its fix.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback

from node.exit_codes import EXIT_FAILED

log = logging.getLogger("grouper.node")

STOP_DEADLINE_S = 40.0  # seconds a stop may take before the node exits without finishing it


def arm(deadline_s: float = STOP_DEADLINE_S, exit=os._exit) -> threading.Event:
    """Start the deadline; set the returned event once the stop is done."""
    done = threading.Event()
    threading.Thread(target=_watch, args=(done, deadline_s, exit), name="stop-deadline", daemon=True).start()
    return done


def _watch(done: threading.Event, deadline_s: float, exit) -> None:
    if done.wait(deadline_s):
        return
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    stacks = "".join(f"\nThread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())
    log.error("stopping took longer than %.0f s: a part of the node hangs; exiting now, as after a crash (the "
              "journal keeps what was accepted durable). Every thread's stack:%s", deadline_s, stacks)
    exit(EXIT_FAILED)
