"""Replication end to end with real clients (issue 28): nothing plays a part here. A 3-node cluster with
replication_factor 2, replica_failover_ms 1750 and replica_lease_ms 500; a python-qpid-proton producer sends durable grouped
messages to the groups' owner (a node other than the raft leader: placement local, its consumer there when the groups are placed),
consumers wait on the other two nodes. The owner's own streams copy its groups to their backups and the
owner proposes them in sync (waited for on `cluster status`). Then kill -9 of the owner mid-stream: raft
promotes its groups to their in-sync backups, which deliver every message the producer saw accepted,
exactly once after settling, in group order; the only repeats are messages the owner had delivered and not
had settled, with their delivery count raised. The producer reconnects to a survivor and goes on once the
promotion is in raft. The old owner, restarted, fences itself and serves none of the promoted groups.
The time from the kill to the first delivery of one of the dead owner's groups elsewhere is printed. The
survivors' consumers are python-qpid-proton, or rhea under Node.js (tests/interop/rhea_client.py).
"""

from __future__ import annotations

import threading
import time

import pytest

from proton import ConnectionException, Delivery, Timeout
from proton.utils import LinkDetached, SendException

from tests.integration.clients import queue_toml
from tests.integration.harness import ManualReceiver, connect, grouped, send_outcome, wait_until

QUEUE = "orders"
GROUPS = [f"g{number}" for number in range(6)]
PER_GROUP = 12  # sends per group; the owner dies about a third of the way through
KILL_AFTER = 24  # accepted sends before the kill
# the shortest failover the owner's lease allows with the default election timeouts (node/core/cluster/owner_lease.py:
# lease <= failover - 2 x election_timeout_max_ms (500) - 250), the lease at its largest then
REPLICA_FAILOVER_MS = 1750
REPLICA_LEASE_MS = 500
CONFIG = (f"[node]\nreplication_factor = 2\nreplica_failover_ms = {REPLICA_FAILOVER_MS}\n"
          f"replica_lease_ms = {REPLICA_LEASE_MS}\nplacement = \"local\"\n"
          + queue_toml(QUEUE, durable=True))
UNSETTLED_MAX = 3  # the owner's consumer keeps this many deliveries unsettled at the kill
TAKER_CREDIT = 1000  # each survivor's consumer: more than the test sends


def owner_row(status, owner: str) -> dict:
    return {member["node"]: member for member in status["members"]}[owner]


def pump(receiver: ManualReceiver, timeout_s: float = 0.02) -> list:
    """What arrived on `receiver` within `timeout_s`, stamped with time.monotonic() as taken."""
    try:
        receiver.connection.wait(lambda: receiver.arrived_count > 0, timeout=timeout_s)
    except Timeout:
        pass
    return [(time.monotonic(), held) for held in receiver.take_arrived()]


class ProtonTakers:
    """python-qpid-proton consumers on the survivors; `take()` stamps what arrived and accepts it."""

    def __init__(self, nodes, connections):
        self.receivers = []
        for node in nodes:
            receiver = ManualReceiver(connect(node), QUEUE, "taker", credit=0)
            connections.append(receiver.connection)
            self.receivers.append(receiver)

    def flow(self) -> None:
        for receiver in self.receivers:
            receiver.flow(TAKER_CREDIT)

    def take(self) -> list:
        """[(arrival, body, delivery count)] of what arrived since the last call, each accepted."""
        taken = []
        for receiver in self.receivers:
            for arrival, held in pump(receiver, 0.01):
                taken.append((arrival, held.body, held.delivery_count))
                held.accept()
        return taken

    def close(self) -> None:
        pass  # their connections are the fixture's


class RheaTakers:
    """rhea consumers (tests/interop/rhea_client.py) on the survivors: each delivery stamped as its event reaches
    this process (a pipe hop after rhea got it) and accepted at once from the thread that reads rhea's events."""

    def __init__(self, nodes):
        from tests.interop.rhea_client import RheaClient, ensure_rhea_installed

        class Stamped(RheaClient):
            def record(self, event: dict) -> None:
                super().record({**event, "arrival": time.monotonic()})
                if event["event"] == "message":
                    try:
                        self._command("settle", link=event["link"], delivery=event["delivery"], outcome="accept")
                    except (OSError, ValueError):  # stdin closed by close(): the taker is done
                        pass

        nodejs = ensure_rhea_installed()
        self.clients = []
        for node in nodes:
            host, port = node.amqp_address.rsplit(":", 1)
            client = Stamped(nodejs, host, int(port))
            self.clients.append(client)
            client.open_receiver("taker", QUEUE)
        self.seen = [0 for _ in self.clients]

    def flow(self) -> None:
        for client in self.clients:
            client.flow("taker", TAKER_CREDIT)

    def take(self) -> list:
        time.sleep(0.01)  # rhea's events arrive on its reader thread; this only paces the caller's loop
        taken = []
        for index, client in enumerate(self.clients):
            with client._changed:
                messages = [event for event in client.events if event["event"] == "message"]
            taken += [(event["arrival"], event["body"], event["delivery_count"])
                      for event in messages[self.seen[index]:]]
            self.seen[index] = len(messages)
        return taken

    def close(self) -> None:
        for client in self.clients:
            client.close()


