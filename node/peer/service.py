"""The owner's end of forwarding: a ForwardBatch in, `handle_forward` called, the high water or a status out.

Rules:
- Owns nothing. It runs on gRPC pool threads; `handle_forward` posts the batch to the engine loop, which
  dedupes by forward_seq and answers once the batch is durable, and this servicer waits for it with
  a deadline no later than the caller's.
- The batch's shape is checked here (source_node set, at least one message, forward_seq >= 1,
  strictly increasing, below FORWARD_SEQ_LIMIT and below the batch's own seq_bound when it says one),
  so the engine loop only ever sees a well-formed batch; its content (queue names, limits) is the
  handler's to judge. A seq at or above its batch's bound jumps ahead of every seq its source gave:
  refused (INVALID_ARGUMENT), logged once per source address and reason, counted.
- Failures become status codes in one table, `STATUS_BY_ERROR`; an error it does not know is a bug,
  logged here with its traceback and reported as INTERNAL.
- Only members forward. Who may is the listener's `check(context, batch)`, asked before anything else:
  with cluster TLS, only callers over mutual TLS showing a node certificate (`MembersOnly`, on the
  peer listener, whose handshake already demands a certificate the cluster CA signed) that carries
  the serverAuth and clientAuth extended key usages (a certificate without the extension is refused),
  and nobody on the admin port (`refuse_all`); without cluster TLS, on the admin port, callers whose
  batch carries the cluster credential, an HMAC keyed from the raft secret (`SignedByMember`,
  node/peer/members.py, node/peer/signature.py); either way the claimed source must be a current raft
  member (node/peer/members.py). Only a node with no raft secret (allow_insecure_cluster) takes
  batches from anyone (`open_to_all`), which its log and banner say. A refused caller gets
  UNAUTHENTICATED or PERMISSION_DENIED, and is logged once per source address and reason.
- A batch names the node it comes from (source_node, a node id HOST:RAFT_PORT), and the owner keeps
  per-source state (forward_seq dedup, acknowledgements) by it. Over mutual TLS the claim is bound
  to the certificate: HOST must be one the caller's certificate names (a DNS name or IP address of
  its subjectAltName, as a TLS client would check it), so a node with a valid cluster certificate
  cannot forward as another node and disturb that node's sequence. Nodes that share one host (one
  machine) cannot be told apart this way. With cluster_tls_server_name the certificates name a
  common name, not the nodes' hosts, so the claim is not bound then (the README says so). The
  cluster credential covers the source, so a captured call cannot be replayed as another source's;
  every holder of the raft secret is a member, and may forward as any member.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from concurrent import futures
from typing import Callable, Mapping, Sequence

import grpc
from cryptography import x509

from node.core.errors import GrouperError, InvalidField, NotAllowed, NotFound, ResourceLimitExceeded
from node.peer.credentials import ClusterTls, canonical_host, certificate_hosts, node_usages
from node.peer.forwarder import FORMAT_VERSIONS_READ, MESSAGE_BYTES_MAX, Entry
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
CERTIFICATES_REMEMBERED_MAX = 64  # peers' certificates whose usages were read, kept by their PEM

FORWARD_SEQ_LIMIT = 1 << 63  # a source's seqs are signed 64-bit (node/core/outbound.py): none reaches it

# (source_node, entries, timeout_ms, seq_bound, disputed_high_water) -> the source's high water here
HandleForward = Callable[[str, list[Entry], int, int, int], int]
# what a listener's check answers for a call: (None, "") lets it in, else the status and the reason
Refusal = tuple[grpc.StatusCode | None, str]
ADMITTED: Refusal = (None, "")
_COUNTS_LOCK = threading.Lock()  # over every servicer's refused_counts: listeners may share one

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


class SeqJump(InvalidField):
    """A batch's forward seq beyond what its source can have given (INVALID_ARGUMENT, logged)."""


