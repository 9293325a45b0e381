"""A dead owner's forwarding backlog is bounded (outbound_max_bytes) and paged past
outbound_memory_max_bytes, against three real node processes.

Node 1 owns the groups of `orders` (its consumer was the only one when they were placed), node 2 those
of `other`. With node 1 killed, node 0 accepts sends for node 1's groups into its outbound store until
the next would pass the bound, then refuses them with amqp:resource-limit-exceeded naming node 1 and
the bound in bytes; sends for node 2's groups go on. /metrics shows the backlog's bytes per owner,
and node 0 restarted recovers the same backlog from its journal and still refuses past the bound.
Once node 1 is back, every accepted message reaches its consumer in group order and node 0 takes sends
for its groups again. With a small memory budget, node 0 keeps only a few of the backlog's bodies in
memory, the rest in its journal alone, also after a kill -9; node 1 back gets all of it, in group order.
Every wait is bounded and polls.
"""

from __future__ import annotations

import pytest
from proton import Delivery

from tests.integration.cluster import Cluster
from tests.integration.harness import WAIT_S, grouped, wait_until
from tests.integration.test_clustered_groups import bodies
from tests.integration.test_slow_peers import metrics

OUTBOUND_MAX_BYTES = 20_000  # node 0 holds at most this much for one owner: about 18 of the sends below
BODY = "x" * 1000  # each send's body; its encoded message is a little larger
GROUPS = ("g0", "g1", "g2")
SENDS_MAX = 100  # bound of the filling loop: the refusal must come well before it
OUTBOUND_MEMORY_MAX_BYTES = 4000  # the paging test's budget: bodies of about three of its sends
PAGED_SENDS = 120  # the paging test's backlog: about forty times its memory budget


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path, 3, f"[node]\noutbound_max_bytes = {OUTBOUND_MAX_BYTES}\n")
    yield made.start()
    made.kill_all()


def send_with_condition(sender, message) -> tuple:
    """(remote state, condition or None) once the node settles the send: the condition's description
    tells the producer which owner and which bound."""
    delivery = sender.link.send(message)
    sender.connection.wait(lambda: delivery.settled, timeout=WAIT_S, msg=f"outcome on {sender.link.name}")
    state, condition = delivery.remote_state, delivery.remote.condition
    delivery.settle()
    return state, condition


def test_a_dead_owners_backlog_is_bounded_refused_naming_it_and_delivered_in_order_once_it_is_back(cluster,
                                                                                                   clients):
    source, owner, spare = cluster.nodes
    owner_id = cluster.node_ids[1]
    on_owner = clients.consumer(owner, "orders", "c1")
    on_spare = clients.consumer(spare, "other", "c2")
    cluster.wait_consumers("orders", {1: 1})
    cluster.wait_consumers("other", {2: 1})
    clients.send(source, "orders", [grouped(f"{group}:warm", group) for group in GROUPS], name="warm")
    assert sorted(bodies(on_owner.fetch_many(len(GROUPS)))) == sorted(f"{group}:warm" for group in GROUPS)
    clients.send(source, "other", [grouped("h:warm", "h")], name="warm-other")
    assert bodies(on_spare.fetch_many(1)) == ["h:warm"]

    owner.kill()
    sender = clients.connection(source).create_sender("orders", name="filler")
    accepted: list[str] = []
    refusal = None
    for number in range(SENDS_MAX):
        body = f"{GROUPS[number % len(GROUPS)]}:{number}:{BODY}"
        state, condition = send_with_condition(sender, grouped(body, GROUPS[number % len(GROUPS)]))
        if state == Delivery.REJECTED:
            refusal = condition
            break
        assert state == Delivery.ACCEPTED, condition
        accepted.append(body)
    assert refusal is not None, f"{len(accepted)} sends of {len(BODY)} bytes were all accepted"
    assert refusal.name == "amqp:resource-limit-exceeded"
    assert f"owner node {owner_id}" in refusal.description
    assert f"outbound_max_bytes = {OUTBOUND_MAX_BYTES} bytes" in refusal.description
    # nothing was dropped to make room, and the next send is refused too
    assert send_with_condition(sender, grouped(f"g0:again:{BODY}", "g0"))[0] == Delivery.REJECTED
    # another owner's groups are unaffected
    clients.send(source, "other", [grouped("h:during", "h")], name="other-during")
    assert bodies(on_spare.fetch_many(1)) == ["h:during"]

    values = metrics(source)
    backlog_bytes = values[f'grouper_forward_backlog_bytes{{owner="{owner_id}"}}']
    assert len(BODY) * len(accepted) <= backlog_bytes <= OUTBOUND_MAX_BYTES
    # refused only once full: the next send (its number a digit or so longer) would have passed the bound
    assert backlog_bytes + backlog_bytes / len(accepted) + 8 > OUTBOUND_MAX_BYTES
    assert values[f'grouper_forward_backlog_messages{{owner="{owner_id}"}}'] == len(accepted)
    assert values[f'grouper_forward_backlog_journal_bytes{{owner="{owner_id}"}}'] == backlog_bytes
    assert values[f'grouper_forward_backlog_refused_messages_total{{owner="{owner_id}"}}'] == 2
    assert values["grouper_outbound_max_bytes"] == OUTBOUND_MAX_BYTES
    status = cluster.status(via=0)  # grouper cluster status --json, answered by node 0
    assert status["outbound"] == {owner_id: len(accepted)} and status["outbound_bytes"] == {owner_id: backlog_bytes}
    text = source.cli("cluster", "status", "--timeout-ms", "2000")
    assert f"outbound {owner_id}: {len(accepted)} ({int(backlog_bytes)} bytes)" in text.stdout, text

    # the backlog is journalled: node 0 restarted counts it again and still refuses past the bound
    source.restart()
    cluster.wait_for(lambda s: s["leader"] and s["leader"] != owner_id, "a leader without node 1", via=0)
    wait_until(lambda: metrics(source).get(f'grouper_forward_backlog_bytes{{owner="{owner_id}"}}') == backlog_bytes,
               "node 0 recovered its backlog for node 1", timeout_s=WAIT_S)
    sender = clients.connection(source).create_sender("orders", name="filler-again")
    state, condition = send_with_condition(sender, grouped(f"g1:after-restart:{BODY}", "g1"))
    assert state == Delivery.REJECTED and f"owner node {owner_id}" in condition.description

    owner.start()
    on_owner = clients.consumer(owner, "orders", "c1-again")
    delivered = bodies(on_owner.fetch_many(len(accepted)))
    for group in GROUPS:
        assert [body for body in delivered if body.startswith(f"{group}:")] == [
            body for body in accepted if body.startswith(f"{group}:")]
    assert sorted(delivered) == sorted(accepted)
    assert on_owner.poll() is None
    wait_until(lambda: f'grouper_forward_backlog_bytes{{owner="{owner_id}"}}' not in metrics(source),
               "node 0's backlog for node 1 drained", timeout_s=WAIT_S)
    assert send_with_condition(sender, grouped(f"g0:after:{BODY}", "g0"))[0] == Delivery.ACCEPTED
    assert bodies(on_owner.fetch_many(1)) == [f"g0:after:{BODY}"]


