"""Domain errors of the node core.

Each error is data: what went wrong (its class and description), who is at fault (`fault`: the client,
the operator, or the node) and whether a retry can succeed (`retriable`). Adapters map them to their wire
form in one table each, by class (AMQP conditions in `node.amqp.conditions`, gRPC status codes in
`node.admin.service` and `node.peer.service`, HTTP statuses through the admin's in `node.console`); the core
never names a wire type.
"""

from __future__ import annotations


class GrouperError(Exception):
    """Base of every expected failure; anything else escaping the core is a bug."""

    retriable = False
    fault = "node"

    def __init__(self, description: str):
        super().__init__(description)
        self.description = description


class NotFound(GrouperError):
    fault = "client"


class AlreadyExists(GrouperError):
    fault = "client"


class InvalidField(GrouperError):
    fault = "client"


class ResourceLimitExceeded(GrouperError):
    fault = "client"
    retriable = True


class ResourceDeleted(GrouperError):
    fault = "operator"


class NotAllowed(GrouperError):
    fault = "client"


class Unauthorized(GrouperError):
    """The user (or an anonymous client) lacks a permission; only an administrator can grant it."""

    fault = "client"


class InvalidConfig(GrouperError):
    """A config file, flag or queue declaration that cannot be used; `key` names the culprit."""

    fault = "operator"

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key = key


class HandlerUnavailable(GrouperError):
    """No route could be decided in time: the grouping handler (the raft leader) is unreachable."""

    fault = "node"
    retriable = True


class StoreFailed(GrouperError):
    """A durable send's journal write failed: the node's disk, not the client, is at fault.

    `outcome_unknown` False: the message was taken back and will never be delivered; sending it again is
    safe. True: a consumer had it before the write failed and may process it, so sending it again may
    deliver it twice; only the application can tell which it wants. The adapter picks the wire condition
    from `reason` (a full disk is a resource limit)."""

    fault = "node"
    retriable = True

    def __init__(self, reason: str, *, outcome_unknown: bool):
        if outcome_unknown:
            description = (f"outcome unknown: the node could not store the message ({reason}), but it had "
                           f"already been delivered to a consumer before the write failed and may be "
                           f"processed; sending it again may deliver it twice")
        else:
            description = (f"the node could not store the message ({reason}); it was not queued and will "
                           f"not be delivered: send it again once the node's disk is fixed")
        super().__init__(description)
        self.reason = reason
        self.outcome_unknown = outcome_unknown


class GroupLeaseExpired(GrouperError):
    """Issue 30: a consumer held deliveries past its queue's group_lease_ms with no settlement or flow on its
    link, so the node took its groups back (node/core/dispatch/queue_leases.py). The client is at fault (a
    hung or too slow consumer); attaching again is safe: what it held went to other consumers."""

    fault = "client"
    retriable = True

    def __init__(self, queue: str, group, lease_ms: int, unsettled_count: int):
        group_text = "no group" if group is None else f"group {group!r}"
        super().__init__(
            f"queue {queue!r}, {group_text}: the consumer's lease lapsed (group_lease_ms={lease_ms} ms with no "
            f"settlement or flow on this link while it held {unsettled_count} unsettled deliveries); they were "
            f"released to other consumers with their delivery count raised, and any settlement of them from "
            f"this link is refused. Settle or grant credit at least every {lease_ms} ms, then attach again")
        self.queue = queue
        self.group = group
        self.lease_ms = lease_ms
