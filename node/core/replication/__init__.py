"""Replicated messages (issue 28, docs/replication.md): which nodes back up a group (assignment), the
owner's stream to each backup (channel), what waits for the backups (gate), and what a backup holds of
the owner's queues (replica). Pure: no I/O, no clock, no threads; time comes in as `now_ms`;
deterministic, so every node that reads the same raft state computes the same answers. A leaf of
node/core: it imports only node/core's top-level modules. The owner's side (streams, stream) runs in
the node shell (docs/replica-streams.md); promotion is not wired yet (docs/replication.md, phases).
"""
