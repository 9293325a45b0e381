"""The lost-identity check asks the other members, never this node itself (grouper up: one host)."""

from __future__ import annotations

from node import membership
from node.admin.client import AdminError


class RecordingClient:
    asked: list[str] = []

    def __init__(self, address, **_):
        self.address = address

    def __enter__(self):
        RecordingClient.asked.append(self.address)
        return self

    def __exit__(self, *_):
        return False

    def cluster_status(self, local_only=False):
        raise AdminError(self.address, "UNAVAILABLE", "down")


def test_members_on_this_nodes_host_are_not_asked_at_its_own_admin_port(tmp_path, monkeypatch, caplog):
    RecordingClient.asked = []
    monkeypatch.setattr(membership, "AdminClient", RecordingClient)
    with caplog.at_level("INFO", logger="grouper.membership"):
        membership.refuse_lost_identity("127.0.0.1:5674", ["127.0.0.1:5674", "127.0.0.1:5684", "127.0.0.1:5694"],
                                        5673, str(tmp_path / "raft"))
    assert RecordingClient.asked == [] and caplog.records == []


def test_members_on_other_hosts_are_asked_at_this_nodes_admin_port(tmp_path, monkeypatch):
    RecordingClient.asked = []
    monkeypatch.setattr(membership, "AdminClient", RecordingClient)
    membership.refuse_lost_identity("node0:5674", ["node0:5674", "node1:5674", "node2:5674"], 5673,
                                    str(tmp_path / "raft"))
    assert RecordingClient.asked == ["node1:5673", "node2:5673"]
