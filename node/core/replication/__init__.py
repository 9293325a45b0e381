"""Replicated messages (issue 28, docs/replication.md): which nodes back up a group, and what a backup
holds of the owner's queues. Pure: no I/O, no clock, no threads; deterministic, so every node that reads
the same raft state computes the same answers. Not wired into the node yet (docs/replication.md, phases).
"""