def entries_from_pb(batch: peer_pb2.ForwardBatch) -> list[Entry]:
    """Raises InvalidField naming the field when the batch is malformed, NotAllowed (FAILED_PRECONDITION:
    the source keeps the batch and retries) when it is in a format version this build does not read."""
    version = batch.format_version or 1  # 0: sent before versions, which is version 1
    if version not in FORMAT_VERSIONS_READ:
        raise NotAllowed(f"forwarded batch from {batch.source_node!r} is in peer format version {version}; "
                         f"this node reads {', '.join(map(str, FORMAT_VERSIONS_READ))}: upgrade this node "
                         f"(one version step at a time), it will then take the batch the source keeps resending")
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
    bound = batch.seq_bound or FORWARD_SEQ_LIMIT
    if previous_seq >= bound:  # the last seq is the highest
        raise SeqJump(f"messages[{len(entries) - 1}].forward_seq: {previous_seq} jumps ahead of "
                      + (f"the batch's own seq_bound {bound}: its source never gave that seq"
                         if batch.seq_bound else f"every node seq (they stay below {FORWARD_SEQ_LIMIT})")
                      + "; the batch is refused, and its source's sequence here is unchanged")
    return entries


# ---- who may forward ------------------------------------------------------------------------------

def caller_refusal(auth: Mapping[str, Sequence[bytes]], usages_of: Callable[[bytes], set[str]],
                   source_node: str = "", hosts_of: Callable[[bytes], frozenset[str]] | None = None) -> Refusal:
    """The peer listener's verdict from a call's auth context (grpc's `context.auth_context()`).

    The handshake verified the certificate against the cluster CA; here it must also be a node's
    (serverAuth and clientAuth, named in its extended key usage: a certificate without that extension
    is refused), so a client's certificate from the same CA cannot forward. With
    `hosts_of`, the host of `source_node` (the batch's claimed origin) must be one it names."""
    if list(auth.get("transport_security_type", ())) != [b"ssl"]:
        return grpc.StatusCode.UNAUTHENTICATED, "the call did not come over TLS; forwarding takes mutual TLS"
    certificates = auth.get("x509_pem_cert") or ()
    if not certificates:
        return grpc.StatusCode.UNAUTHENTICATED, ("the caller showed no verified client certificate; forwarding takes "
                                                 "a node certificate signed by the cluster CA")
    missing = sorted({"serverAuth", "clientAuth"} - usages_of(certificates[0]))
    if missing:
        names = b", ".join(auth.get("x509_common_name") or [b"?"]).decode(errors="replace")
        return grpc.StatusCode.PERMISSION_DENIED, (f"the caller's certificate (CN {names}) lacks {', '.join(missing)}: "
                                                   f"it is no node certificate (a client's, or one naming no "
                                                   f"extended key usage), and only nodes forward")
    if hosts_of is not None:
        host = canonical_host(source_node.rpartition(":")[0] if ":" in source_node else source_node)  # HOST[:PORT]
        hosts = hosts_of(certificates[0])
        if host not in hosts:
            names = b", ".join(auth.get("x509_common_name") or [b"?"]).decode(errors="replace")
            return grpc.StatusCode.PERMISSION_DENIED, (
                f"the batch claims to come from node {source_node!r}, but the caller's certificate (CN {names}) "
                f"names {', '.join(sorted(hosts)) or 'no host'}, not {host!r}: a node forwards only as itself (its "
                f"certificate must name the host of its node id, its advertise host)")
    return ADMITTED


def open_to_all(context: grpc.ServicerContext, batch=None) -> Refusal:
    return ADMITTED


def refuse_all(reason: str) -> Callable[..., Refusal]:
    def check(context: grpc.ServicerContext, batch=None) -> Refusal:
        return grpc.StatusCode.UNAUTHENTICATED, reason
    return check


