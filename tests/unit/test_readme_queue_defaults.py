"""The README's table of queue flags says the defaults a queue really gets from `grouper queue add`."""

from __future__ import annotations

import re
from pathlib import Path

from node.admin.wire import settings_from_pb
from proto import admin_pb2

README = Path(__file__).resolve().parents[2] / "README.md"


def _defaults_by_flag() -> dict[str, str]:
    """`| `--flag ARG` | default | meaning |` rows of the README, as {"--flag": "default"}."""
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \| ([^|]+) \|", README.read_text(), flags=re.MULTILINE)
    return {flag: default.strip() for flag, default in rows}


def _added_queue(name: str):
    return settings_from_pb(admin_pb2.QueueSettings(name=name))  # no flags given: the node's defaults


def test_every_numeric_default_in_the_queue_table_is_the_one_a_new_queue_gets():
    settings = _added_queue("orders")
    numeric = {flag: default for flag, default in _defaults_by_flag().items()
               if re.fullmatch(r"-?[\d,]+", default) and hasattr(settings, flag[2:].replace("-", "_"))}
    assert "--delivery-count-max" in numeric and "--groups-max" in numeric
    for flag, default in numeric.items():
        assert getattr(settings, flag[2:].replace("-", "_")) == int(default.replace(",", "")), flag


def test_the_queue_table_names_the_default_dead_letter_queue_a_new_queue_gets():
    assert _added_queue("orders").dead_letter_queue_name == "orders.DLQ"
    assert _defaults_by_flag()["--dead-letter-queue"] == "the queue's name + `.DLQ`"
