"""A naive reference model of one queue's group dispatch, to judge the core one step at a time.

The model never chooses. The core decides who gets which message; the model checks every effect it
returns against the rules, and after each step checks that nothing deliverable was left waiting and
that its books agree with `Queue.stats()`. Plain dicts and linear scans: slow and obvious on purpose.

What it holds the core to:
- a message is delivered only while available and unexpired, to an acquiring consumer with credit,
  once dispatch is open; a browser sees each available message at most once and acquires nothing;
- a message of group G is never delivered while an earlier message of G is available; and unless
  the queue rebalances without a pause (which the settings document as unordered), never while G is
  held (closing, or paused by a reset) nor while another consumer holds a message of G;
- a group has at most one owner, the one the core reports; `first_for_consumer` is set exactly when
  a consumer takes a group it did not own;
- a failed delivery waits out its redelivery delay (`redelivery_delay_for_ms`): it is not delivered
  before, and since it is still available no later message of its group overtakes it; past
  `delivery_count_max` it goes to the dead-letter queue (always there: auto-created or declared);
- nothing is lost: each message sent is accepted, rejected, dead-lettered, expired, or still queued;
  nothing is duplicated: a message is delivered again only after its last delivery came back;
- journal effects: one `Stored` per message sent, one `Removed` per message gone, and a dead letter
  is `Stored` in the dead-letter queue before it is `Removed` from its source;
- a failed journal batch (`taken_back`): each of its messages that no consumer or browser has seen
  and that is still queued is withdrawn (a `Withdrawn`, no `Removed`: it was never stored) and never
  delivered; a seen one is reported as handed out and left where it is.
"""

from __future__ import annotations

import zlib
from collections import Counter

from node.core.effects import (DeadLettered, Delayed, Deliver, DetachConsumer, Dropped, Kept, ReadRecords, Removed, Stored,
                               Withdrawn)
from node.core.dispatch.message import Outcome
from node.core.dispatch.settings import QueueSettings

AVAILABLE = "available"
ACQUIRED = "acquired"
GONE = "gone"


class ModelError(AssertionError):
    pass


def expect(condition: bool, problem: str) -> None:
    if not condition:
        raise ModelError(problem)


class ModelMessage:
    def __init__(self, seq: int, payload: bytes, group_id, key, expires_at_ms: int, closes_group: bool):
        self.seq = seq
        self.payload = payload
        self.group_id = group_id
        self.key = key
        self.expires_at_ms = expires_at_ms
        self.closes_group = closes_group
        self.delivery_count = 0
        self.available_at_ms = 0  # a failed delivery waits until then
        self.state = AVAILABLE
        self.holder = None  # consumer id while acquired
        self.seen = False  # a consumer or a browser has had it: a failed write cannot take it back

    def expired(self, now_ms: int) -> bool:
        return bool(self.expires_at_ms) and self.expires_at_ms <= now_ms

    def __repr__(self) -> str:
        return f"m{self.seq}({self.group_id!r}, {self.state})"


class ModelConsumer:
    def __init__(self, browse: bool):
        self.browse = browse
        self.credit = 0
        self.unsettled: dict[int, int] = {}  # delivery id -> seq, in delivery order
        self.next_delivery_id = 0
        self.cursor_seq = 0  # browsers: last seq seen
        self.rebalance_due = False


