"""Failover drills: a 3-node cluster under grouped load, nodes killed with SIGKILL and restarted.

Each drill starts its own cluster with the queue declared durable on every node, places consumers
(so it is known which node owns the busy groups), then runs a producer on EVERY node over the same
groups, kills one node (or two) mid-load, restarts it, lets the load go on, stops the producers,
waits until nothing is left in any outbound store or queue, drains the consumers and hands every
log to the checker: no accepted message lost, no order or exclusivity violation, no duplicate among
confirmed acceptances. A probe producer sends a NEW group with every message, to time how long new
groups cannot be routed.

Times come from the clients' own logs (wall-clock ms of this machine), so a measurement is as
precise as the log stamps, not as coarse as a poll. Each drill writes its numbers and the checker's
counts to `<tmp>/<drill>.summary.json` and prints them (pytest -s shows them); the nodes' output is
kept in `<tmp>/node<i>.log`. Every wait is bounded and polls the admin API or the clients' counters.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from node.admin.client import AdminClient, AdminError
from tests.drills.checker import Report, check_files, load_jsonl
from tests.drills.load import GroupedProducer, Load, LoggingConsumer, now_ms, wait_accepted
from tests.integration.cluster import Cluster, in_transit
from tests.integration.clients import queue_toml

QUEUE = "drill"
PROBE_QUEUE = "drill-probe"  # the probe's own queue: its deliveries never wait behind the busy queue's backlog
GROUPS = [f"g{index:02d}" for index in range(15)]
PROBE_GROUPS = [f"new{index:06d}" for index in range(100_000)]  # one new group per probe send
LOAD_S = 3.0  # load before each kill, during an outage, and after the restart
IN_FLIGHT_MAX = 5  # per producer: the consumers keep up (a backlog only lengthens the drain), 2 cores suffice
CONSUMER_CREDIT = 30
RECONNECT_DELAY_MAX_S = 0.25  # clients come back soon after a restart, so the timings show the node
PROGRESS_TIMEOUT_S = 15.0  # bound of every wait for the load to make progress
SETTLE_TIMEOUT_S = 30.0  # bound of the wait for outbound stores and queues to empty after the load
ADMIN_TIMEOUT_MS = 2000
NEW_GROUP_AFTER_LEADER_KILL_BOUND_S = 5.0  # generous: election timeouts are 200..500 ms
FIRST_DELIVERY_AFTER_RESTART_BOUND_S = 10.0
HANDLER_UNAVAILABLE = "grouper:grouping-handler-unavailable"


# ---- the cluster and the clients ---------------------------------------------------------------

@pytest.fixture
def cluster_factory(tmp_path):
    made: list[Cluster] = []

    def make(*args: str) -> Cluster:
        cluster = Cluster(tmp_path, 3, queue_toml(QUEUE, durable=True) + queue_toml(PROBE_QUEUE, durable=True), args)
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.kill_all()
        for index, node in enumerate(cluster.nodes):
            (tmp_path / f"node{index}.log").write_text("\n".join(node.output) + "\n")


class Drill:
    """One drill's cluster, clients and measurements; `summary` ends up in <tmp>/<name>.summary.json."""

    def __init__(self, name: str, cluster: Cluster, directory: Path):
        self.name = name
        self.cluster = cluster
        self.directory = Path(directory)
        self.logs = self.directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.summary: dict = {"drill": name}
        self.consumers: list[LoggingConsumer] = []
        self.producers: dict[int, GroupedProducer] = {}  # node index -> its producer
        self.probe: GroupedProducer | None = None
        self.load = Load([], [])

    def node_id(self, index: int) -> str:
        return self.cluster.node_ids[index]

    def leader(self) -> int:
        return self.cluster.wait_leader()

    def start_consumers(self, placement: dict[int, int], queue: str = QUEUE) -> None:
        """`placement`: node index -> consumers there; returns once the route table knows them all."""
        for index, count in sorted(placement.items()):
            for _ in range(count):
                name = f"c{len(self.consumers)}-node{index}"
                consumer = LoggingConsumer(self.cluster.nodes[index].url, queue, self.logs / f"{name}.jsonl",
                                           name=name, credit=CONSUMER_CREDIT,
                                           reconnect_delay_max_s=RECONNECT_DELAY_MAX_S)
                consumer.start()
                self.consumers.append(consumer)
                self.load.consumers.append(consumer)
        self.cluster.wait_consumers(queue, {index: placement.get(index, 0) for index in range(3)})
        self.summary.setdefault("consumers", {})[queue] = {
            self.node_id(index): count for index, count in sorted(placement.items())}

    def start_producers(self) -> None:
        """One producer per node, all over GROUPS, round-robin."""
        for index, node in enumerate(self.cluster.nodes):
            name = f"p{index}"
            producer = GroupedProducer(node.url, QUEUE, GROUPS, self.logs / f"{name}.jsonl", name=name,
                                       in_flight_max=IN_FLIGHT_MAX, reconnect_delay_max_s=RECONNECT_DELAY_MAX_S)
            producer.start()
            self.producers[index] = producer
            self.load.producers.append(producer)

    def place_groups(self, placement: dict[int, list[str]]) -> None:
        """Route each group of `placement[index]` to node `index` (which must have consumers) by sending
        its first message there: the first proposal wins, and a proposer with consumers gets the group."""
        placers = []
        for index, groups in sorted(placement.items()):
            name = f"place{index}"
            placer = GroupedProducer(self.cluster.nodes[index].url, QUEUE, groups, self.logs / f"{name}.jsonl",
                                     name=name, messages_max=len(groups), in_flight_max=1)
            placer.start()
            placers.append(placer)
            self.load.producers.append(placer)
        for placer in placers:
            placer.join(PROGRESS_TIMEOUT_S)
            assert not placer.is_alive() and placer.outcomes["accepted"] == placer.sent, \
                f"{self.name}: {placer.name} could not place its groups: {placer.outcomes}"
        self.summary["placed"] = {self.node_id(index): groups for index, groups in sorted(placement.items())}

    def start_probe(self, index: int, in_flight_max: int = 1) -> None:
        """A producer at node `index` sending one new group per message to PROBE_QUEUE, whose one
        consumer is at the same node: each route is decided by the raft cluster, and it is `index`."""
        self.start_consumers({index: 1}, PROBE_QUEUE)
        self.probe = GroupedProducer(self.cluster.nodes[index].url, PROBE_QUEUE, PROBE_GROUPS,
                                     self.logs / "probe.jsonl", name="probe", in_flight_max=in_flight_max,
                                     reconnect_delay_max_s=RECONNECT_DELAY_MAX_S)
        self.probe.start()
        self.load.producers.append(self.probe)
        self.summary["probe_node"] = self.node_id(index)

    def kill(self, index: int) -> int:
        """SIGKILL node `index` and wait for its raft member to be gone; returns the wall-clock ms just before
        the signal."""
        killed_ms = now_ms()
        self.cluster.nodes[index].kill()
        return killed_ms

    def restart(self, index: int) -> tuple[int, int]:
        """Start node `index` again on its data directory; (ms before the start, ms it printed ready)."""
        started_ms = now_ms()
        self.cluster.nodes[index].start()
        return started_ms, now_ms()

    # ---- waits ---------------------------------------------------------------------------------

    def wait_accepted(self, producers: list[GroupedProducer], more: int, what: str) -> None:
        """Until each of `producers` has `more` accepted sends beyond what it has now."""
        wait_accepted(producers, more, PROGRESS_TIMEOUT_S, f"{self.name}: {what}")

    def run_load(self, seconds: float, producers: list[GroupedProducer], what: str) -> None:
        """Load for `seconds`, and at least some accepts from each of `producers` in that time."""
        deadline = time.monotonic() + seconds
        self.wait_accepted(producers, 20, what)
        time.sleep(max(0.0, deadline - time.monotonic()))

    def wait_new_leader(self, killed: int) -> tuple[int, int]:
        """Until a live node names a leader other than `killed`: (its index, the wall-clock ms seen)."""
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        last = None
        while time.monotonic() < deadline:
            for index in others(killed):
                last = self.node_status(index)
                leader = last["leader"] if last is not None else ""
                if leader and leader != self.node_id(killed):
                    return self.cluster.index_of(leader), now_ms()
            time.sleep(0.02)
        raise AssertionError(f"{self.name}: no new leader within {PROGRESS_TIMEOUT_S} s; last status: {last}")

    def node_status(self, index: int) -> dict | None:
        node = self.cluster.nodes[index]
        try:
            with AdminClient(node.admin_address, timeout_ms=ADMIN_TIMEOUT_MS) as client:
                return client.cluster_status()
        except AdminError:
            return None

    def settle(self) -> None:
        """Stop the producers, then wait until no node holds a message in an outbound store, waiting
        for a route, queued or acquired: everything accepted has reached a consumer."""
        for producer in self.load.producers:
            producer.stop()
        started_s = time.monotonic()
        trace = self.summary.setdefault("settle_trace", [])  # what was left, about every second
        while True:
            statuses = [self.node_status(index) for index in range(3)]
            left = in_transit(statuses)
            elapsed_s = time.monotonic() - started_s
            if not trace or elapsed_s - trace[-1][0] / 1000 >= 1.0 or not left:
                trace.append((round(elapsed_s * 1000), left))
            if not left:
                return
            assert elapsed_s < SETTLE_TIMEOUT_S, f"{self.name}: still in transit after {SETTLE_TIMEOUT_S} s: {left}"
            time.sleep(0.2)

    def check(self) -> Report:
        """Settle, drain, stop the consumers and judge every log; the counts go into the summary."""
        started_s = time.monotonic()
        self.settle()
        self.load.finish(quiet_s=0.5, timeout_s=PROGRESS_TIMEOUT_S)
        self.summary["settle_and_drain_ms"] = round((time.monotonic() - started_s) * 1000)
        report = check_files(self.load.send_paths, self.load.delivery_paths)
        self.summary["report"] = {
            **{field.name: getattr(report, field.name) for field in dataclasses.fields(report)
               if isinstance(getattr(report, field.name), int)},
            **{field.name: len(getattr(report, field.name)) for field in dataclasses.fields(report)
               if isinstance(getattr(report, field.name), list)},
            "ok": report.ok,
        }
        self.summary["producers"] = {producer.name: producer.outcomes for producer in self.load.producers}
        self.summary["checker"] = report.summary()
        return report

    def write_summary(self) -> None:
        path = self.directory / f"{self.name}.summary.json"
        path.write_text(json.dumps(self.summary, indent=1, sort_keys=True) + "\n")
        print(f"\n{self.name} summary ({path}):\n{json.dumps(self.summary, indent=1, sort_keys=True)}")

    # ---- reading the logs ----------------------------------------------------------------------

    def probe_sends(self) -> list[dict]:
        return load_jsonl(self.probe.log_path) if self.probe is not None else []

    def deliveries(self) -> list[dict]:
        return load_jsonl([consumer.log_path for consumer in self.consumers])


