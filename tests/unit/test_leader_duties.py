"""The raft leader's duties: examples of the reaper and of owner failover, then hypothesis over status readings.

The hypothesis test feeds random readings (time passing, leadership won and lost, members coming
and going) and judges every command against the history of readings alone: the reaper runs exactly
when half a group timeout of unbroken leadership has passed, the reaper interval too, and no member
is out of reach (unless marked down) or back for less than half a group timeout, sparing the
members out of reach; nobody is failed over before being out of reach for owner_failover_ms under
one leadership.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from handler.leader_duties import ExpireIdle, FailOver, FollowConsumers, LeaderDuties, MarkUp, RaftStatus

GROUP_TIMEOUT_MS = 1000
FAILOVER_MS = 500
REAPER_MS = 100


def leading(term: int = 1, reachable=None, unreachable=(), down=()) -> RaftStatus:
    """The leader's view of members n2 and n3: reachable unless said otherwise."""
    if reachable is None:
        reachable = [member for member in ("n2", "n3") if member not in unreachable]
    return RaftStatus(leader=True, term=term, reachable=tuple(reachable), unreachable=tuple(unreachable),
                      down=frozenset(down))


FOLLOWING = RaftStatus(leader=False, term=1, reachable=(), unreachable=())


def reaper() -> LeaderDuties:
    return LeaderDuties(group_timeout_ms=GROUP_TIMEOUT_MS, reaper_interval_ms=REAPER_MS)


def failover() -> LeaderDuties:
    return LeaderDuties(owner_failover_ms=FAILOVER_MS)


# ---- the reaper ----------------------------------------------------------------------------------

def test_a_follower_has_no_duties():
    duties = reaper()
    assert duties.tick(0, FOLLOWING) == []
    assert duties.tick(10_000, FOLLOWING) == []


def test_without_a_group_timeout_or_failover_there_is_nothing_to_do():
    duties = LeaderDuties()
    assert not duties.active
    assert duties.tick(0, leading()) == [] and duties.tick(100_000, leading()) == []