@pytest.mark.parametrize("taker", ["proton", "rhea"])
def test_owner_kill_under_grouped_load_moves_its_groups_to_their_backups_with_nothing_lost_or_reordered(
        cluster_factory, connections, taker):
    cluster = cluster_factory(CONFIG)
    # the owner is not the raft leader: its kill costs the promotion only, not an election first
    owner_index = (cluster.wait_leader() + 1) % 3
    owner_node = cluster.nodes[owner_index]

    # the groups are placed on the owner: its consumer is the only one when the first message of each arrives
    owner_consumer = ManualReceiver(connect(owner_node), QUEUE, "c0", credit=0)
    connections.append(owner_consumer.connection)
    cluster.wait_consumers(QUEUE, {owner_index: 1})
    producer_connection = connect(owner_node)
    connections.append(producer_connection)
    sender = producer_connection.create_sender(QUEUE, name="producer")
    sends = [(group, seq) for seq in range(PER_GROUP) for group in GROUPS]
    accepted: list[tuple[str, int]] = []
    for group, seq in sends[:len(GROUPS)]:
        assert send_outcome(sender, grouped(f"{group}:{seq}", group))[0] == Delivery.ACCEPTED
        accepted.append((group, seq))
    survivors = [node for index, node in enumerate(cluster.nodes) if index != owner_index]
    takers = ProtonTakers(survivors, connections) if taker == "proton" else RheaTakers(survivors)
    try:
        run_kill(cluster, connections, owner_index, owner_consumer, sender, sends, accepted, takers)
    finally:
        takers.close()


