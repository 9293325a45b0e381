"""A seeded, single-process, deterministic simulation of an N-node Grouper cluster.

One `random.Random(seed)` decides everything, time is an integer `now_ms` advanced by the
simulation, and the invariants are checked after every step, so a failing seed replays exactly:
the failure names the seed, the config and the last steps.

What is modelled (the production classes where they exist):
- each node: `SimNode` (tests/sim/node_model.py) = the node's own ClusterProtocol and Broker, with a
  journal that survives crashes (torn tails optional) and forwarders; optionally the node's memory
  budgets for queued messages (message_memory_max_bytes, record_memory_max_bytes): bodies paged out to
  the journal once on disk and read back as dispatch nears them, and cold tails past the record budget,
  read back from the journal, recovered as cold tails after a restart;
- the raft cluster: `RaftLog`, one linearizable log applied to a real `RouteTable`, with a leader
  that can be down and per-replica apply lag, replays and snapshot installs; every claim carries the
  config's placement (balanced, as a node's default, or local); the leader's duties
  (the production LeaderDuties of handler/leader_duties.py): with a group timeout, expire_idle after
  half a group timeout of leadership, and none while a node is down (a member it cannot reach) or
  back for less than half a group timeout; with route_follow_ms, follow_consumers for a node whose
  consumers of a queue all left (moves, their clears and their ends are in the log, and snapshots
  carry the moves in progress); member registration goes through the log (a move waits for every
  registered member);
- the network between nodes: forwarding calls and their replies, with seeded delay, loss and
  duplicated (late) requests; a call to a down node is never answered;
- clients: producers bound to one node for their lifetime (a link), sending grouped messages with a
  sequence per (producer, group); consumers that attach, grant credit, accept, release, detach, and
  (with route_follow_ms) all of a queue's consumers on a node leaving it for another node;
- faults: node crash and restart, leader unavailability, forwarded-batch and ack loss, consumer
  detach, snapshot installs, failed journal writes (off in the random runs unless journal_fail_rate,
  which a sweep of its own sets); a node that stops itself (the protocol's StopNode) is started again
  `restart_ms` later, as by its supervisor.
What is not: raft elections and log repair (pysyncobj's), the leader's own crash (the log outlives
any node), network partitions (unreachable = down), member addresses, mark_down and owner
failover (so neither their interplay with moves), pysyncobj's code versions, clock skew between nodes, a failed write's bytes surviving in the file until the next
batch cuts them, the bridge between threads (the applied feed, acks and failed proposals reach the
node at once, in order), gRPC status codes beyond "no reply", the owner's own deadline on a
forwarded batch, AMQP framing and flow control, ungrouped messages, presettled consumers and
browsers, queue limits, message expiry, non-durable queues, the journal's compaction.

Invariants, after every step:
- the table: route counts match its routes, and its routes are exactly what its log made (a claim of
  a routed group never moves it: first proposal wins);
- every live node's Router holds exactly the routes the log had at the index its replica applied
  (so never a route the log never had), and leases none from later than the log last refreshed it;
- every (queue, group) with messages anywhere (a broker's queue, in flight to a consumer, an
  outbound channel or a forwarding call counting for its owner unless the owner has taken that
  forward seq already, a crashed node's journal, its outbound store included) is held by exactly one
  node, and that node is its route in the table: a group is never split. While the table moves the
  group, its old and new owner may both hold it (a parked message counts for the node parking it);
  once the move ended, the group's messages are on the new owner only;
- no two consumers anywhere hold unsettled messages of one group at once, and the new owner of a
  moving group delivers, until the move ended, only what the old owner sent it;
- a route is never removed while its group has messages or an owner anywhere: a group a consumer
  owns (an exclusive owner keeps it while idle) has a route, naming the owner's node unless a move
  from or to that node is in progress (messages: the "held by exactly one node" invariant above);
- no message is held twice, delivered to two consumers at once, or accepted (durably) twice, beyond
  the allowed duplicates below; no refused or never-sent message is ever delivered; every producer
  hears at most one outcome;
- per (producer, group), first deliveries come in increasing sequence;
- each node's outbound store counts, per owner and in all, the bytes its channels hold (its bounds,
  outbound_max_bytes and outbound_total_max_bytes, refuse sends by these counts); a forwarder holds
  at most outbound_memory_max_bytes (or one entry), and every paged entry read back is in the journal;
- no node drops a message (a `Dropped` effect): so every body read back for dispatch, and every record
  of a cold tail read back, was in the journal; a cold message's group counts as held by its node (the
  "held by exactly one node" invariant above), known from its seq being above its tail's after_seq;
- after every page-out, a node keeps more than message_memory_max_bytes of bodies only if none of
  them could be paged (not on disk yet, delivered, read back for dispatch, or of a group held for a
  hand-over).
At the end, after a drain with faults off and every node up: nothing is left anywhere, and every
accepted message was delivered and accepted by a consumer (nothing lost).

Definitions the invariants use:
- accepted: the producer heard "accepted" (its message was durable here or in the outbound store);
- refused: the producer heard a refusal (no route decided in time, a failed journal write); unknown:
  neither (its node crashed first), or told so (a failed journal write after a consumer had it);
- confirmed acceptance: a consumer's accept whose removal reached the journal (the server settles
  the delivery only then);
- allowed duplicate: a forwarded message recovered by its owner from a torn journal tail that kept
  its STORE but not the high-water MARK journalled after it; the sender was never acked and sends it
  again, so the owner holds it twice. Likewise a message relayed by a group's old owner past its
  mark, one a torn tail kept both in a queue and in the outbound store it was handed over through
  (or in the queue and the park it was unparked from), and a ghost: a message a consumer accepted
  whose REMOVE never reached the disk, recovered by a restart (it holds no group: it goes to the
  group's owner). Nothing else may be held twice or confirmed twice; redelivery
  after a release, a detach or a crash before the accept was durable is ordinary at-least-once.
"""

from __future__ import annotations