def test_a_new_leader_reaps_only_after_half_a_group_timeout_of_leadership():
    duties = reaper()
    assert duties.tick(5_000, leading()) == []
    assert duties.tick(5_000 + GROUP_TIMEOUT_MS // 2 - 1, leading()) == []
    assert duties.tick(5_000 + GROUP_TIMEOUT_MS // 2, leading()) == [ExpireIdle(4_500, ())]


def test_the_reaper_runs_at_most_once_per_interval_with_the_cutoff_a_group_timeout_ago():
    duties = reaper()
    duties.tick(0, leading())
    assert duties.tick(600, leading()) == [ExpireIdle(-400, ())]
    assert duties.tick(650, leading()) == []
    assert duties.tick(700, leading()) == [ExpireIdle(-300, ())]


def test_nothing_is_expired_while_a_member_is_out_of_reach_since_its_outbound_store_may_rely_on_any_route():
    # n3's outbound store may wait under a route naming n2, which n2 need not refresh: the log does not
    # say which routes a member relies on, so none may expire before it can refresh them again
    duties = reaper()
    duties.tick(0, leading())
    assert duties.tick(500, leading(unreachable=("n3",))) == []
    assert duties.tick(5_000, leading(reachable=("n2",), unreachable=("n5", "n3"))) == []


def test_a_member_reachable_again_holds_the_reaper_back_half_a_group_timeout_so_its_first_refresh_lands_first():
    duties = reaper()
    duties.tick(0, leading())
    assert duties.tick(500, leading(unreachable=("n3",))) == []
    assert duties.tick(600, leading()) == []  # back at 600
    assert duties.tick(1_099, leading()) == []
    assert duties.tick(1_100, leading()) == [ExpireIdle(100, ())]


def test_a_member_marked_down_by_owner_failover_holds_nothing_back_but_its_routes_are_spared():
    duties = reaper()
    duties.tick(0, leading())
    status = leading(unreachable=("n3",), down=("n3",))
    assert duties.tick(500, status) == [ExpireIdle(-500, ("n3",))]
    assert duties.tick(600, leading(unreachable=("n2", "n3"), down=("n3",))) == []  # n2 is not down


def test_a_member_marked_down_holds_the_reaper_back_once_it_is_reachable_again():
    duties = reaper()
    duties.tick(0, leading(unreachable=("n3",), down=("n3",)))
    assert duties.tick(500, leading(unreachable=("n3",), down=("n3",))) == [ExpireIdle(-500, ("n3",))]
    assert duties.tick(600, leading(down=("n3",))) == []  # back: its outbound store is refreshed first
    assert duties.tick(1_100, leading()) == [ExpireIdle(100, ())]


def test_losing_leadership_makes_the_next_leadership_wait_again():
    duties = reaper()
    duties.tick(0, leading())
    duties.tick(400, FOLLOWING)
    assert duties.tick(500, leading(term=2)) == []
    assert duties.tick(999, leading(term=2)) == []
    assert duties.tick(1_000, leading(term=2)) == [ExpireIdle(0, ())]


def test_a_leadership_lost_and_won_back_between_two_ticks_is_seen_by_its_new_term():
    duties = reaper()
    duties.tick(0, leading(term=1))
    assert duties.tick(600, leading(term=3)) == []  # led since 600 as far as anyone can tell
    assert duties.tick(1_100, leading(term=3)) == [ExpireIdle(100, ())]


# ---- owner failover ------------------------------------------------------------------------------

def test_a_member_unreachable_for_owner_failover_ms_is_failed_over():
    duties = failover()
    assert duties.tick(0, leading(unreachable=("n3",))) == []
    assert duties.tick(FAILOVER_MS - 1, leading(unreachable=("n3",))) == []
    assert duties.tick(FAILOVER_MS, leading(unreachable=("n3",))) == [
        FailOver("n3", FAILOVER_MS, FAILOVER_MS)]


def test_a_member_reachable_again_before_owner_failover_ms_starts_its_wait_afresh():
    duties = failover()
    duties.tick(0, leading(unreachable=("n3",)))
    duties.tick(400, leading(reachable=("n3",)))
    assert duties.tick(450, leading(unreachable=("n3",))) == []
    assert duties.tick(900, leading(unreachable=("n3",))) == []
    assert duties.tick(950, leading(unreachable=("n3",))) == [FailOver("n3", 950, 500)]


def test_a_member_already_down_is_not_failed_over_again():
    duties = failover()
    duties.tick(0, leading(unreachable=("n3",)))
    assert duties.tick(1_000, leading(unreachable=("n3",), down=("n3",))) == []


def test_a_down_member_reachable_again_is_marked_up_until_the_table_says_it_is_up():
    duties = failover()
    assert duties.tick(0, leading(down=("n3",))) == [MarkUp("n3", 0)]
    assert duties.tick(200, leading(down=("n3",))) == [MarkUp("n3", 200)]
    assert duties.tick(400, leading()) == []


def test_a_new_leader_counts_unreachability_from_its_own_first_look():
    duties = failover()
    duties.tick(0, leading(unreachable=("n3",)))
    duties.tick(400, FOLLOWING)
    assert duties.tick(600, leading(term=2, unreachable=("n3",))) == []
    assert duties.tick(1_099, leading(term=2, unreachable=("n3",))) == []
    assert duties.tick(1_100, leading(term=2, unreachable=("n3",))) == [FailOver("n3", 1_100, 500)]


def test_both_duties_in_one_tick_come_reaper_first():
    duties = LeaderDuties(group_timeout_ms=GROUP_TIMEOUT_MS, owner_failover_ms=FAILOVER_MS)
    duties.tick(0, leading(down=("n3",)))  # marked down under an earlier leader, reachable now
    assert duties.tick(500, leading(down=("n3",))) == [ExpireIdle(-500, ()), MarkUp("n3", 500)]


def test_a_member_out_of_reach_holds_the_reaper_back_until_it_is_failed_over():
    duties = LeaderDuties(group_timeout_ms=GROUP_TIMEOUT_MS, owner_failover_ms=FAILOVER_MS)
    duties.tick(0, leading(unreachable=("n3",)))
    assert duties.tick(500, leading(unreachable=("n3",))) == [FailOver("n3", 500, 500)]
    assert duties.tick(600, leading(unreachable=("n3",), down=("n3",))) == [ExpireIdle(-400, ("n3",))]


def test_nonsense_limits_are_refused_naming_the_setting():
    for arguments in ({"group_timeout_ms": -1}, {"owner_failover_ms": -1}, {"reaper_interval_ms": 0}):
        try:
            LeaderDuties(**arguments)
        except ValueError as error:
            assert next(iter(arguments)) in str(error)
        else:
            raise AssertionError(f"{arguments} was taken")


# ---- hypothesis: every command is justified by the readings before it ----------------------------

MEMBERS = ("n2", "n3", "n4")


def lately_back(member: str, tenure: list, now_ms: int) -> bool:
    """Seen out of reach in this tenure, and reachable again for less than half a group timeout."""
    out = [index for index, (_, seen) in enumerate(tenure) if member in seen.unreachable]
    if not out or out[-1] == len(tenure) - 1:
        return False
    back_ms = tenure[out[-1] + 1][0]
    return now_ms - back_ms < GROUP_TIMEOUT_MS / 2


def holding_back(status: RaftStatus, tenure: list, now_ms: int) -> bool:
    """A member out of reach and not marked down, or lately back, may rely on any route."""
    return any((member in status.unreachable and member not in status.down)
               or lately_back(member, tenure, now_ms) for member in MEMBERS)
READINGS = st.lists(st.tuples(
    st.integers(0, 400),  # ms since the previous reading
    st.booleans() | st.just(True),  # leader (mostly)
    st.integers(1, 3),  # term
    st.frozensets(st.sampled_from(MEMBERS)),  # unreachable
    st.frozensets(st.sampled_from(MEMBERS)),  # down
), max_size=60)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(readings=READINGS)
def test_every_command_follows_from_the_readings_before_it_and_the_reaper_runs_whenever_it_may(readings):
    duties = LeaderDuties(group_timeout_ms=GROUP_TIMEOUT_MS, owner_failover_ms=FAILOVER_MS,
                          reaper_interval_ms=REAPER_MS)
    now_ms = 0
    history: list[tuple[int, RaftStatus]] = []
    last_reap_ms = None
    for elapsed_ms, leader, term, unreachable, down in readings:
        now_ms += elapsed_ms
        status = RaftStatus(leader, term, tuple(m for m in MEMBERS if m not in unreachable),
                            tuple(sorted(unreachable)), frozenset(down))
        history.append((now_ms, status))
        # the readings of this unbroken leadership (same term, leader throughout), oldest first
        tenure = []
        for at_ms, seen in reversed(history):
            if not (seen.leader and seen.term == term):
                break
            tenure.insert(0, (at_ms, seen))
        commands = duties.tick(now_ms, status)
        reap_due = (leader and now_ms - tenure[0][0] >= GROUP_TIMEOUT_MS / 2
                    and (last_reap_ms is None or now_ms - last_reap_ms >= REAPER_MS)
                    and not holding_back(status, tenure, now_ms))
        assert any(isinstance(command, ExpireIdle) for command in commands) == reap_due, (commands, tenure)
        for command in commands:
            assert leader, command
            if isinstance(command, ExpireIdle):
                assert command == ExpireIdle(now_ms - GROUP_TIMEOUT_MS, tuple(sorted(unreachable)))
                last_reap_ms = now_ms
            elif isinstance(command, FailOver):
                member = command.node
                assert member not in down
                out_of_reach = [at_ms for at_ms, seen in tenure if member in seen.unreachable]
                # unreachable in every reading of the tenure since out_of_reach began
                since_ms = now_ms
                for at_ms, seen in reversed(tenure):
                    if member not in seen.unreachable:
                        break
                    since_ms = at_ms
                assert out_of_reach and now_ms - since_ms >= FAILOVER_MS
                assert command.unreachable_ms == now_ms - since_ms
            else:
                assert isinstance(command, MarkUp)
                assert command.node in down and command.node not in unreachable


# ---- groups follow their consumers -------------------------------------------------------------------

FOLLOW_MS = 300


def stranded(term: int = 1, unreachable=(), down=(), n1_consumers: int = 0) -> RaftStatus:
    """n1 holds 2 routes of q and n2 consumes q; n1 has `n1_consumers` on it."""
    consumers = (("n1", "q", n1_consumers),) if n1_consumers else ()
    status = leading(term, unreachable=unreachable, down=down)
    return RaftStatus(status.leader, status.term, status.reachable, status.unreachable, status.down,
                      consumers=consumers + (("n2", "q", 1),), routed=(("n1", "q", 2), ("n2", "p", 1)))


def follower() -> LeaderDuties:
    return LeaderDuties(route_follow_ms=FOLLOW_MS)


def test_routes_follow_consumers_after_route_follow_ms_without_any_on_their_node():
    duties = follower()
    assert duties.active
    assert duties.tick(0, stranded()) == []
    assert duties.tick(FOLLOW_MS - 1, stranded()) == []
    assert duties.tick(FOLLOW_MS, stranded()) == [FollowConsumers("q", "n1", FOLLOW_MS)]
    assert duties.tick(FOLLOW_MS + 1, stranded()) == []  # proposed again only a route_follow_ms later
    assert duties.tick(2 * FOLLOW_MS, stranded()) == [FollowConsumers("q", "n1", 2 * FOLLOW_MS)]


def test_a_consumer_back_on_the_node_starts_the_wait_again():
    duties = follower()
    duties.tick(0, stranded())
    duties.tick(200, stranded(n1_consumers=1))
    assert duties.tick(FOLLOW_MS, stranded()) == []  # stranded again from here
    assert duties.tick(2 * FOLLOW_MS - 1, stranded()) == []
    assert duties.tick(2 * FOLLOW_MS, stranded()) == [FollowConsumers("q", "n1", 2 * FOLLOW_MS)]


def test_no_move_while_a_member_is_out_of_reach_and_a_new_leader_waits_afresh():
    duties = follower()
    duties.tick(0, stranded())
    assert duties.tick(FOLLOW_MS, stranded(unreachable=("n3",))) == []
    assert duties.tick(FOLLOW_MS + 1, stranded(unreachable=("n3",), down=("n3",))) != []  # down: not waited for
    duties = follower()
    duties.tick(0, stranded())
    duties.tick(10, FOLLOWING)
    assert duties.tick(FOLLOW_MS, stranded(term=2)) == []
    assert duties.tick(FOLLOW_MS + 10 + FOLLOW_MS, stranded(term=2)) != []


def test_no_duty_without_route_follow_ms():
    duties = LeaderDuties()
    assert not duties.active
    assert duties.tick(FOLLOW_MS * 10, stranded()) == []
