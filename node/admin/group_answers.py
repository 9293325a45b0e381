"""GroupAnswers: the admin servicer's group requests (list, page, reset, purge, move) answered.

Rules:
- Called by AdminServicer once the caller is identified and authorized (`manage` on the queues the
  request names); returns the response message, or raises a GrouperError the servicer turns into a
  status code. Runs on the call's gRPC pool thread and reaches the node only through `NodeControl`.
- Cluster-wide unless the request is `local_only`: each member is asked as the caller and the counts
  are summed (node/admin/member_calls.py); a page names one node, this one unless it says another.
"""

from __future__ import annotations

from node.admin.control import NodeControl
from node.admin.callers import Caller
from node.admin.member_calls import MemberCalls
from node.admin.wire import group_row_to_pb, messages_max
from proto import admin_pb2


class GroupAnswers:
    def __init__(self, control: NodeControl, members: MemberCalls):
        self._control = control
        self._members = members

    def list(self, request, caller: Caller) -> admin_pb2.ListGroupsResponse:
        results = self._members.everywhere(request, caller, lambda: self._control.list_groups(request.queue),
                                           lambda client: client.list_groups(request.queue, local_only=True))
        return admin_pb2.ListGroupsResponse(groups=[group_row_to_pb(row, node) for node, rows in results
                                                    for row in rows])

    def page(self, request, caller: Caller) -> admin_pb2.GroupPageResponse:
        node = self._control.node_id()
        if request.node and request.node != node:
            return self._members.group_page(request, caller)
        page = self._control.group_page(request.queue, request.prefix, request.position, request.page_size,
                                        request.order)
        return admin_pb2.GroupPageResponse(
            groups=[group_row_to_pb(row, node) for row in page["groups"]], next_position=page["next_position"],
            groups_total=page["groups_total"], scanned=page["scanned"],
            consumers=[admin_pb2.ConsumerRow(**row) for row in page["consumers"]])

    def reset(self, request, caller: Caller) -> admin_pb2.ResetGroupsResponse:
        group = request.group if request.HasField("group") else None
        return admin_pb2.ResetGroupsResponse(groups_reset=sum(count for _, count in self._members.everywhere(
            request, caller, lambda: self._control.reset_groups(request.queue, group),
            lambda client: client.reset_groups(request.queue, group, local_only=True))))

    def purge(self, request, caller: Caller) -> admin_pb2.PurgeGroupResponse:
        count = messages_max(request)
        return admin_pb2.PurgeGroupResponse(messages_purged=sum(n for _, n in self._members.everywhere(
            request, caller, lambda: self._control.purge_group(request.queue, request.group, count),
            lambda client: client.purge_group(request.queue, request.group, count, local_only=True))))

    def move(self, request, caller: Caller) -> admin_pb2.MoveGroupResponse:
        count = messages_max(request)
        return admin_pb2.MoveGroupResponse(messages_moved=sum(n for _, n in self._members.everywhere(
            request, caller, lambda: self._control.move_group(request.queue, request.group,
                                                              request.destination_queue, count),
            lambda client: client.move_group(request.queue, request.group, request.destination_queue,
                                             count, local_only=True))))
