from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueSettings(_message.Message):
    __slots__ = ("name", "group_policy", "group_header", "default_group", "group_first_key", "group_rebalance", "group_rebalance_pause_dispatch", "group_buckets", "consumers_before_dispatch", "time_before_dispatch_ms", "durable", "depth_max_messages", "depth_max_bytes", "group_id_length_max_chars", "delivery_count_max", "dead_letter_queue", "groups_max", "redelivery_delay_ms", "redelivery_delay_multiplier", "redelivery_delay_max_ms", "dead_letter_queue_auto_create", "address", "memory_max_bytes", "trace", "replication_factor", "group_lease_ms", "group_rebalance_mode", "dedup", "dedup_window_messages", "dedup_window_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_POLICY_FIELD_NUMBER: _ClassVar[int]
    GROUP_HEADER_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIRST_KEY_FIELD_NUMBER: _ClassVar[int]
    GROUP_REBALANCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_REBALANCE_PAUSE_DISPATCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_BEFORE_DISPATCH_FIELD_NUMBER: _ClassVar[int]
    TIME_BEFORE_DISPATCH_MS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    DEPTH_MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DEPTH_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_LENGTH_MAX_CHARS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_MAX_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_MAX_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_DELAY_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_DELAY_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_AUTO_CREATE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    GROUP_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_REBALANCE_MODE_FIELD_NUMBER: _ClassVar[int]
    DEDUP_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WINDOW_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    group_policy: str
    group_header: str
    default_group: str
    group_first_key: str
    group_rebalance: bool
    group_rebalance_pause_dispatch: bool
    group_buckets: int
    consumers_before_dispatch: int
    time_before_dispatch_ms: int
    durable: bool
    depth_max_messages: int
    depth_max_bytes: int
    group_id_length_max_chars: int
    delivery_count_max: int
    dead_letter_queue: str
    groups_max: int
    redelivery_delay_ms: int
    redelivery_delay_multiplier: float
    redelivery_delay_max_ms: int
    dead_letter_queue_auto_create: bool
    address: str
    memory_max_bytes: int
    trace: bool
    replication_factor: int
    group_lease_ms: int
    group_rebalance_mode: str
    dedup: bool
    dedup_window_messages: int
    dedup_window_ms: int
    def __init__(self, name: _Optional[str] = ..., group_policy: _Optional[str] = ..., group_header: _Optional[str] = ..., default_group: _Optional[str] = ..., group_first_key: _Optional[str] = ..., group_rebalance: _Optional[bool] = ..., group_rebalance_pause_dispatch: _Optional[bool] = ..., group_buckets: _Optional[int] = ..., consumers_before_dispatch: _Optional[int] = ..., time_before_dispatch_ms: _Optional[int] = ..., durable: _Optional[bool] = ..., depth_max_messages: _Optional[int] = ..., depth_max_bytes: _Optional[int] = ..., group_id_length_max_chars: _Optional[int] = ..., delivery_count_max: _Optional[int] = ..., dead_letter_queue: _Optional[str] = ..., groups_max: _Optional[int] = ..., redelivery_delay_ms: _Optional[int] = ..., redelivery_delay_multiplier: _Optional[float] = ..., redelivery_delay_max_ms: _Optional[int] = ..., dead_letter_queue_auto_create: _Optional[bool] = ..., address: _Optional[str] = ..., memory_max_bytes: _Optional[int] = ..., trace: _Optional[bool] = ..., replication_factor: _Optional[int] = ..., group_lease_ms: _Optional[int] = ..., group_rebalance_mode: _Optional[str] = ..., dedup: _Optional[bool] = ..., dedup_window_messages: _Optional[int] = ..., dedup_window_ms: _Optional[int] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("name", "depth_messages", "depth_bytes", "acquired_messages", "consumers", "browsers", "groups", "owned_groups", "enqueued_total", "delivered_total", "resident_bytes", "paged_bytes", "cold_messages", "runnable_groups", "blocked_groups", "held_groups", "oldest_head_enqueued_at_ms", "dedup_dropped_total")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEPTH_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DEPTH_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    BROWSERS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    OWNED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COLD_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RUNNABLE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    HELD_GROUPS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_HEAD_ENQUEUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    depth_messages: int
    depth_bytes: int
    acquired_messages: int
    consumers: int
    browsers: int
    groups: int
    owned_groups: int
    enqueued_total: int
    delivered_total: int
    resident_bytes: int
    paged_bytes: int
    cold_messages: int
    runnable_groups: int
    blocked_groups: int
    held_groups: int
    oldest_head_enqueued_at_ms: int
    dedup_dropped_total: int
    def __init__(self, name: _Optional[str] = ..., depth_messages: _Optional[int] = ..., depth_bytes: _Optional[int] = ..., acquired_messages: _Optional[int] = ..., consumers: _Optional[int] = ..., browsers: _Optional[int] = ..., groups: _Optional[int] = ..., owned_groups: _Optional[int] = ..., enqueued_total: _Optional[int] = ..., delivered_total: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., paged_bytes: _Optional[int] = ..., cold_messages: _Optional[int] = ..., runnable_groups: _Optional[int] = ..., blocked_groups: _Optional[int] = ..., held_groups: _Optional[int] = ..., oldest_head_enqueued_at_ms: _Optional[int] = ..., dedup_dropped_total: _Optional[int] = ...) -> None: ...

class GroupRow(_message.Message):
    __slots__ = ("group", "messages", "acquired", "consumer", "node", "head_age_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEAD_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    messages: int
    acquired: int
    consumer: str
    node: str
    head_age_ms: int
    def __init__(self, group: _Optional[str] = ..., messages: _Optional[int] = ..., acquired: _Optional[int] = ..., consumer: _Optional[str] = ..., node: _Optional[str] = ..., head_age_ms: _Optional[int] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ...) -> None: ...

class AddQueueRequest(_message.Message):
    __slots__ = ("settings",)
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: QueueSettings
    def __init__(self, settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class AddQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: QueueStats
    def __init__(self, queue: _Optional[_Union[QueueStats, _Mapping]] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("queue", "force")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    force: bool
    def __init__(self, queue: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class UpdateQueueRequest(_message.Message):
    __slots__ = ("settings",)
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: QueueSettings
    def __init__(self, settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class UpdateQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: QueueStats
    def __init__(self, queue: _Optional[_Union[QueueStats, _Mapping]] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("queue", "local_only")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    local_only: bool
    def __init__(self, queue: _Optional[str] = ..., local_only: _Optional[bool] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupRow]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupRow, _Mapping]]] = ...) -> None: ...

class GroupPageRequest(_message.Message):
    __slots__ = ("queue", "prefix", "position", "page_size", "node", "order")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    prefix: str
    position: int
    page_size: int
    node: str
    order: str
    def __init__(self, queue: _Optional[str] = ..., prefix: _Optional[str] = ..., position: _Optional[int] = ..., page_size: _Optional[int] = ..., node: _Optional[str] = ..., order: _Optional[str] = ...) -> None: ...

class ConsumerRow(_message.Message):
    __slots__ = ("consumer", "label", "groups_owned", "groups", "unsettled", "credit", "client")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    GROUPS_OWNED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    UNSETTLED_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    label: str
    groups_owned: int
    groups: _containers.RepeatedScalarFieldContainer[str]
    unsettled: int
    credit: int
    client: str
    def __init__(self, consumer: _Optional[str] = ..., label: _Optional[str] = ..., groups_owned: _Optional[int] = ..., groups: _Optional[_Iterable[str]] = ..., unsettled: _Optional[int] = ..., credit: _Optional[int] = ..., client: _Optional[str] = ...) -> None: ...

class GroupPageResponse(_message.Message):
    __slots__ = ("groups", "next_position", "groups_total", "scanned", "consumers")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_POSITION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupRow]
    next_position: int
    groups_total: int
    scanned: int
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerRow]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupRow, _Mapping]]] = ..., next_position: _Optional[int] = ..., groups_total: _Optional[int] = ..., scanned: _Optional[int] = ..., consumers: _Optional[_Iterable[_Union[ConsumerRow, _Mapping]]] = ...) -> None: ...

