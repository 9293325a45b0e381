"""The admin API's gRPC servicer: requests in, `NodeControl` calls, responses or status codes out.

Rules:
- Owns nothing. It runs on gRPC pool threads and reaches the node only through `NodeControl`,
  which posts into the engine loop thread and waits with a deadline.
- Settings are validated by the node (`QueueSettings.from_dict`), so a bad value fails with
  INVALID_ARGUMENT naming the field whatever client sent it.
- Every call is identified (`node.admin.callers`) and authorized before its work: each method
  needs `manage` on the queues its request names, in one table, `QUEUES_MANAGED`; cluster-wide
  methods need it on '#'. ListQueues is open to every identified caller and lists the queues it may
  manage or browse. An answer spanning the cluster asks the other members with the caller's own
  credentials, so each member authorizes the caller itself.
- Failures become status codes in one table, `STATUS_BY_ERROR`; an error it does not know is a bug,
  logged here with its traceback and reported as INTERNAL. Refused callers are logged at INFO.
"""

from __future__ import annotations

import logging
import time
from concurrent import futures
from typing import Callable

import grpc

from node.admin.client import AccessDenied, AdminClient, AdminError, NodeFailure, api_version_refusal
from node.admin.control import NodeControl
from node.admin.callers import (EVERY_QUEUE, Authenticator, Caller, Unauthenticated, authorization_of,
                                    check_manage, may_see)
from node.admin.flushes import JournalFailed
from node.admin.tls import certificate_user
from node.core.access import Access, Permission
from node.core.errors import (AlreadyExists, GrouperError, HandlerUnavailable, InvalidConfig, InvalidField,
                              NotAllowed, NotFound, ResourceDeleted, ResourceLimitExceeded, Unauthorized)
from node.core.settings import QueueSettings
from node.peer.service import source_host
from proto import admin_pb2, admin_pb2_grpc

log = logging.getLogger(__name__)

WORKERS_DEFAULT = 8  # gRPC pool threads; each admin or forwarded-batch call blocks one while the engine loop answers
CONCURRENT_RPCS_MAX_PER_WORKER = 16  # calls admitted per worker; beyond it RESOURCE_EXHAUSTED
PEER_CALL_TIMEOUT_MS = 3000  # deadline of each call to another member when an answer spans the cluster
# deadline of each member's part of a reroute: it moves a backlog, 2,000 messages per engine loop turn,
# and answers once its journal holds them
REROUTE_MEMBER_TIMEOUT_MS = 60_000
# deadline of each member's queue depths in `cluster status`, asked of every member at once: the
# depths are for the operator's eye, and during a partition the cut-off member's would otherwise
# hold the whole answer (an operator asks then most of all)
STATUS_MEMBER_TIMEOUT_MS = 1000
MESSAGE_LENGTH_MAX_BYTES = 64 << 20  # gRPC messages this listener accepts: forwarded batches carry whole messages
SETTINGS_FIELD_PATH = "settings"  # prefix of field names in settings errors: AddQueueRequest.settings

class NodeUnavailable(GrouperError):
    retriable = True


# First match wins, so a subclass must come before its base.
STATUS_BY_ERROR: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (InvalidField, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidConfig, grpc.StatusCode.INVALID_ARGUMENT),
    (ResourceLimitExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    # the change is made in memory but the node's disk did not take its journal records (full, as a rule)
    (JournalFailed, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ResourceDeleted, grpc.StatusCode.NOT_FOUND),  # deleted while we looked: for the caller it is gone
    (NotAllowed, grpc.StatusCode.FAILED_PRECONDITION),  # a state rule, not a permission
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),  # the caller's credentials are missing or wrong
    (Unauthorized, grpc.StatusCode.PERMISSION_DENIED),  # the caller lacks `manage`; an administrator grants it
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),  # the engine loop did not answer within the bridge deadline
    (NodeUnavailable, grpc.StatusCode.UNAVAILABLE),  # another member needed for the answer is down
    (HandlerUnavailable, grpc.StatusCode.UNAVAILABLE),  # the raft cluster could not commit the change
)


