"""Node-to-node calls over gRPC: forwarding messages to the node that owns their group.

`forwarder` is the sending side (one thread and one channel per destination node), `service` the
owner's servicer; both convert between `peer_pb2` and `forwarder.Entry`, and neither touches the
engine loop's state.
"""
