"""`grouper perf`'s check (node/tools/perf_ledger.py Ledger) against a naive model of what consumers received."""

from hypothesis import given
from hypothesis import strategies as st

from node.tools.perf_ledger import Ledger, percentile


def model(arrivals: list[tuple[str, int]]) -> tuple[int, int, int]:
    """(distinct, duplicates, order violations): a repeat is a duplicate; a first arrival below the
    highest of its group seen before is out of order."""
    seen: set = set()
    distinct = duplicates = violations = 0
    for index, (group, seq) in enumerate(arrivals):
        if (group, seq) in seen:
            duplicates += 1
            continue
        seen.add((group, seq))
        distinct += 1
        earlier = [s for g, s in arrivals[:index] if g == group]
        if earlier and seq < max(earlier):
            violations += 1
    return distinct, duplicates, violations


def test_messages_of_each_group_in_order_are_clean_whatever_the_interleaving():
    ledger = Ledger()
    for seq in range(5):
        ledger.record("a", seq)
        ledger.record("b", seq)

    assert (ledger.received, ledger.distinct, ledger.duplicates, ledger.order_violations) == (10, 10, 0, 0)
    assert ledger.lost(accepted=12) == 2


def test_a_late_message_is_an_order_violation_and_a_repeat_a_duplicate():
    ledger = Ledger()
    for seq in (0, 2, 1, 2):
        ledger.record("a", seq)

    assert (ledger.distinct, ledger.duplicates, ledger.order_violations) == (3, 1, 1)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 40)), max_size=200))
def test_the_ledger_counts_as_the_model_does(arrivals):
    ledger = Ledger()
    for group, seq in arrivals:
        ledger.record(group, seq)

    assert (ledger.distinct, ledger.duplicates, ledger.order_violations) == model(arrivals)
    assert ledger.received == len(arrivals)
    assert ledger.lost(accepted=ledger.distinct) == 0


def test_percentiles_of_sorted_values():
    values = list(range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 1.0)) == (51, 100, 100)
    assert percentile([], 0.5) == 0.0
