"""Per-queue settings: one frozen record, validated once, named as qpid-config and Artemis name them.

Every limit carries its unit. `validate()` holds the cross-field rules; a bad value raises
`InvalidConfig` naming the key, so a config file, a flag or an admin call all fail alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from node.core.errors import InvalidConfig

POLICIES = ("exclusive", "shared", "none")
QPID_DEFAULT_GROUP = "qpid.no-group"
GROUP_ID_LENGTH_MAX_CHARS = 4096  # hard ceiling for group_id_length_max_chars


@dataclass(frozen=True)
class QueueSettings:
    name: str
    group_policy: str = "exclusive"  # exclusive (sticky), shared (sequenced), none
    group_header: str = ""  # application property holding the group id; "" = properties.group-id or JMSXGroupID
    default_group: str = ""  # group of messages without a group id; "" = qpid.no-group in shared, ungrouped in exclusive
    group_first_key: str = ""  # application property set true on a new owner's first message; "" = off
    group_rebalance: bool = False  # reset group owners when a newly attached consumer first grants credit
    group_rebalance_pause_dispatch: bool = False  # hold reassigned groups until their in-flight messages settle
    group_buckets: int = -1  # -1 every group tracked, 0 grouping off, N>0 group ids hashed into N buckets
    consumers_before_dispatch: int = 0  # hold dispatch until this many consumers have granted credit; 0 = off
    time_before_dispatch_ms: int = 0  # or until this long after the first consumer attached; 0 = off
    durable: bool = True  # journal messages before confirming the producer
    depth_max_messages: int = 1_000_000  # queued + in-flight messages; 0 = unlimited
    depth_max_bytes: int = 1 << 30  # queued + in-flight encoded bytes; 0 = unlimited
    groups_max: int = 1_000_000  # groups tracked at once (with messages or an owner); new ones beyond are refused; 0 = unlimited
    group_id_length_max_chars: int = 255  # longer group ids are rejected with amqp:invalid-field
    delivery_count_max: int = 0  # failed deliveries before dead-lettering; 0 = unlimited
    dead_letter_queue: str = ""  # where rejected and over-delivered messages go; "" = discard

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
                    "depth_max_bytes", "delivery_count_max", "groups_max"):
            if getattr(self, key) < 0:
                raise InvalidConfig(key, "must be >= 0")
        if not 1 <= self.group_id_length_max_chars <= GROUP_ID_LENGTH_MAX_CHARS:
            raise InvalidConfig("group_id_length_max_chars", f"must be 1..{GROUP_ID_LENGTH_MAX_CHARS}")
        if self.group_rebalance_pause_dispatch and not self.group_rebalance:
            raise InvalidConfig("group_rebalance_pause_dispatch", "needs group_rebalance")
        if self.dead_letter_queue == self.name:
            raise InvalidConfig("dead_letter_queue", "a queue cannot be its own dead-letter queue")
        return self

    @property
    def grouping(self) -> bool:
        return self.group_policy != "none" and self.group_buckets != 0

    @property
    def effective_default_group(self) -> str | None:
        if self.default_group:
            return self.default_group
        return QPID_DEFAULT_GROUP if self.group_policy == "shared" else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, *, where: str = "queue") -> "QueueSettings":
        """Build from a config-file table or admin request; unknown or mistyped keys are named."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        clean = {}
        for key, value in values.items():
            norm = key.replace("-", "_")
            if norm == "shared_groups":  # qpid-config's spelling of the shared policy
                if value:
                    clean["group_policy"] = "shared"
                continue
            if norm not in fields:
                raise InvalidConfig(f"{where}.{key}", "unknown setting")
            expected = type(getattr(cls, norm, "")) if norm != "name" else str
            if expected is bool and not isinstance(value, bool):
                raise InvalidConfig(f"{where}.{key}", f"expected true or false, got {value!r}")
            if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidConfig(f"{where}.{key}", f"expected an integer, got {value!r}")
            if expected is str and not isinstance(value, str):
                raise InvalidConfig(f"{where}.{key}", f"expected a string, got {value!r}")
            clean[norm] = value
        if "name" not in clean:
            raise InvalidConfig(f"{where}.name", "missing")
        try:
            return cls(**clean).validate()
        except InvalidConfig as error:
            raise InvalidConfig(f"{where}.{error.key}", str(error).split(": ", 1)[1]) from None
