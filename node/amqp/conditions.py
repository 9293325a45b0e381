"""The one table from domain errors to AMQP error conditions: (name, description) pairs."""

from __future__ import annotations

from node.core.errors import GrouperError

INTERNAL_ERROR = "amqp:internal-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
RESOURCE_DELETED = "amqp:resource-deleted"


def condition_for(error: BaseException) -> tuple[str, str]:
    if isinstance(error, GrouperError):
        return error.amqp_condition, error.description
    return INTERNAL_ERROR, f"the node failed to process this: {error}; see the node's log"
