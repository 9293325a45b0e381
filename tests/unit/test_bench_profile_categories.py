"""bench/profile_categories.py charges a py-spy sample to a part of the code by the path of its innermost
frame in a part: each module of the node's packages lands in its own part wherever it moves inside
that package, and a summary leaves out what waits."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cluster_profile import summarize_profile
from bench.profile_categories import CATEGORIES, category, frame_path

ROOT = Path(__file__).resolve().parents[2]
PART = {prefix: name for name, prefixes in CATEGORIES for prefix in prefixes}


def frame(path: str, function: str = "f", line: int = 1) -> str:
    return f"{function} ({path}:{line})"


@pytest.mark.parametrize("folder, glob, prefix", [
    ("node/core/cluster", "*.py", "node/core/cluster/"),
    ("node/core/dispatch", "queue*.py", "node/core/dispatch/queue"),
    ("node/store", "*.py", "node/store/"),
    ("node/amqp", "*.py", "node/amqp/"),
    ("node/peer", "*.py", "node/peer/"),
    ("handler", "*.py", "handler/"),
])
def test_every_module_of_a_package_is_charged_to_the_package_s_part(folder, glob, prefix):
    modules = sorted((ROOT / folder).rglob(glob))
    assert modules
    wrong = {str(path.relative_to(ROOT)): category([frame(str(path.relative_to(ROOT)))]) for path in modules}
    assert {module: part for module, part in wrong.items() if part != PART[prefix]} == {}


def test_a_module_that_does_not_exist_yet_falls_in_its_package_s_part():
    assert category([frame("node/amqp/links.py")]) == PART["node/amqp/"]
    assert category([frame("node/core/cluster/placement.py")]) == PART["node/core/cluster/"]
    assert category([frame("node/core/dispatch/broker.py")]) == PART["node/core/"]


def test_the_innermost_frame_in_a_part_wins_and_frames_in_no_part_are_skipped():
    frames = [frame("node/amqp/loop.py"), frame("node/store/writer.py"), frame("threading.py")]
    assert category(frames) == PART["node/store/"]
    assert category([frame("threading.py")]) == "other"


def test_library_frames_count_by_their_path_under_site_packages():
    assert frame_path("handle (/venv/lib/python3.11/site-packages/grpc/_server.py:120)") == "grpc/_server.py"
    assert category(["handle (/venv/lib/python3.11/site-packages/grpc/_server.py:120)"]) == PART["grpc/"]


def test_no_prefix_is_hidden_by_a_wider_one_above_it():
    prefixes = [prefix for _, group in CATEGORIES for prefix in group]
    hidden = [(later, earlier) for index, later in enumerate(prefixes) for earlier in prefixes[:index]
              if later.startswith(earlier)]
    assert hidden == []


def test_a_summary_leaves_out_samples_that_wait_and_shares_the_busy_ones_by_part(tmp_path):
    raw = tmp_path / "node.txt"
    engine = "thread (1): engine;Thread.run (threading.py:982);AmqpServer._run (node/amqp/loop.py:249)"
    raw.write_text(f"{engine};Queue.add (node/core/dispatch/queue.py:10) 3\n"
                   f"{engine};Journal.store (node/store/journal.py:20) 1\n"
                   f"{engine};EpollSelector.select (selectors.py:468) 6\n")
    summary = summarize_profile(raw)
    assert summary["samples"] == 10 and summary["busy_samples"] == 4 and summary["waiting_pct"] == 60.0
    assert summary["categories_pct"] == {PART["node/core/dispatch/queue"]: 75.0, PART["node/store/"]: 25.0}