import collections
import heapq
import random
from dataclasses import dataclass

from handler.leader_duties import ExpireIdle, FollowConsumers, LeaderDuties, RaftStatus
from node.core.cluster.feed import settings_values
from node.core.effects import Removed
from node.core.dispatch.message import Outcome
from node.core.dispatch.settings import QueueSettings
from tests.sim.node_model import MARK_PREFIX, SimNode, mid_of
from tests.sim.raft_log import RaftLog

DEFINED_QUEUES = ("d1", "d2", "c1")  # the queues operators define at random (queue_definitions); c1 may be a seed


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 3
    queues: int = 2
    groups: int = 4  # per queue
    producers_max: int = 4  # alive at once
    consumers_max: int = 4  # attached at once
    step_ms_max: int = 10  # each step advances the clock by 1..this
    handler_timeout_ms: int = 300  # a message waits this long for a route before it is refused
    # routes idle this long are expired by the leader; 0: never (no leases). On by default, as in a node
    # (GROUP_TIMEOUT_MS_DEFAULT, thirty minutes), scaled to runs that last seconds of simulated time
    group_timeout_ms: int = 400
    reaper_interval_ms: int = 100  # the leader's duties and expire_idle cadence (with a group timeout)
    route_follow_ms: int = 0  # groups follow their consumers after this long; 0: off (and no migrations)
    placement: str = "balanced"  # every node's claims carry it (handler/placement.py's PLACEMENT_*)
    routes_max: int = 1_000_000
    outbound_max_bytes: int = 0  # the outbound store's bound per owner (node/config/settings.py); 0: none
    outbound_total_max_bytes: int = 0  # and for all owners together
    outbound_max_messages: int = 0  # the outbound store's bound per owner in messages; 0: none
    outbound_memory_max_bytes: int = 0  # bodies per owner in memory, the rest paged (node/core/cluster/outbound.py); 0: none
    # the node's budgets for queued messages (node/config/settings.py): bodies of durable queues in memory, the rest
    # paged to the journal (node/core/dispatch/paging.py); their records, the newest past it only counted as a cold
    # tail (node/core/dispatch/cold.py); 0: none
    message_memory_max_bytes: int = 0
    record_memory_max_bytes: int = 0
    read_back_max_bytes: int = 0  # a read of cold records stops once its bodies reach this (node/core/dispatch/cold.py); 0: its default
    net_delay_ms_max: int = 20  # one way, forwarding calls and replies
    forward_loss: float = 0.05  # a forwarding call never reaches the owner
    ack_loss: float = 0.05  # the owner's reply never reaches the sender
    duplicate: float = 0.05  # a forwarding call also reaches the owner again, later
    call_timeout_ms: int = 100  # forward_timeout_ms
    retry_min_ms: int = 10
    retry_max_ms: int = 200
    batch_messages_max: int = 4
    commit_ms_max: int = 10  # proposal to commit
    propose_fail_ms_max: int = 20  # proposal to failure while the leader is down
    apply_lag_ms_max: int = 20  # commit to a replica's apply
    replay_ms_max: int = 30  # a restarted replica replays its log after this
    flush_ms_max: int = 8  # journal unit handed -> the writer takes it (with every unit handed by then)
    write_ms_max: int = 4  # the writer takes a batch -> the engine loop hears it is durable or failed
    seq_reserve_block: int = 8  # small, so reservations are journalled often
    journal_fail_rate: float = 0.0  # per journal write: the batch fails, its records are dropped
    crash_rate: float = 0.01  # per step
    down_ms_min: int = 20
    down_ms_max: int = 400
    restart_ms: int = 50  # a node that stopped itself (StopNode) is started again this much later
    torn_tails: bool = True  # a crash may keep any prefix of what the writer was handed
    leader_down_rate: float = 0.005  # per step
    leader_down_ms_max: int = 600
    snapshot_rate: float = 0.005  # per step: a replica installs a snapshot instead of entries
    drain_steps_max: int = 3000
    scripted: bool = False  # no random actions: a test drives clients and faults itself
    # queues defined, updated and deleted through the raft log at random (DEFINED_QUEUES, no traffic), and
    # these config-file queues (QueueSettings) seeded by every node at every start
    queue_definitions: bool = False
    config_queues: tuple = ()
    trace_lines: int = 40


class SimulationFailure(AssertionError):
    pass


class Producer:
    def __init__(self, producer_id: str, node: SimNode, queue: str):
        self.id = producer_id
        self.node = node
        self.incarnation = node.incarnation
        self.queue = queue
        self.next_seq: dict[str, int] = collections.defaultdict(lambda: 1)

    @property
    def alive(self) -> bool:
        return self.node.alive and self.node.incarnation == self.incarnation


class Consumer:
    def __init__(self, consumer_id: str, node: SimNode, queue: str):
        self.id = consumer_id
        self.node = node
        self.incarnation = node.incarnation
        self.queue = queue
        self.unsettled: dict[int, str] = {}  # delivery id -> message id, in delivery order
        self.accept_all = False

    @property
    def alive(self) -> bool:
        return self.node.alive and self.node.incarnation == self.incarnation and self.id in self.node.consumers


