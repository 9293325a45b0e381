"""A node that cannot serve refuses to start: non-zero exit and a message naming the problem."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.cluster import free_ports
from tests.integration.harness import REPO, with_raft_secret

START_WAIT_S = 30


def start(tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "node.cli", "node", "--amqp-port", "0", "--admin-port", "0", "--http-port", "0",
               *(("--data-dir", str(tmp_path / "data")) if "--data-dir" not in args else ()), *with_raft_secret(args)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=START_WAIT_S,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("flag", ["--amqp-port", "--admin-port", "--http-port", "--raft-port"])
def test_a_port_in_use_is_named(tmp_path, flag):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        cluster = ()
        if flag != "--raft-port":
            [raft] = free_ports(1)
            cluster = ("--raft-port", str(raft), "--peers", f"127.0.0.1:{raft},127.0.0.1:1")
        else:
            cluster = ("--peers", f"127.0.0.1:{port},127.0.0.1:1")
        result = start(tmp_path, *cluster, flag, str(port))
    finally:
        holder.close()
    assert result.returncode != 0
    assert str(port) in result.stderr and "in use" in result.stderr, result.stderr


def test_a_peer_list_without_this_node_is_refused_unless_it_joins(tmp_path):
    [raft] = free_ports(1)
    result = start(tmp_path, "--raft-port", str(raft), "--peers", "127.0.0.1:1,127.0.0.1:2")
    assert result.returncode == 2
    assert f"this node is 127.0.0.1:{raft}" in result.stderr and "--join" in result.stderr, result.stderr
    # the usual slip: the node lists itself under another name than it advertises
    result = start(tmp_path, "--raft-port", str(raft), "--advertise-host", "node1",
                   "--peers", f"127.0.0.1:{raft},127.0.0.1:2")
    assert result.returncode == 2 and f"this node is node1:{raft}" in result.stderr, result.stderr


def test_join_gives_up_naming_the_members_it_asked(tmp_path):
    [raft, dead] = free_ports(2)
    # another loopback address: the member is asked at this node's own admin port, on its host
    result = start(tmp_path, "--raft-port", str(raft), "--peers", f"127.0.0.2:{dead}", "--join",
                   env={"GROUPER_JOIN_TIMEOUT_MS": "1500"})
    assert result.returncode == 1
    assert "could not join the cluster within 1500 ms" in result.stderr and "127.0.0.2:" in result.stderr, \
        result.stderr


def test_an_unwritable_data_dir_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = start(tmp_path, "--data-dir", str(blocker / "data"))
    assert result.returncode != 0
    assert f"journal directory {blocker / 'data'} is not usable" in result.stderr, result.stderr


def test_a_required_data_volume_must_be_mounted(tmp_path):
    missing = tmp_path / "missing"
    result = start(tmp_path, "--data-dir", str(missing), env={"GROUPER_REQUIRE_DATA_VOLUME": "true"})
    assert result.returncode != 0 and f"data dir {missing} does not exist" in result.stderr, result.stderr
    assert not missing.exists()
    plain = Path(tempfile.mkdtemp(dir="/var/tmp"))  # a directory on the root file system, like an image's
    try:
        assert plain.stat().st_dev == os.stat("/").st_dev, "this check needs /var/tmp on the root file system"
        result = start(tmp_path, "--data-dir", str(plain), env={"GROUPER_REQUIRE_DATA_VOLUME": "true"})
        assert result.returncode != 0 and "not a mounted volume" in result.stderr, result.stderr
    finally:
        shutil.rmtree(plain)


def test_a_bad_config_value_is_named(tmp_path):
    result = start(tmp_path, env={"GROUPER_HTTP_PORT": "seventy"})
    assert result.returncode == 2 and "GROUPER_HTTP_PORT: expected an integer" in result.stderr, result.stderr


def test_a_cluster_node_without_a_raft_secret_refuses_to_start_on_loopback_too(tmp_path):
    [raft] = free_ports(1)
    command = [sys.executable, "-m", "node.cli", "node", "--amqp-port", "0", "--admin-port", "0", "--http-port", "0",
               "--data-dir", str(tmp_path / "data"), "--raft-port", str(raft),
               "--peers", f"127.0.0.1:{raft},127.0.0.1:2"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=START_WAIT_S)
    assert result.returncode == 1
    assert "cannot start: this node serves a raft cluster (--peers) but has no raft secret" in result.stderr
    assert "(umask 077; openssl rand -base64 32 > raft.secret)" in result.stderr
    assert "--allow-insecure-cluster" in result.stderr, result.stderr
