"""The one table from domain errors to AMQP error conditions."""

from __future__ import annotations

from proton import Condition

from node.core.errors import GrouperError

INTERNAL_ERROR = "amqp:internal-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"


def condition_for(error: BaseException) -> Condition:
    if isinstance(error, GrouperError):
        return Condition(error.amqp_condition, error.description)
    return Condition(INTERNAL_ERROR, f"the node failed to process this: {error}; see the node's log")
