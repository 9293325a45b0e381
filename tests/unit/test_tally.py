from node.core.tally import LatencyTally


def test_a_tally_counts_each_value_under_the_first_bound_not_below_it_and_cumulates_on_snapshot():
    tally = LatencyTally((1.0, 10.0))
    for value_ms in (0.5, 1.0, 1.5, 10.0, 11.0, 400.0):
        tally.observe(value_ms)
    snapshot = tally.snapshot()
    assert snapshot["buckets"] == [(1.0, 2), (10.0, 4), (float("inf"), 6)]
    assert snapshot["count"] == 6 and snapshot["sum_ms"] == 424.0
    tally.observe(2.0)
    assert snapshot["buckets"][-1] == (float("inf"), 6)  # a snapshot is a copy