def run_kill(cluster, connections, owner_index, owner_consumer, sender, sends, accepted, takers) -> None:
    """The in-sync wait, the kill mid-stream, the takeover's checks and the old owner's fenced return."""
    ids = cluster.node_ids
    others = [index for index in range(3) if index != owner_index]
    owner, owner_node = ids[owner_index], cluster.nodes[owner_index]
    cluster.wait_consumers(QUEUE, {0: 1, 1: 1, 2: 1})
    status = cluster.wait_for(lambda s: sorted(owner_row(s, owner)["in_sync"]) == sorted(ids[index] for index in others),
                              "the owner's streams proposing both backups in sync", timeout_s=15)
    assert owner_row(status, owner)["routes"] == len(GROUPS) and not owner_row(status, owner)["under_replicated"]
    epoch_before = owner_row(status, owner)["epoch"]
    takers.flow()

    # mid-stream: the owner's consumer takes and settles with a lag while the producer goes on
    owner_consumer.flow(1000)
    delivered_before: list = []  # (body, delivery count) the owner delivered
    settled_before: set[str] = set()  # accepted by the client and confirmed by the owner
    unsettled: list = []
    killer = None
    next_send = len(GROUPS)
    unknown: list[tuple[str, int]] = []
    killed_at = 0.0
    while next_send < len(sends):
        group, seq = sends[next_send]
        if len(accepted) == KILL_AFTER and killer is None:
            killer = threading.Thread(target=owner_node.kill)
            killed_at = time.monotonic()
            killer.start()  # the send below races the kill
        try:
            state = send_outcome(sender, grouped(f"{group}:{seq}", group), timeout_s=5)[0]
        except (ConnectionException, LinkDetached, SendException, Timeout):
            state = None
        if state == Delivery.ACCEPTED:
            accepted.append((group, seq))
        elif killer is not None:
            unknown.append((group, seq))  # no outcome: may arrive or not, never counted as accepted
            break
        else:
            raise AssertionError(f"{group}:{seq} refused before the kill: {state}")
        next_send += 1
        if killer is None:
            for _, held in pump(owner_consumer, 0.005):
                delivered_before.append((held.body, held.delivery_count))
                unsettled.append(held)
            while len(unsettled) > UNSETTLED_MAX:
                held = unsettled.pop(0)
                held.accept()
                settled_before.add(held.body)
    assert killer is not None, "the owner was never killed"
    received: list = []  # (arrival, body, delivery count) at the backups' consumers, stamped as taken

    def take() -> None:
        received.extend(takers.take())

    wait_until(lambda: take() or received, "a first delivery of the dead owner's groups at a backup",
               timeout_s=15, interval_s=0)
    first_delivery_ms = (min(arrival for arrival, _, _ in received) - killed_at) * 1000
    killer.join()
    next_send += 1

    # the producer reconnects to a survivor and goes on once raft has moved the dead owner's groups
    cluster.wait_for(lambda s: owner_row(s, owner)["epoch"] > epoch_before and owner_row(s, owner)["routes"] == 0,
                     "the dead owner's groups promoted", via=others[0])
    producer_connection = connect(cluster.nodes[others[0]])
    connections.append(producer_connection)
    sender = producer_connection.create_sender(QUEUE, name="producer-again")
    for group, seq in sends[next_send:]:
        assert send_outcome(sender, grouped(f"{group}:{seq}", group))[0] == Delivery.ACCEPTED, (group, seq)
        accepted.append((group, seq))

    # every accepted message reaches the backups' consumers; stamped as it arrives
    wanted = {f"{group}:{seq}" for group, seq in accepted} - settled_before
    deadline = time.monotonic() + 20
    while not wanted <= {body for _, body, _ in received} and time.monotonic() < deadline:
        take()
    missing = wanted - {body for _, body, _ in received}
    assert not missing, f"lost: {sorted(missing)}"

    bodies_after = [body for _, body, _ in sorted(received)]
    repeats = [body for body in bodies_after if bodies_after.count(body) > 1]
    assert not repeats, f"delivered twice after the kill: {repeats}"
    settled_again = [body for body in bodies_after if body in settled_before]
    unsettled_bodies = {held.body for held in unsettled}
    delivered_bodies = {body for body, _ in delivered_before}
    for arrival, body, count in received:
        if body in delivered_bodies:
            assert body not in settled_before, f"{body} settled at the owner and delivered again"
            assert count >= 1, f"{body} delivered again with delivery count {count}"
    assert not settled_again
    allowed = {f"{group}:{seq}" for group, seq in accepted + unknown}
    assert set(bodies_after) <= allowed, sorted(set(bodies_after) - allowed)
    for group in GROUPS:  # group order: the owner's deliveries, then the backups' from the first unsettled
        before = [int(body.split(":")[1]) for body, _ in delivered_before if body.split(":")[0] == group]
        after = [int(body.split(":")[1]) for body in bodies_after if body.split(":")[0] == group]
        assert before == sorted(before) and after == sorted(after), (group, before, after)
    assert unsettled_bodies - set(bodies_after) == set(), "a delivery the owner had not had settled was lost"
    print(f"\nkill -9 of the owner to the first delivery of its groups at a backup: {first_delivery_ms:.0f} ms "
          f"({type(takers).__name__}, replica_failover_ms {REPLICA_FAILOVER_MS}; {len(accepted)} accepted, "
          f"{len(unknown)} without outcome, {len(unsettled)} unsettled at the kill)")

    # the old owner returns fenced: it serves none of its old groups, the backups keep them
    owner_node.start()
    wait_until(lambda: any("promoted away" in line for line in owner_node.output), "the old owner's fencing log")
    back = ManualReceiver(connect(owner_node), QUEUE, "back", credit=0)
    connections.append(back.connection)
    assert back.poll() is None
    producer_connection = connect(owner_node)
    connections.append(producer_connection)
    sender = producer_connection.create_sender(QUEUE, name="producer-at-old-owner")
    for group in GROUPS:
        assert send_outcome(sender, grouped(f"{group}:{PER_GROUP}", group))[0] == Delivery.ACCEPTED
    after_return: list = []
    deadline = time.monotonic() + 10
    while len(after_return) < len(GROUPS) and time.monotonic() < deadline:
        after_return += [body for _, body, _ in takers.take()]
    assert sorted(after_return) == sorted(f"{group}:{PER_GROUP}" for group in GROUPS), after_return
    assert back.poll() is None
    status = cluster.wait_for(lambda s: True, "status", via=owner_index)
    assert owner_row(status, owner)["routes"] == 0
