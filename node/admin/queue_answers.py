"""QueueAnswers: the admin servicer's queue requests (list, add, update, delete, purge, reroute) answered.

Rules:
- Called by AdminServicer once the caller is identified and authorized (`manage` on the queues the
  request names); returns the response message, or raises a GrouperError the servicer turns into a
  status code. Runs on the call's gRPC pool thread and reaches the node only through `NodeControl`.
- Cluster-wide where the request says so: each member is asked as the caller (node/admin/member_calls.py).
- A delete in a cluster is refused while any member holds messages of the queue, unless forced.
"""

from __future__ import annotations

from typing import Callable

from node.admin.control import NodeControl
from node.admin.callers import Caller, may_see
from node.admin.member_calls import MemberCalls
from node.admin.wire import messages_max, queue_stats_to_pb, settings_changes_from_pb, settings_from_pb
from node.core.access.roles import Access, Permission
from node.core.errors import NotAllowed, NotFound
from proto import admin_pb2

# deadline of each member's part of a reroute: it moves a backlog, 2,000 messages per engine loop turn,
# and answers once its journal holds them
REROUTE_MEMBER_TIMEOUT_MS = 60_000


class QueueAnswers:
    def __init__(self, control: NodeControl, members: MemberCalls, access: Callable[[], Access]):
        """`access`: the node's access model as it is now (the users file may have been reloaded)."""
        self._control = control
        self._members = members
        self._access = access

    def list(self, request, caller: Caller) -> admin_pb2.ListQueuesResponse:
        return admin_pb2.ListQueuesResponse(queues=[queue_stats_to_pb(stats) for stats in self._control.list_queues()
                                                    if may_see(self._access(), caller, stats["name"])])

    def add(self, request, caller: Caller) -> admin_pb2.AddQueueResponse:
        stats = self._control.add_queue(settings_from_pb(request.settings))
        return admin_pb2.AddQueueResponse(queue=queue_stats_to_pb(stats))

    def update(self, request, caller: Caller) -> admin_pb2.UpdateQueueResponse:
        stats = self._control.update_queue(request.settings.name, settings_changes_from_pb(request.settings))
        return admin_pb2.UpdateQueueResponse(queue=queue_stats_to_pb(stats))

    def delete(self, request, caller: Caller) -> admin_pb2.DeleteQueueResponse:
        if self._control.node_id():  # a cluster: what every member holds decides (see MemberCalls.depths)
            depths = self._members.depths(request.queue, caller, request.force)
            if not depths and not self._control.queue_defined(request.queue):
                raise NotFound(f"no queue {request.queue!r} on any node of the cluster, nor defined cluster-wide "
                               f"(an earlier try whose answer was lost may have deleted it)")
            holding = {node: depth for node, depth in depths.items() if depth}
            if holding and not request.force:
                raise NotAllowed(f"queue {request.queue!r} still holds messages: "
                                 + ", ".join(f"node {node}: {depth}" for node, depth in sorted(holding.items()))
                                 + "; consume or purge them, or delete with --force to drop them on every node")
        self._control.delete_queue(request.queue)
        return admin_pb2.DeleteQueueResponse()

    def purge(self, request, caller: Caller) -> admin_pb2.PurgeQueueResponse:
        results = [counts for _, counts in self._members.everywhere(
            request, caller, lambda: self._control.purge_queue(request.queue),
            lambda client: client.purge_queue(request.queue, local_only=True))]
        return admin_pb2.PurgeQueueResponse(messages_purged=sum(purged for purged, _ in results),
                                            messages_left=sum(left for _, left in results))

    def reroute(self, request, caller: Caller) -> admin_pb2.RerouteQueueResponse:
        # a reroute sends to the destination on the caller's behalf: where the model grants `send`
        # apart, the caller needs it as a producer would
        self._access().check(caller.user, Permission.SEND, request.destination)
        group = request.group if request.HasField("group") else None
        count = messages_max(request)
        moved_so_far = [0]  # the first N of the cluster: each node takes what the nodes before it left

        def counted(result: tuple[int, int, str]) -> tuple[int, int, str]:
            moved_so_far[0] += result[0]
            return result

        def remote(client):
            left = None if count is None else count - moved_so_far[0]
            if left == 0:
                return 0, 0, ""
            return counted(client.reroute_queue(request.queue, request.destination, group, left,
                                                local_only=True))
        results = self._members.everywhere(request, caller, lambda: counted(self._control.reroute_queue(
            request.queue, request.destination, group, count)), remote, REROUTE_MEMBER_TIMEOUT_MS)
        moved = sum(result[0] for _, result in results)
        stayed = sum(result[1] for _, result in results)
        reasons = [f"node {node}: {result[2]}" if node else result[2] for node, result in results if result[2]]
        return admin_pb2.RerouteQueueResponse(messages_moved=moved, messages_stayed=stayed,
                                              stayed_reason="; ".join(reasons))