def first_accepted_after(sends: list[dict], since_ms: int) -> dict | None:
    """The first send made at or after `since_ms` that was accepted (by settled_ms)."""
    accepted = [line for line in sends if line["sent_ms"] >= since_ms and line["outcome"] == "accepted"]
    return min(accepted, key=lambda line: line["settled_ms"], default=None)


def delivery_of(deliveries: list[dict], send: dict) -> dict | None:
    key = (send["producer"], send["group"], send["sequence"])
    found = [line for line in deliveries if (line["producer"], line["group"], line["sequence"]) == key]
    return min(found, key=lambda line: line["received_ms"], default=None)


def assert_ok(report: Report) -> None:
    assert report.ok, report.summary()
    assert report.delivered > 0 and report.accepted > 0, report.summary()


def others(index: int, *excluded: int) -> list[int]:
    return [other for other in range(3) if other != index and other not in excluded]


# ---- the drills --------------------------------------------------------------------------------

def test_killing_the_raft_leader_elects_another_and_new_groups_are_routed_again_within_seconds(
        cluster_factory, tmp_path):
    cluster = cluster_factory()
    drill = Drill("leader_kill", cluster, tmp_path)
    leader = drill.leader()
    first, second = others(leader)
    with drill.load:
        drill.start_consumers({first: 1, second: 1})  # the groups live on the followers
        drill.start_producers()
        drill.start_probe(first)
        drill.run_load(LOAD_S, [*drill.producers.values(), drill.probe], "before the kill")

        current = cluster.status()["leader"]
        assert current == drill.node_id(leader), f"the leader moved before the kill: {current}"
        probe_accepted = drill.probe.outcomes["accepted"]
        killed_ms = drill.kill(leader)
        new_leader, elected_seen_ms = drill.wait_new_leader(leader)
        # one probe send may have been in flight at the kill: two more accepts prove a send made after it
        drill.wait_accepted([drill.probe], 2, "a new group after the leader's kill")
        drill.wait_accepted([drill.producers[first], drill.producers[second]], 20, "after the leader's kill")
        restarted_ms, ready_ms = drill.restart(leader)
        drill.run_load(LOAD_S, [*drill.producers.values(), drill.probe], "after the old leader's restart")
        report = drill.check()

    first_new = first_accepted_after(drill.probe_sends(), killed_ms)
    delivered = delivery_of(drill.deliveries(), first_new)
    refused_during = [line for line in drill.probe_sends()
                      if line["sent_ms"] >= killed_ms and line["settled_ms"] <= first_new["settled_ms"]
                      and line["outcome"] != "accepted"]
    drill.summary.update({
        "killed_leader": drill.node_id(leader), "new_leader": drill.node_id(new_leader),
        "probe_accepted_before_kill": probe_accepted,
        "kill_to_new_leader_seen_ms": elected_seen_ms - killed_ms,  # polled every ~20 ms plus a status call
        "kill_to_first_new_group_accepted_ms": first_new["settled_ms"] - killed_ms,
        "kill_to_first_new_group_delivered_ms": delivered["received_ms"] - killed_ms if delivered else None,
        "probe_sends_refused_before_that": len(refused_during),
        "restart_to_ready_ms": ready_ms - restarted_ms,
    })
    drill.write_summary()
    assert_ok(report)
    assert delivered is not None, f"the first new group after the kill was never delivered: {first_new}"
    assert first_new["settled_ms"] - killed_ms < NEW_GROUP_AFTER_LEADER_KILL_BOUND_S * 1000, drill.summary
    assert delivered["received_ms"] - killed_ms < NEW_GROUP_AFTER_LEADER_KILL_BOUND_S * 1000, drill.summary


