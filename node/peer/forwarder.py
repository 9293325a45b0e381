"""Forwarding to one owner node: a thread and a gRPC channel that drive the forwarding channel's state machine.

Rules:
- The decisions are node/core/cluster/forward_sender.py's (pure, shared with the simulation): one
  Forward call in flight, a batch of the oldest pending entries, an ack drops every entry up to the
  owner's high water, a failure backs off and the next call starts from the oldest, the seq bound and
  the disputed high water. This module makes the calls it hands out and tells it each answer.
- Owns the forwarder thread, the ForwardSender (under `_condition`: `submit` and `close` come from
  other threads) and the gRPC channel to the destination; nothing else. The outbound store stays the
  engine loop's: the engine loop `submit`s entries and learns of acks through `on_acked`, which runs
  on the forwarder thread, so it must only post to the engine loop, never touch its state.
- Any failure (the owner's status, no connection, no address yet) is logged once when forwarding
  stops and once when it resumes, never per attempt.
- The thread waits on a condition when it has nothing to send and while backing off; it never spins.
  `close` wakes it and closes the channel, which cancels the call in flight, so it returns promptly
  even when the owner hangs.
- Pending entries are bounded by the caller: the outbound store (node/core/cluster/outbound.py) submits an
  owner's entries only while those pending stay within outbound_memory_max_bytes (at least one), and
  keeps the rest, paged to the journal. `close` drops them, and the caller resubmits its journalled
  entries after a restart.
- With cluster TLS (`tls`) the channel is mutual TLS with this node's certificate; when the TLS
  files change the channel is made again with the new ones, as when the owner's address changes.
  Without it, a `signer` (node/peer/signature.py) puts the cluster credential on every call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from node.core.cluster.forward_sender import (BATCH_BYTES_MAX, BATCH_MESSAGES_MAX, RETRY_MAX_MS, RETRY_MIN_MS, Call,
                                              ForwardSender, Outcome)
from node.core.cluster.outbound import Entry  # the entries a forwarder sends, made by the protocol
from node.peer.forward_batch import MESSAGE_BYTES_MAX, batch_to_pb
from node.peer.peer_channel import ChannelClosed, PeerChannel, call_failure

log = logging.getLogger(__name__)



class _AttemptFailed(Exception):
    """One Forward call got no answer; `reason` is for the log."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Forwarder:
    def __init__(self, source_node: str, destination_node: str,
                 resolve_address: Callable[[], str | None],
                 on_acked: Callable[[int], None],
                 *, batch_messages_max: int = BATCH_MESSAGES_MAX, batch_bytes_max: int = BATCH_BYTES_MAX,
                 call_timeout_ms: int = 5000, retry_min_ms: int = RETRY_MIN_MS, retry_max_ms: int = RETRY_MAX_MS,
                 on_state: Callable[[bool, str], None] | None = None, tls=None, signer=None):
        if not 1 <= batch_bytes_max <= MESSAGE_BYTES_MAX // 2:
            raise ValueError(f"batch_bytes_max must be 1..{MESSAGE_BYTES_MAX // 2}, got {batch_bytes_max}")
        if call_timeout_ms < 1:
            raise ValueError(f"call_timeout_ms must be >= 1, got {call_timeout_ms}")
        self.source_node = source_node
        self.destination_node = destination_node
        self._resolve_address = resolve_address
        self._on_acked = on_acked
        self._on_state = on_state
        self._signer = signer  # node.peer.signature.Signer: the cluster credential without TLS, or None
        self._call_timeout_s = call_timeout_ms / 1000

        # shared with submit/close, under _condition
        self._condition = threading.Condition()
        self._sender = ForwardSender(batch_messages_max=batch_messages_max, batch_bytes_max=batch_bytes_max,
                                     retry_min_ms=retry_min_ms, retry_max_ms=retry_max_ms)
        self._closed = False
        self._peer = PeerChannel(self._condition, tls)  # its channel: made by the forwarder thread, closed by either

        self._thread = threading.Thread(target=self._run, name=f"forward-{destination_node}", daemon=True)
        self._thread.start()

    # ---- any thread --------------------------------------------------------------------------

    def submit(self, entries: list[Entry], seq_bound: int = 0) -> None:
        """`seq_bound`: the node's next seq, above every forward seq it gave (0: not said)."""
        if not entries:
            return
        with self._condition:
            self._sender.submit(entries, seq_bound)
            self._condition.notify()

    def close(self, timeout_s: float = 2.0) -> None:
        with self._condition:
            self._closed = True
            channel = self._peer.close_locked()
            self._condition.notify_all()
        if channel is not None:
            channel.close()  # cancels the call in flight, if any
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("forwarder to %s did not stop within %.1f s", self.destination_node, timeout_s)

    @property
    def pending_count(self) -> int:
        with self._condition:
            return len(self._sender.pending)

    # ---- forwarder thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                call = self._next_call()
                if call is None:
                    return
                try:
                    high_water = self._attempt(call)
                except _AttemptFailed as failure:
                    if self._is_closed():
                        return
                    with self._condition:
                        outcome = self._sender.failed(call, failure.reason, _now_ms())
                else:
                    with self._condition:
                        outcome = self._sender.answered(call, high_water, _now_ms())
                self._report(outcome)
        except BaseException:
            # a bug: a node that silently stops forwarding would strand messages; stop the process
            # and let its supervisor restart it (the outbound store is journalled)
            log.critical("the forwarder to %s stopped on a bug; stopping the node", self.destination_node,
                         exc_info=True)
            os._exit(70)
        finally:
            self._peer.close_channel()

    def _is_closed(self) -> bool:
        with self._condition:
            return self._closed

    def _next_call(self) -> Call | None:
        """Waits until there is something to send and no backoff to sit out; None once closed."""
        with self._condition:
            sender = self._sender
            while not self._closed:
                now_ms = _now_ms()
                call = sender.take_call(now_ms)
                if call is not None:
                    return call
                if sender.pending:
                    self._condition.wait((sender.retry_at_ms - now_ms) / 1000)
                else:
                    self._condition.wait()
            return None

    def _attempt(self, call: Call) -> int:
        stub = self._stub_for_current_address()
        request = batch_to_pb(self.source_node, call.entries, call.seq_bound, call.disputed_high_water)
        metadata = self._signer.metadata(request, self.destination_node) if self._signer is not None else None
        answer, failure = call_failure(stub.Forward, request, self._call_timeout_s, metadata)
        if failure:
            raise _AttemptFailed(failure)
        return answer.high_water

    def _stub_for_current_address(self):
        try:
            address = self._resolve_address()
        except Exception as error:  # the caller's lookup failed: like "not known yet", with a traceback once
            if self._sender.connected is not False:
                log.exception("resolving the address of %s failed", self.destination_node)
            raise _AttemptFailed(f"address lookup failed: {error}") from None
        if address is None:
            raise _AttemptFailed("address unknown")
        before = self._peer.address
        try:
            stub = self._peer.stub_for(address)
        except ChannelClosed:
            raise _AttemptFailed("closed") from None
        if before is not None and address != before:
            log.info("forwarding to %s now at %s (was %s)", self.destination_node, address, before)
        return stub

    def _report(self, outcome: Outcome) -> None:
        """Log and tell what a call's end changed: forwarding stopped or resumed, a new high water."""
        sender = self._sender
        if outcome.failure:
            if outcome.connected_before is False:
                log.debug("forwarding to %s failed again: %s", self.destination_node, outcome.failure)
                return
            log.warning("forwarding from %s to %s (%s) stopped: %s; retrying every %d..%d ms, %d messages pending",
                        self.source_node, self.destination_node, self._peer.address or "address unknown",
                        outcome.failure, sender.retry_min_ms, sender.retry_max_ms, self.pending_count)
            self._set_state(False, outcome.failure)
            return
        if outcome.connected_before is not True:
            if outcome.connected_before is False:
                log.info("forwarding from %s to %s at %s resumed after %d failed attempts over %.1f s; "
                         "%d messages pending", self.source_node, self.destination_node, self._peer.address,
                         sender.failed_attempts, (_now_ms() - sender.failing_since_ms) / 1000, self.pending_count)
            self._set_state(True, f"forwarding to {self._peer.address}")
        if outcome.acked_high_water:
            try:
                self._on_acked(outcome.acked_high_water)
            except Exception:  # the caller's bug must not stop forwarding
                log.exception("on_acked(%d) for %s failed", outcome.acked_high_water, self.destination_node)

    def _set_state(self, connected: bool, reason: str) -> None:
        if self._on_state is None:
            return
        try:
            self._on_state(connected, reason)
        except Exception:  # the caller's bug must not stop forwarding
            log.exception("on_state(%s, %r) for %s failed", connected, reason, self.destination_node)