@pytest.fixture
def paging_cluster(tmp_path):
    made = Cluster(tmp_path, 3, f"[node]\noutbound_memory_max_bytes = {OUTBOUND_MEMORY_MAX_BYTES}\n")
    yield made.start()
    made.kill_all()


def backlog(node, owner_id: str) -> dict[str, float]:
    """The forward backlog's figures for `owner_id` on `node`'s /metrics, by name suffix."""
    values = metrics(node)
    prefix = "grouper_forward_backlog_"
    return {name[len(prefix):].split("{")[0]: value for name, value in values.items()
            if name.startswith(prefix) and f'owner="{owner_id}"' in name}


def test_a_dead_owners_backlog_is_paged_to_the_journal_past_the_memory_budget_and_all_of_it_arrives_in_order(
        paging_cluster, clients):
    cluster = paging_cluster
    source, owner, _spare = cluster.nodes
    owner_id = cluster.node_ids[1]
    on_owner = clients.consumer(owner, "orders", "c1")
    cluster.wait_consumers("orders", {1: 1})
    clients.send(source, "orders", [grouped(f"{group}:warm", group) for group in GROUPS], name="warm")
    assert sorted(bodies(on_owner.fetch_many(len(GROUPS)))) == sorted(f"{group}:warm" for group in GROUPS)

    owner.kill()
    sent = [f"{GROUPS[number % len(GROUPS)]}:{number}:{BODY}" for number in range(PAGED_SENDS)]
    clients.send(source, "orders", [grouped(body, body.split(":")[0]) for body in sent], name="filler")

    def paged(figures: dict) -> bool:
        return figures.get("messages") == PAGED_SENDS and figures.get("journal_messages") == PAGED_SENDS
    wait_until(lambda: paged(backlog(source, owner_id)), "node 0 holds the backlog for node 1", timeout_s=WAIT_S)
    figures = backlog(source, owner_id)
    assert figures["journal_bytes"] == figures["bytes"] >= PAGED_SENDS * len(BODY)
    # the forwarder holds the budget's worth, never more; every other body is in the journal only
    assert 0 < figures["memory_bytes"] <= OUTBOUND_MEMORY_MAX_BYTES, figures
    assert figures["memory_messages"] <= OUTBOUND_MEMORY_MAX_BYTES // len(BODY), figures
    assert metrics(source)["grouper_outbound_memory_max_bytes"] == OUTBOUND_MEMORY_MAX_BYTES

    # killed and restarted, node 0 recovers the backlog from its journal and pages it again
    source.kill()
    source.start()
    wait_until(lambda: paged(backlog(source, owner_id)), "node 0 recovered its backlog for node 1", timeout_s=WAIT_S)
    assert backlog(source, owner_id)["memory_bytes"] <= OUTBOUND_MEMORY_MAX_BYTES

    owner.start()
    on_owner = clients.consumer(owner, "orders", "c1-again")
    delivered = bodies(on_owner.fetch_many(PAGED_SENDS))
    for group in GROUPS:
        assert [body for body in delivered if body.startswith(f"{group}:")] == [
            body for body in sent if body.startswith(f"{group}:")]
    assert sorted(delivered) == sorted(sent)
    assert on_owner.poll() is None
    wait_until(lambda: not backlog(source, owner_id), "node 0's backlog for node 1 drained", timeout_s=WAIT_S)
