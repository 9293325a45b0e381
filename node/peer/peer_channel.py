"""One gRPC channel to a peer node's port, made again when the peer's address or the cluster's TLS files change.

Shared by the forwarder (node/peer/forwarder.py) and the replicator (node/peer/replicator.py), each of
which makes its calls on a thread of its own.
Rules:
- `stub_for` runs on that caller thread only. The channel is published under the caller's lock (the
  one its `close` takes), so a close from any thread sees the newest channel, and a channel made after
  the close is closed at once (ChannelClosed).
- The stub is made before the channel is published: a close may close a published channel at any time,
  and grpcio crashes the process when a stub is made on a closed channel (a call on one only raises
  ValueError, which the callers turn into a failed attempt).
- Plaintext without `tls`; with it, the node's certificate (mutual TLS) and the TLS files' generation,
  so rotated files take effect at the next call.
"""

from __future__ import annotations

import grpc

from node.peer.forward_batch import MESSAGE_BYTES_MAX
from proto import peer_pb2_grpc

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


class ChannelClosed(Exception):
    """The caller closed while a channel was being made."""


def call_failure(method, request, timeout_s: float, metadata) -> tuple[object, str]:
    """One blocking call (not .future(): a third cheaper per call, and a close cancels it by closing the
    channel): (its answer, "") or (None, why it failed, for the caller's log)."""
    try:
        return method(request, timeout=timeout_s, wait_for_ready=False, metadata=metadata), ""
    except grpc.RpcError as error:
        code = error.code()
        return None, f"{code.name}: {error.details() or code.name}"
    except ValueError as error:  # the channel was closed by a close before the call started
        return None, f"channel closed: {error}"


class PeerChannel:
    def __init__(self, lock, tls=None):
        self._lock = lock  # the caller's lock (a threading.Condition): guards `channel` and `closed`
        self._tls = tls  # node.peer.cluster_secrets.ClusterTls, or None: plaintext
        self.channel: grpc.Channel | None = None  # under the lock: replaced by the caller thread
        self.closed = False  # under the lock
        self.address: str | None = None  # caller thread: the address the channel dials
        self._generation = 0  # caller thread: of the TLS files the channel was made with
        self._stub: peer_pb2_grpc.PeerServiceStub | None = None

    def stub_for(self, address: str) -> peer_pb2_grpc.PeerServiceStub:
        """The stub of a channel to `address`, made anew when the address or the TLS files changed."""
        generation = self._tls.current_generation() if self._tls is not None else 0
        if address == self.address and generation == self._generation:
            return self._stub
        if self._tls is None:
            channel = grpc.insecure_channel(address, options=list(CHANNEL_OPTIONS))
        else:
            channel = grpc.secure_channel(address, self._tls.channel_credentials(),
                                          options=[*CHANNEL_OPTIONS, *self._tls.channel_options()])
        stub = peer_pb2_grpc.PeerServiceStub(channel)  # before publishing: see the rules above
        with self._lock:
            previous, self.channel = self.channel, channel
            closed = self.closed
        if previous is not None:
            previous.close()
        if closed:  # the close may have missed the new channel
            channel.close()
            raise ChannelClosed("closed")
        self.address, self._generation, self._stub = address, generation, stub
        return stub

    def close_locked(self) -> grpc.Channel | None:
        """Under the caller's lock: no channel is made after this; returns the one to close (outside the lock:
        closing it cancels the call in flight)."""
        self.closed = True
        return self.channel

    def close_channel(self) -> None:
        """The caller thread, on its way out: close the channel it made last, if any."""
        with self._lock:
            channel = self.channel
        if channel is not None:
            channel.close()
