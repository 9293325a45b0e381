"""The owner's end of forwarding: a ForwardBatch in, `handle_forward` called, the high water or a status out.

Rules:
- Owns nothing. It runs on gRPC pool threads; `handle_forward` posts the batch to the engine loop, which
  dedupes by forward_seq and answers once the batch is durable, and this servicer waits for it with
  a deadline no later than the caller's.
- Who may forward is the listener's check (node/peer/members.py), asked before anything else; a
  refused caller gets UNAUTHENTICATED or PERMISSION_DENIED, and is logged once per source address
  and reason, counted.
- The batch's shape is checked when it is read (node/peer/forward_batch.py), so the engine loop only
  ever sees a well-formed batch. A seq at or above its batch's bound jumps ahead of every seq its
  source gave: refused (INVALID_ARGUMENT), logged once per source address and reason, counted.
- Errors are data: they become status codes in one table, `STATUS_BY_ERROR`, which also says who is
  at fault; an error it does not know is a bug, logged here with its traceback and reported as
  INTERNAL. Whatever the status, the source keeps its entries and retries (node/peer/forwarder.py).
- A batch names the node it comes from (source_node, a node id HOST:RAFT_PORT), and the owner keeps
  per-source state (forward_seq dedup, acknowledgements) by it.
- Replicate (issue 28) is served the same way by a backup: its own check (the batch's owner_node is the
  claimed caller, the replication credential: node/peer/members.py), the batch read and checked by
  node/peer/replica_batch.py, then `handle_replicate` (the replica writer's submit,
  node/store/replica_writer.py) answers (high water, epoch) once durable, within the same deadline; its
  errors go through the same table. A node that keeps no replicas answers UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from concurrent import futures
from typing import Callable, NamedTuple

import grpc

from node.core.errors import GrouperError, InvalidField, NotAllowed, NotFound, ResourceLimitExceeded
from node.core.cluster.outbound import Entry
from node.grpc_port import bind
from node.peer.cluster_secrets import ClusterTls
from node.peer.forward_batch import MESSAGE_BYTES_MAX, SeqJump, entries_from_pb
from node.peer.members import MembersOnly, Refusal, open_to_all, refuse_all
from node.peer.replica_batch import records_from_pb
from proto import peer_pb2, peer_pb2_grpc

log = logging.getLogger(__name__)

TIMEOUT_MS_DEFAULT = 5000  # longest wait for the engine loop to make a batch durable
# A server carrying the peer service must be built with these, or a full batch exceeds gRPC's 4 MiB default.
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
)

PEER_WORKERS = 8  # pool threads of the peer listener; each forwarder keeps one call in flight
CONCURRENT_RPCS_MAX = PEER_WORKERS * 8  # calls admitted at once; beyond it RESOURCE_EXHAUSTED
REFUSALS_REMEMBERED_MAX = 1000  # (source, reason) pairs already logged; the oldest is forgotten first

# (source_node, entries, timeout_ms, seq_bound, disputed_high_water) -> the source's high water here
HandleForward = Callable[[str, list[Entry], int, int, int], int]
# (owner_node, epoch, records, timeout_ms) -> (high water, epoch), once durable (ReplicaWriter.submit)
HandleReplicate = Callable[[str, int, list, int], tuple[int, int]]
NO_REPLICAS = "this node keeps no replicas (it is no cluster member with a replica writer)"
_COUNTS_LOCK = threading.Lock()  # over every servicer's refused_counts: listeners may share one

SOURCE = "source"  # the forwarding node sent what this node never takes: resending it fails again
OWNER = "owner"  # this node cannot take it now (a limit, its disk, its raft member): a resend may succeed
OPERATOR = "operator"  # the cluster's setup (builds of different format versions): an operator must act


class PeerStatus(NamedTuple):
    error: type[BaseException]
    code: grpc.StatusCode
    fault: str  # who is at fault: SOURCE, OWNER or OPERATOR
    retriable: bool | None = None  # the error's own word it must say; None: either


# First match wins, so a subclass must come before its base. An error no row matches is a bug here:
# INTERNAL (BUG).
STATUS_BY_ERROR: tuple[PeerStatus, ...] = (
    PeerStatus(ResourceLimitExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED, OWNER),
    PeerStatus(NotFound, grpc.StatusCode.NOT_FOUND, SOURCE),
    PeerStatus(InvalidField, grpc.StatusCode.INVALID_ARGUMENT, SOURCE),  # SeqJump too
    # the engine loop did not make the batch durable in time
    PeerStatus(TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED, OWNER),
    PeerStatus(NotAllowed, grpc.StatusCode.FAILED_PRECONDITION, OPERATOR, retriable=False),  # a format version
    PeerStatus(GrouperError, grpc.StatusCode.UNAVAILABLE, OWNER, retriable=True),
    PeerStatus(GrouperError, grpc.StatusCode.FAILED_PRECONDITION, OWNER, retriable=False),
)
BUG = PeerStatus(BaseException, grpc.StatusCode.INTERNAL, OWNER)


def verdict(error: BaseException) -> PeerStatus:
    """The row of STATUS_BY_ERROR `error` meets first, or BUG."""
    for row in STATUS_BY_ERROR:
        if isinstance(error, row.error) and (row.retriable is None or row.retriable == error.retriable):
            return row
    return BUG


def status_for(error: BaseException) -> grpc.StatusCode:
    return verdict(error).code


def _message_for(error: BaseException, row: PeerStatus) -> str:
    if row is BUG:
        return f"internal error ({type(error).__name__}: {error}); the owner's log has the details"
    return getattr(error, "description", None) or str(error)


class RefusalLog:
    """Which (source, reason) pairs were logged; at most `remembered_max`, the oldest forgotten first."""

    def __init__(self, remembered_max: int = REFUSALS_REMEMBERED_MAX):
        assert remembered_max >= 1
        self._remembered_max = remembered_max
        self._logged: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def first(self, source: str, reason: str) -> bool:
        """True the first time this pair is seen (log it), False after."""
        key = (source, reason)
        with self._lock:
            if key in self._logged:
                return False
            self._logged[key] = None
            if len(self._logged) > self._remembered_max:
                self._logged.popitem(last=False)
            return True


def source_host(peer: str) -> str:
    """'ipv4:10.0.0.7:51234' or 'ipv6:[::1]:51234' (grpc's context.peer()) -> the address without the port."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer or "unknown"
    host = rest.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host or rest


# ---- the servicer ----------------------------------------------------------------------------------

class PeerServicer(peer_pb2_grpc.PeerServiceServicer):
    def __init__(self, handle_forward: HandleForward, timeout_ms: int = TIMEOUT_MS_DEFAULT,
                 check: Callable[..., Refusal] = open_to_all, refused_counts: Counter | None = None,
                 handle_replicate: HandleReplicate | None = None,
                 replicate_check: Callable[..., Refusal] = refuse_all(NO_REPLICAS)):
        """`check(context, batch)`: who may forward (open_to_all, refuse_all, MembersOnly, SignedByMember);
        `replicate_check` the same for Replicate, whose batch names its caller in owner_node."""
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        self._handle_forward = handle_forward
        self._timeout_ms = timeout_ms
        self._check = check
        self._handle_replicate = handle_replicate
        self._replicate_check = replicate_check
        self.refusals = RefusalLog()
        # kind ("caller", "seq_jump") -> calls refused; may be shared by a node's listeners (/metrics)
        self.refused_counts: Counter[str] = refused_counts if refused_counts is not None else Counter()

    def Forward(self, request, context):
        code, reason = self._check(context, request)
        if code is not None:
            self._refused(context, "caller", reason)
            context.abort(code, reason)
        try:
            entries = entries_from_pb(request)
            high_water = self._handle_forward(request.source_node, entries, self._timeout_for(context),
                                              request.seq_bound, request.disputed_high_water)
            return peer_pb2.ForwardAck(high_water=high_water)
        except Exception as error:  # every failure leaves as a status code; see STATUS_BY_ERROR
            row = verdict(error)
            if isinstance(error, SeqJump):
                self._refused(context, "seq_jump", f"a batch claiming node {request.source_node!r}: {error}")
            if row is BUG:
                log.exception("forward from %r (%d messages) failed", request.source_node, len(request.messages))
            context.abort(row.code, _message_for(error, row))

    def Replicate(self, request, context):
        if self._handle_replicate is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_REPLICAS)
        code, reason = self._replicate_check(context, request)
        if code is not None:
            self._refused(context, "replica_caller", reason, "replication")
            context.abort(code, reason)
        try:
            reset = {"reset": True} if request.reset else {}  # a new stream incarnation (issue 28)
            high_water, epoch = self._handle_replicate(request.owner_node, request.epoch, records_from_pb(request),
                                                       self._timeout_for(context), **reset)
            return peer_pb2.ReplicaAck(high_water=high_water, epoch=epoch)
        except Exception as error:  # every failure leaves as a status code; see STATUS_BY_ERROR
            row = verdict(error)
            if row is BUG:
                log.exception("replica batch from %r (%d entries) failed", request.owner_node, len(request.entries))
            context.abort(row.code, _message_for(error, row))

    def _refused(self, context: grpc.ServicerContext, kind: str, reason: str, what: str = "forwarding") -> None:
        with _COUNTS_LOCK:
            self.refused_counts[kind] += 1
        source = source_host(context.peer() or "")
        if self.refusals.first(source, reason):
            log.warning("%s from %s refused: %s (logged once per source and reason)", what, source, reason)

    def _timeout_for(self, context: grpc.ServicerContext) -> int:
        # the sender stops waiting at its deadline and resends; waiting past it only holds a pool thread
        remaining_s = context.time_remaining()
        if remaining_s is None or remaining_s * 1000 >= self._timeout_ms:
            return self._timeout_ms
        return max(1, int(remaining_s * 1000))