class Model:
    def __init__(self, settings: QueueSettings, *, broker_default_group: str = ""):
        self.settings = settings
        self.name = settings.name
        self.dead_letter_queue = settings.dead_letter_queue_name
        self.grouping = settings.grouping
        # Rebalancing without a pause hands a group over with messages in flight: documented as
        # unordered, so only the rules that do not depend on owners are checked then.
        self.ordered = not (settings.group_rebalance and not settings.group_rebalance_pause_dispatch)
        default = settings.effective_default_group
        if not settings.default_group and settings.group_policy == "shared" and broker_default_group:
            default = broker_default_group
        self.default_group = default
        self.now_ms = 0
        self.messages: dict[int, ModelMessage] = {}
        self.by_payload: dict[bytes, int] = {}
        self.consumers: dict[object, ModelConsumer] = {}
        self.consumer_of: dict = {}  # group key -> consumer id
        self.held: set = set()  # group keys with no dispatch until nothing of them is acquired
        self.started = False
        self.first_attach_ms: int | None = None
        self.outcomes: Counter = Counter()  # accepted, rejected, expired, dead
        self.delivered_total = 0
        self.dead_letter_depth = 0
        self._begin_step()

    # ---- the rules of the model's own bookkeeping --------------------------------------------

    def key_of(self, group_id):
        if not self.grouping:
            return None
        if group_id is None:
            group_id = self.default_group
            if group_id is None:
                return None
        buckets = self.settings.group_buckets
        if buckets > 0:
            return zlib.crc32(group_id.encode("utf-8", "surrogatepass")) % buckets
        return group_id

    def _acquiring(self) -> dict:
        return {cid: c for cid, c in self.consumers.items() if not c.browse}

    def _takers(self) -> list:
        return [cid for cid, c in self.consumers.items() if not c.browse and c.credit > 0]

    def _rules_open(self) -> bool:
        s = self.settings
        count_rule = s.consumers_before_dispatch > 0
        time_rule = s.time_before_dispatch_ms > 0
        if not count_rule and not time_rule:
            return True
        if count_rule and len(self._takers()) >= s.consumers_before_dispatch:
            return True
        return time_rule and self.first_attach_ms is not None and \
            self.now_ms >= self.first_attach_ms + s.time_before_dispatch_ms

    def _live(self, state=None) -> list[ModelMessage]:
        return [m for m in self.messages.values() if m.state != GONE and (state is None or m.state == state)]

    def _acquired_of(self, key) -> list[ModelMessage]:
        return [m for m in self.messages.values() if m.state == ACQUIRED and m.key == key]

    def existing_keys(self) -> list:
        keys = {m.key for m in self._live() if m.key is not None} | set(self.consumer_of)
        return sorted(keys, key=str)

    def _gone(self, message: ModelMessage, why: str) -> None:
        message.state = GONE
        message.holder = None
        self.outcomes[why] += 1
        if self.settings.durable:
            self._expect_removed.add(message.seq)

    def _dead_letter(self, message: ModelMessage) -> None:
        if self.dead_letter_queue:
            self._dead_this_step.add(message.seq)

    def _after_settle(self, key) -> None:
        if key is None or not self.ordered or self._acquired_of(key):
            return
        if key in self.consumer_of and (key in self.held or self.settings.group_policy == "shared"):
            del self.consumer_of[key]
        self.held.discard(key)

    def _return(self, message: ModelMessage, delivery_failed: bool) -> None:
        """A delivery came back: count it, then make the message available, or drop it if it has
        reached delivery_count_max or expired while it was out."""
        if delivery_failed:
            message.delivery_count += 1
        limit = self.settings.delivery_count_max
        if limit and message.delivery_count >= limit:
            self._gone(message, "dead")
            self._expect_dead_lettered.add(message.seq)  # its DeadLettered
            self._dead_letter(message)
        elif message.expired(self.now_ms):
            self._gone(message, "expired")
            self._expect_dropped_ttl.add(message.seq)
        else:
            message.state = AVAILABLE
            message.holder = None
            if delivery_failed and self.settings.redelivery_delay_ms:
                message.available_at_ms = self.now_ms + self.settings.redelivery_delay_for_ms(message.delivery_count)

    def _reset(self, keys, pause: bool) -> None:
        if not self.ordered:
            return
        for key in list(keys):
            if key not in self.consumer_of:
                continue
            if pause and self._acquired_of(key):
                self.held.add(key)
            else:
                del self.consumer_of[key]
                self.held.discard(key)

    # ---- steps: the test calls the core, tells the model what it did, then applies the effects --

    def _begin_step(self) -> None:
        self._expect_stored: set[int] = set()
        self._expect_removed: set[int] = set()
        self._unexplained_removed: set[int] = set()
        self._expect_dead_lettered: set[int] = set()
        self._expect_dropped_ttl: set[int] = set()  # expired while acquired, dropped on return
        self._dead_this_step: set[int] = set()
        self._dead_stored: set[int] = set()
        self._expect_withdrawn: set[int] = set()
        self._delivered_this_step = False

    def begin(self, now_ms: int, *, dispatches: bool = True) -> None:
        """`dispatches=False` for calls that do not run dispatch (a browser attaching or leaving):
        the core has not looked at the clock, so expiry and the dispatch delay are judged as of the
        last call that did."""
        expect(now_ms >= self.now_ms, "time went backwards in the test")
        if dispatches:
            self.now_ms = now_ms
        self._begin_step()

    def sent(self, seq: int, payload: bytes, group_id, expires_at_ms: int, closes_group: bool) -> None:
        message = ModelMessage(seq, payload, group_id, self.key_of(group_id), expires_at_ms, closes_group)
        self.messages[seq] = message
        self.by_payload[payload] = seq
        if self.settings.durable:
            self._expect_stored.add(seq)

    def taken_back(self, seqs: list[int], handed_out: list[bool]) -> None:
        """The journal batch holding `seqs` failed; `handed_out` is what the core reported for each."""
        expect(len(handed_out) == len(seqs), f"take_back answered {handed_out} for {seqs}")
        for seq, out in zip(seqs, handed_out):
            message = self.messages[seq]
            expect(out == message.seen, f"{message}: handed_out={out}, but seen={message.seen}")
            if not message.seen and message.state == AVAILABLE:
                message.state = GONE
                self.outcomes["withdrawn"] += 1
                self._expect_withdrawn.add(seq)

    def attached(self, consumer_id, browse: bool) -> None:
        self.consumers[consumer_id] = ModelConsumer(browse)
        if browse:
            return
        if self.first_attach_ms is None:
            self.first_attach_ms = self.now_ms
        # the rebalance a consumer brings happens when it first grants credit
        self.consumers[consumer_id].rebalance_due = self.settings.group_rebalance

    def credited(self, consumer_id, credit: int) -> None:
        consumer = self.consumers[consumer_id]
        consumer.credit = credit
        if consumer.rebalance_due and credit > 0:
            consumer.rebalance_due = False
            self._reset(list(self.consumer_of), self.settings.group_rebalance_pause_dispatch)

    def reset(self, key=None) -> None:
        self._reset(list(self.consumer_of) if key is None else [key], pause=True)

    def settled(self, consumer_id, delivery_id: int, outcome: Outcome, delivery_failed: bool) -> None:
        seq = self.consumers[consumer_id].unsettled.pop(delivery_id)
        message = self.messages[seq]
        if outcome is Outcome.ACCEPTED:
            self._gone(message, "accepted")
        elif outcome is Outcome.REJECTED:
            self._gone(message, "rejected")
            self._expect_dead_lettered.add(message.seq)
            self._dead_letter(message)
        else:
            self._return(message, outcome is Outcome.MODIFIED and delivery_failed)
        self._after_settle(message.key)

    def detached(self, consumer_id) -> None:
        consumer = self.consumers.pop(consumer_id)
        if consumer.browse:
            return
        owned = [key for key, owner in self.consumer_of.items() if owner == consumer_id]
        touched = set(owned)
        for seq in consumer.unsettled.values():
            message = self.messages[seq]
            self._return(message, delivery_failed=True)
            if message.key is not None:
                touched.add(message.key)
        for key in owned:
            del self.consumer_of[key]
        for key in sorted(touched, key=str):
            self._after_settle(key)
        if not self._acquiring():
            self.started = False
            self.first_attach_ms = None

    # ---- effects -----------------------------------------------------------------------------

    def apply(self, effects: list) -> None:
        for effect in effects:
            if isinstance(effect, Deliver):
                if effect.browse:
                    self._browse(effect)
                else:
                    self._deliver(effect)
            elif isinstance(effect, Stored):
                self._stored(effect)
            elif isinstance(effect, Removed):
                self._removed(effect)
            elif isinstance(effect, Dropped):
                self._dropped(effect)
            elif isinstance(effect, Withdrawn):
                expect(effect.queue == self.name and effect.seq in self._expect_withdrawn, f"unexpected {effect}")
                self._expect_withdrawn.discard(effect.seq)
            elif isinstance(effect, DeadLettered):
                expect(effect.queue == self.name and effect.seq in self._expect_dead_lettered
                       and effect.dead_letter_queue == self.dead_letter_queue, f"unexpected {effect}")
                self._expect_dead_lettered.discard(effect.seq)
            elif isinstance(effect, Delayed):
                message = self.messages.get(effect.seq)
                expect(message is not None and message.available_at_ms == effect.until_ms, f"unexpected {effect}")
            elif isinstance(effect, ReadRecords):
                pass  # the journal's work (tests/unit/test_cold.py answers it); cold messages are not delivered
            elif isinstance(effect, (DetachConsumer, Kept)):
                raise ModelError(f"unexpected {effect}")
            else:
                raise ModelError(f"unknown effect {effect!r}")

    def _deliver(self, effect: Deliver) -> None:
        cid = effect.consumer_id
        consumer = self.consumers.get(cid)
        expect(consumer is not None and not consumer.browse, f"delivery to {cid!r}, not an acquiring consumer")
        expect(consumer.credit > 0, f"delivery to {cid!r} without credit")
        if not self.started:
            expect(self._rules_open(), f"delivery to {cid!r} while dispatch is held")
            self.started = True
        message = self.messages.get(effect.message.seq)
        expect(message is not None, f"delivery of unknown seq {effect.message.seq}")
        expect(message.state == AVAILABLE, f"{message} delivered to {cid!r} while not available "
                                           f"(duplicate or lost-then-found)")
        expect(not message.expired(self.now_ms), f"{message} delivered after it expired")
        expect(message.available_at_ms <= self.now_ms,
               f"{message} delivered at {self.now_ms}, before its redelivery delay ends at {message.available_at_ms}")
        expect(effect.message.delivery_count == message.delivery_count,
               f"{message} delivered with delivery_count {effect.message.delivery_count}, "
               f"expected {message.delivery_count}")
        expect(effect.delivery_id == consumer.next_delivery_id,
               f"delivery id {effect.delivery_id} to {cid!r}, expected {consumer.next_delivery_id}")
        key = message.key
        # a delayed message holds back its group, but never the lane of messages without a group
        earlier = [m for m in self._live(AVAILABLE) if m.key == key and m.seq < message.seq
                   and not (key is None and m.available_at_ms > self.now_ms)]
        expect(not earlier, f"{message} delivered to {cid!r} while earlier {earlier} of its "
                            f"{'group' if key is not None else 'lane'} were available")
        if key is None:
            expect(not effect.first_for_consumer, f"{message} without group flagged first_for_consumer")
        elif self.ordered:
            expect(key not in self.held, f"{message} delivered while group {key!r} is held")
            others = {m.holder for m in self._acquired_of(key)} - {cid}
            expect(not others, f"{message} delivered to {cid!r} while {others} hold messages of {key!r}")
            owner = self.consumer_of.get(key)
            expect(owner in (None, cid), f"{message} delivered to {cid!r}; group {key!r} is owned by {owner!r}")
            expect(effect.first_for_consumer == (owner != cid),
                   f"{message} to {cid!r}: first_for_consumer={effect.first_for_consumer}, owner was {owner!r}")
            self.consumer_of[key] = cid
            if message.closes_group:
                self.held.add(key)
        message.state = ACQUIRED
        message.holder = cid
        message.seen = True
        consumer.unsettled[effect.delivery_id] = message.seq
        consumer.next_delivery_id += 1
        consumer.credit -= 1
        self.delivered_total += 1
        self._delivered_this_step = True

    def _browse(self, effect: Deliver) -> None:
        cid = effect.consumer_id
        consumer = self.consumers.get(cid)
        expect(consumer is not None and consumer.browse, f"browse delivery to {cid!r}, not a browser")
        expect(consumer.credit > 0, f"browse delivery to {cid!r} without credit")
        message = self.messages.get(effect.message.seq)
        expect(message is not None and message.state == AVAILABLE, f"browser {cid!r} shown {message}")
        expect(not message.expired(self.now_ms), f"browser {cid!r} shown expired {message}")
        expect(message.seq > consumer.cursor_seq, f"browser {cid!r} shown {message} again or out of order")
        expect(not effect.first_for_consumer, "a browse copy flagged first_for_consumer")
        expect(effect.delivery_id == consumer.next_delivery_id, f"browse delivery id {effect.delivery_id}")
        consumer.cursor_seq = message.seq
        consumer.next_delivery_id += 1
        consumer.credit -= 1
        message.seen = True

    def _stored(self, effect: Stored) -> None:
        if effect.queue == self.name:
            expect(effect.message.seq in self._expect_stored, f"unexpected {effect}")
            self._expect_stored.discard(effect.message.seq)
        elif effect.queue == self.dead_letter_queue:
            original = self.by_payload.get(effect.message.payload)
            expect(original in self._dead_this_step and original not in self._dead_stored,
                   f"dead-letter queue stored {effect.message.payload!r}, which is not a dead letter of this step")
            self._dead_stored.add(original)
            self.dead_letter_depth += 1
        else:
            raise ModelError(f"Stored for unknown queue: {effect}")

    def _removed(self, effect: Removed) -> None:
        if effect.queue == self.dead_letter_queue:
            return  # an expiry in the dead-letter queue; its Dropped follows
        expect(effect.queue == self.name, f"Removed for unknown queue: {effect}")
        seq = effect.seq
        if seq in self._expect_removed:
            self._expect_removed.discard(seq)
            if seq in self._dead_this_step:
                expect(seq in self._dead_stored, f"m{seq} removed before it was stored as a dead letter")
        else:
            expect(seq not in self._unexplained_removed, f"m{seq} removed twice")
            self._unexplained_removed.add(seq)  # an expiry: its Dropped comes next

    def _dropped(self, effect: Dropped) -> None:
        if effect.queue == self.dead_letter_queue:
            expect(effect.reason == "ttl expired", f"unexpected {effect}")
            self.dead_letter_depth -= 1
            return
        expect(effect.queue == self.name, f"Dropped for unknown queue: {effect}")
        message = self.messages.get(effect.seq)
        if effect.reason == "ttl expired" and effect.seq in self._expect_dropped_ttl:
            self._expect_dropped_ttl.discard(effect.seq)
        elif effect.reason == "ttl expired":
            expect(message is not None and message.state == AVAILABLE, f"{effect} of {message}")
            expect(message.expired(self.now_ms), f"{message} dropped before it expired (now {self.now_ms})")
            if self.settings.durable:
                expect(effect.seq in self._unexplained_removed, f"{message} expired without a Removed")
                self._unexplained_removed.discard(effect.seq)
            self._gone(message, "expired")
            self._expect_removed.discard(effect.seq)  # an expiry frees no group: only settling does
        else:
            raise ModelError(f"unexpected {effect}")

    # ---- end of step -------------------------------------------------------------------------

    def end(self, queue, dead_letter_queue=None, *, ticked: bool = False) -> None:
        expect(not self._expect_stored, f"no Stored for {sorted(self._expect_stored)}")
        expect(not self._expect_removed, f"no Removed for {sorted(self._expect_removed)}")
        expect(not self._unexplained_removed, f"Removed without a reason for {sorted(self._unexplained_removed)}")
        expect(not self._expect_dead_lettered, f"no DeadLettered for {sorted(self._expect_dead_lettered)}")
        expect(not self._expect_dropped_ttl, f"expired {sorted(self._expect_dropped_ttl)} came back undropped")
        expect(not self._expect_withdrawn, f"no Withdrawn for {sorted(self._expect_withdrawn)}")
        cold = _cold_seqs(queue, [m.seq for m in self._live()])
        if ticked:  # a cold message expires once read back (node/core/dispatch/cold.py)
            stale = [m for m in self._live(AVAILABLE) if m.expired(self.now_ms) and m.seq not in cold]
            expect(not stale, f"{stale} expired and still queued after tick({self.now_ms})")
        if self.dead_letter_queue:
            expect(self._dead_stored == self._dead_this_step,
                   f"dead letters {sorted(self._dead_this_step - self._dead_stored)} not stored")
        if not self.started and self._takers() and self._rules_open():
            self.started = True  # the core opened dispatch this step and found nothing to send
        self._check_books(queue, dead_letter_queue)
        self._check_owners(queue, cold)
        self._check_progress(cold)

    def _check_books(self, queue, dead_letter_queue) -> None:
        stats = queue.stats()
        live = self._live()
        acquired = self._live(ACQUIRED)
        sent = len(self.messages)
        settled = sum(self.outcomes.values())
        expect(sent == settled + len(live), "model lost count")
        expect(stats["enqueued_total"] == sent, f"enqueued_total {stats['enqueued_total']}, sent {sent}")
        expect(stats["depth_messages"] == len(live),
               f"depth {stats['depth_messages']}, model has {len(live)} live ({dict(self.outcomes)} gone)")
        expect(stats["depth_bytes"] == sum(len(m.payload) for m in live), "depth_bytes differs")
        expect(stats["acquired_messages"] == len(acquired),
               f"acquired {stats['acquired_messages']}, model has {len(acquired)}")
        expect(stats["delivered_total"] == self.delivered_total, "delivered_total differs")
        expect(stats["consumers"] == len(self._acquiring()), "consumer count differs")
        expect(stats["browsers"] == len(self.consumers) - len(self._acquiring()), "browser count differs")
        if dead_letter_queue is not None:
            depth = dead_letter_queue.stats()["depth_messages"]
            expect(depth == self.dead_letter_depth, f"dead-letter depth {depth}, model {self.dead_letter_depth}")

    def _check_owners(self, queue, cold: set) -> None:
        if not self.grouping:
            expect(queue.stats()["groups"] == 0, "groups tracked with grouping off")
            return
        if not self.ordered:
            return
        for key in self.existing_keys():
            holders = {m.holder for m in self._acquired_of(key)}
            expect(len(holders) <= 1, f"group {key!r} has messages acquired by {holders}")
            if holders:
                expect(self.consumer_of.get(key) in holders, f"group {key!r} held by {holders}, owned by {self.consumer_of.get(key)!r}")
        core = {row["group"]: row["consumer"] for row in queue.group_rows()}
        # a group whose every message is in the cold tail, and has no owner, is not known to the core yet
        warm_keys = {m.key for m in self._live() if m.seq not in cold} | set(self.consumer_of)
        model = {str(key): self.consumer_of.get(key) for key in self.existing_keys() if key in warm_keys}
        expect(core == model, f"groups and owners differ: core {core}, model {model}")

    def _check_progress(self, cold: set) -> None:
        """After a step the core is quiescent: nothing it could deliver is left waiting (but what waits in
        a cold tail for the journal: node/core/dispatch/cold.py)."""
        for cid, consumer in self.consumers.items():
            if consumer.browse and consumer.credit > 0:
                unseen = [m for m in self._live(AVAILABLE)
                          if m.seq > consumer.cursor_seq and not m.expired(self.now_ms) and m.seq not in cold]
                expect(not unseen, f"browser {cid!r} has credit {consumer.credit} but was not shown {unseen}")
        takers = self._takers()
        if not takers or not self.started:
            return
        waiting: set = set()  # groups whose head waits out a redelivery delay
        for message in sorted(self._live(AVAILABLE), key=lambda m: m.seq):
            if message.expired(self.now_ms) or message.seq in cold:
                continue
            key = message.key
            if message.available_at_ms > self.now_ms or key in waiting:
                if key is not None:
                    waiting.add(key)
                continue
            if key is None:
                raise ModelError(f"{message} without group waits while {takers} have credit")
            if not self.ordered or key in self.held:
                continue
            owner = self.consumer_of.get(key)
            expect(not (owner is None or owner in takers),
                   f"{message} waits while {owner or takers!r} could take group {key!r}")

    # ---- for the test to pick targets --------------------------------------------------------

    def unsettled(self) -> list[tuple]:
        return [(cid, did) for cid, c in sorted(self.consumers.items(), key=lambda kv: str(kv[0]))
                for did in c.unsettled]


def _cold_seqs(queue, live_seqs) -> set:
    """Of `live_seqs`, those in the queue's cold tail (node/core/dispatch/cold.py): all above its after_seq while it
    has one, being the queue's newest."""
    cold = getattr(queue, "cold", None)
    if cold is None or not cold.count:
        return set()
    return {seq for seq in live_seqs if seq > cold.after_seq}
