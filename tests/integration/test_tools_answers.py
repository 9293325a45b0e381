"""The newcomer tools' answers (issue 25): SCRAM where a node offers it, a port that is not AMQP named,
no queue made by a typo, `queue list` cluster-wide, one naming of consumers with the console."""

from __future__ import annotations

import json

from node.admin.client import AdminClient
from tests.integration.cli import grouper, grouper_ok, write_users_file
from tests.integration.cluster import Cluster
from tests.integration.harness import connect, wait_until
from tests.integration.test_tools import Background, _free_port_block, by_group, messages

PASSWORD = "right-pass-phrase"


def _secured(node_factory, tmp_path, *args: str):
    users = write_users_file(tmp_path / "users.json", {}, {"alice": "administrator"}, PASSWORD)
    return node_factory("", "--users-file", str(users), *args)


# ---- 1: a password over SCRAM-SHA-256 ---------------------------------------------------------------

def test_a_user_logs_in_with_scram_on_a_plain_loopback_port_without_plain_offered(node_factory, tmp_path):
    node = _secured(node_factory, tmp_path)  # no --sasl-plain-on-loopback: the node offers SCRAM-SHA-256 only
    login = ("--user", "alice", "--node", node.amqp_address)
    password = {"GROUPER_PASSWORD": PASSWORD}

    grouper_ok("send", "trades", "--create", "--group", "a", "--count", "2", *login, env=password)
    assert by_group(messages(grouper_ok("browse", "trades", *login, env=password))) == {"a": [1, 2]}
    assert by_group(messages(grouper_ok("receive", "trades", "--count", "2", *login, env=password))) == {"a": [1, 2]}
    perf = grouper("perf", "--messages", "200", "--groups", "4", *login, env=password)  # the lean engine too
    assert perf.returncode == 0 and "lost 0, duplicates 0, order violations 0" in perf.stdout, perf.stderr
    wrong = grouper("perf", "--messages", "10", *login, env={"GROUPER_PASSWORD": "wrong-pass"})
    assert wrong.returncode == 1 and "refused user 'alice' with SCRAM-SHA-256" in wrong.stderr, wrong.stderr


def test_a_wrong_password_and_a_missing_mechanism_say_what_is_wrong(node_factory, tmp_path):
    node = _secured(node_factory, tmp_path)

    wrong = grouper("receive", "trades", "--user", "alice", "--node", node.amqp_address,
                    env={"GROUPER_PASSWORD": "wrong-pass"})
    anonymous = grouper("receive", "trades", "--node", node.amqp_address)

    assert wrong.returncode == 1 and "refused user 'alice' with SCRAM-SHA-256" in wrong.stderr, wrong.stderr
    assert anonymous.returncode == 1, anonymous.stderr
    assert "does not let anonymous clients in (it offers SCRAM-SHA-256)" in anonymous.stderr
    assert "--allow-anonymous" in anonymous.stderr
    assert wrong.stderr.count("\n") == anonymous.stderr.count("\n") == 1


def test_a_user_given_to_an_open_node_is_told_the_node_has_no_users(node):
    result = grouper("send", "q", "--group", "g", "--user", "alice", "--node", node.amqp_address,
                     env={"GROUPER_PASSWORD": PASSWORD})
    assert result.returncode == 1 and "offers ANONYMOUS only" in result.stderr and "leave out --user" in \
        result.stderr, result.stderr


# ---- 2: a port that is not AMQP --------------------------------------------------------------------

def test_the_admin_and_http_ports_are_named_as_not_amqp_with_the_amqp_port_beside_them(node_factory):
    port = _free_port_block()
    node = node_factory("", "--amqp-port", str(port), "--admin-port", str(port + 1), "--http-port", str(port + 3))

    result = grouper("send", "q", "--group", "g", "--node", node.admin_address)
    http = grouper("receive", "q", "--node", node.http_address)

    assert result.returncode == 1
    assert result.stderr == (f"grouper send: {node.admin_address} is not an AMQP port (it answered like an HTTP/2 "
                             f"server (a node's gRPC admin port)); the AMQP port is {node.amqp_address}: give "
                             f"--node {node.amqp_address}\n")
    assert http.returncode == 1
    assert f"{node.http_address} is not an AMQP port (it answered like a server silent for 5 s" in http.stderr
    assert f"the AMQP port is {node.amqp_address}" in http.stderr and http.stderr.count("\n") == 1


def test_a_not_amqp_port_without_an_amqp_neighbour_names_no_port_and_dumps_no_bytes(node):
    result = grouper("receive", "q", "--node", node.admin_address)  # the harness's ports are not side by side
    assert result.returncode == 1
    assert f"{node.admin_address} is not an AMQP port (it answered like an HTTP/2 server" in result.stderr
    assert "--node" in result.stderr and "\\x" not in result.stderr and result.stderr.count("\n") == 1


# ---- 4: a typo makes no queue ------------------------------------------------------------------------

