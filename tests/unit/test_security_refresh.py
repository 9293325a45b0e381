"""A node's security policy follows its users file: one added beside an open node secures it."""

from __future__ import annotations

import logging

from node.config import NodeConfig
from node.security import ANONYMOUS, SCRAM, Security
from node.users import UserDatabase


def test_an_open_node_turns_secured_when_its_users_file_appears_and_says_so(tmp_path, caplog):
    users_file = tmp_path / "users.json"
    config = NodeConfig(data_dir=str(tmp_path / "node0"), users_file=str(users_file))
    security = Security.from_config(config, environ={})
    assert security.open and security.mechanisms(False, "127.0.0.1", None) == (ANONYMOUS,)
    assert security.refresh() is False  # still no file: nothing changes, nothing is logged
    database = UserDatabase()
    database.add_user("alice", "alice-password", ("administrator",), iterations=4096)
    database.save(str(users_file))
    with caplog.at_level(logging.INFO, logger="grouper.security"):
        assert security.refresh() is True
    assert not security.open and security.mechanisms(False, "127.0.0.1", None) == (SCRAM,)
    assert security.verify_plain("alice", "alice-password")
    assert [record.getMessage() for record in caplog.records] == [
        f"{users_file} appeared: this node is now secured (1 users); new connections must log in"]
