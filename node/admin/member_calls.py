"""MemberCalls: how the admin servicer asks the other members of the cluster, as the caller.

Rules:
- Runs on the gRPC pool thread of the call it serves (or the status pool's, for `queues`); owns no
  state of the node, only what it needs to dial: the members' admin addresses come from `NodeControl`.
- Every call to another member carries the caller's own credentials (`Caller.forwarded`), so each
  member authorizes the caller itself; a caller known here by a client certificate cannot be passed
  on, and is refused where the answer needs the others (or shown without them).
- Each call has a deadline (PEER_CALL_TIMEOUT_MS unless the work says otherwise). A member that
  cannot be reached fails the answer, naming it (`NodeUnavailable`), rather than giving a partial one.
"""

from __future__ import annotations

import grpc

from node.admin.client import AccessDenied, AdminClient, AdminError, NodeFailure
from node.admin.control import NodeControl
from node.admin.callers import Caller
from node.core.errors import GrouperError, NotAllowed, NotFound, Unauthorized
from proto import admin_pb2

PEER_CALL_TIMEOUT_MS = 3000  # deadline of each call to another member when an answer spans the cluster
# deadline of each member's queue depths in `cluster status`, asked of every member at once: the
# depths are for the operator's eye, and during a partition the cut-off member's would otherwise
# hold the whole answer (an operator asks then most of all)
STATUS_MEMBER_TIMEOUT_MS = 1000


class NodeUnavailable(GrouperError):
    """Another member needed for the answer is down or did not answer: retry once it is back."""

    retriable = True


def _add_in_transit(depths: dict[str, int], node: str, status: dict, queue: str) -> None:
    """Count what `node` accepted for `queue` but holds in no queue yet (see ClusterStatusResponse.in_transit)."""
    count = status.get("in_transit", {}).get(queue, 0)
    if count:
        depths[node] = depths.get(node, 0) + count


class MemberCalls:
    def __init__(self, control: NodeControl, peer_credentials: grpc.ChannelCredentials | None = None,
                 peer_server_name: str = ""):
        """`peer_credentials`: TLS to dial the other members' admin ports with, when admin TLS is on, and
        `peer_server_name` the name their certificates carry if not the host dialled."""
        self._control = control
        self._peer_credentials = peer_credentials
        self._peer_server_name = peer_server_name

    def client(self, address: str, caller: Caller, timeout_ms: int = PEER_CALL_TIMEOUT_MS) -> AdminClient:
        return AdminClient(address, timeout_ms=timeout_ms, credentials=self._peer_credentials,
                           metadata=caller.forwarded, server_name=self._peer_server_name)

    def everywhere(self, request, caller: Caller, local, remote, member_timeout_ms: int = PEER_CALL_TIMEOUT_MS):
        """Run `local()` here and, in a cluster, `remote(client)` on every other member, as the caller.

        Returns (node, result) pairs; a queue unknown on some nodes is skipped there, and unknown
        everywhere is NotFound. A member that cannot be reached fails the call, naming it; so does
        one that refuses the caller (the members' users files differ)."""
        results = []
        missing = None
        try:
            results.append((self._control.node_id(), local()))
        except NotFound as error:
            missing = error
        if request.local_only:
            if missing is not None:
                raise missing
            return results
        peers = self._control.peers()
        if peers and caller.by_certificate:
            raise NotAllowed(f"user {caller.user!r} is known here by a client certificate, which this node cannot "
                             f"pass on to the other members; give --user and a password for commands that "
                             f"span the cluster")
        for node, address in peers:
            with self.client(address, caller, member_timeout_ms) as client:
                try:
                    results.append((node, remote(client)))
                except AccessDenied as error:
                    raise Unauthorized(f"node {node} ({address}) refused: {error.message} (do all members read "
                                       f"the same users file?)") from None
                except NodeFailure as error:
                    if error.status != "NOT_FOUND":
                        raise NodeUnavailable(f"node {node} ({address}) failed: {error.message}") from None
                except AdminError as error:
                    raise NodeUnavailable(f"node {node} ({address}) did not answer: {error.message}; the "
                                          f"result would be partial, retry once it is back") from None
        if not results and missing is not None:
            raise missing
        return results

    def depths(self, queue: str, caller: Caller, force: bool) -> dict[str, int]:
        """The messages of `queue` (queued and in flight) on each member that has it. A member that does
        not answer may hold some: the delete is refused, naming it, unless forced."""
        depths = {self._control.node_id(): stats["depth_messages"] for stats in self._control.list_queues()
                  if stats["name"] == queue}
        _add_in_transit(depths, self._control.node_id(), self._control.cluster_status(), queue)
        peers = self._control.peers()
        if peers and caller.by_certificate and not force:
            raise NotAllowed(f"user {caller.user!r} is known here by a client certificate, which this node cannot "
                             f"pass on to the other members to ask their depths; give --user and a password, or "
                             f"--force")
        for node, address in peers if not caller.by_certificate else ():
            try:
                with self.client(address, caller) as client:
                    depths.update({node: stats["depth_messages"] for stats in client.list_queues()
                                   if stats["name"] == queue})
                    _add_in_transit(depths, node, client.cluster_status(local_only=True), queue)
            except AdminError as error:
                if not force:
                    raise NodeUnavailable(f"cannot tell whether node {node} ({address}) holds messages of queue "
                                          f"{queue!r}: {error.message}; retry once it answers, or delete with "
                                          f"--force") from None
        return depths

    def group_page(self, request, caller: Caller) -> admin_pb2.GroupPageResponse:
        """The page of another member, which authorizes the caller itself (as everywhere's calls do)."""
        address = dict(self._control.peers()).get(request.node)
        if address is None:
            raise NotFound(f"no member {request.node!r} with an admin address in this cluster; give a node id as "
                           f"'grouper cluster status' lists it")
        if caller.by_certificate:
            raise NotAllowed(f"user {caller.user!r} is known here by a client certificate, which this node cannot "
                             f"pass on to member {request.node}; log in with a password to see its groups")
        forwarded = admin_pb2.GroupPageRequest(queue=request.queue, prefix=request.prefix, position=request.position,
                                               page_size=request.page_size, order=request.order)
        with self.client(address, caller) as client:
            try:
                return client.call_raw("GroupPage", forwarded)
            except AccessDenied as error:
                raise Unauthorized(f"node {request.node} ({address}) refused: {error.message}") from None
            except NodeFailure as error:
                if error.status == "NOT_FOUND":
                    raise NotFound(f"node {request.node}: {error.message}") from None
                raise NodeUnavailable(f"node {request.node} ({address}) failed: {error.message}") from None
            except AdminError as error:
                raise NodeUnavailable(f"node {request.node} ({address}) did not answer: {error.message}; "
                                      f"retry once it is back") from None

    def queues(self, address: str, caller: Caller) -> tuple[str, list]:
        """(error or "", queue stats) of another member, within STATUS_MEMBER_TIMEOUT_MS."""
        try:
            with self.client(address, caller, STATUS_MEMBER_TIMEOUT_MS) as client:
                return "", client.list_queues()
        except AccessDenied as error:
            return f"refused: {error.message}", []
        except AdminError as error:
            return f"unreachable: {error.message}", []
