"""Forwarding to one owner node: entries of the outbound store go out in order, batched, until acked.

Rules:
- Owns the forwarder thread, the pending entries (submitted, not yet acked) and the gRPC channel to
  the destination; nothing else. The outbound store stays the engine loop's: the engine loop `submit`s
  entries and learns of acks through `on_acked`, which runs on the forwarder thread, so it must
  only post to the engine loop, never touch its state.
- Exactly one Forward call is in flight. A batch is the oldest pending entries that fit the limits,
  always at least one, in submit order; after an ack every entry up to the owner's high water is
  dropped, and the rest (a partial ack leaves some) goes again, oldest first. The owner dedupes by
  forward_seq, so resending after a lost ack is harmless.
- Any failure (the owner's status, no connection, no address yet) backs off exponentially, then
  retries from the oldest unacked entry. It is logged once when forwarding stops and once when it
  resumes, never per attempt.
- The thread waits on a condition when it has nothing to send and while backing off; it never spins.
  `close` wakes it and closes the channel, which cancels the call in flight, so it returns promptly
  even when the owner hangs.
- Pending entries are bounded by the caller: the outbound store (node/core/outbound.py) submits an
  owner's entries only while those pending stay within outbound_memory_max_bytes (at least one), and
  keeps the rest, paged to the journal. `close` drops them, and the caller resubmits its journalled
  entries after a restart.
- With cluster TLS (`tls`) the channel is mutual TLS with this node's certificate; when the TLS
  files change the channel is made again with the new ones, as when the owner's address changes.
  Without it, a `signer` (node/peer/signature.py) puts the cluster credential on every call.
- Each batch carries the seq bound its entries were submitted with (the node's next seq then: no
  forward seq this node gave is at or above it). An ack at or above the bound claims seqs this node
  never gave (the owner took a forged batch as this node's, or this node reused seqs after a
  restart): it is not taken as an ack, the entries stay pending, and the next attempt disputes that
  high water (`disputed_high_water`), on which the owner sets its mark back
  (node/core/cluster/owner.py). An ack below the bound ends the dispute.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from typing import Callable

import grpc

from node.core.outbound import Entry  # the entries a forwarder sends, made by the protocol
from proto import peer_pb2, peer_pb2_grpc

log = logging.getLogger(__name__)

MESSAGE_BYTES_MAX = 64 << 20  # gRPC frame limit for a batch, both ways; a batch is capped far below
ENTRY_OVERHEAD_BYTES = 48  # protobuf framing and fixed fields of one Forwarded, counted against batch_bytes_max
RECONNECT_BACKOFF_INITIAL_MS = 100  # gRPC's own reconnect backoff: notice a peer that comes back quickly
RECONNECT_BACKOFF_MAX_MS = 1000
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
    ("grpc.enable_http_proxy", 0),  # peers are dialled directly: an http_proxy for web traffic must not apply
)


# ForwardBatch.format_version (proto/peer.proto): what this build sends, and what its owner's end reads
# (the one before it too, once there is one, so a cluster upgraded one step at a time keeps forwarding)
FORMAT_VERSION = 1
FORMAT_VERSIONS_READ = (1,)


def batch_to_pb(source_node: str, entries: list[Entry], seq_bound: int = 0,
                disputed_high_water: int = 0) -> peer_pb2.ForwardBatch:
    batch = peer_pb2.ForwardBatch(source_node=source_node, format_version=FORMAT_VERSION, seq_bound=seq_bound,
                                  disputed_high_water=disputed_high_water)
    add = batch.messages.add  # builds in place: half the cost of Forwarded(...) then a copy
    for entry in entries:
        add(forward_seq=entry.forward_seq, queue=entry.queue, has_group=entry.group_id is not None,
            group_id=entry.group_id or "", payload=entry.payload, expires_at_ms=entry.expires_at_ms,
            closes_group=entry.closes_group, enqueued_at_ms=entry.enqueued_at_ms)
    return batch


def entry_size_bytes(entry: Entry) -> int:
    return len(entry.payload) + len(entry.queue) + len(entry.group_id or "") + ENTRY_OVERHEAD_BYTES


class _AttemptFailed(Exception):
    """One Forward attempt did not advance the owner's high water; `reason` is for the log."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Forwarder:
    def __init__(self, source_node: str, destination_node: str,
                 resolve_address: Callable[[], str | None],
                 on_acked: Callable[[int], None],
                 *, batch_messages_max: int = 500, batch_bytes_max: int = 4 << 20,
                 call_timeout_ms: int = 5000, retry_min_ms: int = 100, retry_max_ms: int = 2000,
                 on_state: Callable[[bool, str], None] | None = None, tls=None, signer=None):
        if batch_messages_max < 1:
            raise ValueError(f"batch_messages_max must be >= 1, got {batch_messages_max}")
        if not 1 <= batch_bytes_max <= MESSAGE_BYTES_MAX // 2:
            raise ValueError(f"batch_bytes_max must be 1..{MESSAGE_BYTES_MAX // 2}, got {batch_bytes_max}")
        if call_timeout_ms < 1:
            raise ValueError(f"call_timeout_ms must be >= 1, got {call_timeout_ms}")
        if not 1 <= retry_min_ms <= retry_max_ms:
            raise ValueError(f"need 1 <= retry_min_ms <= retry_max_ms, got {retry_min_ms} and {retry_max_ms}")
        self.source_node = source_node
        self.destination_node = destination_node
        self._resolve_address = resolve_address
        self._on_acked = on_acked
        self._on_state = on_state
        self._tls = tls  # node.peer.credentials.ClusterTls, or None: plaintext
        self._signer = signer  # node.peer.signature.Signer: the cluster credential without TLS, or None
        self._batch_messages_max = batch_messages_max
        self._batch_bytes_max = batch_bytes_max
        self._call_timeout_s = call_timeout_ms / 1000
        self._retry_min_ms = retry_min_ms
        self._retry_max_ms = retry_max_ms

        # shared with submit/close, under _condition
        self._condition = threading.Condition()
        self._pending: deque[Entry] = deque()
        self._last_submitted_seq = 0
        self._seq_bound = 0  # the highest bound submitted with entries; 0: none said
        self._closed = False
        self._channel: grpc.Channel | None = None  # replaced by the forwarder thread, closed by either

        # forwarder thread only
        self._high_water = 0
        self._disputed_high_water = 0  # the owner's last answer at or above the bound; 0: none
        self._retry_at = 0.0  # time.monotonic() before which no attempt is made
        self._retry_delay_ms = 0  # 0 while forwarding works
        self._connected: bool | None = None  # None until the first attempt ends
        self._failed_attempts = 0
        self._failing_since = 0.0
        self._channel_address: str | None = None
        self._channel_generation = 0  # of the TLS files the channel was made with
        self._stub: peer_pb2_grpc.PeerServiceStub | None = None

        self._thread = threading.Thread(target=self._run, name=f"forward-{destination_node}", daemon=True)
        self._thread.start()

    # ---- any thread --------------------------------------------------------------------------

    def submit(self, entries: list[Entry], seq_bound: int = 0) -> None:
        """`seq_bound`: the node's next seq, above every forward seq it gave (0: not said)."""
        if not entries:
            return
        with self._condition:
            if seq_bound > entries[-1].forward_seq:  # else no bound at all: one the batch breaks is refused
                self._seq_bound = max(self._seq_bound, seq_bound)
            previous = self._last_submitted_seq
            for entry in entries:
                if entry.forward_seq <= previous:
                    raise ValueError(f"forward_seq must increase: {entry.forward_seq} after {previous}")
                previous = entry.forward_seq
            self._last_submitted_seq = previous
            self._pending.extend(entries)
            self._condition.notify()

    def close(self, timeout_s: float = 2.0) -> None:
        with self._condition:
            self._closed = True
            channel = self._channel
            self._condition.notify_all()
        if channel is not None:
            channel.close()  # cancels the call in flight, if any
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("forwarder to %s did not stop within %.1f s", self.destination_node, timeout_s)

    @property
    def pending_count(self) -> int:
        with self._condition:
            return len(self._pending)

    # ---- forwarder thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                taken = self._next_batch()
                if taken is None:
                    return
                try:
                    high_water = self._attempt(*taken)
                except _AttemptFailed as failure:
                    if self._is_closed():
                        return
                    self._failed(failure.reason)
                else:
                    self._acked(high_water)
        except BaseException:
            # a bug: a node that silently stops forwarding would strand messages; stop the process
            # and let its supervisor restart it (the outbound store is journalled)
            log.critical("the forwarder to %s stopped on a bug; stopping the node", self.destination_node,
                         exc_info=True)
            os._exit(70)
        finally:
            with self._condition:
                channel = self._channel
            if channel is not None:
                channel.close()

    def _is_closed(self) -> bool:
        with self._condition:
            return self._closed

    def _next_batch(self) -> tuple[list[Entry], int] | None:
        """Waits until there is something to send and no backoff to sit out; None once closed."""
        with self._condition:
            while not self._closed:
                if self._pending:
                    wait_s = self._retry_at - time.monotonic()
                    if wait_s <= 0:
                        return self._take_batch()
                    self._condition.wait(wait_s)
                else:
                    self._condition.wait()
            return None

    def _take_batch(self) -> tuple[list[Entry], int]:
        batch: list[Entry] = []
        size_bytes = 0
        for entry in itertools.islice(self._pending, self._batch_messages_max):
            size_bytes += entry_size_bytes(entry)
            if batch and size_bytes > self._batch_bytes_max:
                break
            batch.append(entry)
        return batch, self._seq_bound if self._seq_bound > batch[-1].forward_seq else 0

    def _attempt(self, batch: list[Entry], seq_bound: int) -> int:
        stub = self._stub_for_current_address()
        request = batch_to_pb(self.source_node, batch, seq_bound, self._disputed_high_water)
        metadata = self._signer.metadata(request, self.destination_node) if self._signer is not None else None
        try:
            # blocking, not .future(): a third cheaper per call, and close() cancels it by closing the channel
            high_water = stub.Forward(request, timeout=self._call_timeout_s, wait_for_ready=False,
                                      metadata=metadata).high_water
        except grpc.RpcError as error:
            code = error.code()
            raise _AttemptFailed(f"{code.name}: {error.details() or code.name}") from None
        except ValueError as error:  # the channel was closed by close() before the call started
            raise _AttemptFailed(f"channel closed: {error}") from None
        if seq_bound and high_water >= seq_bound:
            self._disputed_high_water = high_water
            raise _AttemptFailed(f"the owner answers high water {high_water}, but this node never gave a forward "
                                 f"seq at or above {seq_bound}: it took a batch as this node's that this node never "
                                 f"sent (forged?), or this node reused seqs; not taken as an ack: the entries stay "
                                 f"and go again, disputing that high water, and the owner sets its mark back")
        self._disputed_high_water = 0
        if high_water < batch[0].forward_seq:
            # a reply that takes nothing would otherwise be resent at once, forever
            raise _AttemptFailed(f"the owner took none of the batch (high water {high_water}, "
                                 f"batch starts at {batch[0].forward_seq})")
        return high_water

    def _stub_for_current_address(self) -> peer_pb2_grpc.PeerServiceStub:
        try:
            address = self._resolve_address()
        except Exception as error:  # the caller's lookup failed: like "not known yet", with a traceback once
            if self._connected is not False:
                log.exception("resolving the address of %s failed", self.destination_node)
            raise _AttemptFailed(f"address lookup failed: {error}") from None
        if address is None:
            raise _AttemptFailed("address unknown")
        generation = self._tls.current_generation() if self._tls is not None else 0
        if address != self._channel_address or generation != self._channel_generation:
            if self._tls is None:
                channel = grpc.insecure_channel(address, options=list(CHANNEL_OPTIONS))
            else:
                channel = grpc.secure_channel(address, self._tls.channel_credentials(),
                                              options=[*CHANNEL_OPTIONS, *self._tls.channel_options()])
            # the stub first: close() may close the channel once it is published, and grpcio crashes
            # the process when a stub is made on a closed channel (a call on one only raises ValueError)
            stub = peer_pb2_grpc.PeerServiceStub(channel)
            with self._condition:
                previous, self._channel = self._channel, channel
                closed = self._closed
            if previous is not None:
                previous.close()
                if address != self._channel_address:
                    log.info("forwarding to %s now at %s (was %s)", self.destination_node, address,
                             self._channel_address)
            if closed:  # close() may have missed the new channel
                channel.close()
                raise _AttemptFailed("closed")
            self._channel_address = address
            self._channel_generation = generation
            self._stub = stub
        return self._stub

    def _acked(self, high_water: int) -> None:
        with self._condition:
            while self._pending and self._pending[0].forward_seq <= high_water:
                self._pending.popleft()
            pending_count = len(self._pending)
        self._retry_delay_ms = 0
        self._retry_at = 0.0
        if self._connected is not True:
            if self._connected is False:
                log.info("forwarding from %s to %s at %s resumed after %d failed attempts over %.1f s; "
                         "%d messages pending", self.source_node, self.destination_node, self._channel_address,
                         self._failed_attempts, time.monotonic() - self._failing_since, pending_count)
            self._set_state(True, f"forwarding to {self._channel_address}")
        if high_water > self._high_water:
            self._high_water = high_water
            try:
                self._on_acked(high_water)
            except Exception:  # the caller's bug must not stop forwarding
                log.exception("on_acked(%d) for %s failed", high_water, self.destination_node)

    def _failed(self, reason: str) -> None:
        self._retry_delay_ms = min(self._retry_max_ms, max(self._retry_min_ms, self._retry_delay_ms * 2))
        self._retry_at = time.monotonic() + self._retry_delay_ms / 1000
        if self._connected is False:
            self._failed_attempts += 1
            log.debug("forwarding to %s failed again: %s", self.destination_node, reason)
            return
        self._failed_attempts = 1
        self._failing_since = time.monotonic()
        log.warning("forwarding from %s to %s (%s) stopped: %s; retrying every %d..%d ms, %d messages pending",
                    self.source_node, self.destination_node, self._channel_address or "address unknown", reason,
                    self._retry_min_ms, self._retry_max_ms, self.pending_count)
        self._set_state(False, reason)

    def _set_state(self, connected: bool, reason: str) -> None:
        self._connected = connected
        if self._on_state is None:
            return
        try:
            self._on_state(connected, reason)
        except Exception:  # the caller's bug must not stop forwarding
            log.exception("on_state(%s, %r) for %s failed", connected, reason, self.destination_node)