def test_killing_a_remote_node_that_owns_no_groups_and_restarting_it_loses_and_reorders_nothing(
        cluster_factory, tmp_path):
    cluster = cluster_factory()
    drill = Drill("remote_kill", cluster, tmp_path)
    owner = others(drill.leader())[0]
    with drill.load:
        drill.start_consumers({owner: 2})  # every group lives on the owner
        drill.start_producers()
        drill.run_load(LOAD_S, list(drill.producers.values()), "before the kill")

        leader = cluster.index_of(cluster.status()["leader"])
        remote = others(owner, leader)[0]  # neither the leader nor the owner
        killed_ms = drill.kill(remote)
        drill.run_load(LOAD_S, [drill.producers[index] for index in others(remote)], "while the remote is down")
        restarted_ms, ready_ms = drill.restart(remote)
        drill.run_load(LOAD_S, list(drill.producers.values()), "after the remote's restart")
        report = drill.check()

    remote_sends = load_jsonl(drill.producers[remote].log_path)
    first_back = first_accepted_after(remote_sends, restarted_ms)
    drill.summary.update({
        "owner": drill.node_id(owner), "leader": drill.node_id(leader), "killed_remote": drill.node_id(remote),
        "down_ms": restarted_ms - killed_ms, "restart_to_ready_ms": ready_ms - restarted_ms,
        "restart_to_first_accept_at_remote_ms": first_back["settled_ms"] - restarted_ms,
        "remote_producer_connects": drill.producers[remote].connects,
    })
    drill.write_summary()
    assert_ok(report)
    assert drill.producers[remote].connects >= 2, "the remote's producer never came back"


