"""The raft leader's replica promotion duty (handler/leader_duties.py), with fake RaftStatus readings.

Examples, then hypothesis: every Promote follows from the readings before it (out of reach for
replica_failover_ms under one leadership, routes, a live in-sync backup), at most once per epoch
within replica_failover_ms; with no in-sync backup the duties propose exactly what they did before
promotion existed.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from handler.leader_duties import FailOver, LeaderDuties, MarkUp, Promote, RaftStatus

PROMOTE_MS = 300
FAILOVER_MS = 1000
MEMBERS = ("n2", "n3", "n4")


def reading(unreachable=(), down=(), term: int = 1, routed=(("n2", "q", 3),), epochs=(),
            in_sync=(("n2", ("n3",)),)) -> RaftStatus:
    """The leader n1's view: n2 owns 3 routes of q and n3 is its in-sync backup, unless said otherwise."""
    return RaftStatus(leader=True, term=term, reachable=tuple(m for m in MEMBERS if m not in unreachable),
                      unreachable=tuple(unreachable), down=frozenset(down), routed=routed, epochs=epochs,
                      in_sync=in_sync)


def promoter(owner_failover_ms: int = 0) -> LeaderDuties:
    return LeaderDuties(replica_failover_ms=PROMOTE_MS, owner_failover_ms=owner_failover_ms, replication_factor=3)


def test_an_owner_unreachable_for_replica_failover_ms_with_an_in_sync_backup_is_promoted_at_its_epoch():
    duties = promoter()
    assert duties.active
    assert duties.tick(1000, reading(unreachable=("n2",), epochs=(("n2", 4),))) == []
    assert duties.tick(1000 + PROMOTE_MS - 1, reading(unreachable=("n2",), epochs=(("n2", 4),))) == []
    assert duties.tick(1000 + PROMOTE_MS, reading(unreachable=("n2",), epochs=(("n2", 4),))) == [
        Promote("n2", 4, 1000 + PROMOTE_MS, 3, PROMOTE_MS)]


def test_without_an_in_sync_backup_routes_or_a_live_backup_nobody_is_promoted():
    for status in (reading(unreachable=("n2",), in_sync=()),  # as every cluster before streams: nothing
                   reading(unreachable=("n2",), routed=(("n3", "q", 1),)),  # n2 owns nothing
                   reading(unreachable=("n2", "n3")),  # its backup is out of reach too
                   reading(unreachable=("n2",), down=("n3",))):  # its backup is down
        duties = promoter()
        duties.tick(0, status)
        assert not [c for c in duties.tick(10 * PROMOTE_MS, status) if isinstance(c, Promote)], status


def test_a_promote_is_proposed_once_per_epoch_and_again_only_if_the_epoch_did_not_move():
    duties = promoter()
    duties.tick(0, reading(unreachable=("n2",)))
    assert len(duties.tick(PROMOTE_MS, reading(unreachable=("n2",)))) == 1
    assert duties.tick(PROMOTE_MS + 200, reading(unreachable=("n2",))) == []
    # lost in a leader change that kept this leader: the epoch is still 0 a replica_failover_ms later
    assert duties.tick(2 * PROMOTE_MS, reading(unreachable=("n2",))) == [Promote("n2", 0, 2 * PROMOTE_MS, 3,
                                                                                 2 * PROMOTE_MS)]
    # applied: epoch 1, n2 down, its set emptied: nothing more to promote
    applied = reading(unreachable=("n2",), down=("n2",), epochs=(("n2", 1),), in_sync=())
    assert duties.tick(3 * PROMOTE_MS, applied) == [] and duties.tick(9 * PROMOTE_MS, applied) == []


def test_a_promote_the_caller_could_not_propose_is_due_again_at_the_next_tick():
    duties = promoter()
    duties.tick(0, reading(unreachable=("n2",)))
    assert len(duties.tick(PROMOTE_MS, reading(unreachable=("n2",)))) == 1
    duties.promote_dropped("n2")
    assert len(duties.tick(PROMOTE_MS + 200, reading(unreachable=("n2",)))) == 1


def test_owner_failover_drops_what_promotion_left_once_per_epoch_later():
    duties = promoter(owner_failover_ms=FAILOVER_MS)
    duties.tick(0, reading(unreachable=("n2",)))
    assert [type(c) for c in duties.tick(PROMOTE_MS, reading(unreachable=("n2",)))] == [Promote]
    left = reading(unreachable=("n2",), down=("n2",), epochs=(("n2", 1),), in_sync=(),
                   routed=(("n2", "q", 1),))  # one group had no in-sync backup
    assert duties.tick(FAILOVER_MS - 1, left) == []
    assert duties.tick(FAILOVER_MS, left) == [FailOver("n2", FAILOVER_MS, FAILOVER_MS)]
    assert duties.tick(FAILOVER_MS + 200, left) == []
    # nothing left: nothing to fail over
    gone = reading(unreachable=("n2",), down=("n2",), epochs=(("n2", 2),), in_sync=(), routed=())
    assert duties.tick(FAILOVER_MS + 400, gone) == []


