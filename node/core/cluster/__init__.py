"""The cluster protocol of one node, as a package: one module per concern, one-way dependencies.

Rules:
- Pure: never imports proton, grpc, pysyncobj, threading, socket or time; time comes in as `now_ms`,
  and every decision goes out as effects (node/core/effects.py) for the caller to carry out.
- Modules import only those below them (top first): protocol (the facade: the event entry points);
  owner (batches forwarded here, de-duplication marks); routes (the route table's feed and proposals);
  definitions (cluster-wide queue definitions); recovery (the journal's state put back); handover
  (moves: placement, hand over, relay); sweep (cold tails of moving groups); holds; parking; forwarding
  (outbound channels, bounds, seq reservations, acknowledgements); status (reads the facade it is
  handed); context (what all share); feed (the raft feed's vocabulary: a leaf that handler/ imports
  too). forward_sender stands apart, importing none of them: the
  forwarding channel to one owner, driven by node/peer/forwarder.py and by the simulation.
- A journal answer comes back through the continuation object an AfterFlush carries, whose
  `flushed(reason, now_ms, effects)` belongs to the concern that wrote it (no tags).
- docs/cluster-protocol.md: what each module owns, the entry points, sequence diagrams.
- Loaded lazily (below): the raft member process imports feed.py, the feed's vocabulary, alone, without the
  protocol, the broker and the queues behind it (~6 MB of its resident set).
"""

_CONTEXT_NAMES = ("CLAIM_KEYS_MAX", "MARK_PREFIX", "PARK_PREFIX", "QUEUES_MARK", "SEQ_RESERVATION")

__all__ = [*_CONTEXT_NAMES, "ClusterProtocol"]


def __getattr__(name: str):
    if name == "ClusterProtocol":
        from node.core.cluster.protocol import ClusterProtocol
        return ClusterProtocol
    if name in _CONTEXT_NAMES:
        from node.core.cluster import context
        return getattr(context, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
