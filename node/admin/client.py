"""A typed client of one node's admin API: the methods of `NodeControl`, over gRPC, with a deadline.

Rules:
- Returns plain data (dicts, ints) shaped like `NodeControl`'s results; nothing protobuf leaks out.
- Every call carries the deadline given at construction; none waits for the node to come up.
- A failed call raises one of the errors below, sorted in one table by who can fix it: the node's
  message and gRPC status travel with the error, so callers never see a `grpc.RpcError`.
- TLS and credentials are given, never looked up here: `credentials` (node.admin.tls) make the
  channel TLS, `metadata` (node.admin.callers.basic_metadata) travels with every call.
- Every call names the API version it speaks in API_VERSION_KEY metadata (absent: 1, as before
  versions). A node reads its own version and the one before, so an old CLI keeps working against
  a node one version step newer; a version it does not read is refused (FAILED_PRECONDITION) by name.
"""

from __future__ import annotations

import grpc

from node.core.dispatch.settings import QueueSettings
from proto import admin_pb2, admin_pb2_grpc

DEFAULT_NODE_ADDRESS = "127.0.0.1:5673"
TIMEOUT_MS_DEFAULT = 5000
API_VERSION_KEY = "grouper-admin-version"  # gRPC metadata: the admin API version a call speaks
API_VERSION = 1  # what this build sends
API_VERSIONS_READ = (1,)  # what a node of this build answers


def api_version_refusal(metadata) -> str | None:
    """Why a node of this build does not answer a call with this gRPC metadata, or None."""
    sent = [value for key, value in metadata if key == API_VERSION_KEY]
    version = sent[-1] if sent else "1"
    if version.isascii() and version.isdigit() and int(version) in API_VERSIONS_READ:
        return None
    return (f"the caller speaks admin API version {version!r}; this node reads versions "
            f"{', '.join(map(str, API_VERSIONS_READ))}: use a grouper CLI of this node's release or the "
            f"one before it, or upgrade the node first")


class AdminError(Exception):
    """A call that failed; `status` is the gRPC status name and `message` the node's (or gRPC's) text."""

    def __init__(self, address: str, status: str, message: str):
        super().__init__(message)
        self.address = address
        self.status = status
        self.message = message


class NodeUnreachable(AdminError):
    """No answer: the node is down, unreachable, or too slow. Retrying later may succeed."""


class InvalidRequest(AdminError):
    """The node refused the request's content; fix the request (the message names the field)."""


class NodeFailure(AdminError):
    """The node answered with a failure: not found, already exists, a limit, or a node bug."""


class AccessDenied(AdminError):
    """UNAUTHENTICATED (credentials missing or wrong) or PERMISSION_DENIED (the user lacks `manage`):
    give other credentials, or have an administrator grant the permission; the message says which."""


# Status codes absent from this table are NodeFailure.
ERROR_BY_STATUS: dict[grpc.StatusCode, type[AdminError]] = {
    grpc.StatusCode.UNAVAILABLE: NodeUnreachable,
    grpc.StatusCode.DEADLINE_EXCEEDED: NodeUnreachable,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.UNAUTHENTICATED: AccessDenied,
    grpc.StatusCode.PERMISSION_DENIED: AccessDenied,
}


def _settings_to_pb(settings: QueueSettings) -> admin_pb2.QueueSettings:
    # every field is sent, so the queue gets exactly the settings the caller validated
    return admin_pb2.QueueSettings(**settings.to_dict())


def _stats_from_pb(stats: admin_pb2.QueueStats) -> dict:
    return {field.name: getattr(stats, field.name) for field in stats.DESCRIPTOR.fields}


def _group_from_pb(row: admin_pb2.GroupRow) -> dict:
    return {"group": row.group, "messages": row.messages, "acquired": row.acquired,
            "consumer": row.consumer if row.HasField("consumer") else None, "node": row.node}


def _count_request(count: int | None) -> dict:
    return {} if count is None else {"messages_max": count}


