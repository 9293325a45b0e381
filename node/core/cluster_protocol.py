"""The cluster protocol of one node: routing arrivals, forwarding to owners, taking forwarded batches.

Pure, owned by the engine loop thread. Each input takes `now_ms` where time matters and returns
effects (node/core/effects.py), which the caller carries out in order: node/cluster.py with the
server, the journal, the forwarders and the raft member; tests/sim/node_model.py with simulated ones.
Inputs: a message arrives, a batch ends (`quiesced`), a journal batch is flushed, a forward is
acknowledged or received, a raft entry is applied, a proposal failed, a tick, recovery. Rules:
- A grouped message is enqueued here only when the route of its group names this node; otherwise it
  goes to the outbound channel of its owner. Either way the producer hears "accepted" only once the
  message is stored (journalled when its queue is durable), here or in the outbound store.
- The outbound store is the journal: each forwarded message is a STORE under a reserved name
  (OUTBOUND_PREFIX owner NUL queue) until its owner acknowledges it, then a REMOVE.
- The outbound store is bounded in payload bytes: per owner (`outbound_max_bytes`) and for all owners
  together (`outbound_total_max_bytes`), and in messages per owner (`outbound_max_messages`: each
  keeps a record in memory even with its body paged); 0 = no bound. A producer's message for another
  owner is refused (ResourceLimitExceeded, naming the owner and the bound with its unit) when the
  bytes held plus its own would pass a byte bound, or the channel holds its message bound; an empty
  channel (an empty store, for the node-wide bound) takes any message, so one larger than a bound is
  not refused forever. Once a channel refused a message it refuses every one, whatever its size,
  until its owner acknowledges some of its backlog (the node-wide bound: until any owner does), so a
  later, smaller message of a group never slips in past a refused one while the owner is away. Nothing accepted is dropped: the refusal comes
  before the message is stored, and the channel drains as its owner acknowledges.
  Local groups and other owners are unaffected. An operator's reroute (node/core/reroute.py) obeys
  the bounds as sends do (with the copies its batch already promised): it stops at a full channel,
  the rest left in its queue. Whatever else fills a channel counts toward the bytes but may pass
  the bound, as it moves messages accepted already (refusing would lose or stall them): a group's
  backlog an old owner hands over, a message relayed to a moving group's new owner (its source
  holds it until this node stores it), and what recovery puts back. The bound is on bytes in the
  store, journalled or not. Its bodies page past `outbound_memory_max_bytes` per owner: the
  forwarder holds at most that much unacknowledged, and the rest of a durable backlog is only in the
  journal, read back in order as the owner takes what came before (node/core/outbound.py).
- Forward seqs are node seqs. They must never repeat after a restart, or an owner would take new
  messages for resends: blocks of seqs are reserved in the journal before use, and a batch is
  forwarded only once it, and a reservation covering its seqs, are on disk; batches leave in journal order.
- An owner records, per source node, the highest forward seq it has enqueued (a MARK_PREFIX
  declaration journalled after the messages), so a resend after a lost acknowledgement is skipped.
  Seqs reach an owner with gaps (local messages and other owners take node seqs too; a restart skips
  to the next reservation), so no gap is a fault. But a source says, with each batch, its seq bound
  (its next node seq: every forward seq it ever gave is below it). A mark at or above the source's
  current bound holds seqs the source never gave: a forged batch took them (a forward seq that
  jumped ahead), or the source reused seqs (it lost its journal and its seq reservation, or runs
  without one: `journalled` False). Skipping would drop its new messages as resends. The owner cannot tell that from
  a late copy of an old batch (whose old bound is below the mark too), so it answers as to a
  resend; the source, hearing a high water at or above its bound, keeps its entries and disputes
  that high water in its next batch; a dispute of the mark as it stands sets it back to just below
  the batch, logged and counted (forward_marks_set_back), and the batch is taken.
- An owner enqueues a forwarded batch at once (its consumers may have it before it is on disk) and
  acknowledges it once it is stored. If that journal write fails, the owner stops (StopNode): the
  batch is in its broker, perhaps delivered, but not on disk, and its source will send it again;
  taking the resend would hold it twice, skipping it would acknowledge what no disk holds, and a
  delivered message cannot be taken back. Restarted from its journal, the owner has neither the
  batch nor its high-water mark, and takes the resend once. So a reply's high water is always on
  disk: an earlier failed batch would have stopped the owner before a later one's reply.
Groups follow their consumers (`follows_consumers`, the node's route_follow_ms > 0; every node of a
cluster must agree). The leader moves a route from O (no consumer on the queue for route_follow_ms)
to N (handler/route_table.py: follow_consumers); the log feeds MOVES, then the new ROUTES, and the
handover never reorders a (producer, group) nor lets two consumers hold the group:
- Every node routes the group to N from the moment its replica applies the move. What it routed to
  O before is in its outbound channel to O, in order. It proposes its move_clear once that channel
  holds no entry of the group (O acknowledged them: O has them stored).
- O holds the group in its queue (delivers none of it) and waits until nothing of it is in flight: a
  consumer on O settles, or releases (detach, crash) what it was given. Then it hands the group's
  available messages to N through its outbound channel to N, in queue order, over as many ticks as
  the per-tick bounds (HANDOVER_MESSAGES_PER_TICK, HANDOVER_BYTES_PER_TICK) and its paged bodies' read-
  back take; the rest stays held, and every piece is journalled as one handover is (new forward seqs,
  journalled as outbound STOREs before the queue's REMOVEs, in one journal batch: a torn tail may
  duplicate one, never lose one; a failed write stops the node, StopNode, as memory and journal
  differ). A message of the group reaching O meanwhile (its producers here, forwards sent before
  their source saw the move) goes behind the rest: into O's queue while the group has anything
  there, else straight into the channel to N (relayed). O proposes its clear last: once every
  other member has cleared (nothing more can reach it), the group is empty here and N acknowledged
  everything O handed over or relayed (what O's producers send later is the group's next anyway).
- N queues what O sends, and parks everything else of the group (its producers, other sources):
  journalled under PARK_PREFIX, outside the queue, in arrival order. When the move ends, the parked
  messages go into the queue behind O's. So N's queue holds, during the move, only what O sent, in
  O's order, and O sends it only once none of the group is in flight at O and O holds it: N
  delivers it as it comes (a consumer that followed the group gets its backlog without waiting for
  the move's end, which a cold tail puts off by a whole pass of it), and everything sent after the
  move, parked, goes behind everything sent before it. A handover reaching N before N's replica
  applied the move (a forward from the group's owner as N knows it) is held until the replica
  knows the move. A forward of a group whose route N does not know yet is refused (retriable): a
  handover and what must wait behind it look alike until it does.
- Moves are driven at `tick` and only while the replica is current (`ready`): a replaying replica
  may see a move the log already ended, and forwarded batches are refused (retriable) until then.
  Clears are proposed again every MOVE_CLEAR_RETRY_INTERVAL_MS while this node is still waited for
  (a lost proposal, a leader change; the command is idempotent).
- A crash: everything above is journalled or in the log. A restarted node holds every group it
  recovers messages of until its replica is current (it may no longer own them, or be receiving
  them); then the rules above resume (O hands over again whatever its journal still held, N parks
  again what it had parked), and what it recovered of a group that is neither its own nor moving
  (an accepted message whose REMOVE a failed journal write lost after its group moved on) goes to
  the group's owner the same way. This holds where groups stay where they were placed too: there a
  group moves on when its idle route expires and another node claims it, or by failover (hold_recovered).
- O's queue may hold some of the group cold (node/core/cold.py: its newest messages, their groups
  unknown until read back). Once the group has nothing warm or in flight at O, O sweeps the tail: reads
  it through in seq order (SWEEP_BATCH_RECORDS at a time, fewer past cold.py's byte bound; its own
  reads; the queue reads nothing back for dispatch meanwhile, nor until the REMOVEs of what the sweep
  took are on disk, so no record is read twice) and hands over the records of the groups the pass began
  with, as a handover does, the rest left cold. A message of a moving group reaching O while its queue
  would put it cold does not go in it, so a pass never chases its own group's arrivals: one forwarded by
  another node (bounded: sources stop once they see the move) waits parked (as at N) and is relayed once
  the group has nothing left at O, within the handover's bounds a tick and never through O's queue
  (which would take no more a tick than the record budget has room for); one from a producer on O is
  refused, retriable (parked, a steady producer would keep the group busy at O for good: a park is
  relayed only once on disk). The group is busy at O (no clear) until a whole pass met all of it: a
  pass ending while a message of its group is still on its way to disk (whole in memory, not yet in
  the journal's index) goes again. Read back for dispatch instead, cold records of a group that lives
  elsewhere now (a restart, a failover) are held and handed to its owner, as recovered ones are.
- A member that is down holds a move up (its channel to O may hold the group) until it is back or
  failed over; the leader proposes no move while a member is out of reach. Consumers moving again
  mid-handover change nothing: a moving route is not moved again until its move ended.
Cluster-wide queue definitions (handler/queue_definitions.py) reach every node through the feed:
- A definition is applied to the broker: the queue is declared, or given the new settings when only
  fields a live queue may change differ. A queue here that differs in a fixed field is declared
  again if it is empty and has no consumer; otherwise it keeps its settings (logged: delete it and
  add it again), since regrouping held messages would split their groups.
- A deletion drops the queue here, messages and consumers included. The route table dropped the
  queue's routes in the same raft entry.
- Each change is applied once: the revision of the last one applied is journalled (QUEUES_MARK), and
  a restarted node replaying the log skips what it applied before (replayed, an old definition would
  bring back a queue deleted since, an old deletion drop a queue made again). Once the replica is
  current (`ready`), every definition is applied again where this node differs (a config-file queue
  declared at recovery with the file's settings takes the cluster's), and a config-file queue deleted
  cluster-wide is dropped again if it is empty (a queue holding messages is never dropped unasked).
- The config file's queues are seeds: proposed once the replica is current (ProposeQueueSeeds), each
  defined only where the cluster knows neither a definition nor a deletion of its name, and proposed
  again every SEED_RETRY_INTERVAL_MS until the proposals commit. So the cluster's definition wins.
- A queue this node makes on a client's behalf (auto-created by an attach, with or without address
  parameters, by a send or a dead letter; a subscription queue a `topic` or ADDRESS::QUEUE attach
  made: the broker's `made`) is proposed as a definition at the end of the batch that made it
  (ProposeDefinition, ahead of any claim of that batch, so every node applies the definition before
  the first route of the queue). The attach goes on at once here: until the definition commits the
  queue is this node's alone, and a subscription's copies stay on the node that takes the send
  (only subscriptions with a definition are routed cluster-wide), and another node copies sends to
  a subscription only from when it applied the definition. A proposal that fails (no leader,
  no majority) is made again every DEFINITION_RETRY_INTERVAL_MS while the queue is still here as it
  was made; meanwhile the client sees what a lone node gives it, and its grouped sends wait for
  routes, refused after handler_timeout_ms as any send without a majority. A CONFLICT (another node
  defined the name first, with other settings: two nodes auto-created one name at once with
  different parameters) applies the cluster's definition here: a queue that holds no message takes
  it, its consumers detached with a condition naming the settings that differ (what their attach
  would have heard had the definition been here first); one holding messages keeps its settings,
  logged, since regrouping them would split groups. A queue made here whose definition never
  committed before a restart (recovered from the journal, no definition or deletion in the log) is
  proposed once the replica is current.
- A subscription queue deleted here because its link ended (the broker's `ended`: a temporary one
  detached, a durable one closed) is deleted cluster-wide (ProposeQueueDeletion), once any definition
  of it this node proposed committed; retried likewise. A temporary subscription's definition names
  its node (TEMPORARY_OF): that node deletes, once its replica is current after a restart, every one
  of its own that no live link holds, and every node proposes deleting those of a node the
  owner-failover policy marks down (the deletion's seen revision makes the duplicates no-ops). Without
  owner failover (owner_failover_ms 0) a dead node's temporary subscriptions collect copies until it
  restarts, as its groups wait for it, or an operator deletes them (a node removed for good).
Messages this node puts in a grouped queue itself (an admin `group move`, a dead letter: the broker's
`entered`) came by no route. Their groups get a route naming this node at once, a touch at the end of
the batch that put them there (an admin call's too: the engine loop ends a batch after it), before a
send elsewhere could place them by the consumers and split them; a group whose route already names
another node keeps it, logged.
Never imports threading, grpc, pysyncobj, socket or time.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import logging

from handler.queue_definitions import (CONFLICT, MALFORMED, QUEUES, QUEUES_ALL, TEMPORARY_OF, fixed_changes,
                                       settings_values)
from handler.route_table import MEMBERS, MOVES, MOVES_ALL, REFUSED, ROUTES, SNAPSHOT
from node.core.broker import Broker
from node.core.cold import read_missing
from node.core.effects import (AcceptWhenStored, AfterFlush, ApplyBroker, EnqueueLocal, JournalDeclare,
                               JournalRemove, JournalStore, ProposeClaim, ProposeDefinition, ProposeMoveClear,
                               ProposeQueueDeletion, ProposeQueueSeeds, ProposeTouch, QueueDeleted, ReadRecords,
                               Refuse, Register, Reply, ReportConsumers, StopNode)
from node.core.errors import AlreadyExists, GrouperError, HandlerUnavailable, ResourceLimitExceeded
from node.core.message import REMOVED, STATE_MASK, Message
from node.core.outbound import Entry, Outbound, entry_of, parse_outbound_name
from node.core.routing import Inbound, Router
from node.core.settings import QueueSettings

log = logging.getLogger("grouper.cluster")

PARK_PREFIX = "\x00park\x00"  # journal name of the messages a new owner parks during a move: prefix, queue
MARK_PREFIX = "\x00mark\x00"  # journal declaration holding a source's high-water forward seq
QUEUES_MARK = "\x00queues"  # journal declaration: "revision" of the last queue definition change applied here
SEED_RETRY_INTERVAL_MS = 1000  # config-file queues not yet proposed as definitions are proposed again this often
DEFINITION_RETRY_INTERVAL_MS = 1000  # a failed proposal of a queue made or ended here is made again this soon
SEQ_RESERVATION = "\x00seq"  # journal declaration: node seqs below "reserved" may have been used
SEQ_RESERVE_BLOCK = 1 << 20  # seqs reserved per journal record
CLAIM_KEYS_MAX = 1000  # keys per raft command; a larger batch is split
CLAIM_RETRY_INTERVAL_MS = 100  # a failed proposal (no leader yet) is retried at the next tick after this
TOUCH_RETRY_INTERVAL_MS = CLAIM_RETRY_INTERVAL_MS * 10  # a failed refresh is tried again this soon
CONSUMER_REPORT_INTERVAL_MS = 5000  # consumer counts are re-reported this often even unchanged
REGISTER_RETRY_INTERVAL_MS = 1000  # until this node's addresses are in the table
MOVE_CLEAR_RETRY_INTERVAL_MS = 1000  # a clear the log still waits for is proposed again this often
MOVES_SHOWN_MAX = 20  # moves status() details (what each waits for here), the oldest keys first
SWEEP_BATCH_RECORDS = 1024  # cold records a sweep reads back at once (bodies included)
# what an old owner hands over in one tick, over all its groups moving away; a group goes in as many
# ticks as it takes, in order. The engine loop serves its clients between ticks, and the journal and
# forwarders drain what went (bench/follow_moves.py: 1,000,000 messages of 100 groups in one tick held the
# loop ~50 s and tripled the node's memory); the bytes bound large messages (the one reaching it goes)
HANDOVER_MESSAGES_PER_TICK = 5000
HANDOVER_BYTES_PER_TICK = 16 << 20
MOVED_COUNTS = ("messages_handed_over", "cold_handed_over", "messages_relayed", "messages_parked",
                "restored_handed_over")
STORED = "stored"  # outcome of a journal batch written to disk

# what an AfterFlush hands back to `flushed`
_BATCH = "batch"  # (_BATCH, _Flushing): a batch of new outbound entries
_RESERVATION = "reservation"  # (_RESERVATION, reserved): a seq reservation journalled again on its own
_INBOUND = "inbound"  # (_INBOUND, source, high_water, reply_to, enqueued): a forwarded batch taken here
_PARKED = "parked"  # (_PARKED, key, message): a message parked behind a move
_HANDED = "handed"  # (_HANDED, what): a handover or an unpark, whose memory and journal must agree
_SWEPT = "swept"  # (_SWEPT, queue, seqs): cold records a sweep handed over, their REMOVEs in this batch

# where a message of a moving group goes (_place_arrival)
_QUEUE = "queue"
_PARK = "park"
_RELAY = "relay"


@dataclasses.dataclass(slots=True)
class _Sweep:
    """One pass of a cold tail, oldest first: it hands over the records of `keys` (moving away, with
    nothing warm or in flight here when it began), the others left cold."""
    keys: set
    after_seq: int  # the next read starts above it
    asked: int = 0  # records the read out now asked for


class _Flushing:
    """One batch of new outbound entries on its way to disk; `outcome` None until the journal says."""

    __slots__ = ("batch", "reserved", "outcome")

    def __init__(self, batch: dict, reserved: int):
        self.batch = batch  # owner -> [Entry]
        self.reserved = reserved  # the seq reservation journalled in the same batch, 0 if none
        self.outcome: str | None = None  # STORED or the failure's reason


class ClusterProtocol:
    def __init__(self, node_id: str, broker: Broker, *, handler_timeout_ms: int, group_timeout_ms: int = 0,
                 routes_max: int = 0, journalled: bool = True, seq_reserve_block: int = SEQ_RESERVE_BLOCK,
                 counts: collections.Counter | None = None, follows_consumers: bool = False,
                 queue_seeds: tuple = (), outbound_max_bytes: int = 0, outbound_total_max_bytes: int = 0,
                 outbound_max_messages: int = 0, outbound_memory_max_bytes: int = 0):
        """`queue_seeds`: the config file's queues, as settings dicts; `outbound_max_bytes`,
        `outbound_total_max_bytes`, `outbound_max_messages`: the outbound store's bounds, 0 = none (see
        the header);
        `outbound_memory_max_bytes`: its bodies in memory per owner, 0 = no bound (node/core/outbound.py)."""
        self.node_id = node_id
        self.broker = broker
        self.handler_timeout_ms = handler_timeout_ms
        self.routes_max = routes_max  # for the refusal's text only: the table enforces it
        self.journalled = journalled  # False: no journal, durable queues are kept in memory only
        self.seq_reserve_block = seq_reserve_block
        # what happened, for metrics and the simulation: resends_skipped, forwards_forgotten, reserved_again
        self.counts = counts if counts is not None else collections.Counter()
        self.router = Router(node_id, handler_timeout_ms, group_timeout_ms // 2)
        self.outbound = Outbound(outbound_memory_max_bytes, self.counts)
        self.outbound_max_bytes = outbound_max_bytes
        self.outbound_total_max_bytes = outbound_total_max_bytes
        self.outbound_max_messages = outbound_max_messages
        self.outbound_refused: collections.Counter = collections.Counter()  # owner -> sends refused at the bound
        # owner -> the messages and bytes of a reroute batch's copies for it: [messages, bytes]
        self._rerouting: dict[str, list[int]] = {}
        # owners whose channel refused a send, None for the node-wide bound: every send is refused until
        # some of the backlog leaves (see the header)
        self._outbound_full: set[str | None] = set()
        self.inbound = Inbound()
        self.members: dict = {"nodes": {}, "consumers": {}, "down": {}}
        self.peer_addresses: dict[str, str] = {}  # replaced whole, never mutated: forwarders read it
        self.seq_reserved = 0
        self.registered = False
        self.closed = False
        self._unsubmitted: dict[str, list[Entry]] = {}  # this batch's new outbound entries, per owner
        self._recovered: list = []  # SubmitForwards of what was journalled before a restart: durable already
        self.reserved_durable = 0  # the highest seq reservation known to be on disk
        self._batch_reservation = 0  # the reservation journalled in the current batch, if any
        self._flushing: collections.deque[_Flushing] = collections.deque()  # journal order
        self._reserving = False  # a reservation covering flushed batches is on its way to disk
        self._retry_claims: list = []
        self._retry_due_ms = 0
        self._reported: dict | None = None
        self._report_due_ms = 0
        self._register_due_ms = 0
        self.refresh_due_ms = 0  # when the routes this node relies on are refreshed next (lease only)
        # groups follow their consumers (see the header)
        self.follows_consumers = follows_consumers
        self.moves: dict[tuple[str, str], tuple] = {}  # key -> (from_node, to_node, waiting frozenset)
        self.held: set[tuple[str, str]] = set()  # keys this node holds in its broker for the cluster
        self._restored: set[tuple[str, str]] = set()  # held since recovery until the replica is current
        # [messages, bytes] the old owner may still hand over this tick (_drive_moves sets it each tick)
        self._handover_left = [HANDOVER_MESSAGES_PER_TICK, HANDOVER_BYTES_PER_TICK]
        self.parked: dict[tuple[str, str], list] = {}  # key -> [Message] in arrival order (new owner)
        self._parking: set[int] = set()  # park seqs whose journal write is not known good yet
        # key -> the highest forward seq of what this old owner handed over or relayed: the new owner must
        # hold all that before the move may end (what its producers send after is the group's next, and
        # may still be on its way: the channel keeps its order)
        self._owed: dict[tuple[str, str], int] = {}
        self._recovered_top: dict[str, int] = {}  # owner -> the highest forward seq recovered for it
        self._clear_due_ms: dict[tuple[str, str], int] = {}  # key -> when its clear may be proposed again
        # cold tails of groups moving away (see the header): queue -> the sweep reading it through now;
        # keys whose cold messages a whole sweep handed over; queue -> seqs handed whose REMOVE is not on
        # disk yet (the queue reads nothing back for dispatch until they are)
        self._sweeps: dict[str, _Sweep] = {}
        self._swept: set[tuple[str, str]] = set()
        self._sweep_removing: dict[str, set[int]] = {}
        # cluster-wide queue definitions (see the header)
        self.queue_seeds = tuple(queue_seeds)
        self.definitions: dict[str, dict] = {}  # name -> settings dict, as the replica holds them
        self.deleted_names: set[str] = set()  # deleted cluster-wide and not defined again, as the replica knows
        self.definitions_revision = 0  # the highest revision the feed carried
        self.definitions_applied = 0  # revision of the last definition change applied here (journalled)
        self.seeded = not self.queue_seeds
        self._seeding = False
        self._seed_due_ms = 0
        self._replica_ready = False
        # queues made or ended here on a client's behalf (see the header): the broker records them
        broker.made, broker.ended = [], []
        broker.entered = set()  # groups this node put messages in itself: routed here at once (_route_entered)
        self._defining: dict[str, dict] = {}  # name -> values proposed, outcome not heard yet
        self._define_again: dict[str, dict] = {}  # name -> values whose proposal failed, proposed again when due
        self._to_delete: set[str] = set()  # names to delete cluster-wide, proposed when no define is in flight
        self._deleting: set[str] = set()  # deletions proposed, outcome not heard yet
        self._committed_unseen: set[str] = set()  # definitions this node made committed, not applied here yet
        self._definitions_due_ms = 0  # when failed proposals are made again

    @property
    def batch_due(self) -> bool:
        """True when the end of this batch has something to propose or forward."""
        return bool(self.router.to_claim or self._unsubmitted or self._recovered or self.broker.made
                    or self.broker.ended or self.broker.entered)

    # ---- recovery (before the engine loop runs) --------------------------------------------------

    def recover_declaration(self, values: dict) -> bool:
        """Take a journalled declaration that is the cluster's own; False for a queue's."""
        name = values["name"]
        if name == SEQ_RESERVATION:
            self.seq_reserved = self.reserved_durable = int(values["reserved"])
            self.broker.next_seq = max(self.broker.next_seq, self.seq_reserved)
            return True
        if name == QUEUES_MARK:
            self.definitions_applied = int(values["revision"])
            return True
        if name.startswith(MARK_PREFIX):
            source, high_water = name[len(MARK_PREFIX):], int(values["high_water"])
            self.inbound.advance(source, high_water)
            return True
        return False

    def recover_outbound(self, messages_by_name: dict) -> int:
        """Put journalled outbound messages back in their channels, in seq order; those recovered
        without a body are read back from the journal when their turn comes (node/core/outbound.py).
        Per journal name: a list of Messages (parked ones, and outbound ones with or without a body),
        or, for outbound names, the journal's bodiless backlog (node/store/journal.py BodilessBacklog:
        parallel `seqs`, `group_ids` and `size_bytes`, ascending), which costs no Message per entry.
        Empties each outbound list or backlog as it goes, so that a message's record and what it was
        recovered from are not both held for every message at once: a 1,000,000-message backlog's
        recovery would otherwise peak well above what it leaves."""
        runs = []
        for name, recovered in messages_by_name.items():
            if name.startswith(PARK_PREFIX):
                self._recover_parked(name[len(PARK_PREFIX):], recovered)
                continue
            if type(recovered) is not list:
                runs.append(_taken_bodiless(recovered, *parse_outbound_name(name), name))
                continue
            if any(earlier.seq > later.seq for earlier, later in itertools.pairwise(recovered)):
                recovered.sort(key=_seq_of_message)  # the journal gives each name's in seq order
            runs.append(_taken(recovered, *parse_outbound_name(name), name))
        ready: dict[str, list[Entry | int]] = {}
        count = 0
        # one channel may span several journal names (one per queue): merged, not sorted all together
        for seq, owner, queue, name, group_id, size_bytes, message in heapq.merge(*runs):
            count += 1
            self.broker.next_seq = max(self.broker.next_seq, seq + 1)
            known = self.broker.queues.get(queue)
            route_key = known.route_key(group_id) if known is not None else group_id
            self.outbound.add(owner, seq, (queue, route_key), name, size_bytes)
            # a message recovered without its body (runtime keeps them in the journal) is paged already
            ready.setdefault(owner, []).append(entry_of(queue, message) if message is not None else seq)
            # perhaps a handover or a relay before a restart: owed until acknowledged
            self._recovered_top[owner] = max(self._recovered_top.get(owner, 0), seq)
        for owner in list(ready):  # past the memory budget, paged again
            self.outbound.ready(owner, ready.pop(owner), self._recovered)
        return count

    def _recover_parked(self, queue_name: str, messages: list) -> None:
        known = self.broker.queues.get(queue_name)
        for message in sorted(messages, key=lambda message: message.seq):
            self.broker.next_seq = max(self.broker.next_seq, message.seq + 1)
            route_key = known.route_key(message.group_id) if known is not None else message.group_id
            self.parked.setdefault((queue_name, route_key), []).append(message)

    def hold_recovered(self) -> None:
        """After recovery, before any consumer: hold every group recovered here until the replica is
        current; this node may no longer own it (a ghost whose REMOVE a failed write lost, its idle route
        expired and claimed elsewhere since; a group failed over), or be the new owner of a move still in
        progress. So with or without groups following their consumers."""
        self.broker.made.clear()  # what recovery declared is the journal's, made by no client now
        for name, queue in self.broker.queues.items():
            if queue.settings.grouping:
                for route_key in queue.busy_route_keys():
                    self._hold((name, route_key))
                    self._restored.add((name, route_key))

    # ---- arrivals ----------------------------------------------------------------------------

    def arrive(self, incoming, queue: str, route_key: str, message: Message, durable: bool,
               producer_settled: bool, now_ms: int) -> list:
        item = (incoming, queue, route_key, message, durable, producer_settled)
        owner = self.router.route((queue, route_key), item, now_ms)
        if owner is None:
            return []
        effects: list = []
        self._send(owner, item, now_ms, effects)
        return effects

    def _send(self, owner: str, item, now_ms: int, effects: list) -> None:
        incoming, queue, route_key, message, durable, producer_settled = item
        if self.moves or self.parked:
            key = (queue, route_key)
            move = self.moves.get(key)
            if (move[1] == self.node_id) if move is not None else (owner == self.node_id and key in self.parked):
                self._park(key, message, durable, now_ms, effects)  # behind the move's handover
                effects.append(AcceptWhenStored(incoming, durable, producer_settled))
                return
            if move is not None and move[0] == self.node_id and self._busy(key):
                if self._parks_here(key):
                    # behind a cold tail the group may have messages in: a producer here is refused until
                    # the group has left (parked, its steady sends would keep the move from ever ending:
                    # the park is relayed only once on disk, and the group is busy while anything is)
                    effects.append(Refuse(incoming, HandlerUnavailable(
                        f"group {route_key!r} of queue {queue!r} is moving from node {self.node_id} to "
                        f"{move[1]}, where its consumers went, and its backlog here is partly past the "
                        f"node's record budget (record_memory_max_bytes): the message was not enqueued; "
                        f"send it again shortly")))
                    self.counts["moving_refused"] += 1
                    return
                owner = self.node_id  # behind what the group still has here, handed over after it
        if owner == self.node_id:
            effects.append(EnqueueLocal(incoming, queue, message, durable, producer_settled, now_ms))
            return
        refusal = self._outbound_refusal(owner, message.size_bytes)
        if refusal is not None:
            self.outbound_refused[owner] += 1
            self.counts["outbound_refused"] += 1
            effects.append(Refuse(incoming, refusal))
            return
        self._forward_message(owner, queue, route_key, message, durable, now_ms, effects)
        effects.append(AcceptWhenStored(incoming, durable, producer_settled))

    def _outbound_refusal(self, owner: str, size_bytes: int, promised: dict | None = None,
                          then: str = "the message was not enqueued; send it again") -> ResourceLimitExceeded | None:
        """Why a message of `size_bytes` for `owner` may not enter the outbound store, or None;
        `promised`: owner -> [messages, bytes] on their way into the channels too (a reroute batch's);
        `then`: what happened and what to do, for the refusal's text."""
        outbound = self.outbound
        promised_messages, promised_bytes = promised.get(owner, (0, 0)) if promised else (0, 0)
        held_bytes = outbound.depth_bytes.get(owner, 0) + promised_bytes
        held_messages = len(outbound.channels.get(owner, ())) + promised_messages
        total_bytes = outbound.total_bytes + (sum(both[1] for both in promised.values()) if promised else 0)
        full = self._outbound_full
        if self.outbound_max_bytes and held_bytes and (
                owner in full or held_bytes + size_bytes > self.outbound_max_bytes):
            full.add(owner)
            limit = f"outbound_max_bytes = {self.outbound_max_bytes} bytes per owner"
        elif self.outbound_max_messages and (owner in full or held_messages >= self.outbound_max_messages):
            full.add(owner)  # each message keeps a record in memory, paged or not (node/core/outbound.py)
            limit = f"outbound_max_messages = {self.outbound_max_messages} messages per owner"
        elif self.outbound_total_max_bytes and total_bytes and (
                None in full or total_bytes + size_bytes > self.outbound_total_max_bytes):
            full.add(None)
            limit = (f"outbound_total_max_bytes = {self.outbound_total_max_bytes} bytes for all owners together, "
                     f"which hold {total_bytes} bytes")
        else:
            return None
        return ResourceLimitExceeded(
            f"owner node {owner} has not taken the {held_bytes} bytes node {self.node_id} holds for it in its "
            f"outbound store, which is full at {limit} (this message is {size_bytes} bytes; once full, the store "
            f"takes none until {owner} takes some): is {owner} down or unreachable? So {then} once {owner} takes "
            f"its backlog (grouper cluster status shows it), or raise the limit")

    def _forward_message(self, owner: str, queue: str, route_key: str, message: Message, durable: bool,
                         now_ms: int, effects: list, origin: tuple | None = None) -> None:
        """Into the outbound channel of `owner`, with a new forward seq; `origin` of a relayed one."""
        message.seq = self.broker.allocate_seq()
        message.enqueued_at_ms = message.enqueued_at_ms or now_ms
        journal_name = None
        if durable and self.journalled:
            self._reserve_seq(message.seq, effects)
            journal_name = self.outbound.journal_name(owner, queue)
            effects.append(JournalStore(journal_name, message, origin))
        self.outbound.add(owner, message.seq, (queue, route_key), journal_name, message.size_bytes)
        self._unsubmitted.setdefault(owner, []).append(entry_of(queue, message))

    def _reserve_seq(self, seq: int, effects: list) -> None:
        if seq < self.seq_reserved:
            return
        self.seq_reserved = self._batch_reservation = seq + self.seq_reserve_block
        effects.append(JournalDeclare({"name": SEQ_RESERVATION, "reserved": self.seq_reserved}))

    def _release(self, released, now_ms: int, effects: list) -> None:
        for owner, item in released:
            self._send(owner, item, now_ms, effects)

    # ---- the end of a batch of the engine loop, and the journal's answers ------------------------

    def quiesced(self, now_ms: int) -> list:
        if self.closed:
            return []
        effects: list = []
        if self.broker.made or self.broker.ended:
            self._take_made(effects)  # before the claims: a queue's definition precedes its routes
        if self.broker.entered:
            self._route_entered(now_ms, effects)
        keys = self.router.take_claims()
        if keys:
            effects.extend(ProposeClaim(chunk, now_ms) for chunk in _chunks(keys))
        if self._recovered:
            effects.extend(self._recovered)
            self._recovered = []
        if self._unsubmitted:
            # only this batch's own reservation is proven on disk when the batch is
            batch, self._unsubmitted = self._unsubmitted, {}
            reserved, self._batch_reservation = self._batch_reservation, 0
            flushing = _Flushing(batch, reserved)
            self._flushing.append(flushing)
            effects.append(AfterFlush((_BATCH, flushing)))
        return effects

    def _route_entered(self, now_ms: int, effects: list) -> None:
        """Groups this node put messages in itself (an admin move, a dead letter) came by no route, and
        until one names this node a send elsewhere could place the group on another node and split it.
        So their routes are made here at once: a touch makes a missing route on the node it names,
        never elsewhere (else the periodic refresh would, up to a quarter of group_timeout_ms later, or
        never with it 0). A group whose route already names another node keeps it; its messages here
        wait for a consumer here, logged, as the route table decides where the group lives."""
        entered, self.broker.entered = self.broker.entered, set()
        touches = []
        for key in sorted(entered):
            owner = self.router.routes.get(key)
            if owner is None or owner == self.node_id:
                touches.append((key[0], key[1], self.node_id))
            else:
                log.warning("group %r of queue %r was given messages here (a move or a dead letter) but lives "
                            "on %s: they wait here for a consumer of this node", key[1], key[0], owner)
        effects.extend(ProposeTouch(chunk, now_ms) for chunk in _chunks(touches))

    def flushed(self, what: tuple, reason: str | None, now_ms: int) -> list:
        """What an AfterFlush waited for is on disk (reason None) or failed (the reason)."""
        effects: list = []
        kind = what[0]
        if kind == _BATCH:
            what[1].outcome = reason or STORED
            self._reservation_flushed(what[1].reserved, reason, effects)
        elif kind == _RESERVATION:
            self._reserving = False
            self._reservation_flushed(what[1], reason, effects)
        elif kind == _PARKED:
            _, key, message = what
            parked = self.parked.get(key, [])
            self._parking.discard(message.seq)  # known on disk (or refused): it may be unparked
            if reason is not None and message in parked:  # its producer is refused (or its source stopped us): never deliver it
                parked.remove(message)
                if not parked:
                    del self.parked[key]
        elif kind == _HANDED:
            if reason is not None and not self.closed:
                # the queue forgot what the journal still holds (or holds what it never wrote): only a
                # restart from the journal makes the two agree, and the move goes on from there
                self.closed = True
                effects.append(StopNode(f"{what[1]} was not journalled ({reason})"))
        elif kind == _SWEPT:
            _, queue_name, seqs = what  # a failed write stopped the node (its _HANDED says why)
            removing = self._sweep_removing.get(queue_name, set())
            removing.difference_update(seqs)
            if not removing:
                self._sweep_removing.pop(queue_name, None)
                self._thaw(queue_name)
        elif kind == _INBOUND:
            _, source, high_water, reply_to, enqueued = what
            if reason is None:
                effects.append(Reply(reply_to, high_water, None))
            else:
                effects.append(Reply(reply_to, None, ResourceLimitExceeded(
                    f"the owner could not store the batch ({reason}); retry later")))
                # enqueued here but not on disk: only a restart from the journal makes the two agree (a
                # resend alone, all skipped, changed nothing)
                if enqueued and not self.closed:
                    self.closed = True
                    effects.append(StopNode(f"a batch forwarded by {source} was enqueued here but its journal "
                                            f"write failed ({reason})"))
        else:
            raise AssertionError(f"flushed() was handed {what!r}, which no AfterFlush of this protocol made")
        return effects

    def _reservation_flushed(self, reserved: int, reason, effects: list) -> None:
        if reason is None:
            self.reserved_durable = max(self.reserved_durable, reserved)
        else:  # the reservation may be lost with the batch: the next outbound message journals one
            self.seq_reserved = self.reserved_durable
        self._forward_flushed(effects)

    def _forward_flushed(self, effects: list) -> None:
        while self._flushing and not self.closed:
            flushing = self._flushing[0]
            if flushing.outcome is None:
                return  # not on disk yet; later batches wait behind it
            if flushing.outcome is not STORED:
                # the producers were refused: these messages must not reach their owners
                for owner, entries in flushing.batch.items():
                    self.outbound.forget(owner, [entry.forward_seq for entry in entries])
                    self._outbound_drained(owner)
                self.counts["forwards_forgotten"] += sum(len(entries) for entries in flushing.batch.values())
            else:
                top_seq = max(entry.forward_seq for entries in flushing.batch.values() for entry in entries)
                if top_seq >= self.reserved_durable:
                    # a failed batch took the reservation these seqs were given under: reserve again
                    if not self._reserving:
                        self._reserving = True
                        self.counts["reserved_again"] += 1
                        self.seq_reserved = self.reserved_durable
                        self._reserve_seq(self.broker.next_seq, effects)  # above every seq handed out so far
                        reserved, self._batch_reservation = self._batch_reservation, 0
                        effects.append(AfterFlush((_RESERVATION, reserved)))
                    return
                for owner, entries in flushing.batch.items():
                    self.outbound.ready(owner, entries, effects)
            self._flushing.popleft()

    # ---- the raft member's answers -----------------------------------------------------------

    def claim_failed(self, keys, reason: str) -> None:
        """A claim proposal failed (no leader yet, leader changed): retried at a tick."""
        log.debug("route proposal for %d groups failed (%s); retrying", len(keys), reason)
        self._retry_claims.extend(keys)

    def touch_failed(self, now_ms: int) -> None:
        self.refresh_due_ms = min(self.refresh_due_ms, now_ms + TOUCH_RETRY_INTERVAL_MS)

    def registered_now(self) -> None:
        """This node's addresses are in the table."""
        self.registered = True

    def applied(self, kind: str, payload, at_ms, now_ms: int) -> list:
        """A command the replica applied, in log order (handler/route_table.py names the kinds)."""
        effects: list = []
        if kind == ROUTES:
            # a route's lease runs from the refresh time in the log, not from when this node heard
            # of it: a node replaying an old log must not think old routes fresh
            released = self.router.learn(payload, now_ms if at_ms is None else at_ms, now_ms)
            self._release(released, now_ms, effects)
            if self.moves:
                for queue, group, owner in payload:
                    if owner is None and (queue, group) in self.moves:  # a removed route ends its move
                        self._moves_changed([(queue, group, "", "", ())])
            if self.held:
                self._review_holds(now_ms, effects)
        elif kind == SNAPSHOT:
            fresh = {(queue, group) for queue, group, _, _ in payload}
            gone = [(queue, group, None) for queue, group in self.router.routes if (queue, group) not in fresh]
            released = self.router.learn(gone, now_ms)
            for queue, group, owner, touched_ms in payload:
                released += self.router.learn([(queue, group, owner)], touched_ms, now_ms)
            self._release(released, now_ms, effects)
        elif kind == REFUSED:
            for key in payload:
                for item in self.router.give_up(tuple(key)):
                    effects.append(Refuse(item[0], ResourceLimitExceeded(
                        f"the cluster holds {self.routes_max} live routes (routes_max), so group {key[1]!r} of "
                        f"queue {key[0]!r} got none and the message was not enqueued; "
                        + (f"a route no node used, holds messages of or has an owner of expires after "
                           f"{self.router.lease_ms * 2} ms (group_timeout_ms): send it again then, or raise "
                           f"routes_max on every node" if self.router.lease_ms else
                           "routes never expire with group_timeout_ms 0: set it (and restart the nodes), "
                           "or raise routes_max on every node"))))
        elif kind == MOVES:
            self._moves_changed(payload)
            self._review_holds(now_ms, effects)
        elif kind == MOVES_ALL:
            fresh = {(entry[0], entry[1]) for entry in payload}
            ended = [(queue, group, "", "", ()) for queue, group in sorted(self.moves) if (queue, group) not in fresh]
            self._moves_changed(ended + list(payload))
            self._review_holds(now_ms, effects)
        elif kind == QUEUES:
            for revision, name, values in payload:
                self._definition(revision, name, values, effects)
        elif kind == QUEUES_ALL:  # a snapshot replaces what was known
            revision, definitions, deleted = payload
            self.definitions = dict(definitions)
            self.deleted_names = set(deleted) - set(definitions)
            self.definitions_revision = max(self.definitions_revision, revision)
            if revision > self.definitions_applied:
                # deletions this node has not applied (a name deleted, then defined again, is not one)
                for name, deleted_revision in sorted(deleted.items(), key=lambda item: (item[1], item[0])):
                    if name not in definitions and deleted_revision > self.definitions_applied:
                        self._definition(deleted_revision, name, None, effects)
                for name in sorted(definitions):
                    self._apply_definition(name, definitions[name], effects)
                self.definitions_applied = revision
                if self.journalled:
                    effects.append(JournalDeclare({"name": QUEUES_MARK, "revision": revision}))
            self._committed_unseen.clear()  # the snapshot holds every definition committed so far
            if self._replica_ready:
                self._delete_own_ended()
        elif kind == MEMBERS:
            down = payload.get("down", {})
            for node in sorted(set(down) - set(self.members.get("down", {}))):
                log.warning("node %s is marked down by the owner-failover policy; its groups are placed afresh%s",
                            node, " (this node!)" if node == self.node_id else "")
            self.members = payload
            if down:
                self._delete_temporary_of(set(down))
            self.peer_addresses = {node: info.get("peer_address", "")
                                   for node, info in payload.get("nodes", {}).items()}
        return effects

    def _definition(self, revision: int, name: str, values: dict | None, effects: list) -> None:
        self.definitions_revision = max(self.definitions_revision, revision)
        self._committed_unseen.discard(name)
        if values is None:
            self.definitions.pop(name, None)
            self.deleted_names.add(name)
        else:
            self.definitions[name] = values
            self.deleted_names.discard(name)
        if revision <= self.definitions_applied:
            return  # applied before a restart (the log is being replayed); `ready` reconciles the rest
        self.definitions_applied = revision
        if self.journalled:
            effects.append(JournalDeclare({"name": QUEUES_MARK, "revision": revision}))
        if values is not None:
            self._apply_definition(name, values, effects)
            if self._replica_ready and values.get(TEMPORARY_OF) == self.node_id and name not in self._defining \
                    and name not in self.broker.temporary:
                self._to_delete.add(name)  # its link ended before the definition got here, or the process did
            return
        queue = self.broker.queues.get(name)
        if queue is not None:
            durable = queue.settings.durable
            effects.append(ApplyBroker(self.broker.delete_queue(name), None))
            effects.append(QueueDeleted(name, durable))
            log.info("queue %r deleted cluster-wide (definition revision %d)", name, revision)

    def _apply_definition(self, name: str, values: dict, effects: list) -> None:
        try:
            settings = QueueSettings.from_dict(settings_values(values), where=f"cluster definition of queue {name!r}")
        except GrouperError as error:  # a newer node's setting this one cannot read: keep what is here
            log.error("cannot apply the cluster's definition of queue %r here: %s; upgrade this node", name, error)
            return
        queue = self.broker.queues.get(name)
        if queue is not None and queue.settings == settings:
            return
        if queue is not None:
            # whole records: to_dict leaves out an empty address, which must still count as a change
            fixed = fixed_changes(dataclasses.asdict(queue.settings), dataclasses.asdict(settings))
            if not fixed:
                self.broker.redefine_queue(settings)
                effects.append(ApplyBroker([], None))  # journals the new declaration
                return
            stats = queue.stats()
            if stats["depth_messages"] or stats["consumers"]:
                log.warning("queue %r here differs from its cluster-wide definition in %s and holds %d messages "
                            "and %d consumers: it keeps its settings, since regrouping them would split groups; "
                            "delete the queue and add it again to apply the definition", name, ", ".join(fixed),
                            stats["depth_messages"], stats["consumers"])
                return
            effects.append(ApplyBroker(self.broker.delete_queue(name), None))
        self.broker.declare_queue(settings)
        effects.append(ApplyBroker([], None))  # journals the declaration

    def queues_seeded(self) -> None:
        """Every config-file queue was proposed as a seed, and the proposals committed."""
        self.seeded, self._seeding = True, False

    def queue_seeds_failed(self, now_ms: int) -> None:
        self._seeding = False
        self._seed_due_ms = now_ms + SEED_RETRY_INTERVAL_MS

    def _propose_seeds(self, now_ms: int, effects: list) -> None:
        if self.seeded or self._seeding or not self._replica_ready or now_ms < self._seed_due_ms:
            return
        self._seeding = True
        effects.append(ProposeQueueSeeds(self.queue_seeds))

    def ready(self, now_ms: int) -> list:
        """The replica has caught up with the log."""
        effects: list = []
        self._replica_ready = True
        for name in sorted(self.definitions):  # what a replay skipped: the config file may have said otherwise
            self._apply_definition(name, self.definitions[name], effects)
        for values in self.queue_seeds:  # declared from the config file at recovery, deleted cluster-wide
            queue = self.broker.queues.get(values["name"])
            if values["name"] in self.deleted_names and queue is not None and not queue.stats()["depth_messages"] \
                    and not queue.stats()["consumers"]:
                effects.append(ApplyBroker(self.broker.delete_queue(values["name"]), None))
                effects.append(QueueDeleted(values["name"], queue.settings.durable))
        self._delete_own_ended()  # its links ended with the process
        self._delete_temporary_of(set(self.members.get("down", {})))
        self._define_recovered(effects)
        self._propose_seeds(now_ms, effects)
        self._propose_again(effects)
        released = self.router.become_ready(now_ms)
        if self.held:  # first: what recovery held is older than what waited for the replica, and the
            self._review_holds(now_ms, effects)  # broker delivers it now, ahead of those effects
        self._release(released, now_ms, effects)
        return effects

    # ---- queues made and ended on a client's behalf (see the header) ---------------------------

    @property
    def pending_definitions(self) -> set[str]:
        """Queues whose definition or deletion this node has yet to propose, or to see committed."""
        return {settings.name for settings, _ in self.broker.made} | set(self.broker.ended) | set(
            self._defining) | set(self._define_again) | self._committed_unseen | self._to_delete | self._deleting

    def _take_made(self, effects: list) -> None:
        broker = self.broker
        ended, broker.ended = broker.ended, []
        self._to_delete.update(ended)  # first: what ended and was made again in one batch, in that order
        made, broker.made = broker.made, []
        for settings, temporary in made:
            name = settings.name
            queue = broker.queues.get(name)
            if queue is None or queue.settings is not settings:
                continue  # gone again (a refused send, a link that failed), or redefined meanwhile
            if name in self._to_delete or name in self._deleting:
                if not settings.address:
                    # a forward that reached this node after the subscription's link ended here: the
                    # queue it made goes with the subscription's deletion
                    continue
                self._to_delete.discard(name)  # subscribed again since it ended: a deletion proposed goes first
            values = settings.to_dict()
            if temporary:
                values[TEMPORARY_OF] = self.node_id
            self._define_again.pop(name, None)
            if self.definitions.get(name) != values or name in self._deleting:
                self._defining[name] = values
                effects.append(ProposeDefinition(values))
        if ended:
            self._propose_deletions(effects)

    def _define_recovered(self, effects: list) -> None:
        """Queues recovered from the journal with no definition and no deletion in the log: made here
        for clients before a restart whose definition never committed (no majority, then a crash).
        Config-file queues are seeds, with rules of their own."""
        unknown = set(self.broker.queues) - set(self.definitions) - self.deleted_names - self.pending_definitions \
            - {values["name"] for values in self.queue_seeds}
        for name in sorted(unknown):
            values = self.broker.queues[name].settings.to_dict()
            self._defining[name] = values
            effects.append(ProposeDefinition(values))

    def _propose_deletions(self, effects: list) -> None:
        for name in sorted(self._to_delete):
            if name in self._defining or name in self._committed_unseen:
                continue  # deleted once its definition is in (`definition_proposed`, the feed)
            self._to_delete.discard(name)
            self._define_again.pop(name, None)  # a queue that ended is not defined again
            if name in self.definitions and name not in self._deleting:
                self._deleting.add(name)
                effects.append(ProposeQueueDeletion(name, self.definitions_revision))

    def _propose_again(self, effects: list) -> None:
        again, self._define_again = self._define_again, {}
        for name, values in sorted(again.items()):
            queue = self.broker.queues.get(name)
            if queue is None or self.definitions.get(name) == values or name in self._defining:
                continue
            self._defining[name] = values
            effects.append(ProposeDefinition(values))
        if self._replica_ready:  # what a replaying replica holds may be deleted already
            self._propose_deletions(effects)

    def _delete_own_ended(self) -> None:
        """This node's temporary subscriptions that no live link holds here are deleted cluster-wide."""
        self._to_delete.update(name for name, values in self.definitions.items()
                               if values.get(TEMPORARY_OF) == self.node_id and name not in self._defining
                               and name not in self.broker.temporary)

    def _delete_temporary_of(self, nodes: set) -> None:
        if nodes:
            self._to_delete.update(name for name, values in self.definitions.items()
                                   if values.get(TEMPORARY_OF) in nodes)

    def definition_proposed(self, values: dict, reason: str | None, outcome, held, now_ms: int) -> list:
        """The outcome of a ProposeDefinition: reason None once applied, with the command's
        (outcome, the definition held); else why it failed."""
        name = values["name"]
        if self._defining.get(name) is values:
            del self._defining[name]
        effects: list = []
        if reason is not None:
            log.info("proposing queue %r as a cluster-wide definition failed (%s); retrying in %d ms",
                     name, reason, DEFINITION_RETRY_INTERVAL_MS)
            self._define_again[name] = values
            self._definitions_due_ms = now_ms + DEFINITION_RETRY_INTERVAL_MS
        elif outcome not in (CONFLICT, MALFORMED) and name not in self.definitions:
            self._committed_unseen.add(name)  # in the log; the replica here applies it a moment later
        elif outcome == CONFLICT and held is not None:
            differing = sorted(key for key in set(values) | set(held) if values.get(key) != held.get(key))
            log.warning("queue %r made here differs from its cluster-wide definition in %s: the cluster's "
                        "definition applies", name, ", ".join(differing))
            queue = self.broker.queues.get(name)
            if queue is not None and queue.settings.to_dict() == settings_values(values) \
                    and not queue.depth_messages and queue.consumers:
                # its consumers attached with settings the cluster refused (another node defined the
                # name first): detached, saying so, as an attach would be once the definition is here
                refusal = AlreadyExists(
                    f"queue {name!r} is defined cluster-wide with other settings than this attach made it with "
                    f"({', '.join(differing)} differ): attach again without address parameters, or with the "
                    f"cluster's")
                effects.append(ApplyBroker(self.broker.delete_queue(name, refusal), None))
            self._apply_definition(name, held, effects)
        if name in self._to_delete:
            self._propose_deletions(effects)
        return effects

    def deletion_proposed(self, name: str, reason: str | None, now_ms: int) -> list:
        """The outcome of a ProposeQueueDeletion: reason None once applied, else why it failed."""
        self._deleting.discard(name)
        if reason is not None:
            log.info("deleting queue %r cluster-wide failed (%s); retrying in %d ms", name, reason,
                     DEFINITION_RETRY_INTERVAL_MS)
            self._to_delete.add(name)
            self._definitions_due_ms = now_ms + DEFINITION_RETRY_INTERVAL_MS
        return []

    # ---- timers ------------------------------------------------------------------------------

    def tick(self, now_ms: int, consumer_counts: dict[str, int]) -> list:
        """`consumer_counts`: consumers per queue on this node now (where new groups should go)."""
        if self.closed:
            return []
        effects: list = []
        for item in self.router.expire(now_ms):
            effects.append(Refuse(item[0], HandlerUnavailable(
                f"no route for this message's group could be decided within {self.handler_timeout_ms} ms "
                f"(handler_timeout_ms): the grouping handler (the raft leader) is unavailable, is a majority "
                f"of the cluster's nodes up? The message was not enqueued; send it again later")))
        self._propose_seeds(now_ms, effects)
        if self.broker.made or self.broker.ended:
            self._take_made(effects)
        if (self._define_again or self._to_delete) and now_ms >= self._definitions_due_ms:
            self._propose_again(effects)
        if self._retry_claims and now_ms >= self._retry_due_ms:
            self.router.claim_failed(self._retry_claims)
            self._retry_claims = []
            self._retry_due_ms = now_ms + CLAIM_RETRY_INTERVAL_MS
        if consumer_counts != self._reported or now_ms >= self._report_due_ms:
            effects.append(ReportConsumers(consumer_counts, now_ms))
            self._reported = consumer_counts
            self._report_due_ms = now_ms + CONSUMER_REPORT_INTERVAL_MS
        if not self.registered and now_ms >= self._register_due_ms:
            self._register_due_ms = now_ms + REGISTER_RETRY_INTERVAL_MS
            effects.append(Register(now_ms))
        if self.router.lease_ms and now_ms >= self.refresh_due_ms:
            self.refresh_due_ms = now_ms + self.router.lease_ms // 2
            self._refresh_leases(now_ms, effects)
        if self.moves or self.held or self.parked:  # parked: a new owner's, unparked once its move ended
            self._drive_moves(now_ms, effects)
        if self.router.to_claim:
            effects.extend(self.quiesced(now_ms))
        return effects

    def _refresh_leases(self, now_ms: int, effects: list) -> None:
        # a route expires only when no node uses it: refresh what this node routed lately, what it
        # holds as owner and what waits in its outbound channels, each naming the node it relies on
        # (a touch makes a missing route again there, never elsewhere). A cold tail's groups are not
        # known until it is read back (node/core/cold.py): every route of its queue naming this node is
        # refreshed while it has one
        routes = self.router.routes
        entries = {key: routes[key] for key in self.router.take_used() if key in routes}
        entries.update(self.outbound.owners_by_key())
        # a moving group's route is spared while the move lasts, but must not be found idle when it ends
        # (one end may have stopped and held it up past the group timeout): both ends keep it fresh
        me = self.node_id
        entries.update((key, routes.get(key, move[1])) for key, move in self.moves.items()
                       if me in (move[0], move[1]))
        for name, queue in self.broker.queues.items():
            if queue.settings.grouping:
                entries.update(((name, key), self.node_id) for key in queue.busy_route_keys())
                if queue.cold is not None and queue.cold.count:
                    entries.update(((name, group), self.node_id) for group in routes.groups_of(name, self.node_id))
        if not entries:
            return
        touches = [(queue, group, node) for (queue, group), node in sorted(entries.items())]
        effects.extend(ProposeTouch(chunk, now_ms) for chunk in _chunks(touches))

    # ---- owner side: batches forwarded by other nodes ----------------------------------------

    def acknowledged(self, owner: str, high_water: int) -> list:
        """`owner` holds (stored) everything this node forwarded it up to `high_water`."""
        waiting = len(self.outbound.channels.get(owner, ()))
        effects: list = []
        journalled = self.outbound.acknowledge(owner, high_water, effects)
        if len(self.outbound.channels.get(owner, ())) < waiting:
            self._outbound_drained(owner)
        if self.journalled:
            effects.extend(JournalRemove(journal_name, seq) for journal_name, seq in journalled)
        return effects

    def outbound_read(self, name: str, records: dict) -> list:
        """The journal read back paged entries of outbound channel `name` (seq -> Message, None if it
        has none): submitted in order once the whole read is back (node/core/outbound.py)."""
        effects: list = []
        outbound = self.outbound
        outbound.read_back(name, records, effects)
        if outbound.lost:
            lost, outbound.lost = outbound.lost, []
            for journal_name, seq in lost:
                owner, queue = parse_outbound_name(journal_name)
                log.error("message %d of queue %r waiting for owner node %s is gone from the journal (damaged?): "
                          "it cannot be forwarded and is dropped", seq, queue, owner)
                self._outbound_drained(owner)
            self.counts["forwards_lost"] += len(lost)
        return effects

    def forward_received(self, source: str, entries: list[Entry], reply_to, now_ms: int, seq_bound: int = 0,
                         disputed_high_water: int = 0) -> list:
        """Enqueue a batch `source` forwarded; the Reply comes once it is stored here (or at once if refused).
        `seq_bound`: the source's next node seq as it sent the batch (0: not said); `disputed_high_water`:
        a high water this owner answered it that it says it never reached (see the header)."""
        effects: list = []
        try:
            if 0 < seq_bound <= disputed_high_water == self.inbound.high_water.get(source, 0):
                self._mark_set_back(source, entries[0].forward_seq - 1, seq_bound)
            high_water, enqueued = self._enqueue_forwarded(source, entries, now_ms, effects)
        except GrouperError as error:
            return [Reply(reply_to, None, error)]
        effects.append(AfterFlush((_INBOUND, source, high_water, reply_to, enqueued)))
        return effects

    def _mark_set_back(self, source: str, high_water: int, seq_bound: int) -> None:
        mark = self.inbound.high_water[source]
        self.inbound.set_back(source, high_water)
        self.counts["forward_marks_set_back"] += 1
        log.error("node %s says it never gave a forward seq at or above %d, but this node's mark for it is %d: a "
                  "batch taken here as node %s's was not its (forged, from before forwarding took credentials?) or "
                  "it reused seqs (restarted without its journal). The mark is set back to %d, below its batch, so its "
                  "messages are taken; a message it sent before that was taken already may arrive twice",
                  source, seq_bound, mark, source, high_water)

    def _enqueue_forwarded(self, source: str, entries: list[Entry], now_ms: int,
                           effects: list) -> tuple[int, bool]:
        """Returns the source's high water here and whether this batch enqueued anything."""
        inbound = self.inbound
        advanced = False
        if self.follows_consumers and not self.router.ready:
            # which of a moving group's messages go first depends on what the log says: not yet known
            raise HandlerUnavailable(f"node {self.node_id} is catching up with the raft log and takes no "
                                     f"forwarded messages until then; retry shortly")
        for entry in entries:
            if not inbound.fresh(source, entry.forward_seq):
                self.counts["resends_skipped"] += 1
                continue  # a resend of what is already here
            message = Message(entry.payload, entry.group_id, expires_at_ms=entry.expires_at_ms,
                              closes_group=entry.closes_group, enqueued_at_ms=entry.enqueued_at_ms)
            try:
                if self.follows_consumers and entry.group_id is not None and self._parked_or_relayed(
                        source, entry, message, now_ms, effects):
                    inbound.advance(source, entry.forward_seq)
                    advanced = True
                    continue
                enqueued = self.broker.enqueue(entry.queue, message, now_ms)
            except GrouperError as error:
                if not advanced:
                    raise
                log.info("forwarded batch from %s stopped at seq %d: %s", source, entry.forward_seq,
                         error.description)
                break
            inbound.advance(source, entry.forward_seq)
            advanced = True
            effects.append(ApplyBroker(enqueued, (source, entry.forward_seq)))
        high_water = inbound.high_water.get(source, 0)
        if advanced and self.journalled:
            effects.append(JournalDeclare({"name": MARK_PREFIX + source, "high_water": high_water}))
        return high_water, advanced

    # ---- groups follow their consumers: the handover (see the header) ----------------------------

    def _moves_changed(self, moves) -> None:
        for queue, group, from_node, to_node, waiting in moves:
            key = (queue, group)
            if waiting:
                self.moves[key] = (from_node, to_node, frozenset(waiting))
                if from_node == self.node_id and key not in self.held:
                    self._hold(key)
            elif self.moves.pop(key, None) is not None:
                self._clear_due_ms.pop(key, None)
                self._owed.pop(key, None)
                self._swept.discard(key)
                self.counts["moves_ended"] += 1

    def _place_arrival(self, source: str | None, key: tuple[str, str]) -> str:
        """Where a message of group `key` from `source` (None: a producer here) goes: _QUEUE (this
        node's queue, held if it must be), _PARK (behind a move's handover) or _RELAY (on to the new
        owner, behind what this node sent it already)."""
        me = self.node_id
        move = self.moves.get(key)
        if move is not None:
            from_node, to_node, _ = move
            if from_node == me:
                if not self._busy(key):
                    return _RELAY
                return _PARK if self._parks_here(key) else _QUEUE
            if to_node == me:
                return _QUEUE if source == from_node else _PARK
            owner = to_node  # a move between two other nodes: the group's owner once it ends
        else:
            owner = self.router.routes.get(key)
        if source is not None and owner is not None and owner != me:
            # another node's group sent here: a move this replica has not seen yet (its sender's replica is
            # ahead). The old owner's handover goes first; anything else waits behind it
            return _QUEUE if source == owner else _PARK
        return _PARK if key in self.parked else _QUEUE

    def _holding(self, key: tuple[str, str], arriving: bool = False) -> bool:
        """Whether this node must deliver nothing of the group now; `arriving`: a message of it is
        about to be enqueued here."""
        if not self.router.ready:
            return True
        move = self.moves.get(key)
        if move is not None and self.node_id in (move[0], move[1]):
            # the old owner delivers none of the group; the new owner what its queue has of it, what
            # the old owner sent: all else waits parked (see the header)
            return move[0] == self.node_id
        if key in self.parked:
            return True
        # the group's owner, once a move between two other nodes ended; what reached this node meanwhile
        # waits for a later move here (_place_arrival)
        owner = self.router.routes.get(key) if move is None else move[1]
        return owner is not None and owner != self.node_id and (arriving or self._busy(key))

    def _review_holds(self, now_ms: int, effects: list) -> None:
        if not self.router.ready:
            return  # every hold stands until the replica is current (_holding), and recovery may hold many
        for key in sorted(self.parked):
            # the move it waited behind ended. A group moving on from here (before that move ended, or
            # parked here behind its cold tail) takes what it parked along instead: relayed behind the
            # rest, once nothing of it is left here (_relay_parked); never through its queue here, which
            # would take no more than the record budget has room for a tick
            if key not in self.moves and self.router.routes.get(key) == self.node_id:
                self._unpark(key, now_ms, effects)
        for key in sorted(self.held):
            if key in self._restored:
                move = self.moves.get(key)  # what the journal held stays here unless it is moving...
                owner = self.router.routes.get(key)
                if move is not None and self.node_id not in (move[0], move[1]):
                    continue  # ...between other nodes: held until that move ends, then sent to its owner
                if move is None and owner is not None and owner != self.node_id:
                    # ...or its group lives elsewhere now: a consumer's accept whose journal write failed
                    # after the group moved on, a group failed over. Its owner delivers it, not this node,
                    # once its paged bodies are back (still held till then, tried again at the next tick)
                    if not self._hand_over(key, owner, now_ms, effects):
                        continue
                    self._owed.pop(key, None)
                    self.counts["restored_handed_over"] += 1
                self._restored.discard(key)
            if not self._holding(key):
                self._unhold(key, now_ms, effects)

    def _busy(self, key: tuple[str, str]) -> bool:
        """This node has messages of the group: queued, in flight or parked; or, moving away from here,
        perhaps in its queue's cold tail, which no sweep has been through for it yet."""
        return key in self.parked or self._left_here(key)

    def _left_here(self, key: tuple[str, str]) -> bool:
        """_busy but for what is parked: queued or in flight here, or perhaps in the cold tail."""
        if self._warm_here(key):
            return True
        move = self.moves.get(key)
        return move is not None and move[0] == self.node_id and self._sweep_pending(key)

    def _warm_here(self, key: tuple[str, str]) -> bool:
        """Group `key` has messages queued (warm) or in flight in its queue here."""
        queue = self.broker.queues.get(key[0])
        if queue is None:
            return False
        group_key = queue.group_key_of_route(key[1])
        return bool(queue.group_available(group_key) or queue.group_in_flight(group_key))

    def _cold_admits(self, queue_name: str) -> bool:
        """A message enqueued in this queue now would go cold (node/core/cold.py)."""
        queue = self.broker.queues.get(queue_name)
        return queue is not None and queue.cold is not None and queue.cold.admits()

    def _sweep_pending(self, key: tuple[str, str]) -> bool:
        """The queue of group `key` (moving away) has a cold tail no whole sweep went through for it."""
        queue = self.broker.queues.get(key[0])
        return queue is not None and queue.cold is not None and bool(queue.cold.count) and key not in self._swept

    def _parks_here(self, key: tuple[str, str]) -> bool:
        """A message of group `key`, moving away and busy here, waits parked rather than in the queue:
        behind others parked, or where the queue would put it in its cold tail (a sweep would have to
        find it there again, and one arriving as the sweep ends could be missed)."""
        return key in self.parked or self._cold_admits(key[0])

    def _hold(self, key: tuple[str, str]) -> None:
        try:
            queue = self.broker.queue(key[0], create=True)
        except GrouperError:
            return  # no such queue and none may be made: nothing of the group can be enqueued here
        self.held.add(key)
        queue.hold_group(queue.group_key_of_route(key[1]))

    def _unhold(self, key: tuple[str, str], now_ms: int, effects: list) -> None:
        self.held.discard(key)
        self._restored.discard(key)
        queue = self.broker.queues.get(key[0])
        if queue is not None:
            broker_effects: list = []
            queue.release_group(queue.group_key_of_route(key[1]), now_ms, broker_effects)
            if broker_effects:
                effects.append(ApplyBroker(broker_effects, None))

    def _durable(self, queue_name: str) -> bool:
        queue = self.broker.queues.get(queue_name)
        if queue is not None:
            return queue.settings.durable
        try:  # the settings this queue gets when it is auto-created here
            return self.broker.address_settings.settings_for(queue_name).durable
        except GrouperError:  # a name no queue can have: refused where it is created, journalled till then
            return True

    def _park(self, key: tuple[str, str], message: Message, durable: bool, now_ms: int, effects: list,
              origin: tuple | None = None) -> None:
        message.seq = self.broker.allocate_seq()
        message.enqueued_at_ms = message.enqueued_at_ms or now_ms
        self._parking.add(message.seq)
        if durable and self.journalled:
            effects.append(JournalStore(PARK_PREFIX + key[0], message, origin))
        self.parked.setdefault(key, []).append(message)
        effects.append(AfterFlush((_PARKED, key, message)))
        self.counts["messages_parked"] += 1

    def _unpark(self, key: tuple[str, str], now_ms: int, effects: list) -> None:
        """The move ended: what waited behind its handover goes in the queue, in arrival order."""
        parked = self.parked[key]
        journalled = self._durable(key[0]) and self.journalled
        unparked = False
        while parked:
            old = parked[0]
            if old.seq in self._parking:
                break  # its journal write is not known good yet: its producer may still be refused
            message = _moved_copy(old)
            try:
                enqueued = self.broker.enqueue(key[0], message, now_ms)
            except GrouperError as error:
                log.warning("parked messages of group %r of queue %r wait: %s", key[1], key[0], error.description)
                break  # held until a later tick takes them
            effects.append(ApplyBroker(enqueued, None))
            if journalled:
                effects.append(JournalRemove(PARK_PREFIX + key[0], old.seq))  # after the STORE: a torn tail duplicates
            parked.pop(0)
            unparked = True
        if unparked:
            effects.append(AfterFlush((_HANDED, f"unparking messages of group {key[1]!r} of queue {key[0]!r}")))
        if not parked:
            del self.parked[key]

    def _parked_or_relayed(self, source: str, entry: Entry, message: Message, now_ms: int, effects: list) -> bool:
        """A forwarded message parked behind a move or relayed to a group's new owner (True), or to be
        enqueued here, its group held first if it must be (False)."""
        queue = self.broker.queues.get(entry.queue)
        route_key = queue.route_key(entry.group_id) if queue is not None else entry.group_id
        key = (entry.queue, route_key)
        if key not in self.moves and key not in self.parked and self.router.routes.get(key) is None:
            # a handover and what must wait behind it look alike until the replica knows the group
            raise HandlerUnavailable(f"node {self.node_id} does not know the route of group {key[1]!r} of "
                                     f"queue {key[0]!r} yet (its replica lags the raft log); retry shortly")
        place = self._place_arrival(source, key)
        if place == _PARK:
            self._park(key, message, self._durable(entry.queue), now_ms, effects, origin=(source, entry.forward_seq))
            return True
        if place == _RELAY:
            self._forward_message(self.moves[key][1], entry.queue, route_key, message, self._durable(entry.queue),
                                  now_ms, effects, origin=(source, entry.forward_seq))
            self._owed[key] = message.seq
            self.counts["messages_relayed"] += 1
            return True
        if key not in self.held and self._holding(key, arriving=True):
            self._hold(key)
        return False

    def _drive_moves(self, now_ms: int, effects: list) -> None:
        self._handover_left = [HANDOVER_MESSAGES_PER_TICK, HANDOVER_BYTES_PER_TICK]  # restored groups' too
        self._review_holds(now_ms, effects)
        if not self.router.ready:
            return  # a replaying replica may see moves the log has ended since
        clears = []
        for key, (from_node, to_node, waiting) in sorted(self.moves.items()):
            if from_node == self.node_id:
                self._hand_over(key, to_node, now_ms, effects)  # what this tick has room for; the rest later
                if key in self.parked:
                    self._relay_parked(key, to_node, now_ms, effects)
            if self.node_id not in waiting or now_ms < self._clear_due_ms.get(key, 0):
                continue
            if from_node == self.node_id:
                clear = waiting == {self.node_id} and not self._busy(key) and self._paid(key, to_node)
            else:
                clear = not self.outbound.count(from_node, key)
            if clear:
                clears.append((key[0], key[1], from_node, to_node))
                self._clear_due_ms[key] = now_ms + MOVE_CLEAR_RETRY_INTERVAL_MS
        if clears:
            effects.extend(ProposeMoveClear(chunk) for chunk in _chunks(clears))
        self._start_sweeps(effects)

    def _paid(self, key: tuple[str, str], to_node: str) -> bool:
        """The new owner acknowledged everything this old owner handed over or relayed to it."""
        owed = max(self._owed.get(key, 0), self._recovered_top.get(to_node, 0))
        channel = self.outbound.channels.get(to_node)
        return not channel or next(iter(channel)) > owed  # a channel is in forward seq order

    def _hand_over(self, key: tuple[str, str], to_node: str, now_ms: int, effects: list) -> bool:
        """The old owner sends the group's backlog on, once nothing of it is in flight here: what this
        tick has room for (_handover_left), with bodies in memory (paged ones are asked for, and go at a
        later tick). True once nothing of it is left here."""
        queue = self.broker.queues.get(key[0])
        if queue is None:
            return True
        if key not in self.held:
            self._hold(key)
        group_key = queue.group_key_of_route(key[1])
        if queue.group_in_flight(group_key):
            return False
        left = self._handover_left
        if not queue.group_available(group_key):
            # nothing to send; an exclusive owner here lets go of the group, which lives at to_node now
            # (else it would hold it idle, unrouted)
            queue.hand_over_group(group_key, [], 0, 0)
            return True
        if left[0] <= 0 or left[1] <= 0:
            return False  # this tick's room went to other groups: still held, the next tick goes on
        removed: list = []
        taken, whole = queue.hand_over_group(group_key, removed, left[0], left[1])
        for old in taken:
            message = _moved_copy(old)
            self._forward_message(to_node, key[0], key[1], message, queue.settings.durable, now_ms, effects)
            self._owed[key] = message.seq
            self.counts["messages_handed_over"] += 1
            left[0] -= 1
            left[1] -= old.size_bytes
        if taken:
            effects.append(ApplyBroker(removed, None))  # the REMOVEs after the outbound STOREs: a torn tail duplicates
            effects.append(AfterFlush((_HANDED, f"handing {len(taken)} messages of group {key[1]!r} of queue "
                                                f"{key[0]!r} over to {to_node}")))
        return whole

    def _relay_parked(self, key: tuple[str, str], to_node: str, now_ms: int, effects: list) -> None:
        """What the old owner parked (behind a cold tail, or behind an earlier move's handover): once the
        group has nothing left here (warm, in flight or cold), it goes on to the new owner, in arrival
        order, as much as this tick's handover room takes (_handover_left)."""
        if self._left_here(key):  # called for a group moving away from here: _left_here weighs its cold tail
            return
        parked = self.parked[key]
        durable = self._durable(key[0])
        relayed = False
        left = self._handover_left
        # the head's journal write not known good yet: its producer may still be refused
        while parked and parked[0].seq not in self._parking and left[0] > 0 and left[1] > 0:
            old = parked.pop(0)
            left[0] -= 1
            left[1] -= old.size_bytes
            message = _moved_copy(old)
            self._forward_message(to_node, key[0], key[1], message, durable, now_ms, effects)
            if durable and self.journalled:
                effects.append(JournalRemove(PARK_PREFIX + key[0], old.seq))  # after the STORE: a torn tail duplicates
            self._owed[key] = message.seq
            self.counts["messages_relayed"] += 1
            relayed = True
        if relayed:
            effects.append(AfterFlush((_HANDED, f"relaying parked messages of group {key[1]!r} of queue {key[0]!r} "
                                                f"to {to_node}")))
        if not parked:
            del self.parked[key]

    def _start_sweeps(self, effects: list) -> None:
        """A queue whose groups move away and has a cold tail is read through for them, once nothing of
        theirs is warm or in flight here (what a sweep hands over comes after that, in seq order)."""
        me = self.node_id
        wanted: dict[str, set] = {}
        for key, (from_node, _, _) in self.moves.items():
            if from_node != me or key[0] in self._sweeps or not self._sweep_pending(key):
                continue
            if key in self.held and not self._warm_here(key):
                wanted.setdefault(key[0], set()).add(key)
        for name, keys in sorted(wanted.items()):
            cold = self.broker.queues[name].cold
            if cold.asked:
                continue  # its own read-back is out: the sweep starts at the next tick, above what it brings
            cold.frozen = True
            sweep = self._sweeps[name] = _Sweep(keys, cold.after_seq)
            self._read_on(name, sweep, effects)
            self.counts["cold_sweeps"] += 1

    def _read_on(self, name: str, sweep: _Sweep, effects: list) -> None:
        sweep.asked = SWEEP_BATCH_RECORDS
        effects.append(ReadRecords(name, sweep.after_seq, SWEEP_BATCH_RECORDS,
                                   self.broker.queues[name].cold.read_max_bytes))

    def _thaw(self, name: str) -> None:
        """No sweep of the queue is out and the journal's index has lost what the last one took: the
        queue may read its cold tail back again."""
        if name not in self._sweeps and name not in self._sweep_removing:
            queue = self.broker.queues.get(name)
            if queue is not None and queue.cold is not None:
                queue.cold.frozen = False

    def cold_records(self, name: str, records: dict, now_ms: int) -> list | None:
        """The journal read back the next records of queue `name`'s cold tail (seq -> Message, None if
        it has none): a sweep's, whose effects are returned; None when the read was the queue's own
        (Broker.promote takes it)."""
        sweep = self._sweeps.get(name)
        if sweep is None or not sweep.asked:
            self._hold_strays(name, records)
            return None
        asked, sweep.asked = sweep.asked, 0
        effects: list = []
        queue = self.broker.queues.get(name)
        if queue is None or queue.cold is None or self.closed:
            del self._sweeps[name]  # deleted meanwhile (or stopping): nothing is left to sweep
            return effects
        seqs = sorted(seq for seq, message in records.items() if message is not None)
        removing = self._sweep_removing.setdefault(name, set())
        removed: list = []
        taken = []
        for seq in seqs:
            message = records[seq]
            route_key = queue.route_key(message.group_id)
            key = (name, route_key)
            move = self.moves.get(key)
            if key not in sweep.keys or seq in removing or move is None or move[0] != self.node_id:
                continue  # not moving away, or no longer (its move ended): it stays cold here
            copy = _moved_copy(message)
            self._forward_message(move[1], name, route_key, copy, True, now_ms, effects)
            self._owed[key] = copy.seq
            queue.cold_taken(seq, message.size_bytes, removed)
            taken.append(seq)
            self.counts["cold_handed_over"] += 1
        if taken:
            removing.update(taken)
            effects.append(ApplyBroker(removed, None))  # the REMOVEs after the outbound STOREs: a torn tail duplicates
            effects.append(AfterFlush((_HANDED, f"handing {len(taken)} cold messages of queue {name!r} over")))
            effects.append(AfterFlush((_SWEPT, name, tuple(taken))))
        elif not removing:
            del self._sweep_removing[name]
        if seqs:
            sweep.after_seq = seqs[-1]
        read_bytes = sum(records[seq].size_bytes for seq in seqs)
        if seqs and not read_missing(asked, len(seqs), read_bytes, queue.cold.read_max_bytes):
            self._read_on(name, sweep, effects)  # a whole batch, or one its byte bound cut short: more to read
            return effects
        # the tail's end: what the sweep did not meet of its groups is still on its way to disk, whole
        pending = {(name, queue.route_key(message.group_id)) for message in queue.cold.pending
                   if message.flags & STATE_MASK != REMOVED}
        for key in sweep.keys - pending:
            move = self.moves.get(key)
            if move is not None and move[0] == self.node_id:
                self._swept.add(key)
        del self._sweeps[name]
        self._thaw(name)
        return effects

    def _hold_strays(self, name: str, records: dict) -> None:
        """Cold records about to join queue `name`'s warm part: a group of theirs that lives elsewhere now
        (or may: the replica is not current) is held first, as recovery holds the groups it sees
        (hold_recovered), and handed to its owner as they are."""
        queue = self.broker.queues.get(name)
        if queue is None or not queue.settings.grouping:
            return
        routes, ready = self.router.routes, self.router.ready
        for message in records.values():
            if message is None:
                continue
            key = (name, queue.route_key(message.group_id))
            if key in self.held or key[1] is None:
                continue
            owner = routes.get(key)
            if not ready or (key not in self.moves and owner is not None and owner != self.node_id):
                self._hold(key)
                self._restored.add(key)

    # ---- an operator's reroute (node/core/reroute.py) --------------------------------------------

    def _outbound_drained(self, owner: str) -> None:
        """Some of `owner`'s channel left the store: its sends, and any the node-wide bound refused, are
        weighed again."""
        self._outbound_full.discard(owner)
        self._outbound_full.discard(None)

    def reroute_owner(self, queue: str, route_key: str, size_bytes: int) -> str | None:
        """Where a rerouted message of group (queue, route_key) and `size_bytes` goes, as a send's would:
        None here (a group with no route gets one naming this node: the broker's `entered`), else its
        owner. Raises while the answer may change under it, and when the owner's outbound channel, with
        the copies this batch already promised it, is at its bound (the reroute stops there)."""
        key = (queue, route_key)
        if not self.router.ready:
            raise HandlerUnavailable(f"node {self.node_id} is catching up with the raft log and cannot tell "
                                     f"where groups of {queue!r} live; retry shortly")
        if key in self.moves or key in self.parked or key in self.held:
            raise HandlerUnavailable(f"group {route_key!r} of queue {queue!r} is moving between nodes; retry "
                                     f"once the move ended")
        owner = self.router.routes.get(key)
        if owner is None or owner == self.node_id:
            return None
        refusal = self._outbound_refusal(owner, size_bytes, self._rerouting,
                                         then="the reroute stops here, the rest left in its queue; run it again")
        if refusal is not None:
            raise refusal
        promised = self._rerouting.setdefault(owner, [0, 0])
        promised[0] += 1
        promised[1] += size_bytes
        return owner

    def rerouted(self, broker_effects: list, forwards: list, now_ms: int) -> list:
        """A reroute batch: each copy for another node into its outbound channel (a STORE, as a
        handover's) before the source's REMOVEs; a failed write stops the node, as a handover's does."""
        self._rerouting.clear()  # what reroute_owner promised is in the channels now
        effects: list = []
        for forward in forwards:
            self._forward_message(forward.owner, forward.queue, forward.route_key, forward.message, forward.durable,
                                  now_ms, effects)
        effects.append(ApplyBroker(broker_effects, None))
        if forwards:
            effects.append(AfterFlush((_HANDED, f"rerouting {len(forwards)} messages to their groups' owners")))
        return effects

    # ---- status and shutdown -----------------------------------------------------------------

    def in_transit(self) -> dict[str, int]:
        """Messages accepted here that no queue holds yet, per queue (no zeros): to forward (until their
        owner acknowledges them), waiting for a route, or parked behind a move."""
        counts: collections.Counter = collections.Counter()
        for key_counts in self.outbound.key_counts.values():
            for key, count in key_counts.items():
                counts[key[0]] += count
        for key, items in self.router.waiting.items():
            counts[key[0]] += len(items)
        for key, messages in self.parked.items():
            counts[key[0]] += len(messages)
        return {queue: count for queue, count in sorted(counts.items()) if count}

    def status(self) -> dict:
        return {
            "routes": len(self.router.routes),
            "waiting_for_route": self.router.waiting_count(),
            "outbound": self.outbound.depths(),
            "outbound_store": self.outbound.stats(),  # per owner: messages and bytes, in memory and journalled
            "outbound_refused": dict(sorted(self.outbound_refused.items())),
            "forward_marks_set_back": self.counts["forward_marks_set_back"],  # see the header
            "outbound_max_bytes": self.outbound_max_bytes,
            "outbound_total_max_bytes": self.outbound_total_max_bytes,
            "outbound_max_messages": self.outbound_max_messages,
            "outbound_memory_max_bytes": self.outbound.memory_max_bytes,
            "moving": len(self.moves),
            "moves": [self._move_report(key, move) for key, move in sorted(self.moves.items())[:MOVES_SHOWN_MAX]],
            "held": len(self.held),
            "parked": sum(len(messages) for messages in self.parked.values()),
            # messages that left or waited for a move since this node started, by how
            "moved": {how: self.counts[how] for how in MOVED_COUNTS},
            "cold_sweeps": self.counts["cold_sweeps"],
            "in_transit": self.in_transit(),
            "members": self.members,
        }

    def _move_report(self, key: tuple[str, str], move: tuple) -> dict:
        """What move `key` waits for, as this node sees it: the members yet to clear, and what keeps this
        one from clearing (_drive_moves' conditions, spelled out for an operator)."""
        from_node, to_node, waiting = move
        blocks = []
        if self.node_id in waiting:
            if not self.router.ready:
                blocks.append("this node's replica is not current yet")
            if from_node == self.node_id:
                if waiting != {self.node_id}:
                    blocks.append("the other members' clears (the old owner clears last)")
                if self._warm_here(key):
                    queue = self.broker.queues[key[0]]
                    group_key = queue.group_key_of_route(key[1])
                    blocks.append(f"{queue.group_available(group_key)} queued and "
                                  f"{queue.group_in_flight(group_key)} in flight here")
                if self._sweep_pending(key):
                    blocks.append("a sweep of the queue's cold tail"
                                  + (" (reading)" if key[0] in self._sweeps else " (not started)"))
                if key in self.parked:
                    parked = self.parked[key]
                    blocks.append(f"{len(parked)} parked here, relayed once nothing else of the group is left here"
                                  + ("; the first is not known on disk yet" if parked[0].seq in self._parking else ""))
                if not self._paid(key, to_node):
                    channel = self.outbound.channels.get(to_node)
                    blocks.append(f"{to_node} to acknowledge forward seq {self._owed.get(key, 0)} (recovered up "
                                  f"to {self._recovered_top.get(to_node, 0)}; its channel starts at "
                                  f"{next(iter(channel)) if channel else None})")
            elif count := self.outbound.count(from_node, key):
                blocks.append(f"{from_node} to acknowledge messages of the group forwarded to it ({count} left)")
        return {"queue": key[0], "group": key[1], "from": from_node, "to": to_node, "waiting": sorted(waiting),
                "here": blocks}

    def close(self) -> None:
        self.closed = True


def _chunks(items: list) -> list[list]:
    """Raft commands of at most CLAIM_KEYS_MAX keys each."""
    return [items[start:start + CLAIM_KEYS_MAX] for start in range(0, len(items), CLAIM_KEYS_MAX)]


def _moved_copy(old: Message) -> Message:
    """A message leaving where it was (a queue, a park, a cold tail) for a queue or an outbound channel:
    a new Message (no seq, delivery count or state of its own yet) with what travels with it."""
    return Message(old.payload, old.group_id, expires_at_ms=old.expires_at_ms, closes_group=old.closes_group,
                   enqueued_at_ms=old.enqueued_at_ms)


def _seq_of_message(message: Message) -> int:
    return message.seq


def _taken(messages: list, owner: str, queue: str, name: str):
    """`messages` (in seq order) as (seq, owner, queue, name, group id, size, message or None when it has
    no body), each let go of by the list as it is taken, and the list left empty; seqs are unique across
    a node, so the merge never compares on."""
    for index, message in enumerate(messages):
        messages[index] = None
        yield (message.seq, owner, queue, name, message.group_id, message.size_bytes,
               message if message.payload is not None else None)
    messages.clear()


# entries of a bodiless backlog cut off its arrays at once as recovery takes them (see _taken_bodiless)
RECOVERY_CHUNK_ENTRIES = 4096


def _taken_bodiless(backlog, owner: str, queue: str, name: str):
    """A journal's bodiless backlog (parallel seqs, group ids, sizes; in seq order) as _taken's tuples,
    and the backlog left empty. Its arrays shrink as they are taken, a chunk at a time, or they would
    all be held until the last record is made, on top of every record (24 bytes an entry): reversed in
    place first, each chunk is cut off their ends."""
    columns = seqs, group_ids, size_bytes = backlog.seqs, backlog.group_ids, backlog.size_bytes
    for column in columns:
        column.reverse()
    while seqs:
        end = len(seqs)
        start = max(0, end - RECOVERY_CHUNK_ENTRIES)
        for index in range(end - 1, start - 1, -1):
            yield seqs[index], owner, queue, name, group_ids[index], size_bytes[index], None
        for column in columns:
            del column[start:]