class MembersOnly:
    """The peer listener's check: `caller_refusal`, with the usages and hosts of recent certificates
    kept. `bind_source`: the batch's source node must be a host the certificate names; `members`
    (node/peer/members.py RaftMembers): it must be a current raft member."""

    def __init__(self, bind_source: bool = True, members=None):
        self._lock = threading.Lock()
        self._read: dict[bytes, tuple[set[str], frozenset[str]]] = {}
        self._bind_source = bind_source
        self._members = members

    def __call__(self, context: grpc.ServicerContext, batch) -> Refusal:
        refusal = caller_refusal(context.auth_context() or {}, self._usages_of, batch.source_node,
                                 self._hosts_of if self._bind_source else None)
        if refusal != ADMITTED or self._members is None:
            return refusal
        return self._members.refusal(batch.source_node)

    def _usages_of(self, pem: bytes) -> set[str]:
        return self._certificate(pem)[0]

    def _hosts_of(self, pem: bytes) -> frozenset[str]:
        return self._certificate(pem)[1]

    def _certificate(self, pem: bytes) -> tuple[set[str], frozenset[str]]:
        with self._lock:
            read = self._read.get(pem)
        if read is None:
            try:
                certificate = x509.load_pem_x509_certificate(pem)
                read = node_usages(certificate), certificate_hosts(certificate)
            except ValueError:
                read = set(), frozenset()
            with self._lock:
                if len(self._read) >= CERTIFICATES_REMEMBERED_MAX:
                    self._read.clear()
                self._read[pem] = read
        return read


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
                 check: Callable[..., Refusal] = open_to_all, refused_counts: Counter | None = None):
        """`check(context, batch)`: who may forward (open_to_all, refuse_all, MembersOnly, SignedByMember)."""
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        self._handle_forward = handle_forward
        self._timeout_ms = timeout_ms
        self._check = check
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
            code = status_for(error)
            if isinstance(error, SeqJump):
                self._refused(context, "seq_jump", f"a batch claiming node {request.source_node!r}: {error}")
            if code is grpc.StatusCode.INTERNAL:
                log.exception("forward from %r (%d messages) failed", request.source_node, len(request.messages))
            context.abort(code, _message_for(error, code))

    def _refused(self, context: grpc.ServicerContext, kind: str, reason: str) -> None:
        with _COUNTS_LOCK:
            self.refused_counts[kind] += 1
        source = source_host(context.peer() or "")
        if self.refusals.first(source, reason):
            log.warning("forwarding from %s refused: %s (logged once per source and reason)", source, reason)

    def _timeout_for(self, context: grpc.ServicerContext) -> int:
        # the sender stops waiting at its deadline and resends; waiting past it only holds a pool thread
        remaining_s = context.time_remaining()
        if remaining_s is None or remaining_s * 1000 >= self._timeout_ms:
            return self._timeout_ms
        return max(1, int(remaining_s * 1000))


def add_peer_service(server: grpc.Server, handle_forward: HandleForward,
                     timeout_ms: int = TIMEOUT_MS_DEFAULT, check=open_to_all,
                     refused_counts: Counter | None = None) -> PeerServicer:
    """Serve forwarding on `server`, which must be built with SERVER_OPTIONS."""
    servicer = PeerServicer(handle_forward, timeout_ms, check, refused_counts)
    peer_pb2_grpc.add_PeerServiceServicer_to_server(servicer, server)
    return servicer


ELSEWHERE = ("this node takes forwarded batches only on its peer port, over mutual TLS with a node certificate "
             "the cluster CA signed")  # the refusal on the admin port once cluster TLS is on


def bind_peer_listener(host: str, port: int, handle_forward: HandleForward, tls: ClusterTls,
                       timeout_ms: int = TIMEOUT_MS_DEFAULT, members=None,
                       refused_counts: Counter | None = None) -> tuple[grpc.Server, int]:
    """The peer listener on host:port (0 picks one) with mutual TLS, bound but not started (start()
    it once the node can take batches); returns it and its port. GrouperError when it cannot bind."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=PEER_WORKERS, thread_name_prefix="peer-grpc"),
        maximum_concurrent_rpcs=CONCURRENT_RPCS_MAX,
        options=[("grpc.so_reuseport", 0), *SERVER_OPTIONS])  # no second node silently sharing the port
    # with cluster_tls_server_name the certificates name a common name, not each node's host
    add_peer_service(server, handle_forward, timeout_ms, MembersOnly(bind_source=not tls.server_name, members=members),
                     refused_counts)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound_port = server.add_secure_port(address, tls.server_credentials())
    except RuntimeError:  # newer grpcio raises instead of returning 0
        bound_port = 0
    if bound_port == 0:
        server.stop(None)
        raise GrouperError(f"the peer listener cannot listen on {address}: the port is in use or the host is not "
                           f"an address of this machine; stop the other process or choose another --peer-port")
    return server, bound_port
