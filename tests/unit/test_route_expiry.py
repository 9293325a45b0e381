"""Routes with a lifecycle: the route table and the leader's reaper together, over time.

Nodes are modelled as ClusterProtocol refreshes routes (node/core/cluster/routes.py, _refresh_leases):
every quarter of the group timeout, each live group's route is touched with the time, naming its node.
A group is live while it has messages or an owner; then it goes quiet and nobody touches its route.
The leader's duties (handler/leader_duties.py) run on the same clock and their ExpireIdle commands are
applied to the table, as the raft log would.
"""

from __future__ import annotations

import random

import pytest

from handler.leader_duties import GROUP_TIMEOUT_MS_DEFAULT, ExpireIdle, LeaderDuties, RaftStatus
from handler.route_table import RouteTable
from node.config import NodeConfig

NODES = ("n1", "n2", "n3")
STEP_MS = 100
STATUS = RaftStatus(leader=True, term=1, reachable=NODES[1:], unreachable=())


class Cluster:
    """A table, its leader's duties, and the live groups whose nodes refresh their routes."""

    def __init__(self, routes_max: int, group_timeout_ms: int):
        self.table = RouteTable(routes_max)
        self.duties = LeaderDuties(group_timeout_ms)
        self.group_timeout_ms = group_timeout_ms
        self.now_ms = 0
        self.live: dict[tuple[str, str], int] = {}  # key -> when it goes quiet
        self.refresh_due_ms = 0
        self.refused = 0

    def start_group(self, key: tuple[str, str], lifetime_ms: int, proposer: str) -> None:
        [node] = self.table.claim([list(key)], proposer, self.now_ms)
        if node is None:
            self.refused += 1
            return
        self.live[key] = self.now_ms + lifetime_ms

    def step(self) -> None:
        self.now_ms += STEP_MS
        for key in [key for key, quiet_ms in self.live.items() if quiet_ms <= self.now_ms]:
            del self.live[key]
        if self.group_timeout_ms and self.now_ms >= self.refresh_due_ms:
            self.refresh_due_ms = self.now_ms + self.group_timeout_ms // 4
            entries = [[queue, group, self.table.route(queue, group)] for queue, group in sorted(self.live)]
            assert None not in self.table.touch(entries, self.now_ms)
        for command in self.duties.tick(self.now_ms, STATUS):
            assert isinstance(command, ExpireIdle)
            self.table.expire_idle(command.cutoff_ms, list(command.spared_nodes))
        for queue, group in self.live:  # safety: a live group never loses its route
            assert self.table.route(queue, group) is not None, f"{group} lost its route while live"
        assert len(self.table) <= self.table.routes_max


@pytest.mark.parametrize("seed", range(3))
def test_five_times_routes_max_groups_over_time_with_half_of_it_live_at_once_are_all_accepted(seed):
    rng = random.Random(seed)
    routes_max, group_timeout_ms = 100, 4000
    cluster = Cluster(routes_max, group_timeout_ms)
    # a group stays live longer than a timeout plus a reaper round: what went quiet lingers that long
    lifetime_ms = group_timeout_ms + cluster.duties.reaper_interval_ms + 1000
    started = 0
    while started < 5 * routes_max:
        if len(cluster.live) < routes_max // 2 and rng.random() < 0.5:
            cluster.start_group(("orders", f"g{started}"), rng.randint(lifetime_ms, 2 * lifetime_ms),
                                rng.choice(NODES))
            started += 1
        cluster.step()
    assert cluster.refused == 0
    assert cluster.table.revision > 0 and len(cluster.table) < 5 * routes_max


def test_without_expiry_the_same_traffic_is_refused_once_routes_max_groups_were_ever_seen():
    cluster = Cluster(routes_max=10, group_timeout_ms=0)
    for index in range(20):
        cluster.start_group(("orders", f"g{index}"), 500, "n1")
        for _ in range(10):
            cluster.step()  # each group quiet long before the next starts
    assert cluster.refused == 10 and len(cluster.table) == 10


def test_a_group_live_far_longer_than_the_timeout_keeps_its_route_and_its_node():
    cluster = Cluster(routes_max=10, group_timeout_ms=1000)
    cluster.start_group(("orders", "held"), 60_000, "n2")
    cluster.start_group(("orders", "quiet"), 0, "n1")
    for _ in range(100):
        cluster.step()
    assert cluster.table.route("orders", "held") == "n2"
    assert cluster.table.route("orders", "quiet") is None


def test_a_moving_group_keeps_its_route_past_the_timeout_until_its_move_ends():
    table = RouteTable()
    table.register_node("n1", "p", "a", "m", 0)
    table.register_node("n2", "p", "a", "m", 0)
    table.report_consumers("n1", {"q": 1}, 0)
    assert table.claim([["q", "g"]], "n1", 0) == ["n1"]
    table.report_consumers("n1", {}, 10)
    table.report_consumers("n2", {"q": 1}, 10)
    [(_, _, _, _, waiting)] = table.follow_consumers("q", "n1", 20)
    assert table.expire_idle(10_000) == [] and table.route("q", "g") == "n2"
    for node in ("n2", "n1"):  # the old owner clears last
        table.move_clear([["q", "g", "n1", "n2"]], node)
    assert table.moves == {}
    assert table.expire_idle(10_000) == [("q", "g")]


def test_the_default_group_timeout_is_finite_and_the_reaper_scans_a_sixtieth_of_it():
    assert NodeConfig().group_timeout_ms == GROUP_TIMEOUT_MS_DEFAULT == 30 * 60 * 1000
    assert LeaderDuties(GROUP_TIMEOUT_MS_DEFAULT).reaper_interval_ms == 30_000
    assert LeaderDuties(1000).reaper_interval_ms == 1000  # never more often than once a second
