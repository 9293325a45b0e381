"""Purging a whole queue on this node, in bounded batches of groups, each one engine loop turn.

Rules:
- Runs on the engine loop thread (LoopControl posts each batch through the bridge) over a core
  `Queue`, through the queue's own `take_group_messages`, the same removal as `group purge`: only
  available messages go; messages delivered and not yet settled stay with their consumer.
- The removals are REMOVE records of the effects each batch returns; LoopControl answers "purged" only
  once every batch's records are on disk (node/admin/flushes.py).
- One call looks at most GROUPS_PER_BATCH_MAX groups, so a million groups never hold the loop for
  one long turn: the caller runs batches until `done`, and the loop serves clients in between.
- Messages in no group (a queue without `default_group`) go once the groups are through, at most
  GROUPS_PER_BATCH_MAX of them per turn. `available_left` counts what is available at the end: only
  messages that arrived while the purge ran, which the caller names as such.
- A cold tail (node/core/dispatch/cold.py) is read back batch by batch once the groups are through, and each
  batch purged as warm messages are; a read in flight leaves the purge not done, so the caller's next
  turns wait for it.
- Groups are taken in the queue's dict order from `position`; a group emptied (and so forgotten by
  the queue) moves those after it back by one, which the next position accounts for. Groups that
  arrive during the purge join its end and are purged when it gets there.
"""

from __future__ import annotations

from itertools import islice

GROUPS_PER_BATCH_MAX = 10_000  # groups purged per engine loop turn


def available_left(queue) -> int:
    """Messages still available on the queue (not delivered): after a purge, those that arrived during it."""
    return queue.depth_messages - queue.acquired_messages


def purge_batch(queue, position: int, now_ms: int, effects: list,
                groups_max: int = GROUPS_PER_BATCH_MAX) -> tuple[int, int, bool]:
    """(messages purged, position of the next batch, done) for the batch of groups at `position`."""
    keys = [group.key for group in islice(queue.groups.values(), position, position + groups_max)]
    groups_before = len(queue.groups)
    purged = sum(len(queue.take_group_messages(key, None, effects, bodies=False)) for key in keys)
    forgotten = groups_before - len(queue.groups)  # only groups of this batch: each purge forgets its own at most
    done = len(keys) < groups_max
    if done:  # the groups are through: then the messages in no group, as many per turn
        loose = queue.take_ungrouped_messages(groups_max, effects)
        purged += len(loose)
        done = len(loose) < groups_max
    if done and queue.read_cold_for_purge(effects):
        # a cold tail's next records are read back into the warm part: the groups once more, from the start
        # (records may join groups this purge has passed, ones whose in-flight messages kept them)
        queue.tick(now_ms, effects)
        return purged, 0, False
    queue.tick(now_ms, effects)  # as `group purge` does: dispatch goes on with what is left
    return purged, position + len(keys) - forgotten, done