def test_both_due_in_one_tick_come_promote_first_then_owner_failover():
    duties = promoter(owner_failover_ms=PROMOTE_MS)
    duties.tick(0, reading(unreachable=("n2",)))
    assert [type(c) for c in duties.tick(PROMOTE_MS, reading(unreachable=("n2",)))] == [Promote, FailOver]


def test_a_promoted_member_reachable_again_is_marked_up_without_owner_failover():
    duties = promoter()
    duties.tick(0, reading(unreachable=("n2",)))
    assert duties.tick(50, reading(down=("n2",), epochs=(("n2", 1),))) == [MarkUp("n2", 50)]


def test_a_new_leader_waits_replica_failover_ms_from_its_own_first_look():
    duties = promoter()
    duties.tick(0, reading(unreachable=("n2",)))
    assert duties.tick(PROMOTE_MS, reading(unreachable=("n2",), term=2)) == []
    assert len(duties.tick(2 * PROMOTE_MS, reading(unreachable=("n2",), term=2))) == 1


def test_a_negative_replica_failover_ms_is_refused_naming_it():
    try:
        LeaderDuties(replica_failover_ms=-1)
    except ValueError as error:
        assert "replica_failover_ms" in str(error)
    else:
        raise AssertionError("replica_failover_ms=-1 was taken")


# ---- hypothesis ----------------------------------------------------------------------------------------

READINGS = st.lists(st.tuples(
    st.integers(0, 200),  # ms since the previous reading
    st.booleans() | st.just(True),  # leader (mostly)
    st.integers(1, 2),  # term
    st.frozensets(st.sampled_from(MEMBERS)),  # unreachable
    st.frozensets(st.sampled_from(MEMBERS)),  # down
    st.frozensets(st.sampled_from(MEMBERS)),  # owners with routes
    st.integers(0, 1),  # n2's epoch
    st.frozensets(st.sampled_from(MEMBERS)),  # n2's in-sync backups (n3, n4 count; n2 itself never)
), max_size=40)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(readings=READINGS)
def test_every_promote_follows_from_the_readings_before_it(readings):
    duties = promoter()
    now_ms, history, proposed = 0, [], {}
    for elapsed_ms, leader, term, unreachable, down, owners, epoch, in_sync in readings:
        now_ms += elapsed_ms
        backups = tuple(sorted(in_sync - {"n2"}))
        status = RaftStatus(leader, term, tuple(m for m in MEMBERS if m not in unreachable), tuple(sorted(unreachable)),
                            frozenset(down), routed=tuple((owner, "q", 1) for owner in sorted(owners)),
                            epochs=(("n2", epoch),) if epoch else (), in_sync=(("n2", backups),) if backups else ())
        history.append((now_ms, status))
        tenure = []
        for at_ms, seen in reversed(history):
            if not (seen.leader and seen.term == term):
                break
            tenure.insert(0, (at_ms, seen))
        commands = duties.tick(now_ms, status)
        for command in commands:
            if isinstance(command, MarkUp):
                assert command.node in down and command.node not in unreachable
                continue
            assert isinstance(command, Promote) and leader
            member = command.owner
            since_ms = now_ms
            for at_ms, seen in reversed(tenure):
                if member not in seen.unreachable:
                    break
                since_ms = at_ms
            assert member in unreachable and now_ms - since_ms >= PROMOTE_MS == PROMOTE_MS
            assert command.unreachable_ms == now_ms - since_ms and member in owners
            assert member == "n2" and any(b not in down and b not in unreachable for b in backups)
            assert command.epoch == epoch and command.replication_factor_default == 3
            last = proposed.get((term, member, epoch))
            assert last is None or now_ms - last >= PROMOTE_MS or tenure[0][0] > last
            proposed[(term, member, epoch)] = now_ms


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(readings=READINGS)
def test_with_no_in_sync_backup_the_duties_propose_exactly_what_they_did_before_promotion(readings):
    with_promotion = LeaderDuties(owner_failover_ms=FAILOVER_MS, replica_failover_ms=PROMOTE_MS)
    without = LeaderDuties(owner_failover_ms=FAILOVER_MS)
    now_ms = 0
    for elapsed_ms, leader, term, unreachable, down, owners, _epoch, _in_sync in readings:
        now_ms += elapsed_ms
        status = RaftStatus(leader, term, tuple(m for m in MEMBERS if m not in unreachable), tuple(sorted(unreachable)),
                            frozenset(down), routed=tuple((owner, "q", 1) for owner in sorted(owners)))
        assert with_promotion.tick(now_ms, status) == without.tick(now_ms, status)