def test_killing_the_owner_of_the_busy_groups_holds_their_messages_at_the_senders_until_it_returns(
        cluster_factory, tmp_path):
    cluster = cluster_factory()
    drill = Drill("owner_kill", cluster, tmp_path)
    owner = others(drill.leader())[0]
    with drill.load:
        drill.start_consumers({owner: 2})  # every group lives on the owner
        drill.start_producers()
        drill.run_load(LOAD_S, list(drill.producers.values()), "before the kill")

        killed_ms = drill.kill(owner)
        senders = [drill.producers[index] for index in others(owner)]
        # the other nodes keep accepting: the owner's groups wait in their outbound stores
        drill.run_load(LOAD_S, senders, "while the owner is down")
        held = {drill.node_id(index): (drill.node_status(index) or {}).get("outbound", {}).get(drill.node_id(owner), 0)
                for index in others(owner)}
        restarted_ms, ready_ms = drill.restart(owner)
        drill.run_load(LOAD_S, list(drill.producers.values()), "after the owner's restart")
        report = drill.check()

    after = [line for line in drill.deliveries() if line["received_ms"] >= restarted_ms]
    first_delivery = min(after, key=lambda line: line["received_ms"], default=None)
    held_sends = {(line["producer"], line["group"], line["sequence"])
                  for producer in senders for line in load_jsonl(producer.log_path)
                  if line["outcome"] == "accepted" and killed_ms <= line["settled_ms"] < restarted_ms}
    first_held = min((line for line in after if (line["producer"], line["group"], line["sequence"]) in held_sends),
                     key=lambda line: line["received_ms"], default=None)
    drill.summary.update({
        "owner": drill.node_id(owner), "down_ms": restarted_ms - killed_ms,
        "outbound_to_owner_while_down": held,
        "accepted_elsewhere_while_down": {producer.name: sum(
            1 for line in load_jsonl(producer.log_path)
            if line["outcome"] == "accepted" and killed_ms <= line["settled_ms"] < restarted_ms)
            for producer in senders},
        "restart_to_ready_ms": ready_ms - restarted_ms,
        "restart_to_first_delivery_ms": first_delivery["received_ms"] - restarted_ms if first_delivery else None,
        "ready_to_first_delivery_ms": first_delivery["received_ms"] - ready_ms if first_delivery else None,
        # a message another node accepted while the owner was down, so it came from an outbound store
        "restart_to_first_held_delivery_ms": first_held["received_ms"] - restarted_ms if first_held else None,
    })
    drill.write_summary()
    assert_ok(report)
    assert sum(held.values()) > 0, f"nothing waited in an outbound store for the owner: {held}"
    assert first_delivery is not None and first_held is not None, drill.summary
    assert first_delivery["received_ms"] - restarted_ms < FIRST_DELIVERY_AFTER_RESTART_BOUND_S * 1000, drill.summary
    assert all(consumer.connects >= 2 for consumer in drill.consumers), "a consumer never reconnected"


