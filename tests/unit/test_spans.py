"""The journal's packed index of live STOREs (node/store/spans.py) against a dict, and what it costs."""

from __future__ import annotations

import tracemalloc
from array import array

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from node.store import spans as spans_module
from node.store.spans import Spans


class Model:
    """The index as the journal kept it before Spans: a dict seq -> (offset, length, tag)."""

    def __init__(self):
        self.by_seq: dict[int, tuple[int, int, int]] = {}

    def add(self, seq, offset, length, tag):
        old = self.by_seq.get(seq)
        self.by_seq[seq] = (offset, length, tag)
        return old[1] if old else 0

    def remove(self, seq):
        old = self.by_seq.pop(seq, None)
        return old[1] if old else 0


# a step: ("add", seq step, length, tag), ("remove", pick), ("get", pick); seqs mostly ascend
steps = st.lists(st.one_of(
    st.tuples(st.just("next"), st.integers(1, 3), st.integers(1, 500), st.integers(0, 5)),
    st.tuples(st.just("restore"), st.integers(0, 10_000), st.integers(1, 500), st.integers(0, 5)),
    st.tuples(st.just("below"), st.integers(1, 200), st.integers(1, 500), st.integers(0, 5)),
    st.tuples(st.just("remove"), st.integers(0, 10_000)),
    st.tuples(st.just("remove_oldest"), st.integers(1, 40)),
    st.tuples(st.just("get"), st.integers(0, 10_000)),
), max_size=400)


def check_same(spans: Spans, model: Model, seen: list[int]) -> None:
    for seq in seen:  # removed ones too: a tombstone is no record
        entry = model.by_seq.get(seq)
        assert spans.get(seq) == (entry[:2] if entry else None), seq
    expected = sorted(model.by_seq.items())
    assert list(spans) == [(seq, offset, length) for seq, (offset, length, _) in expected]
    assert len(spans) == len(expected)
    assert spans.live_bytes == sum(length for _, length, _ in model.by_seq.values())
    assert spans.live_seqs() == array("q", [seq for seq, _ in expected])


@hypothesis_settings(max_examples=300, deadline=None)
@given(steps, st.booleans(), st.booleans())
def test_the_index_answers_as_a_dict_of_the_same_stores_and_removes_would(actions, tagged, small_limits):
    # small_limits: rebuilds and overflow merges after a few records, so short runs reach them often
    limits = (spans_module.REBUILD_DEAD_MIN, spans_module.OVERFLOW_MIN)
    if small_limits:
        spans_module.REBUILD_DEAD_MIN, spans_module.OVERFLOW_MIN = 1, 2
    try:
        run_against_model(actions, tagged)
    finally:
        spans_module.REBUILD_DEAD_MIN, spans_module.OVERFLOW_MIN = limits


def run_against_model(actions, tagged):
    spans, model = Spans(tagged=tagged), Model()
    seen: list[int] = [0]  # every seq ever stored (and 0, never stored): removed ones are tombstones
    last_seq = 0
    offset = 0
    for action in actions:
        if action[0] in ("next", "restore", "below"):
            kind, number, length, tag = action
            if kind == "next":
                last_seq += number
                seq = last_seq
            elif kind == "restore":
                if not model.by_seq:
                    continue
                seq = sorted(model.by_seq)[number % len(model.by_seq)]  # a re-STORE of a live seq
            else:
                seq = max(1, last_seq - number)  # below the last: live, tombstoned or never seen
            offset += 1_000
            seen.append(seq)
            assert spans.add(seq, offset, length, tag) == model.add(seq, offset, length, tag)
        elif action[0] == "remove":
            live = sorted(model.by_seq)
            seq = live[action[1] % len(live)] if live and action[1] % 3 else seen[action[1] % len(seen)]
            assert spans.remove(seq) == model.remove(seq)
        elif action[0] == "remove_oldest":  # a queue drained in order
            for seq in sorted(model.by_seq)[:action[1]]:
                assert spans.remove(seq) == model.remove(seq)
        else:
            live = sorted(model.by_seq)
            seq = live[action[1] % len(live)] if live and action[1] % 2 else seen[action[1] % len(seen)]
            entry = model.by_seq.get(seq)
            assert spans.get(seq) == (entry[:2] if entry else None)
        assert spans.live_bytes == sum(length for _, length, _ in model.by_seq.values())
    for after in sorted(set(seen))[::max(1, len(seen) // 4)]:  # a cold tail's reads (merges the overflow)
        assert spans.seqs_after(after, 3) == sorted(seq for seq in model.by_seq if seq > after)[:3]
    check_same(spans, model, seen)
    if tagged:
        assert spans.tag_sum() == sum(tag for _, _, tag in model.by_seq.values())
        spans.untag()
        with pytest.raises(RuntimeError, match="tagged=True"):
            spans.tag_sum()
    check_same(spans, model, seen)


def test_a_drained_index_rebuilds_its_columns_so_tombstones_stay_below_half():
    spans = Spans()
    for seq in range(1, 10_001):
        spans.add(seq, seq * 100, 100)
    for seq in range(1, 9_001):
        spans.remove(seq)
    assert len(spans._seqs) <= 2 * len(spans)
    for seq in range(9_001, 10_001, 2):  # tombstones between live records
        spans.remove(seq)
    assert len(spans._seqs) <= 2 * len(spans)
    assert [seq for seq, _, _ in spans] == list(range(9_002, 10_001, 2))


def test_stores_below_the_last_seq_are_merged_into_the_columns_once_the_overflow_grows():
    spans = Spans()
    for seq in range(10_000, 12_000):
        spans.add(seq, seq, 10)
    for seq in range(1, 2_000):
        spans.add(seq, seq, 10)
    assert len(spans._overflow) <= max(64, len(spans._seqs) // 16)
    assert [seq for seq, _, _ in spans] == list(range(1, 2_000)) + list(range(10_000, 12_000))


def test_an_empty_length_is_refused_because_it_marks_a_removed_record():
    with pytest.raises(ValueError, match="positive length"):
        Spans().add(1, 0, 0)


def test_live_records_cost_at_most_24_bytes_each():
    # 200,000 keeps the test quick; the module header gives the figure for 1,000,000 (20.5 bytes)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        spans = Spans()
        for seq in range(1, 200_001):
            spans.add(seq, seq * 140, 140)
        per_record = (tracemalloc.get_traced_memory()[0] - before) / len(spans)
    finally:
        tracemalloc.stop()
    assert per_record <= 24, f"{per_record:.1f} bytes per live record"


def test_a_removed_seq_is_removed_once_and_a_store_brings_it_back_in_place():
    spans = Spans()
    for seq in range(1, 6):
        spans.add(seq, seq * 10, 10)
    assert spans.remove(3) == 10
    assert spans.remove(3) == 0
    assert (len(spans), spans.live_bytes, spans.get(3)) == (4, 40, None)
    assert spans.add(3, 99, 7) == 0  # the tombstone's place, not the overflow
    assert not spans._overflow
    assert list(spans) == [(1, 10, 10), (2, 20, 10), (3, 99, 7), (4, 40, 10), (5, 50, 10)]
    assert (len(spans), spans.live_bytes, spans._dead) == (5, 47, 0)
