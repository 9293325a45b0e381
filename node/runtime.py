"""Wiring and lifecycle of one node: recover, listen, serve, stop.

Threads and what they own:
- the engine loop thread (node.amqp.loop): the sockets, every proton object, the `Broker` core;
- the journal writer thread: the journal file (it reports back through the bridge);
- gRPC pool threads: nothing; admin calls enter the loop through `Bridge.call` with a deadline;
- the HTTP threads (node.health): nothing; readiness and metrics read the loop through the bridge;
- the main thread: waits for SIGINT/SIGTERM, then asks the loop to stop and waits for it.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import signal
import socket
import sys
import threading
import time

from node.amqp import tls
from node.amqp.loop import AmqpServer
from node.config import NodeConfig
from node.core.broker import Broker
from handler import queue_definitions as definitions
from node.admin.definitions import fixed_refusal, updated_settings
from node.admin.flushes import Flushes
from node.core.effects import Dropped, ReadRecords
from node.core.errors import AlreadyExists, GrouperError, HandlerUnavailable, NotAllowed, NotFound
from node.core.outbound import OUTBOUND_PREFIX
from node.core.settings import QueueSettings
from node.file_modes import secure_start
from node.health import PROBE_TIMEOUT_MS
from node.security import Security
from node.store.journal import Journal
from node.store.trace import TraceWriter

log = logging.getLogger("grouper.node")

STOP_WAIT_S = 10.0  # how long the main thread waits for the engine loop to finish
MEMBERSHIP_RETRY_INTERVAL_MS = 200  # a denied membership change is proposed again after this long


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def resident_bytes() -> int | None:
    """This process's resident set size now (not its peak, which getrusage gives); None off Linux."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class LoopControl:
    """NodeControl over the running engine loop: each call runs on the loop's thread."""

    def __init__(self, node: "Node"):
        self._node = node

    def _call(self, fn):
        return self._node.bridge.call(fn, self._node.config.admin_timeout_ms)

    def list_queues(self):
        return self._call(self._node.broker.list_queues)

    def add_queue(self, settings: QueueSettings):
        if self._node.handler is not None:  # a cluster: defined on every node (handler/queue_definitions.py)
            outcome, held = self._decide(lambda on_result: self._node.handler.define_queue(
                settings.to_dict(), False, on_result))
            if outcome == definitions.CONFLICT:
                differing = sorted(key for key, value in settings.to_dict().items() if held.get(key) != value)
                raise AlreadyExists(f"queue {settings.name!r} is defined cluster-wide with other settings "
                                    f"({', '.join(differing)} differ); change what may change with 'grouper "
                                    f"queue update', or delete it first")
            return self._stats_of(settings.name)

        def add():
            queue = self._node.broker.declare_queue(settings)
            self._node.server.apply([])  # journals the declaration
            return queue.stats()
        return self._call(add)

    def update_queue(self, name: str, changes: dict):
        node = self._node
        if node.handler is None:
            def update():
                settings = updated_settings(node.broker.queue(name).settings.to_dict(), changes)
                node.broker.redefine_queue(settings)
                node.server.apply([])  # journals the new declaration
                return node.broker.queues[name].stats()
            return self._call(update)
        current = self._call(lambda: dict(node.cluster.protocol.definitions.get(name, {})))
        if not current:
            raise NotFound(f"queue {name!r} has no cluster-wide definition (unknown, or auto-created on some nodes); "
                           f"define it with 'grouper queue add' first")
        updated_settings(current, changes)  # a bad value or a fixed field fails here, before any proposal
        outcome, detail = self._decide(lambda on_result: node.handler.update_queue(name, changes, on_result))
        if outcome == definitions.NOT_FOUND:
            raise NotFound(f"queue {name!r} was deleted cluster-wide meanwhile")
        if outcome == definitions.REFUSED:
            raise fixed_refusal(name, detail)
        return self._stats_of(name)

    def queue_defined(self, name: str) -> bool:
        """In a cluster: whether `name` has a cluster-wide definition, as this node's replica last heard."""
        cluster = self._node.cluster
        return cluster is not None and self._call(lambda: name in cluster.protocol.definitions)

    def _stats_of(self, name: str) -> dict:
        queue = self._call(lambda: self._node.broker.queues.get(name))
        return self._call(queue.stats) if queue is not None else {"name": name}

    def _decide(self, propose):
        """Propose a queue definition command and wait for its result, as applied by this node's replica
        (the feed reached the engine loop before the answer: both come through the member's channel)."""
        done = threading.Event()
        answer: list = []

        def on_result(reason, result):  # the raft member channel's reader thread
            answer.extend((reason, result))
            done.set()
        propose(on_result)
        timeout_ms = self._node.config.admin_timeout_ms
        if not done.wait(timeout_ms / 1000):
            raise TimeoutError(f"the raft cluster did not apply the queue change within {timeout_ms} ms "
                               f"(admin_timeout_ms); check 'grouper cluster status' and 'grouper queue list'")
        reason, result = answer
        if reason is not None:
            raise HandlerUnavailable(f"the raft cluster did not take the queue change: {reason}; retry")
        if result[0] == definitions.MALFORMED:
            raise AssertionError(f"the raft cluster found a queue command malformed: {result!r}")
        return result[0], result[1]

    def delete_queue(self, name: str):
        node = self._node
        if node.handler is not None:  # a cluster: one raft entry drops the queue and its routes everywhere
            seen_revision = self._call(lambda: node.cluster.protocol.definitions_revision)
            self._decide(lambda on_result: node.handler.delete_queue(name, seen_revision, on_result))
            return

        flushes = Flushes()

        def delete():
            node = self._node
            durable = node.broker.queue(name).settings.durable
            node.server.apply(node.broker.delete_queue(name))
            node.server.detach_producers_of(name)
            if durable and node.journal is not None:
                node.journal.delete(name)
                flushes.after(node.server)
        self._call(delete)
        self._written(flushes, f"the deletion of queue {name!r}", "the queue is gone from memory, and a restart "
                      "may bring it back with its messages")

    def list_groups(self, queue: str):
        return self._call(lambda: self._node.broker.list_groups(queue))

    def group_page(self, queue: str, prefix: str, position: int, page_size: int) -> dict:
        from node.admin.group_pages import group_page
        node = self._node

        def label_of(consumer_id) -> str:
            state = node.server.consumers.get(consumer_id)
            return getattr(state, "label", "") or ""
        return self._call(lambda: group_page(node.broker.queue(queue), prefix, position, page_size,
                                             node.clock_ms(), label_of))

    def _counted(self, fn, flushes: Flushes | None = None):
        """Run fn(now_ms) -> (count, effects) on the engine loop and carry out its effects; with `flushes`,
        register a wait for the journal records they make."""
        def run():
            count, effects = fn(self._node.clock_ms())
            self._node.server.apply(effects)
            if flushes is not None:
                flushes.after(self._node.server, effects)
            return count
        return self._call(run)

    def _written(self, flushes: Flushes, what: str, meanwhile: str) -> None:
        """Answer only once the journal has on disk what the call changed (node/admin/flushes.py)."""
        flushes.wait(self._node.config.admin_timeout_ms, what, meanwhile)

    def reset_groups(self, queue, group):
        return self._counted(lambda now_ms: self._node.broker.reset_groups(queue, group, now_ms))

    def purge_group(self, queue, group, count):
        flushes = Flushes()
        purged = self._counted(lambda now_ms: self._node.broker.purge_group(queue, group, count, now_ms), flushes)
        self._written(flushes, f"the purge of group {group!r} of queue {queue!r}",
                      f"{purged} messages purged in memory, which a restart may bring back")
        return purged

    def purge_queue(self, queue: str) -> tuple[int, int]:
        from node.admin.queue_purge import available_left, purge_batch
        node = self._node
        flushes = Flushes()

        def batch(position: int):  # one engine loop turn (node.admin.queue_purge)
            effects: list = []
            purged, position, done = purge_batch(node.broker.queue(queue), position, node.clock_ms(), effects)
            node.server.apply(effects)
            flushes.after(node.server, effects)  # each batch's removals go to disk as it ends, not with the tick
            return purged, position, done, available_left(node.broker.queue(queue)) if done else 0
        purged, position, done = 0, 0, False
        while not done:
            count, position, done, left = self._call(lambda position=position: batch(position))
            purged += count
        self._written(flushes, f"the purge of queue {queue!r}",
                      f"{purged} messages purged in memory, which a restart may bring back")
        return purged, left

    def move_group(self, queue, group, destination, count):
        flushes = Flushes()
        moved = self._counted(lambda now_ms: self._node.broker.move_group(queue, group, destination, count, now_ms),
                              flushes)
        self._written(flushes, f"the move of group {group!r} from {queue!r} to {destination!r}",
                      f"{moved} messages moved in memory, and a restart finds each one at {queue!r} or at "
                      f"{destination!r}")
        return moved

    def reroute_queue(self, queue, destination, group, count):
        from node.admin.queue_reroute import reroute_queue
        from node.core.reroute import Reroute
        reroute = reroute_queue(self._node, self._call, self._node.config.admin_timeout_ms,
                                Reroute(queue, destination, group=group, count_max=count))
        return reroute.moved, reroute.stayed, reroute.stayed_reason

    def node_id(self) -> str:
        return self._node.cluster.node_id if self._node.cluster is not None else ""

    def peers(self):
        cluster = self._node.cluster
        if cluster is None:
            return []
        nodes = self._call(lambda: cluster.members["nodes"])
        return [(node, info.get("admin_address", "")) for node, info in sorted(nodes.items())
                if node != cluster.node_id and info.get("admin_address")]

    def _membership(self, change, node_id: str, adding: bool) -> None:
        """Propose the change until it commits or is found done; denials are retried for half of
        admin_timeout_ms, and a proposal is waited for until admin_timeout_ms.

        Raft takes one membership change at a time and a new leader takes none before its first entry
        commits; pysyncobj answers both with a plain denial, so a denial is retried. This node's view
        of the membership tells a change already done (by an earlier try) from one still to make."""
        if self._node.handler is None:
            raise NotAllowed("this node runs alone (no --peers): there is no raft cluster to change")
        change = getattr(self._node.handler, change)  # by name: a node alone has no handler to take it from
        timeout_ms = self._node.config.admin_timeout_ms
        deadline_s = time.monotonic() + timeout_ms / 1000
        retry_until_s = time.monotonic() + timeout_ms / 2000  # half: the denial must reach the client in its deadline
        for attempt in itertools.count():
            done = threading.Event()
            failure: list = []

            def finished(reason, failure=failure, done=done):
                if reason is not None:
                    failure.append(reason)
                done.set()

            change(node_id, finished)
            if not done.wait(max(0.0, deadline_s - time.monotonic())):
                raise TimeoutError(f"the membership change of {node_id} was not committed within {timeout_ms} ms; "
                                   f"check 'grouper cluster status'")
            if not failure:
                return
            members = self._node.handler.status()["members"]
            if not adding and attempt == 0 and node_id not in members:
                raise NotFound(f"{node_id} is not a member of the raft cluster (members: {', '.join(members)}); "
                               f"give a node id as 'grouper cluster status' lists it")
            if (node_id in members) == adding:
                return  # done: by an earlier try, or (adding) before this call
            if time.monotonic() + MEMBERSHIP_RETRY_INTERVAL_MS / 1000 >= retry_until_s:
                raise HandlerUnavailable(f"the raft cluster did not change membership of {node_id} in "
                                         f"{attempt + 1} tries over {timeout_ms // 2} ms: {failure[0]}; check "
                                         f"'grouper cluster status'")
            time.sleep(MEMBERSHIP_RETRY_INTERVAL_MS / 1000)

    def add_member(self, node_id: str) -> None:
        self._membership("add_member", node_id, adding=True)

    def remove_member(self, node_id: str) -> int:
        self._membership("remove_member", node_id, adding=False)
        cluster = self._node.cluster
        keys = self._call(lambda: sorted(key for key, owner in cluster.router.routes.items() if owner == node_id))
        if keys:
            log.warning("node %s left the cluster owning %d routes; dropping them so its groups are placed "
                        "afresh", node_id, len(keys))
            self._node.handler.unroute(keys)
        return len(keys)

    def cluster_status(self) -> dict:
        node = self._node
        if node.cluster is None:
            return {"clustered": False, "members": [{"node": "", "connected": True}]}
        if node.handler is None:  # between the admin API's start and the raft member's
            raise HandlerUnavailable("this node is starting: its raft member is not running yet; ask again "
                                     "in a moment")
        raft = node.handler.status()
        local = self._call(node.cluster.status)
        members = local["members"]
        routes_by_node = self._call(lambda: _routes_by_node(node.cluster.router.routes))
        routes_digest = self._call(node.cluster.router.digest)
        rows = []
        for member in sorted(set(raft["members"]) | set(members["nodes"])):
            info = members["nodes"].get(member, {})
            rows.append({"node": member, "amqp_address": info.get("amqp_address", ""),
                         "admin_address": info.get("admin_address", ""), "down": member in members["down"],
                         "raft_member": member in raft["members"],
                         "connected": member == raft["node"] or member in raft["connected"],
                         "routes": routes_by_node.get(member, 0),
                         "consumers": members["consumers"].get(member, {})})
        return {"clustered": True, "node": raft["node"], "leader": raft["leader"], "term": raft["term"],
                "has_quorum": raft["has_quorum"], "routes": local["routes"],
                "routes_digest": routes_digest, "last_applied": raft.get("last_applied", 0),
                "commit_index": raft.get("commit_index", 0),
                "waiting_for_route": local["waiting_for_route"], "outbound": local["outbound"],
                "outbound_bytes": {owner: stats["bytes"] for owner, stats in local["outbound_store"].items()},
                "in_transit": local["in_transit"], "moving": local["moving"], "moves": local["moves"],
                "members": rows}


