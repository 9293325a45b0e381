"""The raft leader's walk back over a diverged follower's log (handler/raft_catch_up.py).

Replays what run V's stuck follower answered (finding 9, docs/reliability.md): its log held entries
3928-3938 of term 48, uncommitted from a leadership cut off; the new leader's log diverged from 3931.
"""

from __future__ import annotations

from handler.raft_catch_up import FLOOR_AGE_MAX_S, CatchUp

TERM = 50
FOLLOWER_LAST = 3938  # the follower's last entry
MATCH = 3930  # the last entry both logs hold with the same term


def follower_answer(prev_log_idx: int) -> tuple[bool, int]:
    """(accepted, next_node_idx) as pysyncobj's follower answers an append_entries at prev_log_idx."""
    if prev_log_idx > FOLLOWER_LAST:
        return False, FOLLOWER_LAST + 1  # no such entry: its last + 1
    if prev_log_idx > MATCH:
        return False, prev_log_idx  # the entry's term differs: walk back one
    return True, prev_log_idx + 1


def ticks_to_catch_up(catch_up: CatchUp | None, leader_last: int = 4337, batches: int = 3, ticks_max: int = 100):
    """The leader's ticks until the follower accepts: each tick sends `batches` messages from nextIndex
    on, moving nextIndex to the end as pysyncobj does, and reads their answers in order."""
    next_index = leader_last + 1
    for tick in range(ticks_max):
        prevs = [next_index - 1] + [next_index - 1 + (leader_last - next_index + 1) * step // batches
                                    for step in range(1, batches)]
        next_index = leader_last + 1
        for prev in prevs:
            accepted, answer = follower_answer(prev)
            if accepted:
                return tick
            next_index = answer if catch_up is None else catch_up.refused("f", TERM, answer, tick * 0.05)
    return None


def test_without_the_rule_the_leader_never_walks_back_past_the_divergence():
    assert ticks_to_catch_up(None) is None  # the run's follower stayed behind for minutes


def test_with_the_rule_a_refusal_only_lowers_next_index_and_the_follower_catches_up():
    ticks = ticks_to_catch_up(CatchUp())
    assert ticks is not None and ticks <= FOLLOWER_LAST - MATCH + 2


def test_one_batch_a_tick_caught_up_before_too():
    assert ticks_to_catch_up(None, batches=1) is not None


def test_an_acceptance_a_new_term_or_an_old_floor_lets_refusals_name_a_higher_index_again():
    catch_up = CatchUp()
    assert catch_up.refused("f", TERM, 3935, 0.0) == 3935
    assert catch_up.refused("f", TERM, 3939, 0.1) == 3935  # a later message's refusal: held at the floor
    assert catch_up.refused("g", TERM, 3939, 0.1) == 3939  # each follower its own floor
    catch_up.accepted("f")
    assert catch_up.refused("f", TERM, 3939, 0.2) == 3939
    assert catch_up.refused("f", TERM + 1, 4000, 0.3) == 4000  # a new term
    assert catch_up.refused("f", TERM + 1, 4100, 0.3 + FLOOR_AGE_MAX_S + 0.1) == 4100  # went no lower for too long
    catch_up.clear()
    assert catch_up.floors == {}
