"""A cluster of real `grouper node` processes on 127.0.0.1 for black-box tests and drills.

Raft ports are chosen up front (the peer list names them); AMQP and admin ports are picked by the
nodes and kept across restarts. Every wait is bounded and polls the admin API, never a fixed sleep.
"""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

from tests.integration.harness import NodeProcess

WAIT_S = 20.0  # bound of every wait for the cluster to reach a state


# Ports a test hands to nodes before they bind them (raft ports, which every peer must know in
# advance; published host ports) come from below the kernel's ephemeral range. A port inside it can be
# taken in between as the source port of any outgoing connection, or by a peer's own retried dial to
# it (TCP simultaneous open to itself), and the node then fails "Address already in use": a clean CI
# run lost the rolling-upgrade drill to that once.
FIXED_PORTS_LOW = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


_handed_out: set[int] = set()  # never hand a port out twice in one test session


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that nothing listens on now and that no outgoing connection can take."""
    candidates = [port for port in range(FIXED_PORTS_LOW, _ephemeral_low()) if port not in _handed_out]
    random.shuffle(candidates)
    ports = []
    for port in candidates:
        probe = socket.socket()
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            probe.close()
        ports.append(port)
        _handed_out.add(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} free ports between {FIXED_PORTS_LOW} and the ephemeral range")


class Cluster:
    def __init__(self, directory: Path, size: int = 3, config_text: str = "", args: tuple = ()):
        self.raft_ports = free_ports(size)
        self.node_ids = [f"127.0.0.1:{port}" for port in self.raft_ports]
        peers = ",".join(self.node_ids)
        self.nodes = [self.make_node(i, Path(directory), config_text,
                                     ("--raft-port", str(port), "--peers", peers, *args))
                      for i, port in enumerate(self.raft_ports)]

    def make_node(self, index: int, directory: Path, config_text: str, args: tuple) -> NodeProcess:
        """Node `index` of the cluster (bench/cluster_nodes.py makes its own kind of node here)."""
        return NodeProcess(directory / f"node{index}", config_text, args)

    def start(self) -> "Cluster":
        for node in self.nodes:
            node.start()
        self.wait_leader()
        return self

    def kill_all(self) -> None:
        for node in self.nodes:
            node.kill()

    def index_of(self, node_id: str) -> int:
        return self.node_ids.index(node_id)

    # ---- state through the admin API ---------------------------------------------------------

    def status(self, via: int | None = None) -> dict | None:
        """`grouper cluster status --json` from a live node (the first that answers), or None."""
        candidates = [via] if via is not None else range(len(self.nodes))
        for index in candidates:
            node = self.nodes[index]
            if node.process is None or node.process.poll() is not None:
                continue
            result = node.cli("cluster", "status", "--json", "--timeout-ms", "2000")
            if result.returncode == 0:
                return json.loads(result.stdout)
        return None

    def wait_for(self, predicate, what: str, timeout_s: float = WAIT_S, via: int | None = None) -> dict:
        deadline = time.monotonic() + timeout_s
        status = None
        while time.monotonic() < deadline:
            status = self.status(via)
            if status is not None and predicate(status):
                return status
            time.sleep(0.1)
        raise AssertionError(f"cluster did not reach: {what} within {timeout_s} s; last status: {status}")

    def wait_leader(self, excluding: str = "", timeout_s: float = WAIT_S) -> int:
        status = self.wait_for(lambda s: s["leader"] and s["leader"] != excluding
                               and all(m["amqp_address"] for m in s["members"]),
                               "a leader and every member registered", timeout_s)
        return self.index_of(status["leader"])

    def wait_consumers(self, queue: str, counts: dict[int, int], timeout_s: float = WAIT_S) -> None:
        """Until the route table knows exactly these consumer counts on `queue` per node index."""
        def known(status):
            by_node = {m["node"]: m["consumers"].get(queue, 0) for m in status["members"]}
            return all(by_node.get(self.node_ids[i], 0) == count for i, count in counts.items())
        self.wait_for(known, f"consumers on {queue}: {counts}", timeout_s)

    def groups(self, queue: str, via: int = 0) -> list[dict]:
        result = self.nodes[via].cli("groups", queue, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


def in_transit(statuses: list[dict | None]) -> list[str]:
    """What some node still holds (outbound, waiting for a route, queued or acquired), from each node's
    own `cluster status`; empty once every message has reached a consumer and been settled."""
    left = []
    for status in statuses:
        if status is None:
            left.append("a node did not answer")
            continue
        if status["outbound"]:
            left.append(f"{status['node']} outbound {status['outbound']}")
        if status["waiting_for_route"]:
            left.append(f"{status['node']} waiting for a route {status['waiting_for_route']}")
        for member in status["members"]:
            if member["node"] != status["node"]:
                continue
            for queue in member["queues"]:
                if queue["depth_messages"] or queue["acquired_messages"]:
                    left.append(f"{member['node']} {queue['name']}: {queue['depth_messages']} queued, "
                                f"{queue['acquired_messages']} acquired")
    return left