def _routes_by_node(routes: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for owner in routes.values():
        counts[owner] = counts.get(owner, 0) + 1
    return counts


class Node:
    def __init__(self, config: NodeConfig, clock_ms=wall_clock_ms):
        self.config = config
        self.clock_ms = clock_ms
        self.broker = Broker(auto_create=config.auto_create, address_settings=config.auto_create_settings(),
                             default_group=config.default_group, multicast_addresses=config.multicast_addresses)
        self.broker.memory_max_bytes = config.message_memory_max_bytes  # paging: node/core/paging.py
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
        self.health = None  # node.health.HealthServer, once started
        self.serving = False  # recovered and listening: the first half of readiness
        self.handler = None  # the grouping handler's raft member, in a cluster
        self.cluster = None  # node.cluster.ClusterLink, in a cluster
        self.cluster_tls = None  # node.peer.credentials.ClusterTls, in a cluster with cluster TLS
        self.raft_secrets: tuple[str, ...] = ()  # in a cluster with raft_secret_file
        self.raft_members = None  # node.peer.members.RaftMembers, in a cluster: who may forward
        self.forward_refusals: collections.Counter = collections.Counter()  # kind -> forwarding calls refused
        self.peer_server = self.peer_port = None  # the mutual-TLS peer listener, with cluster TLS
        if config.peer_list():
            from node.cluster import ClusterLink
            from node.peer.credentials import ClusterTls, read_raft_secrets
            self.cluster_tls = ClusterTls.from_config(config)
            self.raft_secrets = read_raft_secrets(config.raft_secret_file) if config.raft_secret_file else ()
            self.cluster = ClusterLink(config.node_id, config, self.broker, self.journal, clock_ms,
                                       peer_tls=self.cluster_tls)
            from node.peer.members import RaftMembers
            # who may forward: read on gRPC pool threads (status() is never asked on the loop)
            self.raft_members = RaftMembers(self._members_who_may_forward)
            if self.cluster_tls is None and self.raft_secrets:
                from node.peer.signature import Signer
                self.cluster.forward_signer = Signer(self.raft_secrets)
        # cold tails (node/core/cold.py); where groups follow their consumers, a group moving away takes its
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
        # past the node's budget only records come back; bodies are read when dispatch reaches them (or, for
        # a restored group that lives elsewhere now, when it is handed over). With a record budget, a durable
        # queue's messages come back as a cold tail
        # (node/core/cold.py): only counted, read back whole, oldest first, as the budget makes room and
        # dispatch needs them
        cold = self.broker.records.max_bytes > 0
        # the outbound store's bodies stay in the journal: it pages past its budget and reads back as owners
        # take their backlogs (node/core/outbound.py), so a restart never loads a dead owner's backlog whole
        bodiless = OUTBOUND_PREFIX if self.cluster is not None and self.config.outbound_memory_max_bytes else ""
        recovery = self.journal.recover(self.config.message_memory_max_bytes, cold=cold,
                                        bodiless_prefix=bodiless)
        for settings in self.config.queues:
            self.broker.declare_queue(settings)
        journalled = set()
        for values in recovery.queues:
            if _reserved_name(values["name"]):
                if self.cluster is None or not self.cluster.recover_declaration(values):
                    log.warning("journal holds cluster record %r but this node runs alone; keeping it", values["name"])
                continue
            settings = QueueSettings.from_dict(values, where=f"journal queue {values.get('name')!r}")
            journalled.add(settings)
            if settings.name not in self.broker.queues:
                self.broker.declare_queue(settings)
        # journal only what the journal does not hold yet: new or changed config-file queues
        self.broker.declared = [s for s in self.broker.declared if s not in journalled]
        restored = 0
        outbound = {name: messages for name, messages in recovery.messages.items() if _reserved_name(name)}
        if outbound and self.cluster is not None:
            log.info("recovered %d messages waiting to be forwarded", self.cluster.recover_outbound(outbound))
        elif outbound:
            log.warning("journal holds %d messages waiting for other nodes, but this node runs alone (no "
                        "peers); they stay in the journal until it rejoins its cluster",
                        sum(len(messages) for messages in outbound.values()))
        for name, messages in recovery.messages.items():
            if _reserved_name(name):
                continue
            if name not in self.broker.queues:
                log.warning("journal holds %d messages of undeclared queue %r; declaring it from the address settings",
                            len(messages), name)
                self.broker.queue(name, create=True)
            for message in messages:
                self.broker.restore(name, message)
                restored += 1
        for name, backlog in recovery.cold.items():
            if name not in self.broker.queues:
                log.warning("journal holds %d messages of undeclared queue %r; declaring it from the address settings",
                            len(backlog.seqs), name)
                self.broker.queue(name, create=True)
            self.broker.restore_cold(name, backlog.seqs, backlog.size_bytes)
            restored += len(backlog.seqs)
        if self.cluster is not None:
            self.cluster.hold_recovered()  # with route_follow_ms: until the replica is current
        if cold:
            self._read_cold_back()
        self.broker.page_out(self.clock_ms())  # the budgets; held groups keep their bodies (paging.py)
        log.info("recovered %d queues and %d messages from %s", len(self.broker.queues), restored,
                 self.config.data_dir)

    def _read_cold_back(self) -> None:
        """Before serving, read each recovered cold tail's oldest records back as far as the record budget
        goes, as dispatch would (node/core/cold.py): a restarted node serves its warm part at once."""
        now_ms = self.clock_ms()
        reads = [ReadRecords(name, queue.cold.after_seq, count, queue.cold.read_max_bytes)
                 for name, queue in sorted(self.broker.queues.items())
                 if queue.cold is not None and (count := queue.cold.ask(False))]
        while reads:
            read = reads.pop(0)
            records = self.journal.read_records_after_now(read.queue, read.after_seq, read.count, read.max_bytes)
            if self.cluster is not None:
                self.cluster.cold_records(read.queue, records)  # holds what may live elsewhere, as recovery does
            for effect in self.broker.promote(read.queue, records, now_ms):
                if type(effect) is ReadRecords:
                    reads.append(effect)  # the next batch, while the budget has room
                elif type(effect) is Dropped:
                    log.error("queue %r: message %d dropped at recovery: %s", effect.queue, effect.seq, effect.reason)
                else:  # with no consumer attached yet, promotion asks for nothing else
                    raise AssertionError(f"recovery's read-back of cold records made {effect!r}")

    def start(self) -> None:
        from node.admin import tls as admin_tls
        from node.admin.service import AdminServicer, serve

        self.security = Security.from_config(self.config)
        from node.peer.credentials import insecure_cluster_refusal
        refusal = insecure_cluster_refusal(self.config, users_database=not self.security.open)
        if refusal:
            raise GrouperError(refusal)
        if self.config.peer_list() and not self.config.raft_secret_file:
            from node.peer.credentials import RAFT_UNAUTHENTICATED
            log.error("INSECURE (--allow-insecure-cluster): this node serves a raft cluster without a raft secret; "
                      "%s (%s:%d). Give every node --raft-secret-file", RAFT_UNAUTHENTICATED, self.config.host,
                      self.config.raft_port)
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
        self.server.start()
        self.serving = True

    def _listen(self, what: str, port: int, tls: bool) -> int:
        try:
            return self.server.listen(self.config.host, port, tls)
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
        from node.health import HealthServer

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

    # ---- what node.health asks (HTTP threads) ------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        if not self.serving or self.server.stopping:
            return False, "starting" if not self.serving else "stopping"
        if self.cluster is None:
            return True, ""
        try:
            caught_up, registered = self.bridge.call(lambda: (self.cluster.router.ready, self.cluster.registered),
                                                     PROBE_TIMEOUT_MS)
        except TimeoutError:
            return False, f"the engine loop did not answer within {PROBE_TIMEOUT_MS} ms"
        return _cluster_readiness(self.handler.status(), caught_up, registered)

    def metrics_snapshot(self) -> dict:
        def read():
            consumers = []
            for state in self.server.consumers.values():
                if state.browse:
                    continue
                queue = self.broker.queues.get(state.queue)
                core = queue.consumers.get(state.id) if queue is not None else None
                if core is not None:
                    consumers.append((state.queue, state.label, core.owned_count))
            cluster = None
            if self.cluster is not None:
                router = self.cluster.router
                cluster = {**self.cluster.status(), "decisions": dict(router.decisions),
                           "forward_refusals": dict(self.forward_refusals),
                           "decision_latency": router.decision_latency.snapshot(),
                           "raft_decision_latency": self.cluster.raft_decision_latency.snapshot(),
                           "caught_up": router.ready, "registered": self.cluster.registered}
            return (self.broker.list_queues(), consumers, cluster, self.serving and not self.server.stopping,
                    self.server.engine_objects(), dict(self.server.unrouted))

        queues, consumers, cluster, serving, engine, unrouted = self.bridge.call(read, PROBE_TIMEOUT_MS)
        ready = serving
        if cluster is not None:  # one raft status and one loop visit per scrape serve readiness too
            cluster["raft"] = self.handler.status()
            ready = serving and _cluster_readiness(cluster["raft"], cluster["caught_up"], cluster["registered"])[0]
        return {"ready": ready, "queues": queues, "consumers": consumers, "cluster": cluster,
                "unrouted": unrouted,
                "journal": self.journal.stats() if self.journal is not None else None, "engine": engine,
                "trace": self.trace_writer.stats(),
                "resident_bytes": resident_bytes()}

    def _add_peer_service(self, grpc_server) -> None:
        if self.cluster is not None:
            from node.peer.members import SignedByMember
            from node.peer.service import ELSEWHERE, add_peer_service, open_to_all, refuse_all
            from node.peer.signature import Verifier
            if self.cluster_tls is not None:
                check = refuse_all(ELSEWHERE)
            elif self.raft_secrets:
                check = SignedByMember(Verifier(self.raft_secrets, self.config.node_id), self.raft_members)
            else:
                check = open_to_all
                log.warning("this node has no raft secret: it takes forwarded messages on its admin port from anyone "
                            "who reaches it, who can put messages into any queue and group. Give every node the "
                            "cluster's raft_secret_file (or cluster TLS)")
            add_peer_service(grpc_server, self.cluster.handle_forward, self.config.forward_timeout_ms, check,
                             self.forward_refusals)

    def _start_cluster(self) -> None:
        from handler.member_process import MemberProcess
        from node.membership import call_options, refuse_lost_identity

        config = self.config
        advertised = config.advertise_host or config.host
        self.server.cluster = self.cluster
        _check_port_free(config.host, config.raft_port, "raft")  # pysyncobj would retry a taken port for ever
        peer_port = self.admin_port  # without cluster TLS the admin listener takes forwarded batches too
        if self.cluster_tls is not None:  # bound now, started once the cluster link can take batches
            from node.peer.service import bind_peer_listener
            self.peer_server, self.peer_port = bind_peer_listener(
                config.host, config.peer_port, self.cluster.handle_forward, self.cluster_tls,
                config.forward_timeout_ms, members=self.raft_members, refused_counts=self.forward_refusals)
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
                on_lost=self.cluster.stop_node, loop=self.server.loop,
                election_timeout_min_ms=config.election_timeout_min_ms,
                election_timeout_max_ms=config.election_timeout_max_ms,
                routes_max=config.routes_max, group_timeout_ms=config.group_timeout_ms,
                owner_failover_ms=config.owner_failover_ms, route_follow_ms=config.route_follow_ms,
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
            self.server.stop(STOP_WAIT_S)
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
        while not stop_event.is_set() and self.server.is_alive():
            stop_event.wait(0.5)


def _cluster_readiness(raft: dict, caught_up: bool, registered: bool) -> tuple[bool, str]:
    if not raft["leader"] or not raft["has_quorum"]:
        return False, (f"no raft leader known (term {raft['term']})" if not raft["leader"] else
                       f"no raft majority connected (members {', '.join(raft['members'])})") + \
            "; is a majority of --peers up and reachable?"
    if not caught_up:
        return False, "replaying the grouping handler's log"
    if not registered:
        return False, "not yet registered with the cluster"
    return True, ""


def _check_port_free(host: str, port: int, what: str) -> None:
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener will: TIME_WAIT is no conflict
        probe.bind((host, port))
    except OSError as error:
        raise GrouperError(f"cannot listen for {what} on {host}:{port}: {error.strerror}; is another process "
                           f"using the port?") from None
    finally:
        probe.close()


def _reserved_name(name: str) -> bool:
    return name.startswith("\x00")  # the cluster's own journal records (queue names cannot hold NUL)


def _on_mounted_volume(path: str) -> bool:
    """True if `path` lies under a mount point other than /. A device comparison alone is not enough:
    on Docker's vfs driver a volume and the container's root are on the same host device."""
    try:
        with open("/proc/self/mountinfo") as handle:  # field 5: the mount point, octal-escaped
            points = [line.split()[4].encode().decode("unicode_escape") for line in handle if line.strip()]
    except OSError:  # no /proc: fall back to the device check
        return os.stat(path).st_dev != os.stat("/").st_dev
    return any(point != "/" and (path == point or path.startswith(point.rstrip("/") + "/")) for point in points)


def check_data_dir(config: NodeConfig) -> None:
    """With require_data_volume, the data dir must exist on a file system other than the root's."""
    if not config.require_data_volume:
        return
    path = os.path.abspath(config.data_dir)
    if not os.path.isdir(path):
        raise GrouperError(f"data dir {path} does not exist: mount the data volume there (require_data_volume "
                           f"is on, so it is not created)")
    if not _on_mounted_volume(path):
        raise GrouperError(f"data dir {path} is on the root file system, not a mounted volume: its journal would "
                           f"vanish with the container; mount a volume there, or set require_data_volume false")


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
    banner = [f"amqp: {config.host}:{node.amqp_port}", f"admin: {config.host}:{node.admin_port}",
              f"http: {config.host}:{node.health.port}"]
    if node.amqps_port is not None:
        banner.append(f"amqps: {config.host}:{node.amqps_port}")
    banner.append(f"security: {node.security.describe()}")
    if node.cluster is not None:
        banner.append(f"node: {config.node_id}")
        from node.peer.credentials import describe
        if node.peer_port is not None:
            banner.append(f"peer: {config.host}:{node.peer_port}")
        banner.append(f"cluster security: {describe(node.cluster_tls, node.raft_secrets)}")
    banner.append("ready")
    # one write: the engine loop already serves and logs (to stderr, often the same pipe), and print()
    # writes a line and its newline apart, so a log line could land inside an address line
    sys.stdout.write("".join(line + "\n" for line in banner))
    sys.stdout.flush()
    node.wait_alive(stop_event)
    log.info("stopping")
    node.stop()
    log.info("stopped")
    return 0