class AdminClient:
    def __init__(self, address: str = DEFAULT_NODE_ADDRESS, timeout_ms: int = TIMEOUT_MS_DEFAULT, *,
                 credentials: grpc.ChannelCredentials | None = None, metadata: tuple[tuple[str, str], ...] = (),
                 server_name: str = ""):
        """`server_name`: with TLS, the name the node's certificate must carry instead of the host dialled."""
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        self.address = address
        self.timeout_ms = timeout_ms
        self._metadata = tuple(metadata) + ((API_VERSION_KEY, str(API_VERSION)),)
        # the admin API is always dialled directly: an http_proxy meant for web traffic must not apply
        options = [("grpc.enable_http_proxy", 0)]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        self._channel = (grpc.insecure_channel(address, options=options) if credentials is None
                         else grpc.secure_channel(address, credentials, options=options))
        self._stub = admin_pb2_grpc.AdminServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout_ms / 1000, metadata=self._metadata)
        except grpc.RpcError as error:
            code = error.code()
            error_type = ERROR_BY_STATUS.get(code, NodeFailure)
            raise error_type(self.address, code.name, error.details() or code.name) from None

    def list_queues(self) -> list[dict]:
        response = self._call(self._stub.ListQueues, admin_pb2.ListQueuesRequest())
        return [_stats_from_pb(stats) for stats in response.queues]

    def add_queue(self, settings: QueueSettings) -> dict:
        request = admin_pb2.AddQueueRequest(settings=_settings_to_pb(settings))
        return _stats_from_pb(self._call(self._stub.AddQueue, request).queue)

    def delete_queue(self, name: str, force: bool = False) -> None:
        self._call(self._stub.DeleteQueue, admin_pb2.DeleteQueueRequest(queue=name, force=force))

    def update_queue(self, name: str, changes: dict) -> dict:
        """Change only the fields in `changes` (QueueSettings field names); the stats afterwards."""
        request = admin_pb2.UpdateQueueRequest(settings=admin_pb2.QueueSettings(name=name, **changes))
        return _stats_from_pb(self._call(self._stub.UpdateQueue, request).queue)

    def list_groups(self, queue: str, local_only: bool = False) -> list[dict]:
        request = admin_pb2.ListGroupsRequest(queue=queue, local_only=local_only)
        return [_group_from_pb(row) for row in self._call(self._stub.ListGroups, request).groups]

    def call_raw(self, method: str, request):
        """The protobuf answer of `method`, for a node passing a member's answer on unchanged."""
        return self._call(getattr(self._stub, method), request)

    def group_page(self, queue: str, prefix: str = "", position: int = 0, page_size: int = 50,
                   node: str = "", order: str = "") -> dict:
        """One bounded page of the groups of `queue` on member `node` ("" = the answering node); with
        `order`, that node's top groups by it; see GroupPageRequest."""
        request = admin_pb2.GroupPageRequest(queue=queue, prefix=prefix, position=position, page_size=page_size,
                                             node=node, order=order)
        response = self._call(self._stub.GroupPage, request)
        return {"groups": [{**_group_from_pb(row),
                            "head_age_ms": row.head_age_ms if row.HasField("head_age_ms") else None}
                           for row in response.groups],
                "next_position": response.next_position, "groups_total": response.groups_total,
                "scanned": response.scanned,
                "consumers": [{"consumer": row.consumer, "label": row.label, "groups_owned": row.groups_owned,
                               "groups": list(row.groups), "unsettled": row.unsettled, "credit": row.credit,
                               "client": row.client}
                              for row in response.consumers]}

    def reset_groups(self, queue: str, group: str | None, local_only: bool = False) -> int:
        request = admin_pb2.ResetGroupsRequest(queue=queue, group=group, local_only=local_only)
        return self._call(self._stub.ResetGroups, request).groups_reset

    def purge_group(self, queue: str, group: str, count: int | None, local_only: bool = False) -> int:
        request = admin_pb2.PurgeGroupRequest(queue=queue, group=group, local_only=local_only,
                                              **_count_request(count))
        return self._call(self._stub.PurgeGroup, request).messages_purged

    def purge_queue(self, queue: str, local_only: bool = False) -> tuple[int, int]:
        """(messages purged, available messages left: those that arrived while the purge ran)."""
        response = self._call(self._stub.PurgeQueue, admin_pb2.PurgeQueueRequest(queue=queue, local_only=local_only))
        return response.messages_purged, response.messages_left

    def move_group(self, queue: str, group: str, destination: str, count: int | None,
                   local_only: bool = False) -> int:
        request = admin_pb2.MoveGroupRequest(queue=queue, group=group, destination_queue=destination,
                                             local_only=local_only, **_count_request(count))
        return self._call(self._stub.MoveGroup, request).messages_moved

    def reroute_queue(self, queue: str, destination: str, group: str | None = None, count: int | None = None,
                      local_only: bool = False) -> tuple[int, int, str]:
        """(messages moved, messages selected that stayed, why they stayed: "" when none did)."""
        request = admin_pb2.RerouteQueueRequest(queue=queue, destination=destination, group=group,
                                                local_only=local_only, **_count_request(count))
        response = self._call(self._stub.RerouteQueue, request)
        return response.messages_moved, response.messages_stayed, response.stayed_reason

    def add_member(self, node: str) -> None:
        self._call(self._stub.AddMember, admin_pb2.MemberRequest(node=node))

    def remove_member(self, node: str) -> int:
        return self._call(self._stub.RemoveMember, admin_pb2.MemberRequest(node=node)).routes_dropped

    def cluster_status(self, local_only: bool = False) -> dict:
        """local_only: the answering node's view, without the other members' queues (never waits for
        a member that is down)."""
        response = self._call(self._stub.ClusterStatus, admin_pb2.ClusterStatusRequest(local_only=local_only))
        return {
            "clustered": response.clustered, "node": response.node, "leader": response.leader,
            "term": response.term, "has_quorum": response.has_quorum, "routes": response.routes,
            "waiting_for_route": response.waiting_for_route, "outbound": dict(response.outbound),
            "outbound_bytes": dict(response.outbound_bytes),
            "routes_digest": response.routes_digest, "last_applied": response.last_applied,
            "commit_index": response.commit_index, "in_transit": dict(response.in_transit),
            "moving": response.moving,
            "moves": [{"queue": move.queue, "group": move.group, "from": move.from_node, "to": move.to_node,
                       "waiting": list(move.waiting), "here": list(move.here)} for move in response.moves],
            "members": [{"node": member.node, "amqp_address": member.amqp_address,
                         "admin_address": member.admin_address, "down": member.down,
                         "connected": member.connected, "raft_member": member.raft_member,
                         "routes": member.routes, "error": member.error,
                         "consumers": dict(member.consumers),
                         "epoch": member.epoch, "in_sync": list(member.in_sync),
                         "under_replicated": member.under_replicated,
                         "queues": [_stats_from_pb(stats) for stats in member.queues]}
                        for member in response.members],
        }