class ResetGroupsRequest(_message.Message):
    __slots__ = ("queue", "group", "local_only")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    local_only: bool
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., local_only: _Optional[bool] = ...) -> None: ...

class ResetGroupsResponse(_message.Message):
    __slots__ = ("groups_reset",)
    GROUPS_RESET_FIELD_NUMBER: _ClassVar[int]
    groups_reset: int
    def __init__(self, groups_reset: _Optional[int] = ...) -> None: ...

class PurgeGroupRequest(_message.Message):
    __slots__ = ("queue", "group", "messages_max", "local_only")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_MAX_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    messages_max: int
    local_only: bool
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., messages_max: _Optional[int] = ..., local_only: _Optional[bool] = ...) -> None: ...

class PurgeGroupResponse(_message.Message):
    __slots__ = ("messages_purged",)
    MESSAGES_PURGED_FIELD_NUMBER: _ClassVar[int]
    messages_purged: int
    def __init__(self, messages_purged: _Optional[int] = ...) -> None: ...

class PurgeQueueRequest(_message.Message):
    __slots__ = ("queue", "local_only")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    local_only: bool
    def __init__(self, queue: _Optional[str] = ..., local_only: _Optional[bool] = ...) -> None: ...

class PurgeQueueResponse(_message.Message):
    __slots__ = ("messages_purged", "messages_left")
    MESSAGES_PURGED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_LEFT_FIELD_NUMBER: _ClassVar[int]
    messages_purged: int
    messages_left: int
    def __init__(self, messages_purged: _Optional[int] = ..., messages_left: _Optional[int] = ...) -> None: ...

class MoveGroupRequest(_message.Message):
    __slots__ = ("queue", "group", "destination_queue", "messages_max", "local_only")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_QUEUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_MAX_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    destination_queue: str
    messages_max: int
    local_only: bool
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., destination_queue: _Optional[str] = ..., messages_max: _Optional[int] = ..., local_only: _Optional[bool] = ...) -> None: ...

