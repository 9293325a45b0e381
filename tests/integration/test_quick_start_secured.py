"""The README's "Quick start, then secure it", command for command, against a real `grouper up`.

On free ports instead of 5672..., and the password piped (--password-stdin, $GROUPER_PASSWORD) where
the README's user types it at a prompt.
"""

from __future__ import annotations

import time

from tests.integration.cli import grouper
from tests.integration.grouper_up import GrouperUp
from tests.integration.harness import REPO

SECURED_WAIT_S = 10.0  # a node reads its users file again within about a second of a change
PASSWORD = "quick-start-admin-password"


def wait_all_secured(up: GrouperUp) -> None:
    deadline = time.monotonic() + SECURED_WAIT_S
    logs = [up.data_dir / f"node{index}.log" for index in range(up.nodes)]
    while time.monotonic() < deadline:
        if all("appeared: this node is now secured" in log.read_text() for log in logs):
            return
        time.sleep(0.1)
    raise AssertionError("not every node of grouper up logged that it is secured: "
                         + "; ".join(log.read_text()[-500:] for log in logs))


def test_the_quick_start_cluster_is_secured_by_adding_a_user_to_its_data_dir(tmp_path):
    data_dir = tmp_path / "data" / "cluster"
    up = GrouperUp(data_dir, args=("--config", str(REPO / "examples" / "grouper.toml"))).start()
    try:
        assert f"node0 security: open: no user database at {data_dir / 'users.json'}, every client is anonymous " \
               f"and may do everything" in up.lines
        amqp, admin = ("--node", up.amqp(0)), ("--node", up.admin(0))
        # step 1: one administrator in the file every node of the cluster reads
        added = grouper("user", "add", "admin", "--role", "administrator", "--password-stdin", "--data-dir",
                        str(data_dir), stdin=PASSWORD + "\n")
        assert added.returncode == 0, added.stderr
        assert f"in {data_dir / 'users.json'}; the nodes of `grouper up --data-dir {data_dir}` read it" in added.stdout
        wait_all_secured(up)
        # anonymous clients are refused now, on AMQP and on the admin port
        anonymous = grouper("send", "trades", "--group", "AAPL", "--count", "1", *amqp)
        assert anonymous.returncode == 1, anonymous.stdout + anonymous.stderr
        refused = grouper("queue", "list", *admin)
        assert refused.returncode != 0 and "--password-stdin, $GROUPER_PASSWORD or the prompt" in refused.stderr
        # step 2: the newcomer tools with the administrator's credentials
        credentials = {"GROUPER_PASSWORD": PASSWORD}
        sent = grouper("send", "trades", "--create", "--group", "AAPL", "--group", "MSFT", "--count", "4",
                       "--user", "admin", *amqp, env=credentials)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert f"4 message(s) accepted by {up.amqp(0)} into trades" in sent.stdout
        received = grouper("receive", "trades", "--user", "admin", *amqp, env=credentials)
        assert received.returncode == 0, received.stdout + received.stderr
        assert "4 message(s) received and accepted" in received.stdout
        # step 3: the management commands alike
        listed = grouper("queue", "list", "--user", "admin", *admin, env=credentials)
        assert listed.returncode == 0, listed.stderr
        assert "orders" in listed.stdout and "trades" in listed.stdout
    finally:
        up.kill_tree()
