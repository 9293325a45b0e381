"""The one table from domain errors (and the journal's failures) to AMQP error conditions: (name, description) pairs."""

from __future__ import annotations

from node.core.errors import (AlreadyExists, GrouperError, GroupLeaseExpired, HandlerUnavailable, InvalidConfig,
                              InvalidField, NotAllowed, NotFound, ResourceDeleted, ResourceLimitExceeded, Unauthorized)
from node.core.dispatch.transactions import TransactionRolledBack, UnknownTransaction
from node.store.failures import DISK_FULL, JournalFailure

INTERNAL_ERROR = "amqp:internal-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
RESOURCE_DELETED = "amqp:resource-deleted"


# domain errors (node/core/errors.py) by class: an error takes the condition of its nearest class listed
# here (a subclass defined by an adapter, such as the bridge's BridgeFull, takes its base's); any other
# GrouperError is the node's fault
CONDITION_BY_ERROR = {
    NotFound: "amqp:not-found",
    AlreadyExists: "amqp:precondition-failed",
    InvalidField: "amqp:invalid-field",
    InvalidConfig: "amqp:invalid-field",
    ResourceLimitExceeded: RESOURCE_LIMIT,
    ResourceDeleted: RESOURCE_DELETED,
    NotAllowed: "amqp:not-allowed",
    Unauthorized: "amqp:unauthorized-access",
    HandlerUnavailable: "grouper:grouping-handler-unavailable",
    # issue 30: a consumer's link detached because its group lease lapsed (node/core/dispatch/queue_leases.py)
    GroupLeaseExpired: "grouper:group-lease-expired",
    # issue 31: local transactions (node/core/dispatch/transactions.py), AMQP 1.0 4.5.7's conditions
    UnknownTransaction: "amqp:transaction:unknown-id",
    TransactionRolledBack: "amqp:transaction:rollback",
}


def condition_for(error: BaseException) -> tuple[str, str]:
    if isinstance(error, GrouperError):
        for kind in type(error).__mro__:
            condition = CONDITION_BY_ERROR.get(kind)
            if condition is not None:
                return condition, error.description
        return INTERNAL_ERROR, error.description
    return INTERNAL_ERROR, f"the node failed to process this: {error}; see the node's log"


# a journal batch that could not be written (node/store/failures.py JournalFailure), by its kind: a full
# disk is a resource limit the client may retry after; any other write failure is the node's
JOURNAL_FAILURE_CONDITIONS = {DISK_FULL: RESOURCE_LIMIT}


def journal_failure_condition(failure: JournalFailure) -> str:
    """The condition for producers and links whose records were in a failed journal batch."""
    return JOURNAL_FAILURE_CONDITIONS.get(failure.kind, INTERNAL_ERROR)
