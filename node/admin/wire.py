"""The admin API's protobuf messages to and from the node's own forms (QueueSettings, stats dicts, group rows).

Rules:
- Pure translation, no calls: the servicer's modules convert here, the node never sees a protobuf.
- Settings are validated by the node (`QueueSettings.from_dict`), so a bad value fails with
  INVALID_ARGUMENT naming the field, prefixed `settings` as in AddQueueRequest.settings.
- A field the proto does not carry yet is left out rather than failing the whole call.
"""

from __future__ import annotations

from node.admin.definitions import SETTINGS_FIELD_PATH
from node.core.errors import InvalidField
from node.core.dispatch.settings import QueueSettings
from proto import admin_pb2


def settings_from_pb(settings: admin_pb2.QueueSettings) -> QueueSettings:
    """Only fields the caller set are passed on, so absent ones take the node's defaults."""
    values: dict = {"name": settings.name}
    for field in settings.DESCRIPTOR.fields:
        if field.name != "name" and settings.HasField(field.name):
            values[field.name] = getattr(settings, field.name)
    return QueueSettings.from_dict(values, where=SETTINGS_FIELD_PATH)


def settings_changes_from_pb(settings: admin_pb2.QueueSettings) -> dict:
    """The fields the caller set besides the name (UpdateQueue: the node checks which may change)."""
    return {field.name: getattr(settings, field.name) for field in settings.DESCRIPTOR.fields
            if field.name != "name" and settings.HasField(field.name)}


def queue_stats_to_pb(stats: dict) -> admin_pb2.QueueStats:
    # a counter the proto does not carry yet is left out rather than failing the whole call
    fields = admin_pb2.QueueStats.DESCRIPTOR.fields_by_name
    return admin_pb2.QueueStats(**{key: value for key, value in stats.items() if key in fields})


def group_row_to_pb(row: dict, node: str = "") -> admin_pb2.GroupRow:
    owner = row["consumer"]
    return admin_pb2.GroupRow(group=row["group"], messages=row["messages"], acquired=row["acquired"],
                              consumer=None if owner is None else str(owner), node=row.get("node") or node,
                              head_age_ms=row.get("head_age_ms"))


def messages_max(request) -> int | None:
    """A request's `messages_max`: None when left out (all of them); at least 1 when given."""
    if not request.HasField("messages_max"):
        return None
    if request.messages_max < 1:
        raise InvalidField(f"messages_max: must be >= 1, got {request.messages_max} (leave it out for all)")
    return request.messages_max