class Network:
    def __init__(self, sim: "Simulation"):
        self.sim = sim
        self.in_flight: dict[int, tuple[str, str, list]] = {}  # request number -> (owner, source, entries)
        self._next = 1

    def forward(self, forwarder, number: int, batch: list, seq_bound: int = 0, disputed_high_water: int = 0) -> None:
        sim = self.sim
        source = forwarder.node
        if sim.faults_on and sim.rng.random() < sim.config.forward_loss:
            sim.trace(f"  lost: {source.node_id}->{forwarder.owner} call {number} seqs {_seqs(batch)}")
            sim.stats["calls_lost"] += 1
            return
        copies = 2 if sim.faults_on and sim.rng.random() < sim.config.duplicate else 1
        delay_ms = sim.rng.randint(1, sim.config.net_delay_ms_max)
        for copy in range(copies):
            request = self._next
            self._next += 1
            self.in_flight[request] = (forwarder.owner, source.node_id, batch)
            sim.schedule(delay_ms + copy * sim.rng.randint(1, 3 * sim.config.call_timeout_ms),
                         lambda request=request: self._arrive(request, forwarder, number, batch, seq_bound,
                                                              disputed_high_water), None)

    def _arrive(self, request: int, forwarder, number: int, batch: list, seq_bound: int = 0,
                disputed_high_water: int = 0) -> None:
        sim = self.sim
        del self.in_flight[request]
        owner = sim.nodes[forwarder.owner]
        if not owner.alive:
            return
        source = forwarder.node

        def reply(high_water):
            if sim.faults_on and sim.rng.random() < sim.config.ack_loss:
                sim.trace(f"  ack lost: {owner.node_id}->{source.node_id} call {number} high water {high_water}")
                sim.stats["acks_lost"] += 1
                return
            sim.schedule(sim.rng.randint(1, sim.config.net_delay_ms_max),
                         source.guarded(lambda: self._replied(forwarder, number, high_water)), None)

        sim.trace(f"  {owner.node_id} takes call {number} from {source.node_id} seqs {_seqs(batch)} "
                  f"(high water {owner.inbound.high_water.get(source.node_id, 0)})")
        owner.handle_forward(source.node_id, batch, owner.guarded(reply), seq_bound, disputed_high_water)
        owner.end_of_batch()

    def _replied(self, forwarder, number: int, high_water) -> None:
        forwarder.replied(number, high_water)
        forwarder.node.end_of_batch()


def _seqs(batch) -> str:
    return f"{batch[0].forward_seq}..{batch[-1].forward_seq}"


