"""Group leases (issue 30) as real clients see them: a consumer process that hangs (SIGSTOP) loses its group
after group_lease_ms and another consumer gets it whole and in order; when the hung one wakes, its link
has been detached with grouper:group-lease-expired and its late settlement changes nothing; a slow
consumer that keeps settling keeps its group.

The hung consumer is a process of its own (proton's container API through proton_remote.py, or rhea
through js/remote.js), so it can be stopped; the other consumer and the producer are an in-process
proton container. README, "Group leases".
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.conftest import node_factory  # noqa: F401 (the fixture, reused as it is)
from tests.interop.proton_clients import ContainerClient
from tests.interop.proton_remote import ProtonProcessClient
from tests.interop.rhea_client import RheaClient

QUEUE = "jobs"
LEASE_MS = 500
NODE_CONFIG = f"""\
[[queue]]
name = "{QUEUE}"
group_lease_ms = 60000
"""  # the node fixture shortens it with `grouper queue update`, as an operator would
ACCEPTED = ("accepted", None)


def messages(names: str) -> list[dict]:
    return [{"body": name, "group": name.rstrip("0123456789"), "to": None} for name in names.split()]


@pytest.fixture
def node(node_factory):  # noqa: F811
    node = node_factory(NODE_CONFIG)
    result = node.cli("queue", "update", QUEUE, "--group-lease-ms", str(LEASE_MS))
    assert result.returncode == 0, result.stderr
    return node


@pytest.fixture
def other(node):
    """The consumer that takes over, and the producer: one in-process proton container."""
    client = ContainerClient(node.url)
    yield client
    client.close()


@pytest.fixture(params=("proton", "rhea"))
def hung(request, node):
    """The consumer that will hang: a client process of its own."""
    if request.param == "proton":
        client = ProtonProcessClient(node.url)
    else:
        from tests.interop.rhea_client import ensure_rhea_installed
        host, port = node.amqp_address.rsplit(":", 1)
        client = RheaClient(ensure_rhea_installed(), host, int(port))
    yield client
    client._process.send_signal(signal.SIGCONT)
    client.close()


def test_a_hung_consumer_loses_its_group_in_order_and_its_late_settlement_is_refused(hung, other, node):
    hung.open_receiver("hung", QUEUE)
    hung.flow("hung", 2)
    other.open_sender("p", QUEUE)
    assert other.send("p", messages("A1 A2 A3")) == [ACCEPTED] * 3
    held = hung.receive("hung", 2)
    assert [item.body for item in held] == ["A1", "A2"]

    hung._process.send_signal(signal.SIGSTOP)  # stuck: no settlement, no flow, no heartbeat
    stopped_at_s = time.monotonic()
    other.open_receiver("other", QUEUE)
    other.flow("other", 10)
    taken = other.receive("other", 3)
    moved_after_s = time.monotonic() - stopped_at_s
    assert [(item.body, item.delivery_count) for item in taken] == [("A1", 1), ("A2", 1), ("A3", 0)]
    assert moved_after_s >= LEASE_MS / 1000 - 0.1, moved_after_s  # not before its lease lapsed

    hung._process.send_signal(signal.SIGCONT)
    detached = hung.wait_detached("hung")
    assert detached.condition == "grouper:group-lease-expired", detached
    assert "'A'" in detached.description and f"{LEASE_MS} ms" in detached.description, detached
    assert [line for line in node.output if "its group lease lapsed" in line and "'A'" in line], node.output
    hung._command("settle", link="hung", delivery=held[0].delivery, outcome="accept")  # too late
    hung.open_receiver("probe", QUEUE)  # its attach answered: the node has read the settlement before it

    # A1 is still queued, other's: released, it comes back to other, not gone by hung's accept
    other.settle(taken[0], "release")
    [again] = other.receive("other", 1)
    assert (again.body, again.delivery_count) == ("A1", 1)
    assert not [e for e in hung.events if e["event"] == "settled"]  # the node never settled hung's accept
    for item in [again, *taken[1:]]:
        other.settle(item, "accept")
    assert other.drain("other", 10).messages == []


def test_a_slow_consumer_that_keeps_settling_keeps_its_group(other, node):
    slow = ContainerClient(node.url)
    try:
        slow.open_receiver("slow", QUEUE)
        slow.flow("slow", 1)
        other.open_sender("p", QUEUE)
        assert other.send("p", messages("A1 A2 A3 A4")) == [ACCEPTED] * 4
        other.open_receiver("other", QUEUE)
        other.flow("other", 10)
        bodies = []
        for _ in range(4):  # each message takes 60% of the lease: 2.4 leases in all
            [item] = slow.receive("slow", 1)
            bodies.append((item.body, item.delivery_count))
            time.sleep(0.6 * LEASE_MS / 1000)
            slow.settle(item, "accept")
            slow.flow("slow", 1)
        assert bodies == [("A1", 0), ("A2", 0), ("A3", 0), ("A4", 0)]
        assert not [e for e in slow.events if e["event"] == "detached"]
        assert other.drain("other", 10).messages == []
    finally:
        slow.close()
