"""Issue 26 finding 7: the secret-file rule and production mode (node/file_modes.py), pure, then the
start-up adapter on real files in a temporary directory."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from node import file_modes
from node.config import NodeConfig
from node.core.errors import GrouperError
from node.file_modes import SecretFile, production_mode, secret_file_problem, secret_file_verdict


@pytest.fixture(autouse=True)
def umask_restored():
    """secure_start sets the process's umask; give the rest of the test run its own back."""
    before = os.umask(0o022)
    yield
    os.umask(before)


# ---- the rule, pure -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode, owned_by_node, problem", [
    (0o600, True, None),
    (0o400, True, None),
    (0o644, True, "readable or writable by every local user"),  # `openssl rand > raft.secret` under umask 022
    (0o604, False, "readable or writable by every local user"),
    (0o602, True, "readable or writable by every local user"),
    (0o620, False, "writable by its group"),
    (0o640, True, "readable by its group"),  # the node's own file needs no group
    (0o640, False, None),  # root-owned, given to the node's group: PostgreSQL's rule for its key
    (0o440, False, None),  # a Kubernetes Secret with fsGroup: root:fsGroup, 0440 whatever defaultMode says
])
def test_a_secret_file_is_private_to_its_owner_or_given_to_a_group_by_another_user(mode, owned_by_node, problem):
    assert secret_file_problem(mode, owned_by_node) == problem


@pytest.mark.parametrize("users_database, host, production", [
    (True, "0.0.0.0", True), (True, "10.0.0.5", True), (True, "127.0.0.1", False), (True, "localhost", False),
    (True, "::1", False), (False, "0.0.0.0", False)])
def test_production_mode_is_a_user_database_on_a_non_loopback_host(users_database, host, production):
    assert production_mode(users_database, host) is production


LOOSE = SecretFile("raft_secret_file", "/etc/grouper/raft.secret", 0o644, True)
TIGHT = SecretFile("tls_key_file", "/etc/grouper/key.pem", 0o600, True)


def test_a_loose_secret_file_is_a_warning_naming_the_file_and_the_chmod_that_fixes_it():
    warnings, refusal = secret_file_verdict([LOOSE, TIGHT], production=False, allow_loose=False)
    assert warnings == ["secret file /etc/grouper/raft.secret (raft_secret_file) is readable or writable by every "
                        "local user (mode 0644): run `chmod 600 /etc/grouper/raft.secret` (a mounted Kubernetes "
                        "Secret: defaultMode 0400)"]
    assert refusal is None


def test_production_mode_refuses_a_loose_secret_file_unless_the_operator_allows_it():
    warnings, refusal = secret_file_verdict([LOOSE, TIGHT], production=True, allow_loose=False)
    assert refusal.startswith("1 secret file(s) are open to other local users") and warnings[0] in refusal
    assert "allow_loose_secret_files" in refusal
    assert secret_file_verdict([LOOSE], production=True, allow_loose=True) == (warnings, None)
    assert secret_file_verdict([TIGHT], production=True, allow_loose=False) == ([], None)


def test_every_secret_setting_is_checked_by_its_name():
    config = NodeConfig(tls_key_file="a", admin_tls_key_file="b", http_tls_key_file="c", cluster_tls_key_file="d",
                        raft_secret_file="e", users_file="f", tls_cert_file="cert.pem")
    assert sorted(file_modes.secret_settings(config, {"GROUPER_DEFAULT_PASSWORD_FILE": "g"})) == [
        ("GROUPER_DEFAULT_PASSWORD_FILE", "g"), ("admin_tls_key_file", "b"), ("cluster_tls_key_file", "d"),
        ("http_tls_key_file", "c"), ("raft_secret_file", "e"), ("tls_key_file", "a"), ("users_file", "f")]


# ---- at start, on real files --------------------------------------------------------------------

def secret(path, mode: int):
    path.write_text("s" * 32 + "\n")
    path.chmod(mode)
    return str(path)


def test_start_tightens_an_open_data_directory_and_makes_later_files_private(tmp_path, caplog):
    data = tmp_path / "data"
    data.mkdir(0o755)
    data.chmod(0o755)
    with caplog.at_level(logging.INFO, "grouper.files"):
        file_modes.secure_start(NodeConfig(data_dir=str(data)), environ={})
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert f"data directory {data} was mode 0755; made it 0700" in caplog.text
    (data / "later").write_text("x")
    (data / "below").mkdir()
    assert (stat.S_IMODE((data / "later").stat().st_mode), stat.S_IMODE((data / "below").stat().st_mode)) == (
        0o600, 0o700)


def test_start_leaves_a_private_data_directory_alone_and_says_nothing(tmp_path, caplog):
    data = tmp_path / "data"
    data.mkdir(0o700)
    with caplog.at_level(logging.INFO, "grouper.files"):
        file_modes.secure_start(NodeConfig(data_dir=str(data)), environ={})
    assert caplog.text == ""


def test_start_leaves_a_data_directory_it_cannot_reach_to_the_journal_to_name(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    file_modes.secure_start(NodeConfig(data_dir=str(blocker / "data")), environ={})  # NotADirectoryError inside


def test_start_warns_about_a_readable_raft_secret_on_loopback(tmp_path, caplog):
    path = secret(tmp_path / "raft.secret", 0o644)
    with caplog.at_level(logging.WARNING, "grouper.files"):
        file_modes.secure_start(NodeConfig(data_dir=str(tmp_path / "data"), raft_secret_file=path), environ={})
    assert f"secret file {path} (raft_secret_file) is readable or writable by every local user" in caplog.text
    assert f"chmod 600 {path}" in caplog.text


def test_start_refuses_a_readable_key_on_a_secured_node_on_a_non_loopback_host(tmp_path):
    key = secret(tmp_path / "key.pem", 0o644)
    config = NodeConfig(host="0.0.0.0", data_dir=str(tmp_path / "data"), tls_key_file=key, tls_cert_file="cert.pem")
    with pytest.raises(GrouperError, match=f"secret file {key} \\(tls_key_file\\)"):
        file_modes.secure_start(config, environ={"GROUPER_DEFAULT_USER": "admin"})  # its users file comes first
    users = secret(tmp_path / "users.json", 0o640)  # the same with a users file that exists, also too open
    with pytest.raises(GrouperError, match="2 secret file"):
        file_modes.secure_start(NodeConfig(host="0.0.0.0", data_dir=str(tmp_path / "data"), users_file=users,
                                           tls_key_file=key, tls_cert_file="cert.pem"), environ={})
    os.chmod(key, 0o600)
    os.chmod(users, 0o600)
    file_modes.secure_start(config, environ={"GROUPER_DEFAULT_USER": "admin"})


def test_start_lets_an_operator_start_a_secured_node_with_a_readable_secret_when_told_to(tmp_path, caplog):
    path = secret(tmp_path / "raft.secret", 0o644)
    config = NodeConfig(host="0.0.0.0", data_dir=str(tmp_path / "data"), raft_secret_file=path,
                        users_file=secret(tmp_path / "users.json", 0o600), allow_loose_secret_files=True)
    with caplog.at_level(logging.WARNING, "grouper.files"):
        file_modes.secure_start(config, environ={})
    assert f"secret file {path}" in caplog.text