def test_without_a_majority_new_groups_are_refused_and_known_groups_keep_their_order(cluster_factory, tmp_path):
    cluster = cluster_factory("--handler-timeout-ms", "1000")
    drill = Drill("majority_down", cluster, tmp_path)
    leader = drill.leader()
    survivor, other = others(leader)
    with drill.load:
        drill.start_consumers({survivor: 1, other: 1})
        half = len(GROUPS) // 2
        drill.place_groups({survivor: GROUPS[:half], other: GROUPS[half:]})
        drill.start_producers()
        drill.start_probe(survivor, in_flight_max=5)
        drill.run_load(LOAD_S, [*drill.producers.values(), drill.probe], "before the kills")

        # the leader last, so the two killed nodes never make a majority with the survivor in between
        leader = cluster.index_of(cluster.status()["leader"])
        victims = sorted(others(survivor), key=lambda index: index == leader)
        drill.kill(victims[0])
        drill.kill(victims[1])
        # only now are both raft votes gone: until its member child has died, a killed node's vote still
        # commits, so a new group sent a moment before is legitimately routed
        majority_lost_ms = now_ms()
        known_accepted = drill.producers[survivor].outcomes["accepted"]
        time.sleep(LOAD_S)  # the outage itself is what is observed: its length is the point
        known_accepted_while_down = drill.producers[survivor].outcomes["accepted"] - known_accepted
        restarted_ms, _ = drill.restart(victims[0])  # with the survivor, a majority again
        drill.restart(victims[1])
        cluster.wait_leader()
        drill.wait_accepted([drill.probe], 2, "a new group once the majority is back")
        drill.run_load(LOAD_S, [*drill.producers.values(), drill.probe], "after the restarts")
        report = drill.check()

    probe_sends = drill.probe_sends()
    during = [line for line in probe_sends
              if line["sent_ms"] >= majority_lost_ms and line["settled_ms"] < restarted_ms]
    first_back = first_accepted_after(probe_sends, restarted_ms)
    drill.summary.update({
        "survivor": drill.node_id(survivor), "killed": [drill.node_id(index) for index in victims],
        "down_ms": restarted_ms - majority_lost_ms,
        "new_groups_sent_while_down": len(during),
        "new_groups_outcomes_while_down": sorted({(line["outcome"], line["condition"]) for line in during}),
        "refusal_after_ms": sorted(line["settled_ms"] - line["sent_ms"] for line in during)[:3],
        "known_groups_accepted_at_survivor_while_down": known_accepted_while_down,
        # the groups placed on the survivor go on being delivered there; the others wait in its outbound store
        "deliveries_at_survivor_while_down": sum(
            1 for line in drill.deliveries() if line["queue"] == QUEUE and line["node"] == cluster.nodes[survivor].url
            and majority_lost_ms <= line["received_ms"] < restarted_ms),
        "restart_to_first_new_group_accepted_ms": first_back["settled_ms"] - restarted_ms,
    })
    drill.write_summary()
    assert_ok(report)
    assert len(during) >= 2, f"too few new groups were tried while the majority was down: {during}"
    assert all((line["outcome"], line["condition"]) == ("rejected", HANDLER_UNAVAILABLE) for line in during), during
    assert known_accepted_while_down > 0, "groups with known routes stopped being accepted at the survivor"
    assert drill.summary["deliveries_at_survivor_while_down"] > 0, "the survivor's own groups stopped flowing"
    assert report.refused >= len(during), report.summary()
