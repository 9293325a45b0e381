"""node/core/cluster/shards.py: every node must put a group in the same shard, forever, and the shards share the load."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.cluster.shards import SHARD_COUNT_MAX, check_shard_count, shard_of, split_by_shard

names = st.text(min_size=0, max_size=40)


@given(queue=names, group=names, shard_count=st.integers(1, SHARD_COUNT_MAX))
def test_a_group_lands_in_one_of_the_shards(queue, group, shard_count):
    assert 0 <= shard_of(queue, group, shard_count) < shard_count


def test_one_shard_holds_everything():
    assert {shard_of("q", f"g{i}", 1) for i in range(100)} == {0}


def test_the_shard_of_a_group_never_changes_between_releases():
    # pinned: a cluster's routes live in these shards; a different hash would strand them
    assert [shard_of("orders", f"customer-{i}", 8) for i in range(12)] == PINNED_ORDERS_8
    assert shard_of("q", "", 16) == PINNED_EMPTY_GROUP_16


def test_the_shard_does_not_depend_on_the_process():
    # Python's hash() of a str is salted per process; shard_of must not be
    code = "from node.core.cluster.shards import shard_of; print([shard_of('q', 'g%d' % i, 7) for i in range(50)])"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed)}, cwd=_repo()).stdout for seed in (1, 2)}
    assert runs == {str([shard_of("q", f"g{i}", 7) for i in range(50)]) + "\n"}


def test_queue_and_group_are_not_just_concatenated():
    pairs = [("a", "bc"), ("ab", "c"), ("abc", "")]
    assert len({shard_of(queue, group, SHARD_COUNT_MAX) for queue, group in pairs}) > 1


@settings(max_examples=30, deadline=None)
@given(prefix=st.text(max_size=10), queue=st.text(min_size=1, max_size=10), shard_count=st.integers(2, 8))
def test_groups_spread_evenly_over_the_shards(prefix, queue, shard_count):
    groups_count = 4000
    counts = collections.Counter(shard_of(queue, f"{prefix}{i}", shard_count) for i in range(groups_count))
    mean = groups_count / shard_count
    # binomial spread: the standard deviation is at most sqrt(mean) (22 at 500 per shard); 25% is > 5 of them
    assert len(counts) == shard_count
    assert all(abs(count - mean) <= 0.25 * mean for count in counts.values()), counts


@given(keys=st.lists(st.tuples(names, names, st.integers()), max_size=30), shard_count=st.integers(1, 9))
def test_a_proposal_splits_into_per_shard_parts_that_keep_its_order(keys, shard_count):
    parts = split_by_shard(keys, shard_count)
    assert list(parts) == sorted(parts)
    assert sorted(key for part in parts.values() for key in part) == sorted(keys)
    for shard, part in parts.items():
        assert part == [key for key in keys if shard_of(key[0], key[1], shard_count) == shard]


@pytest.mark.parametrize("bad", [0, -1, SHARD_COUNT_MAX + 1, 2.0, "4", True, None])
def test_a_bad_shard_count_is_refused_with_the_setting_named(bad):
    with pytest.raises(ValueError, match="shard_count"):
        check_shard_count(bad)
    with pytest.raises(ValueError, match="shard_count"):
        shard_of("q", "g", bad)


def _repo() -> str:
    import pathlib
    return str(pathlib.Path(__file__).resolve().parents[2])


PINNED_ORDERS_8 = [0, 2, 1, 1, 3, 7, 6, 4, 1, 7, 7, 3]
PINNED_EMPTY_GROUP_16 = 1
