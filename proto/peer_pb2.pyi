from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Forwarded(_message.Message):
    __slots__ = ("forward_seq", "queue", "has_group", "group_id", "payload", "expires_at_ms", "closes_group", "enqueued_at_ms", "not_durable")
    FORWARD_SEQ_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    HAS_GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CLOSES_GROUP_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NOT_DURABLE_FIELD_NUMBER: _ClassVar[int]
    forward_seq: int
    queue: str
    has_group: bool
    group_id: str
    payload: bytes
    expires_at_ms: int
    closes_group: bool
    enqueued_at_ms: int
    not_durable: bool
    def __init__(self, forward_seq: _Optional[int] = ..., queue: _Optional[str] = ..., has_group: _Optional[bool] = ..., group_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., expires_at_ms: _Optional[int] = ..., closes_group: _Optional[bool] = ..., enqueued_at_ms: _Optional[int] = ..., not_durable: _Optional[bool] = ...) -> None: ...

class ForwardBatch(_message.Message):
    __slots__ = ("source_node", "messages", "format_version", "seq_bound", "disputed_high_water")
    SOURCE_NODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_BOUND_FIELD_NUMBER: _ClassVar[int]
    DISPUTED_HIGH_WATER_FIELD_NUMBER: _ClassVar[int]
    source_node: str
    messages: _containers.RepeatedCompositeFieldContainer[Forwarded]
    format_version: int
    seq_bound: int
    disputed_high_water: int
    def __init__(self, source_node: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Forwarded, _Mapping]]] = ..., format_version: _Optional[int] = ..., seq_bound: _Optional[int] = ..., disputed_high_water: _Optional[int] = ...) -> None: ...

class ForwardAck(_message.Message):
    __slots__ = ("high_water",)
    HIGH_WATER_FIELD_NUMBER: _ClassVar[int]
    high_water: int
    def __init__(self, high_water: _Optional[int] = ...) -> None: ...

class ReplicaEntry(_message.Message):
    __slots__ = ("repl_seq", "queue", "has_group", "group_id", "frame")
    REPL_SEQ_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    HAS_GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    repl_seq: int
    queue: str
    has_group: bool
    group_id: str
    frame: bytes
    def __init__(self, repl_seq: _Optional[int] = ..., queue: _Optional[str] = ..., has_group: _Optional[bool] = ..., group_id: _Optional[str] = ..., frame: _Optional[bytes] = ...) -> None: ...

class ReplicaBatch(_message.Message):
    __slots__ = ("owner_node", "epoch", "format_version", "entries")
    OWNER_NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    owner_node: str
    epoch: int
    format_version: int
    entries: _containers.RepeatedCompositeFieldContainer[ReplicaEntry]
    def __init__(self, owner_node: _Optional[str] = ..., epoch: _Optional[int] = ..., format_version: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[ReplicaEntry, _Mapping]]] = ...) -> None: ...

class ReplicaAck(_message.Message):
    __slots__ = ("high_water", "epoch")
    HIGH_WATER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    high_water: int
    epoch: int
    def __init__(self, high_water: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...
