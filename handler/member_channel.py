"""The channel between a node and its raft member process: whole messages over one socketpair.

A message is any plain-data value (tuples, lists, dicts, str, int, float, bool, None), pickled, with
a 4-byte big-endian length in front. Rules:
- Only the node and the member process it started hold the two ends: the socketpair is made by the
  node and handed to the child as an inherited descriptor, never bound to an address, so nothing
  else can connect, read or write; that is why unpickling what arrives is safe here and nowhere else.
- `send` never blocks its caller: with nothing queued ahead it writes what the socket takes at
  once, and queues the rest for one writer thread, which drains it many messages per write. The
  engine loop proposes through it and must not wait for the other process.
- One reader hands each message to `on_message` in arrival order, so the order in which the member
  applied raft entries is the order in which the node hears of them. The reader is a thread
  (`start`), or an asyncio loop's reader callback (`start_on(loop)`): the node reads on its engine
  loop, since a thread of its own would wait for the busy loop's GIL (up to a switch interval, 5 ms)
  and then hand each message to the loop again. `read_until` reads on the calling thread before
  either, for what must arrive before a loop runs. When the other end is gone (EOF, a reset, a
  message longer than MESSAGE_BYTES_MAX), or `on_message` raised (a bug: it is logged), it stops
  reading and calls `on_closed(reason)` once.
Never imports pysyncobj, grpc or proton.
"""

from __future__ import annotations

import logging
import pickle
import select
import socket
import struct
import threading
import time
from collections import deque

log = logging.getLogger("grouper.handler")

MESSAGE_BYTES_MAX = 1 << 30  # a snapshot of a million routes is ~60 MB; longer is a broken channel
READ_CHUNK_BYTES = 1 << 20
_LENGTH = struct.Struct(">I")


class MemberChannel:
    def __init__(self, sock: socket.socket, name: str, on_message, on_closed):
        self._sock = sock
        self._name = name
        self._on_message = on_message
        self._on_closed = on_closed
        self._outbox: deque = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._writing = False  # the writer thread is writing frames it took from the outbox
        self._closed_reported = threading.Lock()
        self._reported = False
        self._writer = threading.Thread(target=self._write_loop, name=f"{name}-writer", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=f"{name}-reader", daemon=True)
        self._buffer = bytearray()  # received bytes not yet a whole message
        self._loop = None  # the asyncio loop that reads, after start_on

    def start(self) -> None:
        """Read on a thread of this channel's own."""
        self._start_writer()
        self._reader.start()

    def start_on(self, loop) -> None:
        """Read on `loop` (asyncio), from the loop's thread or before the loop runs."""
        self._start_writer()
        self._loop = loop
        loop.add_reader(self._sock.fileno(), self._readable)

    def read_until(self, wanted, timeout_s: float) -> bool:
        """Before `start_on`: read and hand over messages on the calling thread until `wanted(message)`
        was true of one (True), or `timeout_s` passed or the channel closed (False)."""
        self._start_writer()
        deadline = time.monotonic() + timeout_s
        seen = []
        while not seen:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not select.select([self._sock], [], [], remaining_s)[0]:
                return False
            if not self._receive(lambda message: seen.append(True) if wanted(message) else None):
                return False
        return True

    def _start_writer(self) -> None:
        if self._writer.ident is None:  # not started yet (read_until starts it before start_on)
            self._writer.start()

    def send(self, message) -> None:
        frame = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        data = _LENGTH.pack(len(frame)) + frame
        with self._wake:
            if self._closing:
                return  # the other end is gone or going: what the caller wanted is reported lost there
            if not self._outbox and not self._writing:
                # nothing queued ahead: write here, without waking the writer thread, which in a busy
                # node waits up to a GIL switch interval (5 ms) to run; what does not fit now goes to it
                try:
                    sent = self._sock.send(data, socket.MSG_DONTWAIT)
                except OSError:  # full (BlockingIOError) or broken: the writer thread finds out which
                    sent = 0
                if sent == len(data):
                    return
                data = data[sent:]
            self._outbox.append(data)
            self._wake.notify()

    def close(self, flush_timeout_s: float = 1.0) -> None:
        """Write what is queued (within `flush_timeout_s`), then shut the socket; the reader ends too."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._writer.is_alive() and self._writer is not threading.current_thread():
            self._writer.join(flush_timeout_s)
        if self._loop is not None and not self._loop.is_closed():
            if self._loop.is_running():
                self._loop.call_soon_threadsafe(self._loop.remove_reader, self._sock.fileno())
            else:
                self._loop.remove_reader(self._sock.fileno())
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    # ---- threads -----------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while not self._outbox and not self._closing:
                    self._wake.wait()
                if not self._outbox:
                    return
                frames = list(self._outbox)
                self._outbox.clear()
                self._writing = True  # send() must not write past these
            try:
                self._sock.sendall(b"".join(frames))
            except OSError as error:
                self._closed(f"writing failed: {error}")
                return
            with self._wake:
                self._writing = False

    def _read_loop(self) -> None:
        while self._receive():
            pass

    def _readable(self) -> None:  # the loop's reader callback
        if not self._receive(flags=socket.MSG_DONTWAIT):
            self._loop.remove_reader(self._sock.fileno())

    def _receive(self, then=None, flags: int = 0) -> bool:
        """One read (blocking unless `flags` say otherwise) and every whole message it completes,
        each handed to on_message (then to `then`); False once the channel is closed."""
        try:
            chunk = self._sock.recv(READ_CHUNK_BYTES, flags)
        except BlockingIOError:
            return True
        except OSError as error:
            self._closed(f"reading failed: {error}")
            return False
        if not chunk:
            self._closed("the other end closed the channel")
            return False
        buffer = self._buffer
        buffer += chunk
        position = 0  # of the next message's length in `buffer`
        try:
            while len(buffer) - position >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(buffer, position)
                if length > MESSAGE_BYTES_MAX:
                    self._closed(f"a message claims {length} bytes, more than {MESSAGE_BYTES_MAX}")
                    return False
                start = position + _LENGTH.size
                if len(buffer) < start + length:
                    break
                message = pickle.loads(buffer[start:start + length])
                position = start + length
                try:
                    self._on_message(message)
                    if then is not None:
                        then(message)
                except Exception as error:  # a bug here: say so and end, never go on deaf
                    kind = message[0] if isinstance(message, tuple) and message else message
                    log.exception("%s: handling a %r message failed", self._name, kind)
                    self._closed(f"handling a message failed: {type(error).__name__}: {error}")
                    return False
        finally:
            del buffer[:position]
        return True

    def _closed(self, reason: str) -> None:
        with self._closed_reported:
            if self._reported:
                return
            self._reported = True
        with self._wake:
            closing = self._closing
            self._closing = True
            self._wake.notify()
        if not closing:
            self._on_closed(reason)
