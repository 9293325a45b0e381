"""Wiring and lifecycle of one node: build its parts, recover, listen, serve, stop.

Rules:
- This module wires; it holds no broker, admin or probe logic. What the node hosts lives beside it:
  recovery in node/recovery.py, the admin API's LoopControl in node/admin/loop_control.py, what the
  HTTP endpoints read in node/http_port/probes.py, the start-up checks and the banner in node/preflight.py.
- Nothing listens before recovery is done, and "ready" is printed only once every listener serves.

Threads and what they own:
- the engine loop thread (node.amqp.loop): the sockets, every proton object, the node shell and the
  cores it runs (node/core/shell.py);
- the journal writer thread: the journal file (it reports back through the bridge);
- the replica writer thread, in a cluster: the replica journals under <data_dir>/replicas (node/cluster.py);
- gRPC pool threads: nothing; admin calls enter the loop through `Bridge.call` with a deadline;
- the HTTP threads (node.http_port): nothing; readiness and metrics read the loop through the bridge;
- the main thread: waits for SIGINT/SIGTERM, then asks the loop to stop and waits for it.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import sys
import threading
import time

from node import stop_deadline
from node.admin.loop_control import LoopControl
from node.amqp import duplicate_ids, tls
from node.amqp.loop import AmqpServer
from node.config import NodeConfig
from node.core.dispatch.broker import Broker
from node.core.errors import GrouperError
from node.file_modes import secure_start
from node.preflight import check_data_dir, check_port_free, print_banner
from node.recovery import recover
from node.security import Security
from node.http_port.probes import metrics_snapshot, readiness
from node.store.journal import Journal
from node.store.trace import TraceWriter

log = logging.getLogger("grouper.node")

STOP_WAIT_S = 10.0  # how long the main thread waits for the engine loop to finish


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Node:
    def __init__(self, config: NodeConfig, clock_ms=wall_clock_ms):
        self.config = config
        self.clock_ms = clock_ms
        self.broker = Broker(auto_create=config.auto_create, address_settings=config.auto_create_settings(),
                             default_group=config.default_group, multicast_addresses=config.multicast_addresses,
                             dedup_id_of=duplicate_ids.dedup_id)  # issue 31: what a de-duplicating queue remembers
        self.broker.memory_max_bytes = config.message_memory_max_bytes  # paging: node/core/dispatch/paging.py
        self.journal = Journal(config.data_dir, fsync=config.journal_fsync,
                               compact_min_bytes=config.journal_compact_min_bytes)
        # its thread and directory come with the first trace line (a queue with trace = true)
        self.trace_writer = TraceWriter(config.trace_path(), config.trace_file_max_bytes, config.trace_max_bytes)
        self.bridge = None
        self.server = None
        self.amqp_port = None
        self.amqps_port = None  # with TLS configured
        self.security = None
        self.admin_server = None
        self.admin_port = None
        self.health = None  # node.http_port.server.HealthServer, once started
        self.serving = False  # recovered and listening: the first half of readiness
        self.handler = None  # the grouping handler's raft member, in a cluster
        self.cluster = None  # node.cluster.ClusterLink, in a cluster
        self.cluster_tls = None  # node.peer.cluster_secrets.ClusterTls, in a cluster with cluster TLS
        self.raft_secrets: tuple[str, ...] = ()  # in a cluster with raft_secret_file
        self.raft_members = None  # node.peer.members.RaftMembers, in a cluster: who may forward
        self.forward_refusals: collections.Counter = collections.Counter()  # kind -> forwarding calls refused
        self.peer_server = self.peer_port = None  # the mutual-TLS peer listener, with cluster TLS
        if config.peer_list():
            from node.cluster import ClusterLink
            from node.peer.cluster_secrets import ClusterTls, read_raft_secrets
            self.cluster_tls = ClusterTls.from_config(config)
            self.raft_secrets = read_raft_secrets(config.raft_secret_file) if config.raft_secret_file else ()
            self.cluster = ClusterLink(config.node_id, config, self.broker, self.journal, clock_ms,
                                       peer_tls=self.cluster_tls)
            from node.peer.members import RaftMembers
            # who may forward: read on gRPC pool threads (status() is never asked on the loop)
            self.raft_members = RaftMembers(self._members_who_may_forward)
            if self.cluster_tls is None and self.raft_secrets:
                from node.peer.signature import Signer
                self.cluster.forwarders.signer = Signer(self.raft_secrets)
        # cold tails (node/core/dispatch/cold.py); where groups follow their consumers, a group moving away takes its
        # cold messages along, found by a sweep of the tail (node/core/cluster/sweep.py)
        self.broker.records.max_bytes = config.record_memory_max_bytes

    def _members_who_may_forward(self) -> list[str] | None:
        """The raft member's partners and the nodes registered through raft (the replicated members
        table). A node that joined with --join knows as raft partners only the members in its --peers
        and those added after it, but every member registers itself through raft, so the table names
        them all. Asked on gRPC pool threads: the table is read on the engine loop, through the bridge."""
        if self.handler is None or self.bridge is None:
            return None
        partners = self.handler.status()["members"]
        cluster = self.cluster
        registered = self.bridge.call(lambda: list(cluster.members.get("nodes", {})), self.config.admin_timeout_ms)
        return sorted(set(partners) | set(registered))

    def recover(self) -> None:
        recover(self)  # node/recovery.py

    def start(self) -> None:
        from node.admin import tls as admin_tls
        from node.admin.service import AdminServicer, serve

        self.security = Security.from_config(self.config)
        from node.peer.cluster_secrets import check_cluster_security
        check_cluster_security(self.config, users_database=not self.security.open)
        admin_files = admin_tls.ServerFiles.from_config(self.config)  # a bad file fails here, before listening
        tls_context = tls.server_context(self.config) if self.config.tls_cert_file else None
        self.server = AmqpServer(self.broker, self.journal, self.config, self.clock_ms, self.security, tls_context)
        self.server.tracer.writer = self.trace_writer
        self.bridge = self.server.bridge
        self.amqp_port = self._listen("AMQP", self.config.amqp_port, tls=False)
        if tls_context is not None:
            self.amqps_port = self._listen("AMQP over TLS", self.config.amqps_port, tls=True)
        # kept: the web console calls it in process (node.admin.local), as the admin port's callers do
        self.admin_servicer = AdminServicer(LoopControl(self), self.security,
                                            admin_tls.peer_channel_credentials(self.config),
                                            self.config.cluster_tls_server_name)
        self.admin_server, self.admin_port = serve(
            LoopControl(self), self.config.host, self.config.admin_port, add_services=self._add_peer_service,
            security=self.security, credentials=admin_files.credentials() if admin_files is not None else None,
            servicer=self.admin_servicer)
        if self.cluster is not None:
            self._start_cluster()
        self.journal.start(on_durable=lambda ticket: self.bridge.post(lambda: self.server.journal_durable(ticket)),
                           on_failed=lambda ticket, reason: self.bridge.post(
                               lambda: self.server.journal_failed(ticket, reason)),
                           on_bodies=lambda queue, bodies: self.bridge.post(
                               lambda: self.server.journal_bodies(queue, bodies)),
                           on_records=lambda queue, records: self.bridge.post(
                               lambda: self.server.journal_records(queue, records)))
        self.server.apply([])  # journals the declarations made during recovery
        self.server.thread.start()
        self.serving = True

    def _listen(self, what: str, port: int, tls: bool) -> int:
        try:
            return self.server.listener.listen(self.config.host, port, tls)
        except OSError as error:
            raise GrouperError(f"cannot listen for {what} on {self.config.host}:{port}: "
                               f"{error.strerror or error}; is another process using the port?") from None

    def reload_tls(self) -> None:
        """SIGHUP: certificates, keys and the users file are read again, on the engine loop."""
        if self.server is not None:
            self.bridge.post(self.server.gate.reload_tls)

    def start_health(self) -> None:
        from node.admin import tls as admin_tls
        from node.console import Console
        from node.http_port.server import HealthServer

        # the console calls this node's admin API in process; the other members over their admin ports
        console = Console(self, self.security, self.admin_servicer,
                          admin_credentials=admin_tls.peer_channel_credentials(self.config),
                          admin_server_name=self.config.cluster_tls_server_name)
        try:
            self.health = HealthServer(self, self.config.host, self.config.http_port, security=self.security,
                                       metrics_auth=self.config.metrics_auth,
                                       tls_cert_file=self.config.http_tls_cert_file,
                                       tls_key_file=self.config.http_tls_key_file, console=console,
                                       advertise_host=self.config.advertise_host,
                                       allowed_hosts=self.config.http_allowed_hosts)
        except OSError as error:
            raise GrouperError(f"cannot listen for HTTP (health, metrics) on {self.config.host}:"
                               f"{self.config.http_port}: {error.strerror}; is another process using the port? "
                               f"Set --http-port") from None
        self.health.start()

    # ---- what the HTTP endpoints ask (HTTP threads): node/http_port/probes.py --------------------

    def readiness(self) -> tuple[bool, str]:
        return readiness(self)

    def metrics_snapshot(self) -> dict:
        return metrics_snapshot(self)

    def _add_peer_service(self, grpc_server) -> None:
        if self.cluster is not None:
            from node.peer.members import admin_port_check
            from node.peer.service import add_peer_service
            from node.peer.signature import REPLICATION
            check = admin_port_check(self.cluster_tls, self.raft_secrets, self.config.node_id, self.raft_members)
            replicate_check = admin_port_check(self.cluster_tls, self.raft_secrets, self.config.node_id,
                                               self.raft_members, REPLICATION)
            add_peer_service(grpc_server, self.cluster.handle_forward, self.config.forward_timeout_ms, check,
                             self.forward_refusals, self.cluster.replicas.submit, replicate_check)

    def _start_cluster(self) -> None:
        from handler.member_process import MemberProcess
        from node.membership import call_options, refuse_lost_identity

        config = self.config
        advertised = config.advertise_host or config.host
        self.server.cluster = self.cluster
        check_port_free(config.host, config.raft_port, "raft")  # pysyncobj would retry a taken port for ever
        peer_port = self.admin_port  # without cluster TLS the admin listener takes forwarded batches too
        if self.cluster_tls is not None:  # bound now, started once the cluster link can take batches
            from node.peer.service import bind_peer_listener
            self.peer_server, self.peer_port = bind_peer_listener(
                config.host, config.peer_port, self.cluster.handle_forward, self.cluster_tls,
                config.forward_timeout_ms, members=self.raft_members, refused_counts=self.forward_refusals,
                handle_replicate=self.cluster.replicas.submit)
            peer_port = self.peer_port
        raft_dir = os.path.join(config.data_dir, "raft")
        refuse_lost_identity(config.node_id, config.peer_list(), self.admin_port, raft_dir,
                             call_options(config, config.peer_list()))
        try:
            self.handler = MemberProcess(
                config.node_id, config.peer_list(), raft_dir,
                on_applied=lambda kind, payload, at_ms: self.bridge.post(
                    lambda: self.cluster.applied(kind, payload, at_ms)),
                on_ready=lambda: self.bridge.post(self.cluster.ready),
                on_lost=self.cluster.proposals.stop_node, loop=self.server.loop,
                election_timeout_min_ms=config.election_timeout_min_ms,
                election_timeout_max_ms=config.election_timeout_max_ms,
                routes_max=config.routes_max, group_timeout_ms=config.group_timeout_ms,
                owner_failover_ms=config.owner_failover_ms, route_follow_ms=config.route_follow_ms,
                replica_failover_ms=config.replica_failover_ms, replication_factor=config.replication_factor,
                placement=config.placement,
                bind_host=config.host, raft_secrets=self.raft_secrets)
        except Exception as error:
            raise GrouperError(f"cannot start the grouping handler on raft port {config.raft_port}: {error}; "
                               f"is another process using the port?") from None
        self.cluster.attach(self.server, self.handler, self.bridge, {
            "peer_address": f"{advertised}:{peer_port}",
            "amqp_address": f"{advertised}:{self.amqp_port}",
            "admin_address": f"{advertised}:{self.admin_port}"})
        if self.peer_server is not None:
            self.peer_server.start()

    def stop(self) -> None:
        if self.health is not None:
            self.health.stop()
        if self.server is not None:
            self.server.thread.stop(STOP_WAIT_S)
        if self.cluster is not None:
            self.cluster.close()
        if self.handler is not None:
            self.handler.stop()
        if self.peer_server is not None:
            self.peer_server.stop(grace=0.5)
        if self.admin_server is not None:
            self.admin_server.stop(grace=0.5)
        self.trace_writer.close()
        self.journal.close()

    def wait_alive(self, stop_event: threading.Event) -> None:
        while not stop_event.is_set() and self.server.thread.is_alive():
            stop_event.wait(0.5)


def run(config: NodeConfig) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    node = None
    try:
        secure_start(config)  # before anything is created: umask 0077, data dir 0700, secret files checked
        check_data_dir(config)
        node = Node(config)
        node.recover()
        node.start()
        node.start_health()
        if config.join:
            from node.membership import call_options, join
            join(config.node_id, config.peer_list(), node.admin_port, config.join_timeout_ms,
                 call_options(config, config.peer_list()))
    except GrouperError as error:
        print(f"grouper node: cannot start: {error.description}", file=sys.stderr)
        if node is not None:
            node.stop() if node.serving else node.journal.close()
        return 1
    stop_event = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop_event.set())
    signal.signal(signal.SIGHUP, lambda *_: node.reload_tls())
    print_banner(node)
    node.wait_alive(stop_event)
    log.info("stopping")
    stopped = stop_deadline.arm()  # a part that hangs must not keep the node alive (node/stop_deadline.py)
    node.stop()
    stopped.set()
    log.info("stopped")
    return 0
