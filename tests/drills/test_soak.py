"""A short soak (bench/soak.py) as a test: clients that come and go must leave the node as they found it.

One node for SOAK_DURATION_S under a steady grouped load plus episodes of clients killed with kill -9,
links suspended with detach closed=false, 1 MiB bodies over 16 KiB frames, and an idle connection
kept open by heartbeats. The checks are counts and generous ceilings, never times: RSS growth over
the second half, engine objects back to zero once every client left, every episode not killed
ending well, the node alive without tracebacks, and the drill checker's verdict on the logs.
"""

from __future__ import annotations

from bench import soak

SOAK_DURATION_S = 60.0
SEED = 1


def test_a_short_soak_leaves_memory_and_engine_objects_flat_and_every_accepted_message_delivered(tmp_path):
    result = soak.run_soak(SOAK_DURATION_S, tmp_path, seed=SEED)

    report = soak.render(result, f"tests/drills/test_soak.py ({SOAK_DURATION_S:g} s)")
    assert not result.problems(), report
    assert result.baseline_after == {"connections": 0, "links": 0, "unsettled_deliveries": 0, "depth_messages": 0}, \
        report
    assert result.rss_growth_bytes < soak.RSS_GROWTH_MAX_BYTES, report
    assert result.episodes["killed"]["killed"] >= 3, report  # each role came and went several times
    for role in ("detach", "large", "heartbeat"):
        assert result.episodes[role]["ended"] >= 3 and result.episodes[role]["failed"] == 0, report
    assert result.accepted > 1000 and result.checker_ok, report
