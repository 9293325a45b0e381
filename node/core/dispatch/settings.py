"""Per-queue settings: one frozen record, validated once, named as qpid-config and Artemis name them.

Every limit carries its unit. `validate()` holds the cross-field rules; a bad value raises
`InvalidConfig` naming the key, so a config file, a flag or an admin call all fail alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from node.core.errors import InvalidConfig
from node.core.replication.assignment import check_replication_factor

POLICIES = ("exclusive", "shared", "none")
QPID_DEFAULT_GROUP = "qpid.no-group"
GROUP_ID_LENGTH_MAX_CHARS = 4096  # hard ceiling for group_id_length_max_chars
REDELIVERY_DELAY_MULTIPLIER_MAX = 100.0  # hard ceiling for redelivery_delay_multiplier
REBALANCE_MODES = ("reset", "incremental")  # issue 30: group_rebalance_mode
DEAD_LETTER_SUFFIX = ".DLQ"  # the default dead-letter queue of queue Q is Q.DLQ (as Artemis names them)


@dataclass(frozen=True)
class QueueSettings:
    name: str
    group_policy: str = "exclusive"  # exclusive (sticky), shared (sequenced), none
    group_header: str = ""  # application property holding the group id; "" = properties.group-id or JMSXGroupID
    default_group: str = ""  # group of messages without a group id; "" = qpid.no-group in shared, ungrouped in exclusive
    group_first_key: str = ""  # application property set true on a group's new consumer's first message; "" = off
    group_rebalance: bool = False  # reset groups' consumers when a newly attached consumer first grants credit
    group_rebalance_pause_dispatch: bool = False  # hold reassigned groups until their in-flight messages settle
    group_buckets: int = -1  # -1 every group tracked, 0 grouping off, N>0 group ids hashed into N buckets
    consumers_before_dispatch: int = 0  # hold dispatch until this many consumers have granted credit; 0 = off
    time_before_dispatch_ms: int = 0  # or until this long after the first consumer attached; 0 = off
    durable: bool = True  # journal messages before confirming the producer
    depth_max_messages: int = 1_000_000  # queued + in-flight messages; 0 = unlimited
    depth_max_bytes: int = 1 << 30  # queued + in-flight encoded bytes; 0 = unlimited (a limit of disk, not RAM)
    # bytes of message bodies this queue keeps in RAM; past it the bodies of its journalled messages live only
    # in the journal and are read back ahead of dispatch (node/core/dispatch/paging.py). 0 = only the node's budget
    # (message_memory_max_bytes in node/config/settings.py) bounds it. A non-durable queue refuses it: no journal holds its bodies
    memory_max_bytes: int = 0
    # groups tracked at once (with messages or a consumer); 0 = unlimited. At the limit an empty group kept by
    # its exclusive consumer gives its place to the new group (the one empty longest, node/core/dispatch/queue.py's
    # header); a new group is refused only while every tracked group has messages queued or in flight
    groups_max: int = 1_000_000
    group_id_length_max_chars: int = 255  # longer group ids are rejected with amqp:invalid-field
    delivery_count_max: int = 10  # failed deliveries before dead-lettering (Artemis's default); 0 = unlimited
    redelivery_delay_ms: int = 0  # wait before a failed delivery is redelivered (its group waits too); 0 = none
    redelivery_delay_multiplier: float = 1.0  # each further failure multiplies the delay by this (>= 1.0)
    redelivery_delay_max_ms: int = 0  # the delay never grows past this; 0 = 10 x redelivery_delay_ms (Artemis's rule)
    dead_letter_queue: str = ""  # where rejected and over-delivered messages go; "" = "<queue>.DLQ"
    dead_letter_queue_auto_create: bool = True  # create the dead-letter queue when it does not exist yet
    address: str = ""  # the multicast address this queue subscribes to (node/core/dispatch/addresses.py); "" = none
    trace: bool = False  # write delivery traces for `grouper audit` (README "Auditing deliveries")
    # ---- issue 28: replicated messages (docs/replication.md) ----
    # copies of each message of this durable queue, its owner's included (1..5); 0 = the cluster's default
    # (node config replication_factor). Fixed once the queue exists: it decides which nodes back each group
    replication_factor: int = 0
    # issue 30, group leases: a consumer holding unsettled deliveries loses its groups (its link detached,
    # node/core/dispatch/queue_leases.py) after this long with no settlement or flow on its link; 0 = off
    group_lease_ms: int = 0
    # issue 30, incremental rebalance (node/core/dispatch/queue_rebalance.py): what group_rebalance does when a
    # consumer joins. "reset" frees every group (as Artemis does); "incremental" moves only the surplus groups
    # of the most loaded consumers to the newcomer, as few as make the counts even within one.
    # `group_rebalance = "incremental"` (or "reset") in a config table sets both fields
    group_rebalance_mode: str = "reset"
    # ---- issue 31: producer de-duplication (node/core/dispatch/dedup.py) ----
    dedup: bool = False  # a resend of an id the queue took within its window is accepted and not queued again
    dedup_window_messages: int = 100_000  # ids remembered per queue; the oldest is forgotten past it
    dedup_window_ms: int = 300_000  # how long an id is remembered (SQS's 5 minutes); 0 = until pushed out by count

    def validate(self) -> "QueueSettings":
        if not self.name or len(self.name) > 255:
            raise InvalidConfig("name", "queue name must be 1..255 characters")
        if any(ord(char) < 32 for char in self.name):  # control characters name the node's own records
            raise InvalidConfig("name", "queue name must not contain control characters")
        if self.group_policy not in POLICIES:
            raise InvalidConfig("group_policy", f"{self.group_policy!r} is not one of {', '.join(POLICIES)}")
        if self.group_buckets < -1:
            raise InvalidConfig("group_buckets", "must be -1 (every group), 0 (off) or a positive bucket count")
        for key in ("consumers_before_dispatch", "time_before_dispatch_ms", "depth_max_messages",
                    "depth_max_bytes", "memory_max_bytes", "delivery_count_max", "groups_max", "redelivery_delay_ms",
                    "redelivery_delay_max_ms"):
            if getattr(self, key) < 0:
                raise InvalidConfig(key, "must be >= 0")
        if not 1.0 <= self.redelivery_delay_multiplier <= REDELIVERY_DELAY_MULTIPLIER_MAX:
            raise InvalidConfig("redelivery_delay_multiplier",
                                f"must be 1.0..{REDELIVERY_DELAY_MULTIPLIER_MAX} (1.0 = the same delay every time)")
        if self.memory_max_bytes and not self.durable:
            raise InvalidConfig("memory_max_bytes", f"{self.memory_max_bytes} bytes set on a non-durable queue, whose "
                                                    f"bodies are in no journal to page to; set 0 or make it durable")
        if self.redelivery_delay_max_ms and self.redelivery_delay_max_ms < self.redelivery_delay_ms:
            raise InvalidConfig("redelivery_delay_max_ms",
                                f"{self.redelivery_delay_max_ms} ms is below redelivery_delay_ms="
                                f"{self.redelivery_delay_ms} ms; raise it or set 0 (10 x the delay)")
        if not 1 <= self.group_id_length_max_chars <= GROUP_ID_LENGTH_MAX_CHARS:
            raise InvalidConfig("group_id_length_max_chars", f"must be 1..{GROUP_ID_LENGTH_MAX_CHARS}")
        if self.group_rebalance_pause_dispatch and not self.group_rebalance:
            raise InvalidConfig("group_rebalance_pause_dispatch", "needs group_rebalance")
        if self.dead_letter_queue_name == self.name:
            raise InvalidConfig("dead_letter_queue", "a queue cannot be its own dead-letter queue")
        if self.address == self.name:
            raise InvalidConfig("address", f"a subscription queue cannot be named like its address {self.address!r}: "
                                           f"the name would mean both; name it e.g. {self.address}.subscriber")
        if len(self.address) > 255 or "::" in self.address or any(ord(char) < 32 for char in self.address):
            raise InvalidConfig("address", "an address is at most 255 characters, without '::' or control characters")
        if self.replication_factor:  # issue 28
            try:
                check_replication_factor(self.replication_factor)
            except ValueError as error:
                raise InvalidConfig("replication_factor", f"{error}; leave it out (or 0) for the cluster's "
                                                          f"default") from None
        # issue 30, group leases
        if self.group_lease_ms < 0:
            raise InvalidConfig("group_lease_ms", "must be >= 0 (0 = no lease: a consumer keeps its groups while attached)")
        # issue 30, incremental rebalance
        if self.group_rebalance_mode not in REBALANCE_MODES:
            raise InvalidConfig("group_rebalance_mode", f"{self.group_rebalance_mode!r} is not one of "
                                                        f"{', '.join(REBALANCE_MODES)}")
        if self.group_rebalance_mode != "reset" and not self.group_rebalance:
            raise InvalidConfig("group_rebalance_mode", "needs group_rebalance (or write group_rebalance = "
                                                        f"{self.group_rebalance_mode!r}, which sets both)")
        self._validate_dedup()
        return self

    def _validate_dedup(self) -> None:  # issue 31
        if not 1 <= self.dedup_window_messages <= DEDUP_WINDOW_MESSAGES_MAX:
            raise InvalidConfig("dedup_window_messages", f"must be 1..{DEDUP_WINDOW_MESSAGES_MAX} ids (each costs "
                                                         f"memory while remembered)")
        if self.dedup_window_ms < 0:
            raise InvalidConfig("dedup_window_ms", "must be >= 0 (0 = remembered until pushed out by count)")

    @property
    def dead_letter_queue_name(self) -> str:
        return self.dead_letter_queue or self.name + DEAD_LETTER_SUFFIX

    def redelivery_delay_for_ms(self, delivery_count: int) -> int:
        """The wait before redelivering a message that failed `delivery_count` times (>= 1)."""
        delay_ms = self.redelivery_delay_ms
        if not delay_ms:
            return 0
        cap_ms = self.redelivery_delay_max_ms or delay_ms * 10
        exponent = min(delivery_count - 1, 64)  # past 64 doublings any delay is at its cap
        return int(min(delay_ms * self.redelivery_delay_multiplier ** exponent, cap_ms))

    @property
    def grouping(self) -> bool:
        return self.group_policy != "none" and self.group_buckets != 0

    @property
    def effective_default_group(self) -> str | None:
        if self.default_group:
            return self.default_group
        return QPID_DEFAULT_GROUP if self.group_policy == "shared" else None

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        if not self.address:  # records and messages of queues that subscribe to nothing stay as they were
            del values["address"]
        if not self.trace:  # likewise for untraced queues: a node of an earlier release reads them
            del values["trace"]
        if not self.memory_max_bytes:  # so a node of the release before paging reads the record (upgrades)
            del values["memory_max_bytes"]
        if not self.replication_factor:  # issue 28: absent = the cluster default, as before replication
            del values["replication_factor"]
        if not self.group_lease_ms:  # issue 30: records of queues without a lease stay as they were
            del values["group_lease_ms"]
        if self.group_rebalance_mode == "reset":  # issue 30: records of queues that reset stay as they were
            del values["group_rebalance_mode"]
        for key in _DEDUP_KEYS:  # issue 31: a queue without de-duplication writes the record it wrote before
            if values[key] == _DEDUP_DEFAULTS[key]:
                del values[key]
        return values

    @classmethod
    def from_dict(cls, values: dict, *, where: str = "queue") -> "QueueSettings":
        """Build from a config-file table or admin request; unknown or mistyped keys are named."""
        clean = cls.check_values(values, where=where)
        if "name" not in clean:
            raise InvalidConfig(f"{where}.name", "missing")
        try:
            return cls(**clean).validate()
        except InvalidConfig as error:
            raise InvalidConfig(f"{where}.{error.key}", str(error).split(": ", 1)[1]) from None

    @classmethod
    def check_values(cls, values: dict, *, where: str = "queue") -> dict:
        """Some settings by field name (dashes or underscores), each known and of its field's type;
        the cross-field rules wait for `validate()` on a whole record."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        clean = {}
        for key, value in values.items():
            norm = key.replace("-", "_")
            if norm == "shared_groups":  # qpid-config's spelling of the shared policy
                if value:
                    clean["group_policy"] = "shared"
                continue
            if norm == "group_rebalance" and isinstance(value, str):  # issue 30: reset | incremental
                clean["group_rebalance"] = True
                norm = "group_rebalance_mode"
            if norm not in fields:
                raise InvalidConfig(f"{where}.{key}", "unknown setting")
            expected = type(getattr(cls, norm, "")) if norm != "name" else str
            if expected is bool and not isinstance(value, bool):
                raise InvalidConfig(f"{where}.{key}", f"expected true or false, got {value!r}")
            if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidConfig(f"{where}.{key}", f"expected an integer, got {value!r}")
            if expected is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InvalidConfig(f"{where}.{key}", f"expected a number, got {value!r}")
            if expected is float:
                value = float(value)
            if expected is str and not isinstance(value, str):
                raise InvalidConfig(f"{where}.{key}", f"expected a string, got {value!r}")
            clean[norm] = value
        return clean


DEDUP_WINDOW_MESSAGES_MAX = 10_000_000  # hard ceiling for dedup_window_messages: each id remembered costs memory
_DEDUP_KEYS = ("dedup", "dedup_window_messages", "dedup_window_ms")  # issue 31
_DEDUP_DEFAULTS = {key: getattr(QueueSettings, key) for key in _DEDUP_KEYS}
