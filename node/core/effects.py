"""What the core asks its adapters to do. Plain records; the adapters carry them out in order.

One vocabulary for the node shell's (node/core/shell.py) effects out: each adapter carries them out with
one table from effect type to method (node/amqp/executor.py, tests/sim/node_model.py). Longer than 300
lines because it is one record per effect, each with its rule: split, one vocabulary would be scattered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from node.core.errors import GrouperError
from node.core.dispatch.message import Message


class Deliver:
    """Send `message` on consumer `consumer_id`'s link. Browsers get copies, never unsettled."""

    __slots__ = ("consumer_id", "delivery_id", "message", "first_for_consumer", "browse")

    def __init__(self, consumer_id, delivery_id: int, message: Message, first_for_consumer: bool,
                 browse: bool):
        self.consumer_id = consumer_id
        self.delivery_id = delivery_id
        self.message = message
        self.first_for_consumer = first_for_consumer
        self.browse = browse


@dataclass(frozen=True, slots=True)
class DetachConsumer:
    """Close the consumer's link with `error` as the condition; its state is already gone."""

    consumer_id: object
    error: GrouperError


@dataclass(frozen=True, slots=True)
class Stored:
    """Journal `message` under `queue`: a message of a durable queue was added (journal it before confirming
    the producer), or the cluster keeps one under a journal name of its own (an outbound channel, a park).
    `origin` (source, forward seq) of a forwarded or relayed message, for the simulation's invariants only."""

    queue: str
    message: Message
    origin: tuple | None = None


@dataclass(frozen=True, slots=True)
class Declared:
    """Journal a declaration: a durable queue's settings, or a cluster record (a seq reservation, a source's
    high-water mark): {"name": ..., ...}. Journalled before the messages that need it."""

    values: dict


@dataclass(frozen=True, slots=True)
class Enqueued:
    """A message entered a traced queue (settings.trace): the adapter writes its trace line. Comes before
    the effects of the enqueue itself, so a delivery it causes is traced after it."""

    queue: str
    message: Message


@dataclass(frozen=True, slots=True)
class PageIn:
    """Read these paged-out bodies of durable queue `queue` back from the journal, then hand them to
    Broker.page_in on the engine loop (node/core/dispatch/paging.py). Seqs in the order dispatch needs them."""

    queue: str
    seqs: tuple


@dataclass(frozen=True, slots=True)
class ReadRecords:
    """Read the next `count` live records of durable queue `queue` above seq `after_seq` back from the
    journal whole (record and body), then hand them to Broker.promote on the engine loop: a cold tail's
    oldest (node/core/dispatch/cold.py). The read stops early once the bodies read reach `max_bytes` (the record
    that reaches it included), and only then or at the journal's last record of the queue."""

    queue: str
    after_seq: int
    count: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Removed:
    """A message of a durable queue is gone for good (accepted, rejected, expired, purged, moved)."""

    queue: str
    seq: int


@dataclass(frozen=True, slots=True)
class Withdrawn:
    """A durable send was taken back, never delivered, because its journal write failed: its STORE never
    reached the disk, so there is nothing to journal; its producer is refused."""

    queue: str
    seq: int