# The queues each method touches, all needing `manage`; a method missing here is refused (see _answer).
QUEUES_MANAGED: dict[str, Callable[[object], tuple[str, ...]]] = {
    "ListQueues": lambda request: (),  # every caller; the answer holds only the queues it may see (may_see)
    "AddQueue": lambda request: (request.settings.name,),
    "DeleteQueue": lambda request: (request.queue,),
    "UpdateQueue": lambda request: (request.settings.name,),
    "ListGroups": lambda request: (request.queue,),
    "GroupPage": lambda request: (request.queue,),
    "ResetGroups": lambda request: (request.queue,),
    "PurgeGroup": lambda request: (request.queue,),
    "PurgeQueue": lambda request: (request.queue,),
    "MoveGroup": lambda request: (request.queue, request.destination_queue),
    "RerouteQueue": lambda request: (request.queue, request.destination),  # and send on the destination
    "AddMember": lambda request: (EVERY_QUEUE,),
    "RemoveMember": lambda request: (EVERY_QUEUE,),
    "ClusterStatus": lambda request: (EVERY_QUEUE,),
}


def status_for(error: BaseException) -> grpc.StatusCode:
    for error_type, code in STATUS_BY_ERROR:
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.INTERNAL


def _message_for(error: BaseException, code: grpc.StatusCode) -> str:
    if code is grpc.StatusCode.INTERNAL:
        return f"internal error ({type(error).__name__}: {error}); the node's log has the details"
    return getattr(error, "description", None) or str(error)


def settings_from_pb(settings: admin_pb2.QueueSettings) -> QueueSettings:
    """Only fields the caller set are passed on, so absent ones take the node's defaults."""
    values: dict = {"name": settings.name}
    for field in settings.DESCRIPTOR.fields:
        if field.name != "name" and settings.HasField(field.name):
            values[field.name] = getattr(settings, field.name)
    return QueueSettings.from_dict(values, where=SETTINGS_FIELD_PATH)


def queue_stats_to_pb(stats: dict) -> admin_pb2.QueueStats:
    # a counter the proto does not carry yet is left out rather than failing the whole call
    fields = admin_pb2.QueueStats.DESCRIPTOR.fields_by_name
    return admin_pb2.QueueStats(**{key: value for key, value in stats.items() if key in fields})


def group_row_to_pb(row: dict, node: str = "") -> admin_pb2.GroupRow:
    owner = row["consumer"]
    return admin_pb2.GroupRow(group=row["group"], messages=row["messages"], acquired=row["acquired"],
                              consumer=None if owner is None else str(owner), node=row.get("node") or node,
                              head_age_ms=row.get("head_age_ms"))


def _messages_max(request) -> int | None:
    if not request.HasField("messages_max"):
        return None
    if request.messages_max < 1:
        raise InvalidField(f"messages_max: must be >= 1, got {request.messages_max} (leave it out for all)")
    return request.messages_max


def _add_in_transit(depths: dict[str, int], node: str, status: dict, queue: str) -> None:
    """Count what `node` accepted for `queue` but holds in no queue yet (see ClusterStatusResponse.in_transit)."""
    count = status.get("in_transit", {}).get(queue, 0)
    if count:
        depths[node] = depths.get(node, 0) + count


