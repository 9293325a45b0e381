"""The one table from domain errors (and the journal's failures) to AMQP error conditions: (name, description) pairs."""

from __future__ import annotations

from node.core.errors import GrouperError
from node.store.failures import DISK_FULL, JournalFailure

INTERNAL_ERROR = "amqp:internal-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
RESOURCE_DELETED = "amqp:resource-deleted"


def condition_for(error: BaseException) -> tuple[str, str]:
    if isinstance(error, GrouperError):
        return error.amqp_condition, error.description
    return INTERNAL_ERROR, f"the node failed to process this: {error}; see the node's log"


# a journal batch that could not be written (node/store/failures.py JournalFailure), by its kind: a full
# disk is a resource limit the client may retry after; any other write failure is the node's
JOURNAL_FAILURE_CONDITIONS = {DISK_FULL: RESOURCE_LIMIT}


def journal_failure_condition(failure: JournalFailure) -> str:
    """The condition for producers and links whose records were in a failed journal batch."""
    return JOURNAL_FAILURE_CONDITIONS.get(failure.kind, INTERNAL_ERROR)
