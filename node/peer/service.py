"""The owner's end of forwarding: a ForwardBatch in, `handle_forward` called, the high water or a status out.

Rules:
- Owns nothing. It runs on gRPC pool threads; `handle_forward` posts the batch to the engine loop, which
  dedupes by forward_seq and answers once the batch is durable, and this servicer waits for it with
  a deadline no later than the caller's.
- The batch's shape is checked here (source_node set, at least one message, forward_seq >= 1 and
  strictly increasing), so the engine loop only ever sees a well-formed batch; its content (queue names,
  limits) is the handler's to judge.
- Failures become status codes in one table, `STATUS_BY_ERROR`; an error it does not know is a bug,
  logged here with its traceback and reported as INTERNAL.
"""

from __future__ import annotations

import logging
from typing import Callable

import grpc

from node.core.errors import GrouperError, InvalidField, NotFound, ResourceLimitExceeded
from node.peer.forwarder import MESSAGE_BYTES_MAX, Entry
from proto import peer_pb2, peer_pb2_grpc

log = logging.getLogger(__name__)

TIMEOUT_MS_DEFAULT = 5000  # longest wait for the engine loop to make a batch durable
# A server carrying the peer service must be built with these, or a full batch exceeds gRPC's 4 MiB default.
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
)

HandleForward = Callable[[str, list[Entry], int], int]

# First match wins, so a subclass must come before its base. `None` means "by the error's own word":
# UNAVAILABLE when it says a retry can succeed, FAILED_PRECONDITION when not.
STATUS_BY_ERROR: tuple[tuple[type[BaseException], grpc.StatusCode | None], ...] = (
    (ResourceLimitExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidField, grpc.StatusCode.INVALID_ARGUMENT),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),  # the engine loop did not make the batch durable in time
    (GrouperError, None),
)


def status_for(error: BaseException) -> grpc.StatusCode:
    for error_type, code in STATUS_BY_ERROR:
        if isinstance(error, error_type):
            if code is None:
                return grpc.StatusCode.UNAVAILABLE if error.retriable else grpc.StatusCode.FAILED_PRECONDITION
            return code
    return grpc.StatusCode.INTERNAL


def _message_for(error: BaseException, code: grpc.StatusCode) -> str:
    if code is grpc.StatusCode.INTERNAL:
        return f"internal error ({type(error).__name__}: {error}); the owner's log has the details"
    return getattr(error, "description", None) or str(error)


def entries_from_pb(batch: peer_pb2.ForwardBatch) -> list[Entry]:
    """Raises InvalidField naming the field when the batch is malformed."""
    if not batch.source_node:
        raise InvalidField("source_node: must not be empty")
    if not batch.messages:
        raise InvalidField("messages: a batch holds at least one message")
    entries = []
    previous_seq = 0
    for index, message in enumerate(batch.messages):
        seq = message.forward_seq
        if seq <= previous_seq:
            expected = "be >= 1" if index == 0 else f"increase (previous {previous_seq})"
            raise InvalidField(f"messages[{index}].forward_seq: must {expected}, got {seq}")
        previous_seq = seq
        # _make, positional in Entry's field order, costs half of Entry(name=...) per message
        entries.append(Entry._make((seq, message.queue, message.group_id if message.has_group else None,
                                    message.payload, message.expires_at_ms, message.closes_group,
                                    message.enqueued_at_ms)))
    return entries


class PeerServicer(peer_pb2_grpc.PeerServiceServicer):
    def __init__(self, handle_forward: HandleForward, timeout_ms: int = TIMEOUT_MS_DEFAULT):
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        self._handle_forward = handle_forward
        self._timeout_ms = timeout_ms

    def Forward(self, request, context):
        try:
            entries = entries_from_pb(request)
            high_water = self._handle_forward(request.source_node, entries, self._timeout_for(context))
            return peer_pb2.ForwardAck(high_water=high_water)
        except Exception as error:  # every failure leaves as a status code; see STATUS_BY_ERROR
            code = status_for(error)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("forward from %r (%d messages) failed", request.source_node, len(request.messages))
            context.abort(code, _message_for(error, code))

    def _timeout_for(self, context: grpc.ServicerContext) -> int:
        # the sender stops waiting at its deadline and resends; waiting past it only holds a pool thread
        remaining_s = context.time_remaining()
        if remaining_s is None or remaining_s * 1000 >= self._timeout_ms:
            return self._timeout_ms
        return max(1, int(remaining_s * 1000))


def add_peer_service(server: grpc.Server, handle_forward: HandleForward,
                     timeout_ms: int = TIMEOUT_MS_DEFAULT) -> None:
    """Serve forwarding on `server`, which must be built with SERVER_OPTIONS."""
    peer_pb2_grpc.add_PeerServiceServicer_to_server(PeerServicer(handle_forward, timeout_ms), server)