def _raft_address(node: str) -> str:
    host, _, port = node.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidField(f"node: expected a raft address HOST:PORT, got {node!r}")
    return node


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, control: NodeControl, security=None, peer_credentials: grpc.ChannelCredentials | None = None,
                 peer_server_name: str = "", clock_ms: Callable[[], int] = lambda: int(time.monotonic() * 1000)):
        """`security`: node.security.Security (None: an open node, as in tests of the API alone);
        `peer_credentials`: TLS to dial the other members' admin ports with, when admin TLS is on, and
        `peer_server_name` the name their certificates carry if not the host dialled."""
        self._control = control
        self._security = security
        self._authenticator = Authenticator(security)
        self._peer_credentials = peer_credentials
        self._peer_server_name = peer_server_name
        self._clock_ms = clock_ms
        # threads that ask the other members for their queue depths at once (cluster status); a
        # cluster with more members asks this many at a time
        self._status_pool = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="status-members")

    def _access(self) -> Access:
        return self._security.access if self._security is not None else _OPEN_ACCESS

    def _identify(self, context: grpc.ServicerContext) -> Caller:
        return self._authenticator.identify(authorization_of(context.invocation_metadata() or ()),
                                            certificate_user(context.auth_context() or {}), self._clock_ms(),
                                            source_host(context.peer() or ""))

    def _answer(self, method: str, request, context: grpc.ServicerContext, work: Callable[[Caller], object]):
        caller = None
        try:
            refusal = api_version_refusal(context.invocation_metadata() or ())
            if refusal is not None:
                raise NotAllowed(refusal)
            caller = self._identify(context)
            check_manage(self._access(), caller, QUEUES_MANAGED[method](request))
            return work(caller)
        except Exception as error:  # every failure leaves as a status code; see STATUS_BY_ERROR
            code = status_for(error)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("admin call %s failed: %s", type(request).__name__, request)
            elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                who = "unidentified caller" if caller is None else f"user {caller.user!r}"
                log.info("admin call %s from %s (%s) refused: %s", method, context.peer(), who, error)
            context.abort(code, _message_for(error, code))

    def ListQueues(self, request, context):
        return self._answer("ListQueues", request, context, lambda caller: admin_pb2.ListQueuesResponse(
            queues=[queue_stats_to_pb(stats) for stats in self._control.list_queues()
                    if may_see(self._access(), caller, stats["name"])]))

    def AddQueue(self, request, context):
        def work(caller):
            stats = self._control.add_queue(settings_from_pb(request.settings))
            return admin_pb2.AddQueueResponse(queue=queue_stats_to_pb(stats))
        return self._answer("AddQueue", request, context, work)

    def DeleteQueue(self, request, context):
        def work(caller):
            if self._control.node_id():  # a cluster: what every member holds decides (see _depths)
                depths = self._depths(request.queue, caller, request.force)
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
        return self._answer("DeleteQueue", request, context, work)

    def _depths(self, queue: str, caller: Caller, force: bool) -> dict[str, int]:
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
                with self._member_client(address, caller) as client:
                    depths.update({node: stats["depth_messages"] for stats in client.list_queues()
                                   if stats["name"] == queue})
                    _add_in_transit(depths, node, client.cluster_status(local_only=True), queue)
            except AdminError as error:
                if not force:
                    raise NodeUnavailable(f"cannot tell whether node {node} ({address}) holds messages of queue "
                                          f"{queue!r}: {error.message}; retry once it answers, or delete with "
                                          f"--force") from None
        return depths

    def UpdateQueue(self, request, context):
        def work(caller):
            changes = {field.name: getattr(request.settings, field.name) for field in request.settings.DESCRIPTOR.fields
                       if field.name != "name" and request.settings.HasField(field.name)}
            stats = self._control.update_queue(request.settings.name, changes)
            return admin_pb2.UpdateQueueResponse(queue=queue_stats_to_pb(stats))
        return self._answer("UpdateQueue", request, context, work)

    def _member_client(self, address: str, caller: Caller, timeout_ms: int = PEER_CALL_TIMEOUT_MS) -> AdminClient:
        return AdminClient(address, timeout_ms=timeout_ms, credentials=self._peer_credentials,
                           metadata=caller.forwarded, server_name=self._peer_server_name)

    def _everywhere(self, request, caller: Caller, local, remote, member_timeout_ms: int = PEER_CALL_TIMEOUT_MS):
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
            with self._member_client(address, caller, member_timeout_ms) as client:
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

    def ListGroups(self, request, context):
        def work(caller):
            results = self._everywhere(request, caller, lambda: self._control.list_groups(request.queue),
                                       lambda client: client.list_groups(request.queue, local_only=True))
            return admin_pb2.ListGroupsResponse(groups=[group_row_to_pb(row, node) for node, rows in results
                                                        for row in rows])
        return self._answer("ListGroups", request, context, work)

    def GroupPage(self, request, context):
        def work(caller):
            node = self._control.node_id()
            if request.node and request.node != node:
                return self._member_group_page(request, caller)
            page = self._control.group_page(request.queue, request.prefix, request.position, request.page_size)
            return admin_pb2.GroupPageResponse(
                groups=[group_row_to_pb(row, node) for row in page["groups"]], next_position=page["next_position"],
                groups_total=page["groups_total"], scanned=page["scanned"],
                consumers=[admin_pb2.ConsumerRow(**row) for row in page["consumers"]])
        return self._answer("GroupPage", request, context, work)

    def _member_group_page(self, request, caller: Caller) -> admin_pb2.GroupPageResponse:
        """The page of another member, which authorizes the caller itself (as _everywhere's calls do)."""
        address = dict(self._control.peers()).get(request.node)
        if address is None:
            raise NotFound(f"no member {request.node!r} with an admin address in this cluster; give a node id as "
                           f"'grouper cluster status' lists it")
        if caller.by_certificate:
            raise NotAllowed(f"user {caller.user!r} is known here by a client certificate, which this node cannot "
                             f"pass on to member {request.node}; log in with a password to see its groups")
        forwarded = admin_pb2.GroupPageRequest(queue=request.queue, prefix=request.prefix, position=request.position,
                                               page_size=request.page_size)
        with self._member_client(address, caller) as client:
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

    def ResetGroups(self, request, context):
        group = request.group if request.HasField("group") else None
        return self._answer("ResetGroups", request, context, lambda caller: admin_pb2.ResetGroupsResponse(
            groups_reset=sum(count for _, count in self._everywhere(
                request, caller, lambda: self._control.reset_groups(request.queue, group),
                lambda client: client.reset_groups(request.queue, group, local_only=True)))))

    def PurgeGroup(self, request, context):
        def work(caller):
            count = _messages_max(request)
            return admin_pb2.PurgeGroupResponse(messages_purged=sum(n for _, n in self._everywhere(
                request, caller, lambda: self._control.purge_group(request.queue, request.group, count),
                lambda client: client.purge_group(request.queue, request.group, count, local_only=True))))
        return self._answer("PurgeGroup", request, context, work)

    def PurgeQueue(self, request, context):
        def work(caller):
            results = [counts for _, counts in self._everywhere(
                request, caller, lambda: self._control.purge_queue(request.queue),
                lambda client: client.purge_queue(request.queue, local_only=True))]
            return admin_pb2.PurgeQueueResponse(messages_purged=sum(purged for purged, _ in results),
                                                messages_left=sum(left for _, left in results))
        return self._answer("PurgeQueue", request, context, work)

    def MoveGroup(self, request, context):
        def work(caller):
            count = _messages_max(request)
            return admin_pb2.MoveGroupResponse(messages_moved=sum(n for _, n in self._everywhere(
                request, caller, lambda: self._control.move_group(request.queue, request.group,
                                                                  request.destination_queue, count),
                lambda client: client.move_group(request.queue, request.group, request.destination_queue,
                                                 count, local_only=True))))
        return self._answer("MoveGroup", request, context, work)

    def RerouteQueue(self, request, context):
        def work(caller):
            # a reroute sends to the destination on the caller's behalf: where the model grants `send`
            # apart, the caller needs it as a producer would
            self._access().check(caller.user, Permission.SEND, request.destination)
            group = request.group if request.HasField("group") else None
            count = _messages_max(request)
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
            results = self._everywhere(request, caller, lambda: counted(self._control.reroute_queue(
                request.queue, request.destination, group, count)), remote, REROUTE_MEMBER_TIMEOUT_MS)
            moved = sum(result[0] for _, result in results)
            stayed = sum(result[1] for _, result in results)
            reasons = [f"node {node}: {result[2]}" if node else result[2] for node, result in results if result[2]]
            return admin_pb2.RerouteQueueResponse(messages_moved=moved, messages_stayed=stayed,
                                                  stayed_reason="; ".join(reasons))
        return self._answer("RerouteQueue", request, context, work)

    def AddMember(self, request, context):
        def work(caller):
            self._control.add_member(_raft_address(request.node))
            return admin_pb2.MemberResponse()
        return self._answer("AddMember", request, context, work)

    def RemoveMember(self, request, context):
        return self._answer("RemoveMember", request, context, lambda caller: admin_pb2.MemberResponse(
            routes_dropped=self._control.remove_member(_raft_address(request.node))))

    def _member_queues(self, address: str, caller: Caller) -> tuple[str, list]:
        """(error or "", queue stats) of another member, within STATUS_MEMBER_TIMEOUT_MS."""
        try:
            with self._member_client(address, caller, STATUS_MEMBER_TIMEOUT_MS) as client:
                return "", client.list_queues()
        except AccessDenied as error:
            return f"refused: {error.message}", []
        except AdminError as error:
            return f"unreachable: {error.message}", []

    def ClusterStatus(self, request, context):
        pool = self._status_pool

        def work(caller):
            status = self._control.cluster_status()
            response = admin_pb2.ClusterStatusResponse(
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
            asked = []  # (row, future): the other members' queue depths, asked of all at once
            for member in status.get("members", []):
                row = response.members.add(node=member["node"], amqp_address=member.get("amqp_address", ""),
                                           admin_address=member.get("admin_address", ""),
                                           down=member.get("down", False), connected=member.get("connected", False),
                                           raft_member=member.get("raft_member", False),
                                           routes=member.get("routes", 0), consumers=member.get("consumers", {}))
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
                    asked.append((row, pool.submit(self._member_queues, member["admin_address"], caller)))
                    continue
                row.queues.extend(queue_stats_to_pb(stats) for stats in queues)
            for row, answer in asked:
                error, queues = answer.result()
                if error:
                    row.error = error
                else:
                    row.queues.extend(queue_stats_to_pb(stats) for stats in queues)
            return response
        return self._answer("ClusterStatus", request, context, work)


_OPEN_ACCESS = Access.open()


def serve(control: NodeControl, host: str, port: int, *, workers: int = WORKERS_DEFAULT,
          add_services=None, security=None, credentials: grpc.ServerCredentials | None = None,
          peer_credentials: grpc.ChannelCredentials | None = None, peer_server_name: str = "",
          servicer: AdminServicer | None = None) -> tuple[grpc.Server, int]:
    """Start the admin API on host:port (0 picks a free port); returns the server and its port.

    `security` (node.security.Security) identifies and authorizes callers; None serves an open API.
    `credentials` (node.admin.tls.ServerFiles.credentials()) serve TLS for every service on the port,
    the ones `add_services` adds included; None serves plaintext. `peer_credentials` is the TLS this
    node dials the other members' admin ports with, `peer_server_name` the name their certificates
    carry when it is not the host dialled. `servicer`: the one to serve, when the caller also calls it
    in process (node.admin.local); None: one made of `control` and the rest.

    Raises GrouperError naming host:port when it cannot listen there, as the AMQP listener does,
    so `grouper node` reports it as a failed start rather than a traceback."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="admin-grpc"),
        maximum_concurrent_rpcs=workers * CONCURRENT_RPCS_MAX_PER_WORKER,
        # gRPC sets SO_REUSEPORT by default, which lets a second node share a port silently
        options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MESSAGE_LENGTH_MAX_BYTES),
                 ("grpc.max_send_message_length", MESSAGE_LENGTH_MAX_BYTES)],
    )
    if servicer is None:
        servicer = AdminServicer(control, security, peer_credentials, peer_server_name)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(servicer, server)
    if add_services is not None:  # the node-to-node service shares the listener
        add_services(server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound_port = (server.add_insecure_port(address) if credentials is None
                      else server.add_secure_port(address, credentials))
    except RuntimeError:  # newer grpcio raises instead of returning 0
        bound_port = 0
    if bound_port == 0:
        server.stop(None)
        raise GrouperError(f"the admin API cannot listen on {address}: the port is in use or the host is "
                      f"not an address of this machine; stop the other process or choose another admin port")
    server.start()
    return server, bound_port
