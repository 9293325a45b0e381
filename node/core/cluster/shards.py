"""Which raft group (shard) decides a message group's route, for a cluster beyond one raft group's ceiling.

Pure: no I/O, no clock, no randomness. docs/cluster-ceiling.md has the design; this module is its one
rule that every node must compute alike. Rules:
- a (queue, group) pair belongs to exactly one shard, `shard_of(queue, group, shard_count)`, and that
  answer depends on nothing but its three arguments: not on the process, the Python version or the
  order groups arrive in (Python's own hash() is salted per process, so it is not used);
- the hash covers the queue name's length, the queue name and the group id, so ("a", "bc") and
  ("ab", "c") are different keys whatever characters either holds;
- the shard count is fixed for a cluster's lifetime: changing it moves most keys to another shard,
  which only a resharding protocol could do safely (the doc says why none is built).
Not wired into the running node: the simulation (tests/sim/sharding.py) is its only caller today.
"""

from __future__ import annotations

import hashlib

SHARD_COUNT_MAX = 256  # raft groups per cluster; each costs every member a raft log, a tick and connections


def check_shard_count(shard_count: int) -> None:
    """Raise ValueError naming the setting if `shard_count` cannot be a cluster's shard count."""
    if isinstance(shard_count, bool) or not isinstance(shard_count, int):
        raise ValueError(f"shard_count must be a whole number, got {shard_count!r}: fix the cluster's settings")
    if not 1 <= shard_count <= SHARD_COUNT_MAX:
        raise ValueError(f"shard_count must be between 1 and {SHARD_COUNT_MAX} (SHARD_COUNT_MAX), got "
                         f"{shard_count}: fix the cluster's settings")


def shard_of(queue: str, group: str, shard_count: int) -> int:
    """The shard (0 .. shard_count-1) whose raft group decides the route of `group` on `queue`."""
    check_shard_count(shard_count)
    if shard_count == 1:
        return 0
    queue_bytes = queue.encode()
    key = len(queue_bytes).to_bytes(4, "big") + queue_bytes + group.encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    # 64 bits mod a count <= 256: the bias is below 2**-56, far under any spread a test could see
    return int.from_bytes(digest, "big") % shard_count


def split_by_shard(keys, shard_count: int) -> dict[int, list]:
    """`keys` ((queue, group, ...) tuples, the first two fields naming the group) by shard, each list
    in the order given, shards in ascending order: what one proposal becomes when its groups live in
    several raft groups."""
    by_shard: dict[int, list] = {}
    for key in keys:
        by_shard.setdefault(shard_of(key[0], key[1], shard_count), []).append(key)
    return dict(sorted(by_shard.items()))
