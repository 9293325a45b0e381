"""What the admin API's queue commands check before they change a queue, alone or cluster-wide.

Pure: no I/O, no clock. `updated_settings` is the one rule of `grouper queue update` for a node alone
and for a cluster (whose replicated command, handler/queue_definitions.py, applies the same field
lists again on the definition it holds): only fields a live queue reads at each use may change.
"""

from __future__ import annotations

from node.core.cluster.feed import FIXED_FIELDS, UPDATABLE_FIELDS, fixed_changes, settings_values
from node.core.errors import InvalidField, NotAllowed
from node.core.dispatch.settings import QueueSettings

SETTINGS_FIELD_PATH = "settings"  # prefix of field names in settings errors, as AddQueueRequest.settings


def fixed_refusal(name: str, fields: list[str]) -> NotAllowed:
    return NotAllowed(f"queue {name!r}: {', '.join(fields)} cannot change on a live queue (they decide which group "
                      f"a message belongs to, or whether it is journalled, so queued messages would be regrouped); "
                      f"settings that can change: {', '.join(sorted(UPDATABLE_FIELDS))}. To change the others, "
                      f"delete the queue and add it again")


def updated_settings(current: dict, changes: dict) -> QueueSettings:
    """The settings after `changes` (only the fields the caller set), validated; NotAllowed names any
    field that cannot change on a live queue, InvalidField a bad value or an empty update."""
    current = settings_values(current)  # a temporary subscription's definition names its node too
    name = current["name"]
    unknown = sorted(set(changes) - UPDATABLE_FIELDS - FIXED_FIELDS)
    if unknown:
        raise InvalidField(f"{SETTINGS_FIELD_PATH}: unknown fields {', '.join(unknown)}")
    if not set(changes) - {"name"}:
        raise InvalidField(f"{SETTINGS_FIELD_PATH}: nothing to update for queue {name!r}; give the settings to change")
    fixed = fixed_changes(current, changes)
    if fixed:
        raise fixed_refusal(name, fixed)
    return QueueSettings.from_dict({**current, **changes}, where=SETTINGS_FIELD_PATH)
