"""ClusterAnswers: the admin servicer's cluster requests (add or remove a member, the cluster's status).

Rules:
- Called by AdminServicer once the caller is identified and authorized (`manage` on '#'); returns the
  response message, or raises a GrouperError the servicer turns into a status code. Runs on the
  call's gRPC pool thread and reaches the node only through `NodeControl`.
- The status asks every other member for its queue depths at once, on its own small pool, each
  within STATUS_MEMBER_TIMEOUT_MS: a member that does not answer is shown with its error, never
  holding the answer back.
"""

from __future__ import annotations

from concurrent import futures

from node.admin.control import NodeControl
from node.admin.callers import Caller
from node.admin.member_calls import MemberCalls
from node.admin.wire import queue_stats_to_pb
from node.core.errors import InvalidField
from proto import admin_pb2

# threads that ask the other members for their queue depths at once (cluster status); a cluster
# with more members asks this many at a time
STATUS_WORKERS = 8


def _raft_address(node: str) -> str:
    host, _, port = node.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidField(f"node: expected a raft address HOST:PORT, got {node!r}")
    return node


def _status_to_pb(status: dict) -> admin_pb2.ClusterStatusResponse:
    """This node's part of the status: the raft cluster, routes, what waits and what moves."""
    return admin_pb2.ClusterStatusResponse(
        clustered=status["clustered"], node=status.get("node", ""), leader=status.get("leader", ""),
        term=status.get("term", 0), has_quorum=status.get("has_quorum", False),
        routes=status.get("routes", 0), waiting_for_route=status.get("waiting_for_route", 0),
        outbound=status.get("outbound", {}), outbound_bytes=status.get("outbound_bytes", {}),
        routes_digest=status.get("routes_digest", ""),
        last_applied=status.get("last_applied", 0), commit_index=status.get("commit_index", 0),
        in_transit=status.get("in_transit", {}), moving=status.get("moving", 0),
        moves=[admin_pb2.GroupMove(queue=move["queue"], group=move["group"], from_node=move["from"],
                                   to_node=move["to"], waiting=move["waiting"], here=move["here"])
               for move in status.get("moves", [])])


class ClusterAnswers:
    def __init__(self, control: NodeControl, members: MemberCalls):
        self._control = control
        self._members = members
        self._status_pool = futures.ThreadPoolExecutor(max_workers=STATUS_WORKERS,
                                                       thread_name_prefix="status-members")

    def add_member(self, request, caller: Caller) -> admin_pb2.MemberResponse:
        self._control.add_member(_raft_address(request.node))
        return admin_pb2.MemberResponse()

    def remove_member(self, request, caller: Caller) -> admin_pb2.MemberResponse:
        return admin_pb2.MemberResponse(routes_dropped=self._control.remove_member(_raft_address(request.node)))

    def status(self, request, caller: Caller) -> admin_pb2.ClusterStatusResponse:
        status = self._control.cluster_status()
        response = _status_to_pb(status)
        asked = []  # (row, future): the other members' queue depths, asked of all at once
        for member in status.get("members", []):
            row = response.members.add(node=member["node"], amqp_address=member.get("amqp_address", ""),
                                       admin_address=member.get("admin_address", ""),
                                       down=member.get("down", False), connected=member.get("connected", False),
                                       raft_member=member.get("raft_member", False),
                                       routes=member.get("routes", 0), consumers=member.get("consumers", {}),
                                       epoch=member.get("epoch", 0), in_sync=member.get("in_sync", []),
                                       under_replicated=member.get("under_replicated", False))
            if member["node"] == status.get("node") or not status["clustered"]:
                queues = self._control.list_queues()
            elif request.local_only:
                continue
            elif not member.get("admin_address"):
                row.error = "not registered yet: its addresses are not in the route table"
                continue
            elif caller.by_certificate:
                row.error = "not asked: a client certificate cannot be passed on; log in with --user to see it"
                continue
            else:
                asked.append((row, self._status_pool.submit(self._members.queues, member["admin_address"], caller)))
                continue
            row.queues.extend(queue_stats_to_pb(stats) for stats in queues)
        for row, answer in asked:
            error, queues = answer.result()
            if error:
                row.error = error
            else:
                row.queues.extend(queue_stats_to_pb(stats) for stats in queues)
        return response
