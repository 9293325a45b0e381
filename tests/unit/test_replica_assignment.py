"""Backup assignment by rendezvous hashing (node/core/replication/assignment.py): properties over any
member set, and the spread of a failed owner's groups over the survivors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.core.replication.assignment import (REPLICATION_FACTOR_MAX, backups_of, check_replication_factor,
                                              promotion_target, rank, under_replicated)

MEMBERS = st.sets(st.sampled_from([f"n{i}" for i in range(8)]), min_size=1, max_size=8)
KEYS = st.text(min_size=0, max_size=12)
FACTORS = st.integers(min_value=1, max_value=REPLICATION_FACTOR_MAX)


@given(MEMBERS, KEYS, FACTORS, st.data())
def test_backups_never_include_the_owner_and_have_the_factors_size(members, key, factor, data):
    owner = data.draw(st.sampled_from(sorted(members)))
    backups = backups_of(owner, "orders", key, members, factor)
    assert owner not in backups
    assert len(set(backups)) == len(backups) == min(factor - 1, len(members) - 1)
    assert set(backups) <= members
    assert under_replicated(owner, members, factor) == (len(members) - 1 < factor - 1)


@given(MEMBERS, KEYS, FACTORS, st.data())
def test_the_answer_does_not_depend_on_the_order_members_are_listed_in(members, key, factor, data):
    owner = data.draw(st.sampled_from(sorted(members)))
    listed = data.draw(st.permutations(sorted(members)))
    assert backups_of(owner, "q", key, listed, factor) == backups_of(owner, "q", key, set(members), factor)


@given(MEMBERS, KEYS, FACTORS, st.data())
def test_a_member_joining_changes_a_groups_backups_only_by_entering_them(members, key, factor, data):
    owner = data.draw(st.sampled_from(sorted(members)))
    joiner = "joiner"
    before = backups_of(owner, "q", key, members, factor)
    after = backups_of(owner, "q", key, members | {joiner}, factor)
    if joiner not in after:
        assert after == before
    else:  # the joiner took one place; the others keep their relative order, the last may drop out
        rest = tuple(member for member in after if member != joiner)
        assert rest == before[:len(rest)]


@given(MEMBERS, KEYS, FACTORS, st.data())
def test_a_member_leaving_that_backs_nothing_of_a_group_changes_nothing(members, key, factor, data):
    owner = data.draw(st.sampled_from(sorted(members)))
    backups = backups_of(owner, "q", key, members, factor)
    for leaver in members - {owner} - set(backups):
        assert backups_of(owner, "q", key, members - {leaver}, factor) == backups


def test_a_failed_owners_groups_spread_evenly_over_the_survivors():
    # why rendezvous backups and not a backup node: a failover must not double one survivor's load
    members = {"n0", "n1", "n2", "n3"}
    keys = [f"customer-{i}" for i in range(3000)]
    taken: dict[str, int] = {}
    for key in keys:
        target = promotion_target("n0", "orders", key, members, members, 2)
        taken[target] = taken.get(target, 0) + 1
    assert set(taken) == {"n1", "n2", "n3"}
    for count in taken.values():  # a third each, give or take 10% of a third (blake2b: the same every run)
        assert abs(count - 1000) < 100, taken


def test_promotion_skips_backups_out_of_sync_and_refuses_when_none_is_left():
    members = {"a", "b", "c"}
    first, second = backups_of("a", "q", "g", members, 3)
    assert promotion_target("a", "q", "g", members, {first, second}, 3) == first
    assert promotion_target("a", "q", "g", members, {second}, 3) == second
    assert promotion_target("a", "q", "g", members, set(), 3) is None
    assert promotion_target("a", "q", "g", members, members, 1) is None  # no copies: nothing to promote


def test_rank_is_stable_across_processes_and_versions():
    # a rank computed by another node, or before an upgrade, must match: a pinned value, not hash()
    assert rank("n1", "orders", "customer-7") == 16073136173289304122
    assert rank("n2", "orders", "customer-7") != rank("n1", "orders", "customer-7")


@pytest.mark.parametrize("factor", [0, -1, REPLICATION_FACTOR_MAX + 1])
def test_a_factor_out_of_range_is_refused_naming_the_range(factor):
    with pytest.raises(ValueError, match=f"1 to {REPLICATION_FACTOR_MAX}"):
        check_replication_factor(factor)
