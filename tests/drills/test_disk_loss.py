"""The disk-loss fault's pieces that need no cluster (tests/drills/disk_loss.py): emptying a data directory
and the arguments of a node reborn as a new member."""

from __future__ import annotations

from tests.drills.disk_loss import rebirth_args, wipe


def test_wipe_empties_the_data_directory_but_keeps_it_and_counts_the_bytes(tmp_path):
    data = tmp_path / "node0"
    (data / "raft").mkdir(parents=True)
    (data / "raft" / "raft.journal").write_bytes(b"x" * 10)
    (data / "journal-000001.log").write_bytes(b"y" * 5)
    (data / "replicas" / "127.0.0.1:1").mkdir(parents=True)
    (data / "replicas" / "127.0.0.1:1" / "journal").write_bytes(b"z" * 3)
    assert wipe(data) == 18
    assert data.is_dir() and list(data.iterdir()) == []
    assert wipe(data) == 0


def test_a_reborn_node_gets_a_new_host_and_raft_port_joins_through_one_member_and_keeps_its_other_flags():
    args = ("--raft-port", "20001", "--peers", "127.0.0.1:20001,127.0.0.1:20002,127.0.0.1:20003",
            "--handler-timeout-ms", "2000")
    reborn = rebirth_args(args, "127.0.0.2", 20009, "127.0.0.1:20002")
    assert reborn == ("--host", "127.0.0.2", "--raft-port", "20009", "--peers", "127.0.0.1:20002", "--join",
                      "--handler-timeout-ms", "2000")
    # reborn twice: the flags of the first rebirth are replaced, not repeated
    assert rebirth_args(reborn, "127.0.0.3", 20010, "127.0.0.1:20003") == (
        "--host", "127.0.0.3", "--raft-port", "20010", "--peers", "127.0.0.1:20003", "--join",
        "--handler-timeout-ms", "2000")
