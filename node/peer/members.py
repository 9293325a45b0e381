"""Who may forward, beyond the certificate: the raft membership, and the cluster credential without TLS.

Rules:
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
- `SignedByMember` is the admin port's check when the cluster has a raft secret and no cluster TLS:
  the batch's credential must verify (node/peer/signature.py), then its source must be a member.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

import grpc

from node.peer.signature import Verifier

log = logging.getLogger("grouper.peer")

REFRESH_INTERVAL_MS = 5000  # the membership is read again this often while callers ask
MISS_REFRESH_INTERVAL_MS = 200  # a node not in the list makes it read again, at most this often

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
        return self._members.refusal(batch.source_node)
