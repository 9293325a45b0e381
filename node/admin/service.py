"""The admin API's gRPC servicer: requests in, `NodeControl` calls, responses or status codes out.

Rules:
- Owns nothing. It runs on gRPC pool threads and reaches the node only through `NodeControl`,
  which posts into the engine loop thread and waits with a deadline.
- Every call is identified (`node.admin.callers`) and authorized before its work: each method
  needs `manage` on the queues its request names, in one table, `QUEUES_MANAGED`; cluster-wide
  methods need it on '#'. ListQueues is open to every identified caller and lists the queues it may
  manage or browse. An answer spanning the cluster asks the other members with the caller's own
  credentials, so each member authorizes the caller itself (node/admin/member_calls.py).
- The work is the subject's: queue_answers, group_answers, cluster_answers; protobuf conversions in
  wire. Settings are validated by the node (`QueueSettings.from_dict`), so a bad value fails with
  INVALID_ARGUMENT naming the field whatever client sent it.
- Failures become status codes in one table, `STATUS_BY_ERROR` (error type -> code: an error takes
  its own class's code, else its nearest listed base's); an error it does not know is a bug, logged
  here with its traceback and reported as INTERNAL. Refused callers are logged at INFO.
"""

from __future__ import annotations

import logging
import time
from concurrent import futures
from typing import Callable

import grpc

from node.admin.client import api_version_refusal
from node.admin.cluster_answers import ClusterAnswers
from node.admin.control import NodeControl
from node.admin.callers import EVERY_QUEUE, Authenticator, Caller, Unauthenticated, authorization_of, check_manage
from node.admin.flushes import JournalFailed
from node.admin.group_answers import GroupAnswers
from node.admin.member_calls import MemberCalls, NodeUnavailable
from node.admin.queue_answers import QueueAnswers
from node.admin.tls import certificate_user
from node.core.access.roles import Access
from node.core.errors import (AlreadyExists, HandlerUnavailable, InvalidConfig, InvalidField,
                              NotAllowed, NotFound, ResourceDeleted, ResourceLimitExceeded, Unauthorized)
from node.grpc_port import bind
from node.peer.service import source_host
from proto import admin_pb2_grpc

log = logging.getLogger(__name__)

WORKERS_DEFAULT = 8  # gRPC pool threads; each admin or forwarded-batch call blocks one while the engine loop answers
CONCURRENT_RPCS_MAX_PER_WORKER = 16  # calls admitted per worker; beyond it RESOURCE_EXHAUSTED
MESSAGE_LENGTH_MAX_BYTES = 64 << 20  # gRPC messages this listener accepts: forwarded batches carry whole messages

# Error type -> status code. An error not listed takes its nearest listed base's code (status_for), so
# the order here does not matter; one with none listed is a bug: INTERNAL.
STATUS_BY_ERROR: dict[type[BaseException], grpc.StatusCode] = {
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    InvalidField: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidConfig: grpc.StatusCode.INVALID_ARGUMENT,
    ResourceLimitExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # the change is made in memory but the node's disk did not take its journal records (full, as a rule)
    JournalFailed: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ResourceDeleted: grpc.StatusCode.NOT_FOUND,  # deleted while we looked: for the caller it is gone
    NotAllowed: grpc.StatusCode.FAILED_PRECONDITION,  # a state rule, not a permission
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,  # the caller's credentials are missing or wrong
    Unauthorized: grpc.StatusCode.PERMISSION_DENIED,  # the caller lacks `manage`; an administrator grants it
    TimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,  # the engine loop did not answer within the bridge deadline
    NodeUnavailable: grpc.StatusCode.UNAVAILABLE,  # another member needed for the answer is down
    HandlerUnavailable: grpc.StatusCode.UNAVAILABLE,  # the raft cluster could not commit the change
}


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
    return next((STATUS_BY_ERROR[kind] for kind in type(error).__mro__ if kind in STATUS_BY_ERROR),
                grpc.StatusCode.INTERNAL)