class RerouteQueueRequest(_message.Message):
    __slots__ = ("queue", "destination", "group", "messages_max", "local_only")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_MAX_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    destination: str
    group: str
    messages_max: int
    local_only: bool
    def __init__(self, queue: _Optional[str] = ..., destination: _Optional[str] = ..., group: _Optional[str] = ..., messages_max: _Optional[int] = ..., local_only: _Optional[bool] = ...) -> None: ...

class RerouteQueueResponse(_message.Message):
    __slots__ = ("messages_moved", "messages_stayed", "stayed_reason")
    MESSAGES_MOVED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_STAYED_FIELD_NUMBER: _ClassVar[int]
    STAYED_REASON_FIELD_NUMBER: _ClassVar[int]
    messages_moved: int
    messages_stayed: int
    stayed_reason: str
    def __init__(self, messages_moved: _Optional[int] = ..., messages_stayed: _Optional[int] = ..., stayed_reason: _Optional[str] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ("local_only",)
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    local_only: bool
    def __init__(self, local_only: _Optional[bool] = ...) -> None: ...

class ClusterMember(_message.Message):
    __slots__ = ("node", "amqp_address", "admin_address", "down", "connected", "routes", "queues", "error", "consumers", "raft_member", "epoch", "in_sync", "under_replicated")
    class ConsumersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    AMQP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DOWN_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    RAFT_MEMBER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    node: str
    amqp_address: str
    admin_address: str
    down: bool
    connected: bool
    routes: int
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    error: str
    consumers: _containers.ScalarMap[str, int]
    raft_member: bool
    epoch: int
    in_sync: _containers.RepeatedScalarFieldContainer[str]
    under_replicated: bool
    def __init__(self, node: _Optional[str] = ..., amqp_address: _Optional[str] = ..., admin_address: _Optional[str] = ..., down: _Optional[bool] = ..., connected: _Optional[bool] = ..., routes: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ..., error: _Optional[str] = ..., consumers: _Optional[_Mapping[str, int]] = ..., raft_member: _Optional[bool] = ..., epoch: _Optional[int] = ..., in_sync: _Optional[_Iterable[str]] = ..., under_replicated: _Optional[bool] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("node", "leader", "term", "has_quorum", "routes", "members", "waiting_for_route", "outbound", "clustered", "routes_digest", "last_applied", "commit_index", "in_transit", "outbound_bytes", "moving", "moves")
    class OutboundEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class InTransitEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class OutboundBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    HAS_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_ROUTE_FIELD_NUMBER: _ClassVar[int]
    OUTBOUND_FIELD_NUMBER: _ClassVar[int]
    CLUSTERED_FIELD_NUMBER: _ClassVar[int]
    ROUTES_DIGEST_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    IN_TRANSIT_FIELD_NUMBER: _ClassVar[int]
    OUTBOUND_BYTES_FIELD_NUMBER: _ClassVar[int]
    MOVING_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    node: str
    leader: str
    term: int
    has_quorum: bool
    routes: int
    members: _containers.RepeatedCompositeFieldContainer[ClusterMember]
    waiting_for_route: int
    outbound: _containers.ScalarMap[str, int]
    clustered: bool
    routes_digest: str
    last_applied: int
    commit_index: int
    in_transit: _containers.ScalarMap[str, int]
    outbound_bytes: _containers.ScalarMap[str, int]
    moving: int
    moves: _containers.RepeatedCompositeFieldContainer[GroupMove]
    def __init__(self, node: _Optional[str] = ..., leader: _Optional[str] = ..., term: _Optional[int] = ..., has_quorum: _Optional[bool] = ..., routes: _Optional[int] = ..., members: _Optional[_Iterable[_Union[ClusterMember, _Mapping]]] = ..., waiting_for_route: _Optional[int] = ..., outbound: _Optional[_Mapping[str, int]] = ..., clustered: _Optional[bool] = ..., routes_digest: _Optional[str] = ..., last_applied: _Optional[int] = ..., commit_index: _Optional[int] = ..., in_transit: _Optional[_Mapping[str, int]] = ..., outbound_bytes: _Optional[_Mapping[str, int]] = ..., moving: _Optional[int] = ..., moves: _Optional[_Iterable[_Union[GroupMove, _Mapping]]] = ...) -> None: ...

class GroupMove(_message.Message):
    __slots__ = ("queue", "group", "from_node", "to_node", "waiting", "here")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    HERE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    from_node: str
    to_node: str
    waiting: _containers.RepeatedScalarFieldContainer[str]
    here: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., from_node: _Optional[str] = ..., to_node: _Optional[str] = ..., waiting: _Optional[_Iterable[str]] = ..., here: _Optional[_Iterable[str]] = ...) -> None: ...

class MoveGroupResponse(_message.Message):
    __slots__ = ("messages_moved",)
    MESSAGES_MOVED_FIELD_NUMBER: _ClassVar[int]
    messages_moved: int
    def __init__(self, messages_moved: _Optional[int] = ...) -> None: ...

class MemberRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class MemberResponse(_message.Message):
    __slots__ = ("routes_dropped",)
    ROUTES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    routes_dropped: int
    def __init__(self, routes_dropped: _Optional[int] = ...) -> None: ...
