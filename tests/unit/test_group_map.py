"""GroupMap (node/core/group_map.py) against a dict: the same answers after any sequence of changes.

Group ids come from a small alphabet so they overlap (one a prefix of another, the empty id), plus
non-ASCII, lone surrogates and NUL, which the separator scheme must keep apart; bulk inserts push the
map through many bucket splits. A snapshot (state, pickled) restores the same map, layout included.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from node.core.group_map import ENTRIES_PER_BUCKET_MAX, VALUE_MAX, GroupMap

GROUPS = st.one_of(st.text(alphabet="ab\x00é\ud800😀", max_size=4),
                   st.integers(0, 400).map(lambda number: f"customer-{number}"))
VALUES = st.one_of(st.integers(0, 1 << 20), st.just(VALUE_MAX), st.just(0))


class GroupMapMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.map = GroupMap()
        self.model: dict[str, int] = {}

    @rule(group=GROUPS, value=VALUES)
    def put(self, group, value):
        self.map[group] = value
        self.model[group] = value

    @rule(first=st.integers(0, 10_000), count=st.integers(1, 3 * ENTRIES_PER_BUCKET_MAX * 8), value=VALUES)
    def put_many(self, first, count, value):
        for number in range(first, first + count):
            self.map[f"bulk-{number}"] = self.model[f"bulk-{number}"] = min(value + number % 7, VALUE_MAX)

    @rule(group=GROUPS)
    def pop(self, group):
        assert self.map.pop(group, None) == self.model.pop(group, None)

    @rule(data=st.data())
    def pop_present(self, data):
        if self.model:
            group = data.draw(st.sampled_from(sorted(self.model)))
            assert self.map.pop(group) == self.model.pop(group)

    @rule(data=st.data())
    def pop_half(self, data):
        for group in sorted(self.model)[::2]:
            assert self.map.pop(group) == self.model.pop(group)

    @rule(group=GROUPS)
    def read(self, group):
        assert self.map.get(group) == self.model.get(group)
        assert self.map.get(group, -1) == self.model.get(group, -1)
        assert (group in self.map) == (group in self.model)

    @rule(limit=st.integers(0, (1 << 20) + 10))
    def below(self, limit):
        assert sorted(self.map.below(limit)) == sorted((group, value) for group, value in self.model.items()
                                                        if value < limit)

    @rule()
    def restore(self):
        restored = GroupMap.from_state(pickle.loads(pickle.dumps(self.map.state())))
        assert restored == self.map and repr(restored) == repr(self.map)
        self.map = restored

    @invariant()
    def same_as_the_model(self):
        assert len(self.map) == len(self.model)
        assert bool(self.map) == bool(self.model)
        assert dict(self.map.items()) == self.model
        assert sorted(self.map) == sorted(self.model)
        assert sorted(self.map.values()) == sorted(self.model.values())
        assert len(list(self.map.items())) == len(self.model)  # each entry once


TestGroupMap = GroupMapMachine.TestCase
TestGroupMap.settings = settings(max_examples=150, stateful_step_count=30, deadline=None, derandomize=True,
                                 database=None)


LAYOUT_SCRIPT = """
import hashlib, pickle
from node.core.group_map import GroupMap
group_map = GroupMap()
for number in range(1000):
    group_map[f"g{number}"] = number
for number in range(0, 1000, 3):
    del group_map[f"g{number}"]
print(hashlib.sha256(pickle.dumps(group_map.state())).hexdigest())
"""


def test_the_same_changes_give_the_same_layout_in_any_process():
    # replicas restore each other's snapshots: the layout must not depend on the process's str hash seed
    layouts = {subprocess.run([sys.executable, "-c", LAYOUT_SCRIPT], env={**os.environ, "PYTHONHASHSEED": seed},
                              capture_output=True, text=True, check=True).stdout for seed in ("1", "2")}
    assert len(layouts) == 1
    group_map = GroupMap.from_items((f"g{number}", number) for number in range(1000))
    assert group_map.state()[:3] == [32, 31, 1000]  # 63 buckets: 1000 entries, at most 16 per bucket on average


def test_values_outside_8_unsigned_bytes_and_keys_that_are_not_str_are_refused_by_name():
    group_map = GroupMap()
    for value in (-1, VALUE_MAX + 1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="ints 0..") as refused:
            group_map["g"] = value
        assert "the caller checks its input" in str(refused.value)
    with pytest.raises(ValueError, match="must be a str"):
        group_map[b"g"] = 1
    assert len(group_map) == 0 and group_map.get("g") is None and 1 not in group_map
    assert group_map.pop(("g",)) is None


def test_a_damaged_state_is_refused_and_never_half_restored():
    good = GroupMap.from_items((f"g{number}", number) for number in range(100)).state()
    damaged = [None, [1, 2], [3, 0, 0, [b"\xff"] * 3, [b""] * 3], [1, 0, 1, [b"\xff"], [b""]],
               good[:2] + [good[2] + 1] + good[3:], good[:3] + [good[3][:-1], good[4]],
               good[:3] + [[blob[1:] for blob in good[3]], good[4]]]
    for state in damaged:
        with pytest.raises(ValueError, match="state"):
            GroupMap.from_state(state)


def test_reads_of_a_key_that_is_not_a_str_find_nothing_as_a_dicts_do():
    group_map = GroupMap.from_items([("g", 1)])
    for key in (None, b"g", 1, ("g",)):
        assert group_map.get(key) is None and group_map.get(key, 7) == 7 and key not in group_map
        assert group_map.pop(key, 5) == 5
    assert dict(group_map.items()) == {"g": 1}
