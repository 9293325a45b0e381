"""node.admin.local: the admin API in process answers as over gRPC (the same refusals and statuses),
and its failed-login throttle holds back the address the caller acts for, not this process's."""

from __future__ import annotations

import pytest

from node.admin.client import AccessDenied, NodeFailure
from node.admin.callers import FAILURES_BEFORE_THROTTLE, basic_metadata
from node.admin.local import LocalAdmin
from node.admin.service import AdminServicer
from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from tests.unit.test_admin import BrokerControl
from tests.unit.test_admin_callers import PASSWORD, CountingSecurity, database


@pytest.fixture(scope="module")
def servicer():
    broker = Broker()
    for name in ("orders.x", "payments"):
        broker.declare_queue(QueueSettings(name=name))
        broker.enqueue(name, Message(b"payload", "g"), now_ms=1_000)
    return AdminServicer(BrokerControl(broker, now_ms=lambda: 1_000), CountingSecurity(database()))


def as_user(servicer, user: str, password: str = PASSWORD, source: str = "10.0.0.9") -> LocalAdmin:
    return LocalAdmin(servicer, source, basic_metadata(user, password))


def test_a_call_answers_as_the_admin_api_does(servicer):
    with as_user(servicer, "manager") as admin:
        assert [(row["group"], row["messages"]) for row in admin.list_groups("orders.x")] == [("g", 1)]
        assert [queue["name"] for queue in admin.list_queues()] == ["orders.x"]  # only what it may see


def test_refusals_keep_their_status_and_text(servicer):
    with pytest.raises(AccessDenied) as refused:
        as_user(servicer, "manager").list_groups("payments")
    assert refused.value.status == "PERMISSION_DENIED" and "manage" in refused.value.message
    with pytest.raises(NodeFailure) as missing:
        as_user(servicer, "admin").list_groups("nope")
    assert missing.value.status == "NOT_FOUND" and "nope" in missing.value.message
    with pytest.raises(AccessDenied) as anonymous:
        LocalAdmin(servicer, "10.0.0.9").list_queues()
    assert anonymous.value.status == "UNAUTHENTICATED"


def test_the_throttle_holds_back_the_address_acted_for():
    servicer = AdminServicer(BrokerControl(Broker(), now_ms=lambda: 1_000), CountingSecurity(database()))
    for _ in range(FAILURES_BEFORE_THROTTLE + 1):
        with pytest.raises(AccessDenied, match="wrong password"):
            as_user(servicer, "admin", "guess", source="10.0.0.7").list_queues()
    with pytest.raises(AccessDenied, match="too many failed logins in a row from 10.0.0.7"):
        as_user(servicer, "admin", source="10.0.0.7").list_queues()
    # another address is not held (for another user: admin's own count holds admin everywhere)
    assert as_user(servicer, "viewer", source="10.0.0.8").list_queues() == []
    for _ in range(FAILURES_BEFORE_THROTTLE + 1):  # an IPv6 address, as grpc writes it ('ipv6:[::1]:port')
        with pytest.raises(AccessDenied, match="wrong password"):
            as_user(servicer, "manager", "guess", source="::1").list_queues()
    with pytest.raises(AccessDenied, match="too many failed logins in a row from ::1"):  # not verified before
        as_user(servicer, "sender", source="::1").list_queues()
