"""Who may forward: a node certificate, the raft membership, and the cluster credential without TLS.

Rules:
- Only members forward. A listener's check `check(context, batch) -> Refusal` is asked before
  anything else: with cluster TLS, only callers over mutual TLS showing a node certificate
  (`MembersOnly`, on the peer listener, whose handshake already demands a certificate the cluster
  CA signed) that carries the serverAuth and clientAuth extended key usages (a certificate without
  the extension is refused), and nobody on the admin port (`refuse_all`, ELSEWHERE); without
  cluster TLS, on the admin port, callers whose batch carries the cluster credential, an HMAC keyed
  from the raft secret (`SignedByMember`, node/peer/signature.py); either way the claimed source
  must be a current raft member (`RaftMembers`). Only a node with no raft secret
  (allow_insecure_cluster) takes batches from anyone (`open_to_all`), which its log and banner say.
- Over mutual TLS a batch's claimed source is bound to the certificate: the HOST of its node id
  must be one the caller's certificate names (a DNS name or IP address of its subjectAltName, as a
  TLS client would check it), so a node with a valid cluster certificate cannot forward as another
  node and disturb that node's sequence. Nodes that share one host cannot be told apart this way.
  With cluster_tls_server_name the certificates name a common name, not the nodes' hosts, so the
  claim is not bound then (the README says so). The cluster credential covers the source, so a
  captured call cannot be replayed as another source's; every holder of the raft secret is a
  member, and may forward as any member.
- Replicate calls (issue 28) are checked the same way, with the batch's owner_node as the claimed
  caller (`claimant`) and the replication credential (node/peer/signature.py REPLICATION), so an owner
  replicates only as itself over mutual TLS, and a forwarding credential lets nobody replicate.
- `RaftMembers` answers, on gRPC pool threads, whether a node id is a current member: the raft
  member's partners and the nodes registered through raft (node/runtime.py `_members_who_may_forward`:
  a node that joined with --join has as raft partners only its --peers and later members, while the
  replicated members table names every node that registered). It keeps that list, read through
  `read_members` (a call to the raft member process and one through the bridge) at most once
  per REFRESH_INTERVAL_MS, and again at most once per MISS_REFRESH_INTERVAL_MS when asked about a node
  not in it, so a node that just joined is let in within one refresh, and a removed one is kept out
  within REFRESH_INTERVAL_MS. When no list could be read yet (the raft member is starting) it refuses,
  retriably (the forwarder retries every failure), and tries again at most once per
  MISS_REFRESH_INTERVAL_MS: one pool thread at a time waits for the raft member, never every caller.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Mapping, Sequence

import grpc
from cryptography import x509

from node.peer.node_certificate import canonical_host, certificate_hosts, node_usages
from node.peer.signature import FORWARDING, CredentialKind, Verifier

log = logging.getLogger("grouper.peer")

REFRESH_INTERVAL_MS = 5000  # the membership is read again this often while callers ask
MISS_REFRESH_INTERVAL_MS = 200  # a node not in the list makes it read again, at most this often

CERTIFICATES_REMEMBERED_MAX = 64  # peers' certificates whose usages were read, kept by their PEM

# what a listener's check answers for a call: (None, "") lets it in, else the status and the reason
Refusal = tuple[grpc.StatusCode | None, str]
ADMITTED: Refusal = (None, "")


class RaftMembers:
    def __init__(self, read_members: Callable[[], Iterable[str] | None], clock=time.monotonic):
        self._read_members = read_members
        self._clock = clock
        self._lock = threading.Lock()
        self._members: frozenset[str] | None = None
        self._read_s = float("-inf")

    def refusal(self, source_node: str) -> Refusal:
        members = self._current(source_node)
        if members is None:
            return grpc.StatusCode.UNAVAILABLE, ("this node does not know the raft membership yet (its raft member is "
                                                 "starting); retry shortly")
        if source_node in members:
            return ADMITTED
        return grpc.StatusCode.PERMISSION_DENIED, (
            f"the batch claims to come from node {source_node!r}, which is not a member of the raft cluster as "
            f"this node knows it: only members forward (a node that just joined is let in once this node's raft "
            f"member knows it)")

    def _current(self, source_node: str) -> frozenset[str] | None:
        with self._lock:
            members, age_s = self._members, self._clock() - self._read_s
            known = members is not None and source_node in members
            due = age_s * 1000 >= (REFRESH_INTERVAL_MS if known else MISS_REFRESH_INTERVAL_MS)
            if due:
                self._read_s = self._clock()  # one reader at a time; the others use the list they have
        if not due:
            return members
        try:
            read = self._read_members()
        except Exception as error:  # the raft member is busy or restarting: keep the list read before
            log.debug("reading the raft membership failed: %s", error)
            return members
        if read is None:
            return members
        members = frozenset(read)
        with self._lock:
            self._members = members
        return members


class SignedByMember:
    """The admin port's check without cluster TLS: the cluster credential, then raft membership."""

    def __init__(self, verifier: Verifier, members: RaftMembers):
        self._verifier = verifier
        self._members = members

    def __call__(self, context: grpc.ServicerContext, batch) -> Refusal:
        metadata = {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}
        reason = self._verifier.refusal(batch, metadata)
        if reason:
            return grpc.StatusCode.UNAUTHENTICATED, reason
        return self._members.refusal(getattr(batch, self._verifier.kind.claimant))


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
    (RaftMembers): it must be a current raft member. `claimant`: the batch's field naming its source
    (a ReplicaBatch's is owner_node)."""

    def __init__(self, bind_source: bool = True, members=None, claimant: str = "source_node"):
        self._lock = threading.Lock()
        self._read: dict[bytes, tuple[set[str], frozenset[str]]] = {}
        self._bind_source = bind_source
        self._members = members
        self._claimant = claimant

    def __call__(self, context: grpc.ServicerContext, batch) -> Refusal:
        source_node = getattr(batch, self._claimant)
        refusal = caller_refusal(context.auth_context() or {}, self._usages_of, source_node,
                                 self._hosts_of if self._bind_source else None)
        if refusal != ADMITTED or self._members is None:
            return refusal
        return self._members.refusal(source_node)

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


ELSEWHERE = ("this node takes forwarded batches only on its peer port, over mutual TLS with a node certificate "
             "the cluster CA signed")  # the refusal on the admin port once cluster TLS is on


def admin_port_check(cluster_tls, raft_secrets, node_id: str, raft_members,
                     kind: CredentialKind = FORWARDING) -> Callable[..., Refusal]:
    """Who may forward (or, with kind REPLICATION, replicate) on the admin port: nobody with cluster
    TLS (its peer port takes them), members signing with the raft secret without it, and anyone at all
    on a node that has neither (warned, once for forwarding)."""
    if cluster_tls is not None:
        return refuse_all(ELSEWHERE)
    if raft_secrets:
        return SignedByMember(Verifier(raft_secrets, node_id, kind), raft_members)
    if kind is not FORWARDING:
        return open_to_all
    log.warning("this node has no raft secret: it takes forwarded messages on its admin port from anyone who "
                "reaches it, who can put messages into any queue and group. Give every node the cluster's "
                "raft_secret_file (or cluster TLS)")
    return open_to_all
