"""Where an operator's reroute (node/core/dispatch/reroute.py) sends a message of a group: as a send would.

Pure, on the engine loop, through the protocol's state (ClusterProtocol.reroute_owner calls it). A reroute
never guesses: while the answer may change under it (the replica catching up, the group moving) it refuses
with a retriable error, and it stops at an owner whose channel is at its bound.
"""

from __future__ import annotations

from node.core.errors import HandlerUnavailable


def owner_of(protocol, queue: str, route_key: str, size_bytes: int) -> str | None:
    """Where a rerouted message of group (queue, route_key) goes, as a send's would: None here, else its
    owner. Raises while the answer may change under it, and when the owner's channel, with the copies
    this batch promised it, is at its bound (the reroute stops there)."""
    key = (queue, route_key)
    if not protocol.router.ready:
        raise HandlerUnavailable(f"node {protocol.node_id} is catching up with the raft log and cannot tell "
                                 f"where groups of {queue!r} live; retry shortly")
    if key in protocol.moves or key in protocol.parked or key in protocol.held:
        raise HandlerUnavailable(f"group {route_key!r} of queue {queue!r} is moving between nodes; retry "
                                 f"once the move ended")
    owner = protocol.router.routes.get(key)
    if owner is None or owner == protocol.node_id:
        return None
    protocol.forwarding.promise(owner, size_bytes)
    return owner