@dataclass(frozen=True, slots=True)
class Dropped:
    """A message was discarded without a consumer accepting it; reason is for logs and metrics."""

    queue: str
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A message left `queue` for its dead-letter queue (stored there as `dead_letter_seq`); for logs."""

    queue: str
    seq: int
    dead_letter_queue: str
    dead_letter_seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class Kept:
    """A message that should have been dead-lettered stays in `queue`: no dead-letter queue could take it."""

    queue: str
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class Delayed:
    """A failed delivery waits out its redelivery delay: the adapter ticks the core at `until_ms`."""

    queue: str
    seq: int
    until_ms: int


# ---- what the node shell (node/core/shell.py) asks its adapter to do with producers, consumers, waiters --
# `incoming` is the adapter's handle on a producer's delivery, `target` a consumer's (consumer, delivery):
# opaque to the core, handed back untouched.

class AcceptSend(NamedTuple):
    """Settle a producer's delivery as accepted. `tell` False: the producer settled it first, so no outcome
    goes back (only a multicast send's tally counts it)."""

    incoming: object
    tell: bool = True


class RefuseUnstored(NamedTuple):
    """Reject a producer's delivery whose journal batch failed with `reason` (the journal's failure, which
    picks the wire condition); `error` says whether the message was taken back (StoreFailed)."""

    incoming: object
    error: GrouperError
    reason: object


class Confirm(NamedTuple):
    """A consumer's outcome that removed a message is on disk: settle its delivery (`target`)."""

    target: object


class Unconfirmed(NamedTuple):
    """A consumer's outcome could not be stored (its REMOVE was in a failed batch): its delivery stays
    unsettled; CloseUnstored follows."""

    target: object


class CloseUnstored(NamedTuple):
    """Close the links of these consumers (the targets of a failed batch, in order, repeats included)
    whose settlements' removals failed with `reason`: a restart would deliver those messages again."""

    targets: list
    reason: object


class Flushed(NamedTuple):
    """Call `fn(reason)`, an after_flush callback of the adapter: everything journalled before it was
    registered is on disk (reason None) or failed."""

    fn: object
    reason: object


class WriteFailed(NamedTuple):
    """The journal batch failed with `reason`: `taken_back` sends withdrawn, `outcome_unknown` already
    handed out (their producers are told so). For the log; the refusals follow as effects of their own."""

    reason: object
    taken_back: int
    outcome_unknown: int


# ---- what the cluster protocol (node/core/cluster/) asks its adapter to do ----------------------------
# Named tuples: built once per message on the hot path, where a frozen dataclass costs twice as much.
# `incoming` is the server's handle on a producer's delivery and `reply_to` the gRPC call waiting for a
# forwarded batch: opaque to the core, handed back untouched.

class EnqueueLocal(NamedTuple):
    """This node owns the group: enqueue in the broker, then accept once stored (or refuse)."""

    incoming: object
    queue: str
    message: Message
    durable: bool
    producer_settled: bool
    now_ms: int


class AcceptWhenStored(NamedTuple):
    """Confirm the producer once the current journal batch is on disk (at once if not durable)."""

    incoming: object
    durable: bool
    producer_settled: bool


class Refuse(NamedTuple):
    """Reject the producer's delivery with `error`; the message went nowhere."""

    incoming: object
    error: GrouperError


class AfterFlush(NamedTuple):
    """Once everything journalled so far is on disk, or failed, hand `what` back to the protocol's
    `flushed(what, reason, now_ms)` (reason None: on disk). `what` is the continuation of the concern
    that asked (node/core/cluster/), opaque to the adapters."""

    what: object


class SubmitForward(NamedTuple):
    """Give `entries` (durable here already) to the forwarder of `owner`, in this order."""

    owner: str
    entries: list


class ReadOutbound(NamedTuple):
    """Read paged entries of `owner`'s outbound channel back from the journal whole: `reads` is
    ((journal name, seqs), ...); each name's answer (seq -> Message | None) goes to the protocol's
    `outbound_read` (node/core/cluster/outbound.py)."""

    owner: str
    reads: tuple


class ProposeClaim(NamedTuple):
    """Propose routes for `keys` [(queue, group)]; a failure comes back through `claim_failed`."""

    keys: list
    now_ms: int


class ProposeTouch(NamedTuple):
    """Propose refreshing [(queue, group, node)]; a failure comes back through `touch_failed`."""

    entries: list
    now_ms: int


class ProposeMoveClear(NamedTuple):
    """Propose RouteTable.move_clear(entries, this node): [(queue, group, from_node, to_node)]. A lost
    proposal is made again at a later tick while the log still waits for this node."""

    entries: list


class ReportConsumers(NamedTuple):
    counts: dict
    now_ms: int


class Register(NamedTuple):
    """Propose this node's addresses; success comes back through `registered`."""

    now_ms: int


class Reply(NamedTuple):
    """Answer a forwarded batch: the source's high water now stored here, or the error that stopped it."""

    reply_to: object
    high_water: int | None
    error: GrouperError | None


class StopNode(NamedTuple):
    """Stop this node at once, without a clean shutdown: what it holds in memory is no longer what its
    journal holds, and nothing short of a restart from the journal makes them agree again. The
    supervisor restarts it; recovery and the peers' resends bring back everything that was promised."""

    reason: str


class ProposeQueueSeeds(NamedTuple):
    """Propose the config file's queues as cluster-wide definitions where none is known (seed=True):
    settings dicts; the adapter reports back through queues_seeded / queue_seeds_failed."""

    seeds: tuple


class QueueDeleted(NamedTuple):
    """The cluster deleted `queue` and the broker dropped it here: detach its producers, and forget its
    journalled messages when it was durable."""

    queue: str
    durable: bool


class ProposeDefinition(NamedTuple):
    """Propose a queue this node made on a client's behalf as a cluster-wide definition (seed=False): a
    settings dict; the outcome comes back through ClusterProtocol.definition_proposed."""

    values: dict


class ProposeQueueDeletion(NamedTuple):
    """Propose deleting queue `name` cluster-wide (a subscription whose link ended, or whose node is
    gone), as the replica knew the definitions at `seen_revision`; the outcome comes back through
    ClusterProtocol.deletion_proposed."""

    name: str
    seen_revision: int
