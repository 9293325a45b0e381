"""Node-to-node calls over gRPC: forwarding messages to the node that owns their group.

`forwarder` is the sending side (one thread and one channel per destination node), `service` the
owner's servicer and, with cluster TLS, its mutual-TLS listener; both convert between `peer_pb2`
and `forwarder.Entry`, and neither touches the engine loop's state. `credentials` reads and checks
what nodes show each other (the cluster TLS files, the raft secret) and says when a node needs them.
"""