class Forwarders:
    """A node's forwarders, one per owner, made on first use; engine loop thread (`close` at shutdown).
    `resolve_address(owner)` is asked on each forwarder's thread; `on_acked(owner, high_water)` runs
    there too, so it must only post to the engine loop."""

    def __init__(self, source_node: str, resolve_address: Callable[[str], str | None],
                 on_acked: Callable[[str, int], None], *, call_timeout_ms: int, tls=None):
        self.source_node = source_node
        self.signer = None  # node.peer.signature.Signer: without `tls`, the cluster credential; set before use
        self._resolve_address = resolve_address
        self._on_acked = on_acked
        self._call_timeout_ms = call_timeout_ms
        self._tls = tls  # node.peer.cluster_secrets.ClusterTls, or None: plaintext
        self._forwarders: dict[str, Forwarder] = {}

    def to(self, owner: str) -> Forwarder:
        forwarder = self._forwarders.get(owner)
        if forwarder is None:
            resolve, on_acked = self._resolve_address, self._on_acked
            forwarder = self._forwarders[owner] = Forwarder(
                self.source_node, owner, resolve_address=lambda: resolve(owner),
                on_acked=lambda high_water: on_acked(owner, high_water),
                call_timeout_ms=self._call_timeout_ms, tls=self._tls, signer=self.signer)
        return forwarder

    def close(self) -> None:
        for forwarder in self._forwarders.values():
            forwarder.close()