def test_a_typo_is_refused_with_the_close_names_and_makes_no_queue(node):
    grouper_ok("send", "trades", "--create", "--group", "a", "--node", node.amqp_address)

    for argv in (("receive", "tradse"), ("browse", "tradse"), ("send", "tradse", "--group", "a")):
        result = grouper(*argv, "--node", node.amqp_address)
        assert result.returncode == 1, result
        assert result.stderr.startswith(f"grouper {argv[0]}: no queue 'tradse' (did you mean 'trades'?) at "
                                        f"{node.amqp_address}"), result.stderr
        assert "--create" in result.stderr and result.stderr.count("\n") == 1
    listed = json.loads(grouper_ok("queue", "list", "--json", "--node", node.admin_address))
    assert [queue["name"] for queue in listed] == ["trades"]


def test_other_clients_still_get_queues_made_on_first_use(node):
    connection = connect(node)
    try:
        connection.create_receiver("made-by-proton")
    finally:
        connection.close()
    listed = json.loads(grouper_ok("queue", "list", "--json", "--node", node.admin_address))
    assert "made-by-proton" in [queue["name"] for queue in listed]


# ---- 7: one naming of consumers ------------------------------------------------------------------------

def test_receive_and_groups_name_a_consumer_as_the_console_does(node):
    grouper_ok("send", "trades", "--create", "--group", "a", "--count", "2", "--node", node.amqp_address)
    holder = Background("receive", "trades", "--count", "1", "--hold", "--node", node.amqp_address)
    try:
        holder.wait_for("holding 1 message(s)")
        printed = messages("\n".join(holder.lines))[0]["consumer"]
        with AdminClient(node.admin_address) as client:
            page = client.group_page("trades")  # what the console's Consumers view shows
        assert [consumer["label"] for consumer in page["consumers"]] == [printed]
        rows = json.loads(grouper_ok("groups", "trades", "--json", "--node", node.admin_address))
        assert [(row["group"], row["consumer"], row["label"]) for row in rows] == \
            [("a", page["consumers"][0]["consumer"], printed)]
        assert printed in grouper_ok("groups", "trades", "--node", node.admin_address)
    finally:
        holder.stop()


# ---- 3: `queue list` in a cluster --------------------------------------------------------------------

def test_queue_list_in_a_cluster_sums_every_node_and_names_one_that_does_not_answer(tmp_path):
    cluster = Cluster(tmp_path).start()
    try:
        first, second, _ = cluster.nodes
        grouper_ok("send", "trades", "--create", "--group", "a", "--count", "3", "--node", second.amqp_address)
        wait_until(lambda: "trades" in grouper_ok("queue", "list", "--node", first.admin_address),
                   "the queue's definition to reach node0")

        listed = grouper_ok("queue", "list", "--node", first.admin_address)
        row = next(line for line in listed.splitlines() if line.startswith("trades "))
        assert row.split()[1] == "3", listed  # the depth, summed: node0 itself holds none of it
        assert f"{cluster.node_ids[1]}=3" in row and f"{cluster.node_ids[0]}=0" in row, listed
        assert "cluster-wide: 3 of 3 nodes answered" in listed, listed
        as_json = json.loads(grouper_ok("queue", "list", "--json", "--node", first.admin_address))
        assert as_json[0]["depth_messages"] == 3 and as_json[0]["nodes"][cluster.node_ids[1]]["depth_messages"] == 3

        second.kill()
        partial = grouper("queue", "list", "--node", first.admin_address)
        assert partial.returncode == 1, partial
        assert "cluster-wide: 2 of 3 nodes answered" in partial.stdout and f"{cluster.node_ids[1]} did not" in \
            partial.stdout, partial.stdout
        assert f"not listed: the queues of {cluster.node_ids[1]}" in partial.stderr, partial.stderr
    finally:
        cluster.kill_all()


def test_queue_list_of_a_single_node_names_it(node):
    listed = grouper_ok("queue", "list", "--node", node.admin_address)
    assert listed.splitlines()[-1] == f"(a single node, at {node.admin_address})"



def test_queue_list_for_a_user_who_may_not_see_the_cluster_names_the_node_it_lists(node_factory, tmp_path):
    users = write_users_file(tmp_path / "users.json", {"watcher": "browse:trades"},
                             {"alice": "administrator", "wally": "watcher"}, PASSWORD)
    node = node_factory("", "--users-file", str(users))
    password = {"GROUPER_PASSWORD": PASSWORD}
    grouper_ok("send", "trades", "--create", "--group", "a", "--user", "alice", "--node", node.amqp_address,
               env=password)

    listed = grouper_ok("queue", "list", "--user", "wally", "--node", node.admin_address, env=password)

    assert listed.splitlines()[1].startswith("trades ")
    assert listed.splitlines()[-1] == (f"(the queues of the node at {node.admin_address} only: listing its peers' "
                                       f"too takes `manage` on '#')")
