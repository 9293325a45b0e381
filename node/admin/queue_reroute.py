"""Rerouting a queue on this running node: the loop side of `grouper queue reroute`.

Rules:
- The work is node/core/reroute.py's; this only runs its batches on the engine loop thread (one
  bridge call each, so clients are served in between) and carries out their effects: a node alone
  applies them to its server, a cluster member hands them to its cluster protocol, which journals the
  copies for other nodes in their outbound channels before the source's removals.
- The answer waits until every batch's journal unit is on disk: "moved" means stored (forwarded
  copies: stored in this node's outbound channel, from where their owner takes them as it takes
  forwarded sends). A failed write is reported, naming the disk as the cause; nothing is lost, as the
  copies were journalled ahead of the removals.
- A group's copy takes the group id the destination reads from the payload (the codec), as a send's.
- A batch that stopped at a body paged out to the journal (`waiting_for_bodies`) is tried again every
  BODIES_POLL_INTERVAL_MS; after `timeout_ms` without a message moved the reroute gives up there, and
  the answer counts the rest as stayed, saying why.
"""

from __future__ import annotations

import threading
import time

from node.amqp import codec
from node.core.errors import GrouperError
from node.core.reroute import Reroute


BODIES_POLL_INTERVAL_MS = 10  # while a batch waits for bodies paged out to the journal: the next try after this


class JournalFailed(GrouperError):
    fault = "node"
    retriable = True


def regroup(payload: bytes, group_header: str):
    """The group id a queue grouping by `group_header` reads from this payload."""
    return codec.read_arrival(payload, group_header, 0).group_id


def reroute_queue(node, call, timeout_ms: int, reroute: Reroute) -> Reroute:
    """Run `reroute` to its end on `node` (node.runtime.Node); `call(fn)` runs fn on its engine loop
    thread with the admin deadline. Returns `reroute`, its counts final."""
    outcomes: list = []  # one per batch: None once on disk, else why its write failed
    written = threading.Semaphore(0)

    def on_flush(reason) -> None:  # engine loop thread
        outcomes.append(reason)
        written.release()

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
        node.server.after_flush(on_flush)
        return reroute.done

    batches = 0
    done = False
    progress_s = time.monotonic()
    moved = 0
    while not done:
        done = call(batch)
        batches += 1
        if reroute.moved != moved:
            moved, progress_s = reroute.moved, time.monotonic()
        elif reroute.waiting_for_bodies and not done:
            if time.monotonic() - progress_s > timeout_ms / 1000:
                call(lambda: reroute.give_up(node.broker, f"bodies paged out to the journal were not read back "
                                                          f"within {timeout_ms} ms (admin_timeout_ms); retry"))
                break
            time.sleep(BODIES_POLL_INTERVAL_MS / 1000)
    for _ in range(batches):
        if not written.acquire(timeout=timeout_ms / 1000):
            raise TimeoutError(f"the journal did not report the rerouted messages written within {timeout_ms} ms "
                               f"(admin_timeout_ms): {reroute.moved} moved in memory; check the node's disk "
                               f"and 'grouper queue list'")
    failures = [reason for reason in outcomes if reason is not None]
    if failures:
        raise JournalFailed(f"the journal could not write the reroute of {reroute.source!r} ({failures[0]}): "
                            f"{reroute.moved} messages moved in memory, and a restart finds each one at "
                            f"{reroute.source!r} or at {reroute.destination!r}; free the node's disk")
    return reroute
