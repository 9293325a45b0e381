"""The AMQP adapter's one table from domain errors to conditions (node/amqp/conditions.py), and the rule
that core errors are data: they name no wire type."""

from __future__ import annotations

import inspect

from node.amqp.bridge import BridgeFull
from node.amqp.conditions import CONDITION_BY_ERROR, INTERNAL_ERROR, condition_for
from node.core import errors
from node.core.errors import GrouperError, NotFound, StoreFailed

CORE_ERRORS = [value for value in vars(errors).values()
               if inspect.isclass(value) and issubclass(value, GrouperError)]


def test_core_errors_carry_fault_and_retry_but_no_wire_form():
    for error in CORE_ERRORS:
        assert error.fault in ("client", "operator", "node"), error
        assert isinstance(error.retriable, bool), error
        assert not [name for name in dir(error) if name.startswith(("amqp", "grpc", "http"))], error


def test_every_core_error_but_the_base_and_store_failures_has_a_row():
    # StoreFailed's condition depends on the journal's failure (journal_failure_condition); the base is the
    # node's fault by definition
    assert set(CORE_ERRORS) - set(CONDITION_BY_ERROR) == {GrouperError, StoreFailed}


def test_an_error_takes_its_nearest_listed_class_and_keeps_its_description():
    assert condition_for(NotFound("no queue q")) == ("amqp:not-found", "no queue q")
    assert condition_for(BridgeFull("the bridge is full"))[0] == "amqp:resource-limit-exceeded"
    assert condition_for(GrouperError("odd")) == (INTERNAL_ERROR, "odd")
    name, description = condition_for(ValueError("boom"))
    assert name == INTERNAL_ERROR and "boom" in description and "log" in description