def add_peer_service(server: grpc.Server, handle_forward: HandleForward,
                     timeout_ms: int = TIMEOUT_MS_DEFAULT, check=open_to_all,
                     refused_counts: Counter | None = None, handle_replicate: HandleReplicate | None = None,
                     replicate_check=refuse_all(NO_REPLICAS)) -> PeerServicer:
    """Serve forwarding (and, with handle_replicate, replication) on `server`, which must be built with
    SERVER_OPTIONS."""
    servicer = PeerServicer(handle_forward, timeout_ms, check, refused_counts, handle_replicate, replicate_check)
    peer_pb2_grpc.add_PeerServiceServicer_to_server(servicer, server)
    return servicer


def bind_peer_listener(host: str, port: int, handle_forward: HandleForward, tls: ClusterTls,
                       timeout_ms: int = TIMEOUT_MS_DEFAULT, members=None,
                       refused_counts: Counter | None = None,
                       handle_replicate: HandleReplicate | None = None) -> tuple[grpc.Server, int]:
    """The peer listener on host:port (0 picks one) with mutual TLS, bound but not started (start()
    it once the node can take batches); returns it and its port. GrouperError when it cannot bind."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=PEER_WORKERS, thread_name_prefix="peer-grpc"),
        maximum_concurrent_rpcs=CONCURRENT_RPCS_MAX,
        options=[("grpc.so_reuseport", 0), *SERVER_OPTIONS])  # no second node silently sharing the port
    # with cluster_tls_server_name the certificates name a common name, not each node's host
    add_peer_service(server, handle_forward, timeout_ms, MembersOnly(bind_source=not tls.server_name, members=members),
                     refused_counts, handle_replicate,
                     MembersOnly(bind_source=not tls.server_name, members=members, claimant="owner_node"))
    bound_port = bind(server, host, port, tls.server_credentials(),
                      "the peer listener cannot listen on {address}: the port is in use or the host is not an "
                      "address of this machine; stop the other process or choose another --peer-port")
    return server, bound_port
