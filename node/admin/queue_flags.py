"""The per-queue flags of `grouper queue add` and `queue update`, and the QueueSettings they give.

Rules:
- Spelled as qpid-config and Artemis spell them; each flag is a QueueSettings field, so `grouper node`
  config ([[queue]] tables) and `queue add` agree.
- `queue add` checks the values here, before any call, naming the flag (`--group-buckets`); `queue
  update` passes the flags given on, and the node checks them and which may change.
- Parsing only: no node is called.
"""

from __future__ import annotations

import argparse

from node.core.errors import InvalidConfig
from node.core.dispatch.settings import QueueSettings

_QUEUE_FLAG_KEYS = ("group_policy", "group_header", "default_group", "group_first_key", "group_rebalance",
                    "group_rebalance_pause_dispatch", "group_buckets", "consumers_before_dispatch",
                    "time_before_dispatch_ms", "durable", "depth_max_messages", "depth_max_bytes", "memory_max_bytes",
                    "groups_max", "group_id_length_max_chars", "delivery_count_max", "dead_letter_queue",
                    "trace")
_QUEUE_FLAG_KEYS += ("replication_factor",)  # issue 28
_QUEUE_FLAG_KEYS += ("group_lease_ms",)  # issue 30
_QUEUE_FLAG_KEYS += ("group_rebalance_mode",)  # issue 30, incremental rebalance
_QUEUE_FLAG_KEYS += ("dedup", "dedup_window_messages", "dedup_window_ms")  # issue 31


def add_queue_flags(parser: argparse.ArgumentParser) -> None:
    """Per-queue group settings, spelled as qpid-config and Artemis spell them."""
    add = parser.add_argument
    add("--group-policy", choices=["exclusive", "shared", "none"],
        help="exclusive: a sticky consumer per group (default); shared: a group's consumer only while it holds "
             "unsettled messages")
    add("--shared-groups", action="store_true", help="alias of --group-policy shared (qpid-config)")
    add("--group-header", metavar="KEY", help="application property holding the group id")
    add("--default-group", metavar="NAME", help="group of messages that carry no group id")
    add("--group-first-key", metavar="KEY", help="property set true on the first message a group's new consumer gets")
    add("--group-rebalance", action="store_true", default=None,
        help="reset groups' consumers when a new consumer first grants credit")
    add("--group-rebalance-pause-dispatch", action="store_true", default=None,
        help="hold reassigned groups until their in-flight messages are settled")
    add("--group-buckets", type=int, metavar="N", help="-1 every group, 0 grouping off, N hash buckets")
    add("--consumers-before-dispatch", type=int, metavar="N")
    add("--time-before-dispatch-ms", type=int, metavar="MS")
    add("--durable", dest="durable", action="store_true", default=None, help="journal messages (default)")
    add("--no-durable", dest="durable", action="store_false")
    add("--depth-max-messages", type=int, metavar="N", help="0 = unlimited")
    add("--depth-max-bytes", type=int, metavar="BYTES", help="0 = unlimited")
    add("--memory-max-bytes", type=int, metavar="BYTES",
        help="bytes of message bodies kept in RAM, the rest paged to the journal; 0 = the node's budget only")
    add("--groups-max", type=int, metavar="N", help="groups tracked at once; 0 = unlimited")
    add("--group-id-length-max-chars", type=int, metavar="CHARS")
    add("--delivery-count-max", type=int, metavar="N", help="failed deliveries before dead-lettering")
    add("--dead-letter-queue", metavar="QUEUE")
    add("--trace", dest="trace", action="store_true", default=None,
        help="write delivery traces for grouper audit (README 'Auditing deliveries')")
    add("--no-trace", dest="trace", action="store_false")
    # issue 28: replicated messages (docs/replication.md)
    add("--replication-factor", type=int, metavar="N",
        help="copies of each message of this durable queue, its owner's included (1..5); default: the "
             "cluster's replication_factor")
    # issue 30: group leases
    add("--group-lease-ms", type=int, metavar="MS",
        help="a consumer holding unsettled deliveries loses its groups after MS with no settlement or flow; 0 = off")
    # issue 30: incremental rebalance
    add("--group-rebalance-mode", choices=["reset", "incremental"],
        help="what a rebalance does when a consumer joins: reset every group (default), or move only the surplus "
             "groups of the most loaded consumers to it (incremental; implies --group-rebalance)")
    # ---- issue 31: producer de-duplication ----
    add("--dedup", dest="dedup", action="store_true", default=None,
        help="accept a resend of a message-id (or _AMQ_DUPL_ID) taken within the window without queueing it again")
    add("--no-dedup", dest="dedup", action="store_false")
    add("--dedup-window-messages", type=int, metavar="N", help="ids remembered per queue (default 100000)")
    add("--dedup-window-ms", type=int, metavar="MS",
        help="how long an id is remembered (default 300000; 0 = by count only)")


def queue_changes_from_args(args: argparse.Namespace) -> dict:
    """The queue flags given, as QueueSettings fields (`grouper queue update`: the node checks the values)."""
    changes = {key: getattr(args, key) for key in _QUEUE_FLAG_KEYS if getattr(args, key, None) is not None}
    if getattr(args, "shared_groups", False):
        if changes.get("group_policy", "shared") != "shared":
            raise InvalidConfig("--shared-groups", "conflicts with --group-policy")
        changes["group_policy"] = "shared"
    if changes.get("group_rebalance_mode") == "incremental":  # issue 30: the mode is group_rebalance's
        changes.setdefault("group_rebalance", True)
    return changes


def queue_settings_from_args(name: str, args: argparse.Namespace) -> QueueSettings:
    values = {"name": name, **queue_changes_from_args(args)}
    try:
        return QueueSettings.from_dict(values, where="--")
    except InvalidConfig as error:
        raise InvalidConfig(error.key.replace("--.", "--").replace("_", "-"), str(error).split(": ", 1)[1]) from None
