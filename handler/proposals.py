"""What a proposal's proposer hears: pysyncobj's outcome of a replicated call, as a reason in words.

Owns the mapping of pysyncobj's FAIL_REASON codes to sentences that say what went wrong (and so what to
do), and the callbacks the raft member hands pysyncobj with each proposal. Rules: a callback runs on
pysyncobj's tick thread, so it only calls what the caller gave it, never blocks and never proposes
anything itself but by enqueueing; a proposal whose failure nobody waits for is logged, never dropped
silently.
"""

from __future__ import annotations

import logging

from pysyncobj import FAIL_REASON

log = logging.getLogger("grouper.handler")

REASONS = {
    FAIL_REASON.QUEUE_FULL: "the raft command queue is full",
    FAIL_REASON.MISSING_LEADER: "the raft cluster has no leader (is a majority of nodes up?)",
    FAIL_REASON.DISCARDED: "the proposal was discarded by a leader change",
    FAIL_REASON.NOT_LEADER: "the proposal reached a node that is no longer the leader",
    FAIL_REASON.LEADER_CHANGED: "the raft leader changed while the proposal was in flight",
    FAIL_REASON.REQUEST_DENIED: "the raft cluster denied the request",
    FAIL_REASON.UNKNOWN_OUTCOME: "the outcome of the proposal is unknown",
}


def reason_for(error) -> str | None:
    """None for success, else the failure in words."""
    if error == FAIL_REASON.SUCCESS:
        return None
    return REASONS.get(error, f"raft error {error}")


def callback(on_failed, on_success=None):
    """A pysyncobj callback: on_success() once the proposal is in the log, else on_failed(reason)."""
    def done(result, error):
        if error == FAIL_REASON.SUCCESS:
            if on_success is not None:
                on_success()
        else:
            on_failed(reason_for(error))
    return done


def logged(what: str):
    """A pysyncobj callback for a proposal nobody waits for: a failure is logged, naming `what`."""
    return callback(lambda reason: log.warning("grouping handler: %s failed: %s", what, reason))
