"""Rerouting a queue on this running node: the loop side of `grouper queue reroute`.

Rules:
- The work is node/core/dispatch/reroute.py's; this only runs its batches on the engine loop thread (one
  bridge call each, so clients are served in between) and carries out their effects: a node alone
  applies them to its server, a cluster member hands them to its cluster protocol, which journals the
  copies for other nodes in their outbound channels before the source's removals.
- The answer waits until every batch's journal unit is on disk (node/admin/flushes.py): "moved" means
  stored (forwarded copies: stored in this node's outbound channel, from where their owner takes them
  as it takes forwarded sends). A failed write is reported, naming the disk as the cause; nothing is
  lost, as the copies were journalled ahead of the removals.
- A group's copy takes the group id the destination reads from the payload (the codec), as a send's.
- A batch that stopped at a body paged out to the journal (`waiting_for_bodies`) is tried again every
  BODIES_POLL_INTERVAL_MS; after `timeout_ms` without a message moved the reroute gives up there, and
  the answer counts the rest as stayed, saying why.
"""

from __future__ import annotations

import time

from node.admin.flushes import Flushes
from node.amqp import codec
from node.core.dispatch.reroute import Reroute


BODIES_POLL_INTERVAL_MS = 10  # while a batch waits for bodies paged out to the journal: the next try after this


def regroup(payload: bytes, group_header: str):
    """The group id a queue grouping by `group_header` reads from this payload."""
    return codec.read_arrival(payload, group_header, 0).group_id


def reroute_queue(node, call, timeout_ms: int, reroute: Reroute) -> Reroute:
    """Run `reroute` to its end on `node` (node.runtime.Node); `call(fn)` runs fn on its engine loop
    thread with the admin deadline. Returns `reroute`, its counts final."""
    flushes = Flushes()

    def batch() -> bool:
        now_ms = node.clock_ms()
        cluster = node.cluster
        if cluster is None:
            effects, _ = reroute.batch(node.broker, now_ms, regroup=regroup)
            node.server.apply(effects)
        else:
            effects, forwards = reroute.batch(node.broker, now_ms, owner_of=cluster.protocol.reroute_owner,
                                              regroup=regroup)
            cluster.carry_out(cluster.protocol.rerouted(effects, forwards, now_ms))
        flushes.after(node.server)
        return reroute.done

    done = False
    progress_s = time.monotonic()
    moved = 0
    while not done:
        done = call(batch)
        if reroute.moved != moved:
            moved, progress_s = reroute.moved, time.monotonic()
        elif reroute.waiting_for_bodies and not done:
            if time.monotonic() - progress_s > timeout_ms / 1000:
                call(lambda: reroute.give_up(node.broker, f"bodies paged out to the journal were not read back "
                                                          f"within {timeout_ms} ms (admin_timeout_ms); retry"))
                break
            time.sleep(BODIES_POLL_INTERVAL_MS / 1000)
    flushes.wait(timeout_ms, f"the reroute of {reroute.source!r}",
                 f"{reroute.moved} messages moved in memory, and a restart finds each one at {reroute.source!r} "
                 f"or at {reroute.destination!r}")
    return reroute
