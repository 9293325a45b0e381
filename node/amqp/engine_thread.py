"""The engine loop's thread: the event loop it runs, its start, and its stop with a grace period.

Rules:
- `start`, `stop` and `is_alive` are called from the node's main thread (node/runtime.py); everything
  else here runs on the engine loop's thread. `stop` reaches the loop through the bridge only.
- A stop closes the listeners and every connection first, then gives their close frames
  SHUTDOWN_GRACE_S to leave before the sockets are closed and the loop stops.
- An exception escaping a callback is a broken invariant (the core and proton's objects may disagree
  from then on): the process exits with status 70 and its supervisor restarts it. A socket's own
  failure (OSError) is the peer's business and only logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

log = logging.getLogger("grouper.amqp")

SHUTDOWN_GRACE_S = 0.3  # time for close frames to leave before the loop stops


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # about a third of asyncio's cost per wake-up
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class EngineThread:
    """Runs `server.loop` on a thread of its own; `tick_interval_s` paces the server's `_tick`."""

    def __init__(self, server, tick_interval_s: float):
        self.server = server
        self.tick_interval_s = tick_interval_s

    def start(self) -> None:
        self.server._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.server._thread.start()

    def is_alive(self) -> bool:
        thread = self.server._thread
        return thread is not None and thread.is_alive()

    def stop(self, wait_s: float) -> None:
        """Close every connection (their close frames get SHUTDOWN_GRACE_S to leave), then stop the loop."""
        if not self.is_alive():
            return
        self.server.bridge.post(self._shutdown)
        self.server._thread.join(wait_s)

    def _run(self) -> None:
        server = self.server
        server.bridge.loop_thread_id = threading.get_ident()
        asyncio.set_event_loop(server.loop)
        server.loop.set_exception_handler(_stop_on_bug)
        server.loop.call_later(self.tick_interval_s, server._tick)
        server.wake()  # journals the declarations made during recovery
        try:
            server.loop.run_forever()
        except BaseException:
            log.exception("the engine loop stopped on an unexpected error")
            os._exit(70)  # a broken invariant: stop the process, the supervisor restarts it

    def _shutdown(self) -> None:
        server = self.server
        server.stopping = True
        server.listener.close()
        server.connections.close_all()
        server.loop.call_later(SHUTDOWN_GRACE_S, self._stop_loop)

    def _stop_loop(self) -> None:
        server = self.server
        server.bridge.close()
        server.connections.close_sockets()
        server.loop.stop()


def _stop_on_bug(loop, context: dict) -> None:
    """asyncio logs an exception escaping a callback and carries on; here that is a broken invariant
    (see the header): stop, and let the supervisor restart the node."""
    error = context.get("exception")
    if error is None or isinstance(error, OSError):
        loop.default_exception_handler(context)
        return
    log.critical("the engine loop stopped on an unexpected error: %s", context.get("message"), exc_info=error)
    logging.shutdown()
    os._exit(70)
