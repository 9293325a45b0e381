"""Which nodes back up a group: rendezvous (highest random weight) hashing over the live members.

Rules:
- A group's backups are the `replication_factor - 1` members, other than its owner, that rank highest
  for its route key. The rank is a keyed hash of (member, queue, route key) and nothing else, so every
  node computes the same backups from the same member set, with no per-route state in the raft log.
- Members joining or leaving move only the groups whose top ranks they enter or leave (about 1/n of
  them per member), which bounds the catch-up a membership change causes.
- The owner is never its own backup; with fewer members than the factor, a group has every other
  member as backup and `under_replicated` says so.
- A route key is the group id ("" for a group named ""); a queue's ungrouped messages use
  UNGROUPED_ROUTE_KEY.
- blake2b, not Python's hash(): the answer must not change between processes or versions.
"""

from __future__ import annotations

from hashlib import blake2b

# the route key of a queue's ungrouped messages: they are backed up together, as one group per queue. A NUL
# first keeps it apart from the group ids clients use ("" included); a group that did use this id would
# only share these backups, which costs nothing but balance
UNGROUPED_ROUTE_KEY = "\x00ungrouped"
REPLICATION_FACTOR_MAX = 5  # copies of a message, owner included: more costs a stream each for no gain


def check_replication_factor(replication_factor: int) -> None:
    if not 1 <= replication_factor <= REPLICATION_FACTOR_MAX:
        raise ValueError(f"replication_factor must be 1 to {REPLICATION_FACTOR_MAX} (copies of a message, "
                         f"its owner's included); got {replication_factor}")


def rank(member: str, queue: str, route_key: str) -> int:
    digest = blake2b(f"{queue}\0{route_key}".encode(), digest_size=8, key=member.encode()[:64])
    return int.from_bytes(digest.digest(), "big")


def backups_of(owner: str, queue: str, route_key: str, members, replication_factor: int) -> tuple[str, ...]:
    """The backups of one group, best first: the member promoted if `owner` fails is the first in sync."""
    wanted = replication_factor - 1
    if wanted <= 0:
        return ()
    candidates = sorted((member for member in members if member != owner),
                        key=lambda member: (rank(member, queue, route_key), member), reverse=True)
    return tuple(candidates[:wanted])


def under_replicated(owner: str, members, replication_factor: int) -> bool:
    """Too few members besides `owner` to hold every copy the factor asks for."""
    return sum(1 for member in members if member != owner) < replication_factor - 1


def promotion_target(owner: str, queue: str, route_key: str, members, in_sync, replication_factor: int) -> str | None:
    """The backup that takes a group over when `owner` fails: its best-ranked backup still in sync, or
    None when none is (the group then waits for its owner: promoting a stale copy would lose messages)."""
    for backup in backups_of(owner, queue, route_key, members, replication_factor):
        if backup in in_sync:
            return backup
    return None