def _message_for(error: BaseException, code: grpc.StatusCode) -> str:
    if code is grpc.StatusCode.INTERNAL:
        return f"internal error ({type(error).__name__}: {error}); the node's log has the details"
    return getattr(error, "description", None) or str(error)


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, control: NodeControl, security=None, peer_credentials: grpc.ChannelCredentials | None = None,
                 peer_server_name: str = "", clock_ms: Callable[[], int] = lambda: int(time.monotonic() * 1000)):
        """`security`: node.security.Security (None: an open node, as in tests of the API alone);
        `peer_credentials`: TLS to dial the other members' admin ports with, when admin TLS is on, and
        `peer_server_name` the name their certificates carry if not the host dialled."""
        self._security = security
        self._authenticator = Authenticator(security)
        self._clock_ms = clock_ms
        members = MemberCalls(control, peer_credentials, peer_server_name)
        self._queues = QueueAnswers(control, members, self._access)
        self._groups = GroupAnswers(control, members)
        self._cluster = ClusterAnswers(control, members)

    def _access(self) -> Access:
        return self._security.access if self._security is not None else _OPEN_ACCESS

    def _identify(self, context: grpc.ServicerContext) -> Caller:
        return self._authenticator.identify(authorization_of(context.invocation_metadata() or ()),
                                            certificate_user(context.auth_context() or {}), self._clock_ms(),
                                            source_host(context.peer() or ""))

    def _answer(self, method: str, request, context: grpc.ServicerContext,
                work: Callable[[object, Caller], object]):
        """`work(request, caller)` once the caller may call `method`; a failure leaves as a status code."""
        caller = None
        try:
            refusal = api_version_refusal(context.invocation_metadata() or ())
            if refusal is not None:
                raise NotAllowed(refusal)
            caller = self._identify(context)
            check_manage(self._access(), caller, QUEUES_MANAGED[method](request))
            return work(request, caller)
        except Exception as error:  # every failure leaves as a status code; see STATUS_BY_ERROR
            code = status_for(error)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("admin call %s failed: %s", type(request).__name__, request)
            elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                who = "unidentified caller" if caller is None else f"user {caller.user!r}"
                log.info("admin call %s from %s (%s) refused: %s", method, context.peer(), who, error)
            context.abort(code, _message_for(error, code))

    def ListQueues(self, request, context):
        return self._answer("ListQueues", request, context, self._queues.list)

    def AddQueue(self, request, context):
        return self._answer("AddQueue", request, context, self._queues.add)

    def UpdateQueue(self, request, context):
        return self._answer("UpdateQueue", request, context, self._queues.update)

    def DeleteQueue(self, request, context):
        return self._answer("DeleteQueue", request, context, self._queues.delete)

    def PurgeQueue(self, request, context):
        return self._answer("PurgeQueue", request, context, self._queues.purge)

    def RerouteQueue(self, request, context):
        return self._answer("RerouteQueue", request, context, self._queues.reroute)

    def ListGroups(self, request, context):
        return self._answer("ListGroups", request, context, self._groups.list)

    def GroupPage(self, request, context):
        return self._answer("GroupPage", request, context, self._groups.page)

    def ResetGroups(self, request, context):
        return self._answer("ResetGroups", request, context, self._groups.reset)

    def PurgeGroup(self, request, context):
        return self._answer("PurgeGroup", request, context, self._groups.purge)

    def MoveGroup(self, request, context):
        return self._answer("MoveGroup", request, context, self._groups.move)

    def AddMember(self, request, context):
        return self._answer("AddMember", request, context, self._cluster.add_member)

    def RemoveMember(self, request, context):
        return self._answer("RemoveMember", request, context, self._cluster.remove_member)

    def ClusterStatus(self, request, context):
        return self._answer("ClusterStatus", request, context, self._cluster.status)


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
    bound_port = bind(server, host, port, credentials,
                      "the admin API cannot listen on {address}: the port is in use or the host is not an address of "
                      "this machine; stop the other process or choose another admin port")
    server.start()
    return server, bound_port
