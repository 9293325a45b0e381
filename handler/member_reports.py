"""Member reports: what the route table knows of each member of the raft cluster.

Owns the rules of the reports the members make and the leader's marks, as a view over the table's
`consumers`, `nodes` and `down` dicts (handler/route_table.py holds them: its snapshot pickles them),
built for one command. Each command answers whether it changed something, so the table bumps its
revision once per change:
- `report_consumers(node, counts)`: the node's consumers per queue replace what it reported before;
  queues with no consumer (zero, negative or malformed counts) are left out, and a node with none has no
  entry. Stored in sorted order, whatever order the reporter built its dict in.
- `register(node, addresses)`: how to reach a member; a member registers when it (re)starts, so it is up.
- `mark_down(node, now_ms)` keeps the first time (it says how long the node has been gone); `mark_up`.
Deterministic and never raising for input from the cluster (malformed input changes nothing).
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from handler.command_input import is_int, is_str


class MemberReports:
    def __init__(self, consumers: dict, nodes: dict, down: dict):
        self.consumers = consumers  # node -> queue -> consumers; no zero entries
        self.nodes = nodes  # node -> {"peer_address", "amqp_address", "admin_address"}
        self.down = down  # node -> now_ms when marked down; absent means up

    def report_consumers(self, node: str, counts: dict) -> bool:
        if not is_str(node) or not isinstance(counts, dict):
            return False
        queues = sorted(queue for queue in counts if is_str(queue))
        held = {queue: counts[queue] for queue in queues
                if is_int(counts[queue]) and counts[queue] > 0}
        if held == self.consumers.get(node, {}):
            return False
        if held:
            self.consumers[node] = held
        else:
            del self.consumers[node]
        return True

    def register(self, node: str, peer_address: str, amqp_address: str, admin_address: str) -> bool:
        if not all(is_str(value) for value in (node, peer_address, amqp_address, admin_address)):
            return False
        member = {"peer_address": peer_address, "amqp_address": amqp_address,
                  "admin_address": admin_address}
        if self.nodes.get(node) == member and node not in self.down:
            return False
        self.nodes[node] = member
        self.down.pop(node, None)
        return True

    def mark_down(self, node: str, now_ms: int) -> bool:
        if not (is_str(node) and is_int(now_ms)) or node in self.down:
            return False
        self.down[node] = now_ms
        return True

    def mark_up(self, node: str) -> bool:
        if not is_str(node) or node not in self.down:
            return False
        del self.down[node]
        return True

    def up(self) -> set[str]:
        """The members registered and not marked down."""
        return set(node for node in self.nodes if node not in self.down)