class Simulation:
    def __init__(self, seed: int, nodes: int = 3, **overrides):
        self.seed = seed
        self.overrides = dict(overrides, nodes=nodes)
        self.config = config = SimConfig(nodes=nodes, **overrides)
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.step_number = 0
        self.faults_on = True
        self.draining = False
        self._events: list = []
        self._event_serial = 0
        self._call_number = 0
        self._trace: collections.deque = collections.deque(maxlen=config.trace_lines)
        self.stats: collections.Counter = collections.Counter()
        self.raft = self._make_raft()
        self.network = Network(self)
        self.queue_names = [f"q{i}" for i in range(1, config.queues + 1)]
        self.group_names = [f"g{i}" for i in range(1, config.groups + 1)]
        self.nodes = {f"n{i}": self._make_node(f"n{i}") for i in range(1, config.nodes + 1)}
        self.producers: list[Producer] = []
        self.consumers: list[Consumer] = []
        self._next_client = 1
        # what clients saw
        self.sent: dict[str, tuple] = {}  # message id -> (producer, queue, group, seq)
        self.outcome: dict[str, str] = {}  # message id -> "accepted" | "refused" | "unknown" (told so)
        self.delivered_once: set[str] = set()
        self.last_first_delivery: dict[tuple, int] = {}  # (producer, queue, group) -> seq
        self.accepted_by_consumer: set[str] = set()
        self.confirmed: collections.Counter = collections.Counter()
        self.allowed_duplicates: set[str] = set()
        self.moved: dict[tuple[str, str], int] = {}  # (queue, group) -> moves ended, for the invariants
        # (node, mid) -> the node that last forwarded the message there (crashes keep it: what a node
        # recovers came the same way), for what a moving group's new owner may deliver
        self.forwarded_from: dict[tuple[str, str], str] = {}
        self.ghosts: set[str] = set()  # accepted by a consumer, then recovered from a journal (see crash)
        self._checked: dict = {}  # what the last invariant check saw, to skip unchanged parts
        self._replay = "<the scenario's own calls>"
        for node in self.nodes.values():
            node.boot()
        self.raft_term = 1  # a new term at every leader outage: the next leader is new
        self.duties = LeaderDuties(config.group_timeout_ms, reaper_interval_ms=config.reaper_interval_ms,
                                   route_follow_ms=config.route_follow_ms)
        if self.duties.active:
            self.schedule(0, self._leader_duties, None)  # the first leader leads from t=0

    def _make_raft(self):
        """The raft cluster the nodes propose to (tests/sim/sharding.py makes several raft groups)."""
        return RaftLog(self, self.config.routes_max)

    def _make_node(self, node_id: str) -> SimNode:
        """One node (tests/sim/sharding.py's nodes keep one replica per raft group)."""
        return SimNode(self, node_id)

    # ---- events ------------------------------------------------------------------------------

    def schedule(self, delay_ms: int, fn, label: str | None) -> None:
        self._event_serial += 1
        heapq.heappush(self._events, (self.now_ms + max(0, delay_ms), self._event_serial, fn, label))

    def next_call_number(self) -> int:
        self._call_number += 1
        return self._call_number

    def trace(self, line: str) -> None:
        self._trace.append(f"t={self.now_ms} {line}")

    def violation(self, problem: str) -> None:
        trace = "\n".join(self._trace)
        raise SimulationFailure(
            f"seed {self.seed}, step {self.step_number}, t={self.now_ms} ms: {problem}\n"
            f"replay: Simulation({self.seed}, **{self.overrides!r}).{self._replay}\n"
            f"last steps:\n{trace}")

    # ---- running -----------------------------------------------------------------------------

    def run(self, steps: int) -> "Simulation":
        self._replay = f"run({steps})"
        for _ in range(steps):
            self.step()
        self.drain()
        return self

    def step(self) -> None:
        self.step_number += 1
        target_ms = self.now_ms + self.rng.randint(1, self.config.step_ms_max)
        while self._events and self._events[0][0] <= target_ms:
            due_ms, _, fn, label = heapq.heappop(self._events)
            self.now_ms = due_ms
            if label:
                self.trace(label)
            fn()
            self._end_of_batches()
        self.now_ms = target_ms
        self.trace(f"step {self.step_number}")
        if self.draining:
            self._drain_action()
        elif not self.config.scripted:
            self._random_action()
        self._accept_everything()
        self._end_of_batches()
        for node in self._alive_nodes():
            node.tick(self.now_ms)
        self._end_of_batches()
        self.check_invariants()

    def _end_of_batches(self) -> None:
        for node in self._alive_nodes():
            node.end_of_batch()

    def _alive_nodes(self) -> list[SimNode]:
        return [node for node in self.nodes.values() if node.alive]

    # ---- the raft feed -----------------------------------------------------------------------

    def committed(self, index: int) -> None:
        for node in self._alive_nodes():
            due_ms = max(self.now_ms + self.rng.randint(0, self.config.apply_lag_ms_max), node.replay_due_ms)
            node.apply_due_ms[index] = due_ms
            self.schedule(due_ms - self.now_ms, node.guarded(node.catch_up), None)

    def _leader_duties(self) -> None:
        """The duties thread of handler/duties_thread.py (its DUTIES_INTERVAL_MS and the reaper interval are both
        reaper_interval_ms here) around the same LeaderDuties: the members the leader cannot reach are
        the nodes that are down (the simulation has no partitions)."""
        self.schedule(self.config.reaper_interval_ms, self._leader_duties, None)
        alive = tuple(sorted(node.node_id for node in self.nodes.values() if node.alive))
        down = tuple(sorted(node.node_id for node in self.nodes.values() if not node.alive))
        table = self.raft.table
        status = RaftStatus(leader=self.raft.leader_up, term=self.raft_term, reachable=alive, unreachable=down,
                            consumers=tuple((node, queue, count) for node, held in sorted(table.consumers.items())
                                            for queue, count in sorted(held.items())),
                            routed=tuple((node, queue, count) for (node, queue), count
                                         in sorted(table.route_counts.items())))
        for command in self.duties.tick(self.now_ms, status):
            if isinstance(command, FollowConsumers):
                self.trace(f"leader: groups of {command.queue} follow their consumers away from {command.from_node}")
                self.raft.propose(("follow_consumers", command.queue, command.from_node, command.now_ms))
                continue
            assert isinstance(command, ExpireIdle), command  # no owner failover here
            self.raft.propose(("expire_idle", command.cutoff_ms, command.spared_nodes))

    def registered(self, node_id: str) -> None:
        """The log holds `node_id`'s registration (RaftLog.commit)."""
        node = self.nodes[node_id]
        if node.alive:
            node.protocol.registered_now()

    def move_ended(self, key: tuple[str, str]) -> None:
        self.moved[key] = self.moved.get(key, 0) + 1
        self.trace(f"  move of {key} ended: its messages are at {self.raft.current.get(key)} only from now on")

    def _set_leader(self, up: bool) -> None:
        self.raft.set_leader(up)
        if not up:
            self.raft_term += 1  # the next leader is new, and waits before it reaps
        if up:
            for node in self._alive_nodes():
                if node.ready_target is None:
                    node.ready_target = self.raft.commit_index
                    self.schedule(0, node.guarded(node.catch_up), None)

    # ---- random actions ----------------------------------------------------------------------

    def _random_action(self) -> None:
        rng, config = self.rng, self.config
        roll = rng.random()
        if roll < config.crash_rate:
            self._crash_one()
        elif roll < config.crash_rate + config.leader_down_rate:
            if self.raft.leader_up:
                down_ms = rng.randint(10, config.leader_down_ms_max)
                self.trace(f"leader down for {down_ms} ms")
                self.stats["leader_outages"] += 1
                self._set_leader(False)
                self.schedule(down_ms, lambda: self._set_leader(True), "leader up")
        elif not self._alive_nodes():
            return  # every node stopped itself (StopNode after failed writes): wait for the supervisor
        elif roll < config.crash_rate + config.leader_down_rate + config.snapshot_rate:
            node = rng.choice(self._alive_nodes())
            self.trace(f"{node.node_id} installs a snapshot at index {self.raft.commit_index}")
            node.install_snapshot(self.raft.commit_index)
            self.stats["snapshots"] += 1
        else:
            actions = (self._send, self._attach, self._credit, self._accept, self._release, self._detach,
                       self._new_producer)
            weights = (40, 4, 10, 16, 2, 2, 3)
            if config.route_follow_ms:  # consumers move between nodes, and their groups after them
                actions, weights = actions + (self._migrate,), weights + (2,)
            if config.queue_definitions:
                actions, weights = actions + (self._change_definition,), weights + (4,)
            rng.choices(actions, weights=weights)[0]()

    def _change_definition(self) -> None:
        """An operator's `grouper queue add / update / delete` through a random node (LoopControl)."""
        rng = self.rng
        node = rng.choice(self._alive_nodes())
        name = rng.choice(DEFINED_QUEUES)
        verb = rng.choice(("add", "add", "update", "delete"))
        if verb == "add":
            command = ("define_queue", QueueSettings(name=name, group_buckets=rng.choice((-1, 8)),
                                                     durable=rng.random() < 0.5).to_dict(), False)
        elif verb == "update":
            command = ("update_queue", name, {"depth_max_messages": rng.randint(1, 5)})
        else:
            command = ("delete_queue", name, node.protocol.definitions_revision)
        self.trace(f"operator at {node.node_id}: {command}")
        self.stats[f"queue_{verb}s"] += 1
        self.raft.propose(command)

    def _alive_producers(self) -> list[Producer]:
        self.producers = [producer for producer in self.producers if producer.alive]
        return self.producers

    def _alive_consumers(self) -> list[Consumer]:
        self.consumers = [consumer for consumer in self.consumers if consumer.alive]
        return self.consumers

    def _client_id(self, prefix: str) -> str:
        self._next_client += 1
        return f"{prefix}{self._next_client}"

    def _new_producer(self) -> Producer | None:
        if len(self._alive_producers()) >= self.config.producers_max:
            return None
        node = self.rng.choice(self._alive_nodes())
        producer = Producer(self._client_id("p"), node, self.rng.choice(self.queue_names))
        self.producers.append(producer)
        self.trace(f"producer {producer.id} on {node.node_id} for {producer.queue}")
        return producer

    def _send(self) -> None:
        producers = self._alive_producers()
        producer = self.rng.choice(producers) if producers else self._new_producer()
        if producer is not None:
            self.send(producer, self.rng.choice(self.group_names))

    def _attach(self, node: SimNode | None = None, queue: str | None = None) -> Consumer | None:
        if node is None and len(self._alive_consumers()) >= self.config.consumers_max:
            return None
        node = node or self.rng.choice(self._alive_nodes())
        consumer = Consumer(self._client_id("c"), node, queue or self.rng.choice(self.queue_names))
        self.consumers.append(consumer)
        node.consumers[consumer.id] = consumer
        self.trace(f"consumer {consumer.id} attaches at {node.node_id} to {consumer.queue}")
        node.apply(node.broker.attach_consumer(consumer.queue, consumer.id, False, self.now_ms))
        return consumer

    def _pick_consumer(self) -> Consumer | None:
        consumers = self._alive_consumers()
        return self.rng.choice(consumers) if consumers else self._attach()

    def _migrate(self) -> None:
        """Every consumer of one queue on one node leaves it for another node."""
        consumers = self._alive_consumers()
        alive = self._alive_nodes()
        if not consumers or len(alive) < 2:
            return
        leaving = self.rng.choice(consumers)
        source, queue = leaving.node, leaving.queue
        target = self.rng.choice([node for node in alive if node is not source])
        self.trace(f"consumers of {queue} move from {source.node_id} to {target.node_id}")
        self.stats["migrations"] += 1
        for consumer in [consumer for consumer in consumers if consumer.node is source and consumer.queue == queue]:
            self._detach(consumer)
            moved = self._attach(target, queue)
            moved.node.apply(moved.node.broker.set_credit(moved.id, self.rng.randint(1, 5), self.now_ms))

    def _credit(self) -> None:
        consumer = self._pick_consumer()
        if consumer is not None:
            credit = self.rng.randint(0, 5)
            self.trace(f"{consumer.id} credit {credit}")
            consumer.node.apply(consumer.node.broker.set_credit(consumer.id, credit, self.now_ms))

    def _accept(self) -> None:
        consumer = self._pick_consumer()
        if consumer is not None and consumer.unsettled:
            held = sorted(consumer.unsettled)
            for delivery_id in self.rng.sample(held, self.rng.randint(1, len(held))):
                self._settle(consumer, delivery_id, Outcome.ACCEPTED)

    def _release(self) -> None:
        consumer = self._pick_consumer()
        if consumer is not None and consumer.unsettled:
            self._settle(consumer, self.rng.choice(sorted(consumer.unsettled)), Outcome.RELEASED)

    def _settle(self, consumer: Consumer, delivery_id: int, outcome: Outcome) -> None:
        node = consumer.node
        mid = consumer.unsettled.pop(delivery_id)
        self.trace(f"{consumer.id} {outcome.value} {mid}")
        effects = node.broker.settle(consumer.id, delivery_id, outcome, self.now_ms)
        if outcome is Outcome.ACCEPTED:
            self.accepted_by_consumer.add(mid)
            if any(isinstance(effect, Removed) for effect in effects):  # the server settles once it is durable
                node.after_flush(lambda reason: self._confirm(mid) if reason is None else None)
        node.apply(effects)

    def _confirm(self, mid: str) -> None:
        self.confirmed[mid] += 1
        if self.confirmed[mid] > 1:
            if mid not in self.allowed_duplicates:
                self.violation(f"{mid} was accepted (durably) {self.confirmed[mid]} times")
            self.stats["duplicates_accepted"] += 1

    def _detach(self, consumer: Consumer | None = None) -> None:
        consumer = consumer or self._pick_consumer()
        if consumer is None:
            return
        node = consumer.node
        self.trace(f"{consumer.id} detaches from {node.node_id}")
        node.consumers.pop(consumer.id, None)
        consumer.unsettled.clear()
        node.apply(node.broker.detach_consumer(consumer.id, self.now_ms))

    def _crash_one(self) -> None:
        alive = self._alive_nodes()
        if len(alive) < 2:
            return
        node = self.rng.choice(alive)
        store = node.store
        keep = self.rng.randint(store.durable, store.handed) if self.config.torn_tails else store.durable
        down_ms = self.rng.randint(self.config.down_ms_min, self.config.down_ms_max)
        self.trace(f"{node.node_id} crashes (journal keeps {keep} of {len(store.records)} records, "
                   f"{store.durable} durable); down {down_ms} ms")
        self.stats["crashes"] += 1
        self.stats["torn_tails"] += keep > store.durable
        self.crash(node, keep)
        self.schedule(down_ms, lambda: self.restart(node), f"{node.node_id} restarts")

    def crash(self, node: SimNode, keep: int) -> None:
        """`node` stops; its journal keeps its first `keep` records (at least the durable ones)."""
        node.crash(keep)
        declarations, messages = node.store.recovered()
        marks = {name[len(MARK_PREFIX):]: int(values["high_water"])
                 for name, values in declarations.items() if name.startswith(MARK_PREFIX)}
        queued, outbound = set(), set()
        for name, by_seq in messages.items():
            for record in by_seq.values():
                (outbound if name.startswith("\x00") else queued).add(mid_of(record[3]))
                origin = record[6]  # a forwarded message enqueued or relayed here
                if origin is not None and origin[1] > marks.get(origin[0], 0):
                    self.allowed_duplicates.add(mid_of(record[3]))
                    self.trace(f"  {node.node_id} keeps {mid_of(record[3])} past its mark: may be held twice")
        for mid in sorted(queued & self.accepted_by_consumer):
            # a consumer accepted it but its REMOVE never reached the disk (a failed or torn write): it
            # comes back, and goes to its group's owner if that is elsewhere now
            self.ghosts.add(mid)
            self.allowed_duplicates.add(mid)
        for mid in sorted(queued & outbound):  # a handover's STORE kept, its queue's REMOVE torn off
            self.allowed_duplicates.add(mid)
            self.trace(f"  {node.node_id} keeps {mid} in a queue and handed over: may be held twice")

    def restart(self, node: SimNode, config_queues=()) -> None:
        if node.alive:
            return
        previous_index = node.applied_index
        node.boot(config_queues)
        if previous_index and self.rng.random() < 0.5:
            index = self.rng.randint(0, previous_index)  # pysyncobj's last full dump
            node.install_snapshot(index)

    # ---- scripted scenarios (config.scripted): a test drives clients and faults ------------

    def producer(self, node_id: str, queue: str) -> Producer:
        producer = Producer(self._client_id("p"), self.nodes[node_id], queue)
        self.producers.append(producer)
        return producer

    def send(self, producer: Producer, group: str) -> str:
        seq = producer.next_seq[group]
        producer.next_seq[group] = seq + 1
        mid = f"{producer.id}/{producer.queue}/{group}/{seq}"
        self.sent[mid] = (producer.id, producer.queue, group, seq)
        self.trace(f"send {mid} at {producer.node.node_id}")
        producer.node.receive(mid, producer.queue, group, mid.encode(), self.now_ms)
        self._end_of_batches()
        return mid

    def consumer(self, node_id: str, queue: str, *, accept_all: bool = True) -> Consumer:
        consumer = self._attach(self.nodes[node_id], queue)
        consumer.accept_all = accept_all
        self._end_of_batches()
        return consumer

    def detach(self, consumer: Consumer) -> None:
        self._detach(consumer)
        self._end_of_batches()

    def advance(self, duration_ms: int) -> None:
        until_ms = self.now_ms + duration_ms
        while self.now_ms < until_ms:
            self.step()

    def crash_node(self, node_id: str, *, keep: int | None = None) -> None:
        node = self.nodes[node_id]
        self.trace(f"{node_id} crashes")
        self.crash(node, node.store.durable if keep is None else keep)

    def restart_node(self, node_id: str, *, config_queues=()) -> None:
        """`config_queues`: queues its config file declares (new ones are journalled at the start)."""
        self.trace(f"{node_id} restarts")
        self.restart(self.nodes[node_id], config_queues)
        self._end_of_batches()

    def stall_journal(self, node_id: str, stalled: bool) -> None:
        self.trace(f"{node_id} journal {'stalls' if stalled else 'resumes'}")
        self.nodes[node_id].journal_stalled = stalled

    def fail_journal(self, node_id: str, failing: bool) -> None:
        """While failing, every journal write of the node fails (a full or broken disk)."""
        self.trace(f"{node_id} journal {'fails' if failing else 'works again'}")
        self.nodes[node_id].journal_failing = failing

    def set_leader(self, up: bool) -> None:
        self.trace(f"leader {'up' if up else 'down'}")
        self._set_leader(up)

    def route(self, queue: str, group: str) -> str | None:
        return self.raft.table.route(queue, group)

    # ---- clients hear back -------------------------------------------------------------------

    def producer_outcome(self, mid: str, error) -> None:
        if mid in self.outcome:
            self.violation(f"{mid} got a second outcome ({error or 'accepted'}) after {self.outcome[mid]}")
        if error is not None and getattr(error, "outcome_unknown", False):
            # a failed journal write after a consumer had it: the refusal says so, and nothing else is promised
            self.outcome[mid] = "unknown"
            self.trace(f"  {mid} outcome unknown: {error}")
            if mid not in self.delivered_once:
                self.violation(f"{mid} was refused as 'outcome unknown' but no consumer ever had it")
            return
        self.outcome[mid] = "accepted" if error is None else "refused"
        if error is not None:
            self.trace(f"  {mid} refused: {error}")
            if mid in self.delivered_once:
                self.violation(f"{mid} was refused after it had been delivered")

    def delivered(self, node: SimNode, deliver) -> None:
        consumer = node.consumers.get(deliver.consumer_id)
        if consumer is None:
            return
        mid = mid_of(deliver.message)
        if mid not in self.sent:
            self.violation(f"{node.node_id} delivered {mid}, which no producer sent")
        if self.outcome.get(mid) == "refused":
            self.violation(f"{mid} was refused but {node.node_id} delivered it")
        if mid not in self.allowed_duplicates:
            _, queue, group, _ = self.sent[mid]
            for other in self._alive_consumers():
                if mid in other.unsettled.values():
                    self.violation(f"{mid} delivered to {consumer.id} while {other.id} holds it unsettled")
                if other is not consumer and any(self.sent[held][1:3] == (queue, group) for held in other.unsettled.values()
                                                 if held not in self.allowed_duplicates):
                    self.violation(f"{mid} delivered to {consumer.id} on {node.node_id} while {other.id} on "
                                   f"{other.node.node_id} holds a message of group {(queue, group)} unsettled")
            move = self.raft.table.moves.get((queue, group))
            if move is not None and node.node_id == move[1] and \
                    self.forwarded_from.get((node.node_id, mid)) != move[0]:
                self.violation(f"{node.node_id} delivered {mid} while group {(queue, group)} is still moving "
                               f"there from {move[0]} (waiting for {move[3]}), and {move[0]} had not sent it")
        consumer.unsettled[deliver.delivery_id] = mid
        self.trace(f"  {node.node_id} delivers {mid} to {consumer.id}")
        if mid in self.delivered_once:
            self.stats["redeliveries"] += 1
            return
        self.delivered_once.add(mid)
        producer, queue, group, seq = self.sent[mid]
        last = self.last_first_delivery.get((producer, queue, group), 0)
        if seq <= last:
            self.violation(f"order: {mid} first delivered after seq {last} of the same producer and group")
        self.last_first_delivery[(producer, queue, group)] = seq

    # ---- invariants, after every step --------------------------------------------------------

    def _check_definitions(self) -> None:
        """A node whose replica is current and has applied the whole log holds every defined queue with
        the definition's settings, and no queue deleted since (these queues carry no messages, so no
        node keeps other settings to spare a group). The definitions are the log's, never a node's."""
        queues = self.raft.queues
        for node in self._alive_nodes():
            if not node.router.ready or node.applied_index != self.raft.commit_index:
                continue
            if node.protocol.definitions != queues.definitions:
                self.violation(f"{node.node_id} knows definitions {node.protocol.definitions}, the log "
                               f"{queues.definitions}")
            pending = node.protocol.pending_definitions  # its own proposals, until they commit
            for name in sorted((set(queues.definitions) | set(queues.deleted)) - pending):
                queue = node.broker.queues.get(name)
                values = queues.definitions.get(name)
                if values is None and queue is not None:
                    self.violation(f"{node.node_id} holds queue {name}, deleted cluster-wide")
                elif values is not None and (queue is None or
                                             queue.settings != QueueSettings.from_dict(settings_values(values))):
                    self.violation(f"{node.node_id} holds queue {name} as "
                                   f"{None if queue is None else queue.settings}, defined as {values}")
            # a queue a node made for its clients (auto-created by a send or an attach) is defined
            # cluster-wide once its proposal committed: every node holds it with the same settings
            # (config-file queues are seeds, with rules of their own)
            seeds = {values["name"] for values in node.protocol.queue_seeds}
            undefined = sorted(set(node.broker.queues) - set(queues.definitions) - seeds - pending)
            if undefined:
                self.violation(f"{node.node_id} holds queues {undefined} that have no cluster-wide definition "
                               f"and proposes none")

    def check_invariants(self) -> None:
        raft, table = self.raft, self.raft.table
        if self.config.queue_definitions or self.config.config_queues:
            self._check_definitions()
        if self._checked.get("table") != (table.revision, raft.commit_index):  # else nothing changed
            self._checked["table"] = (table.revision, raft.commit_index)
            recount: dict = {}
            for (queue, _group), (owner, _touched_ms) in table.entries():
                recount[(owner, queue)] = recount.get((owner, queue), 0) + 1
            if recount != table.route_counts:
                self.violation(f"route counts {table.route_counts} disagree with routes {recount}")
            routes = {key: route[0] for key, route in table.entries()}
            if routes != raft.current:
                self.violation(f"the table's routes {routes} are not what its log made: {raft.current}")
        holders: dict[tuple[str, str], set] = collections.defaultdict(set)
        via: dict[tuple[str, str], set] = collections.defaultdict(set)  # where a down node's messages are
        held: list[str] = []  # message ids held by brokers, crashed ones' journals included
        for node in self.nodes.values():
            if not node.alive:
                for key in node.down_holdings:
                    holders[key].add(node.node_id)
                    via[key].add(f"{node.node_id}'s journal while it is down")
                # its outbound store: what its owner has not taken yet will be forwarded after a restart
                for key, owner, seq in node.down_outbound:
                    if seq > self.nodes[owner].taken_from(node.node_id):
                        holders[key].add(owner)
                        via[key].add(f"for {owner} in {node.node_id}'s outbound store while {node.node_id} is down")
                held.extend(node.down_mids)
                continue
            router = node.router
            # a router changes only by what its replica applies: check again when that moved
            state = (node.incarnation, node.applied_index, len(router.routes), len(raft.route_history))
            if self._checked.get(node.node_id) != state:
                self._checked[node.node_id] = state
                for key in set(raft.route_history) | set(router.routes):
                    expected = raft.owner_at(key, node.applied_index)
                    if router.routes.get(key) != expected:
                        self.violation(f"{node.node_id} routes {key} to {router.routes.get(key)} but the log "
                                       f"had {expected} at its applied index {node.applied_index}")
                for key, refreshed_ms in router.refreshed_ms.items():
                    touched = raft.touched_at(key, node.applied_index)
                    if touched is None or refreshed_ms > touched:
                        self.violation(f"{node.node_id} leases {key} from t={refreshed_ms} but the log had it "
                                       f"touched at {touched} at its applied index {node.applied_index}")
            depth = 0
            for name, queue in node.broker.queues.items():
                depth += queue.depth_messages
                for group_key, group in queue.groups.items():
                    if group.consumer is not None:
                        self._check_owned_route(node.node_id, (name, group_key))
                    if group.available_count or group.acquired:
                        if self._ghosts_only(node, name, group_key):
                            continue  # accepted already, back from the journal: on its way to the owner
                        holders[(name, group_key)].add(node.node_id)
            if depth != len(node.live):
                self.violation(f"{node.node_id} holds {depth} messages but journalled {len(node.live)}")
            for key in self._cold_groups(node):  # counted only, their groups unknown to the node
                self.stats["cold_groups_checked"] += 1
                if not self._ghosts_only(node, *key):
                    holders[key].add(node.node_id)
                    via[key].add(f"{node.node_id}'s cold tail")
            held.extend(node.live.values())
            for key, parked in node.protocol.parked.items():  # behind a move's handover, journalled
                holders[key].add(node.node_id)
                held.extend(mid_of(message) for message in parked)
            for owner, channel in node.outbound.channels.items():
                taken = self.nodes[owner].taken_from(node.node_id)  # a resend of these is skipped
                for key in {entry[0] for seq, entry in channel.items() if seq > taken}:
                    holders[key].add(owner)
            self._check_outbound_bytes(node)
        for owner, source, batch in self.network.in_flight.values():
            taken = self.nodes[owner].taken_from(source)
            for key in {(entry.queue, entry.group_id) for entry in batch if entry.forward_seq > taken}:
                holders[key].add(owner)
        for key, nodes in holders.items():
            where = f" ({'; '.join(sorted(via[key]))})" if key in via else ""
            move = table.moves.get(key)
            if move is not None:  # the old and the new owner both hold it until the move ends
                if not nodes <= {move[0], move[1]}:
                    self.violation(f"group {key} moving from {move[0]} to {move[1]} is held at {sorted(nodes)}{where}")
                continue
            if key in self.moved and nodes != {raft.current.get(key)}:
                self.violation(f"group {key} moved to {raft.current.get(key)} (move ended) but its messages are "
                               f"at {sorted(nodes)}{where}")
            if len(nodes) > 1:
                self.violation(f"group {key} is split across {sorted(nodes)}{where}")
            if len(nodes) != 1 or raft.current.get(key) not in nodes:
                self.violation(f"group {key} is held at {sorted(nodes)}{where} but routed to {raft.current.get(key)}")
        if len(set(held)) != len(held):
            for mid, count in collections.Counter(held).items():
                if count > 1 and mid not in self.allowed_duplicates:
                    self.violation(f"{mid} is held {count} times")

    def _check_owned_route(self, node_id: str, key: tuple[str, str]) -> None:
        """A group a consumer owns keeps its route (an exclusive owner keeps an idle group), and the
        route names the owner's node, or a move from or to it is in progress."""
        route = self.raft.table.entry(*key)
        if route is None:
            self.violation(f"group {key} is owned by a consumer on {node_id} but has no route: expired or "
                           f"removed under its owner")
        elif route[0] != node_id and node_id not in (self.raft.table.moves.get(key) or [None, None])[:2]:
            self.violation(f"group {key} is owned by a consumer on {node_id} but routed to {route[0]}")

    def _cold_groups(self, node: SimNode) -> set[tuple[str, str]]:
        """The (queue, group) of the messages in `node`'s cold tails: its queues' live messages above the
        tail's after_seq (node/core/dispatch/cold.py), whose groups the node does not know until it reads them back."""
        after = {name: queue.cold.after_seq for name, queue in node.broker.queues.items()
                 if queue.cold is not None and queue.cold.count}
        if not after:
            return set()
        return {(name, self.sent[mid][2]) for (name, seq), mid in node.live.items()
                if name in after and seq > after[name]}

    def _ghosts_only(self, node: SimNode, queue: str, group: str) -> bool:
        """Whether every message `node` holds of the group is a ghost: one a consumer accepted whose
        REMOVE a failed journal write lost, recovered by a restart (ordinary at-least-once)."""
        if not self.ghosts:
            return False
        mids = [mid for (name, _seq), mid in node.live.items() if name == queue and self.sent[mid][2] == group]
        return bool(mids) and all(mid in self.ghosts for mid in mids)

    # ---- the end: a quiescent drain, then nothing lost ---------------------------------------

    def drain(self) -> None:
        self.draining = True
        self.faults_on = False
        self.trace("drain: faults off, every node up, every consumer accepts everything")
        self._set_leader(True)
        for node in self.nodes.values():
            if not node.alive:
                self.restart(node)
        for _ in range(self.config.drain_steps_max):
            self.step()
            if self._drained():
                break
        else:
            self.violation(f"not drained after {self.config.drain_steps_max} steps: {self._leftovers()}")
        lost = sorted(mid for mid, outcome in self.outcome.items()
                      if outcome == "accepted" and mid not in self.accepted_by_consumer)
        if lost:
            self.violation(f"{len(lost)} accepted messages were never delivered and accepted: {lost[:10]}")

    def _drain_action(self) -> None:
        self._alive_producers().clear()
        consumers = self._alive_consumers()
        covered = {(consumer.node.node_id, consumer.queue) for consumer in consumers}
        for node in self._alive_nodes():
            for queue in self.queue_names:
                if (node.node_id, queue) not in covered:
                    self._attach(node, queue)
        for consumer in self._alive_consumers():
            consumer.accept_all = True

    def _accept_everything(self) -> None:
        for consumer in self._alive_consumers():
            if consumer.accept_all:
                for delivery_id in sorted(consumer.unsettled):
                    self._settle(consumer, delivery_id, Outcome.ACCEPTED)
                consumer.node.apply(consumer.node.broker.set_credit(consumer.id, 10, self.now_ms))

    def _drained(self) -> bool:
        return not self._leftovers()

    def _leftovers(self) -> dict:
        left: dict = {}
        for node in self.nodes.values():
            if node.live:
                left[f"{node.node_id} holds"] = sorted(node.live.values())[:5]
            if node.outbound.channels and any(node.outbound.channels.values()):
                left[f"{node.node_id} outbound"] = node.outbound.depths()
            if node.protocol.parked:
                left[f"{node.node_id} parked"] = sorted(node.protocol.parked)[:5]
            if node.router.waiting:
                left[f"{node.node_id} waiting"] = node.router.waiting_count()
            if node.unflushed():
                left[f"{node.node_id} unflushed"] = node.unflushed()
        if self.network.in_flight:
            left["network"] = len(self.network.in_flight)
        if self.raft.table.moves:
            left["moves"] = self.raft.table.moves_all()[:5]
        return left

    def _check_outbound_bytes(self, node: SimNode) -> None:
        """The byte counts the outbound store's bounds are decided on agree with its channels."""
        outbound = node.outbound
        sizes = {owner: sum(entry[2] for entry in channel.values()) for owner, channel in outbound.channels.items()}
        if {owner: size for owner, size in sizes.items() if size} != outbound.depth_bytes \
                or sum(sizes.values()) != outbound.total_bytes:
            self.violation(f"{node.node_id}'s outbound store counts {outbound.depth_bytes} bytes per owner "
                           f"({outbound.total_bytes} in all) but its channels hold {sizes}")
        if self.stats["forwards_lost"]:
            self.violation(f"{node.node_id} read back {self.stats['forwards_lost']} paged outbound entries the "
                           f"journal did not have")

    def summary(self) -> dict:
        outcomes = collections.Counter(self.outcome.values())
        return {"sent": len(self.sent), "accepted": outcomes["accepted"], "refused": outcomes["refused"],
                "outcome_unknown": outcomes["unknown"],
                "delivered": len(self.delivered_once), "log_entries": self.raft.commit_index,
                **self.stats}
