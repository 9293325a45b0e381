"""A member that comes back with an empty raft state under the identity the cluster knows.

What is promised (node/membership.py): a node whose raft dir holds nothing (a replaced volume)
asks the other members before its raft member starts; if one knows it as a member that ran before,
it refuses to start, exit status 1, naming the situation and the steps (`grouper cluster
remove-node`, then `--join`). With those steps it becomes a new member and serves. It never runs a
raft member with an empty log under its old identity, which could vote twice in one term.
"""

from __future__ import annotations

import shutil

from tests.integration.cluster import free_ports
from tests.integration.harness import NodeProcess
from tests.integration.test_clustered_groups import QUEUE, bodies
from tests.integration.harness import grouped


def test_a_member_back_on_an_empty_volume_refuses_to_start_until_removed_and_joined_anew(cluster, clients, tmp_path):
    # --join and this check ask a member at the member's host and this node's admin port: on one
    # machine, the node takes another loopback address and node 0's admin port number
    admin_address = cluster.nodes[0].admin_address
    [port] = free_ports(1)
    node_id = f"127.0.0.2:{port}"
    node = NodeProcess(tmp_path / "member", "", ("--host", "127.0.0.2", "--raft-port", str(port),
                                                "--peers", cluster.node_ids[0], "--join"))
    node._admin_port = int(admin_address.rsplit(":", 1)[1])
    try:
        node.start()
        cluster.wait_for(lambda s: node_id in [m["node"] for m in s["members"] if m["amqp_address"]
                                               and m["raft_member"]], "the member registered")
        node.kill()
        shutil.rmtree(node.data_dir)  # the volume is replaced: journal and raft state are gone
        node.data_dir.mkdir()
        seen = len(node.output)
        try:
            node.start()
        except RuntimeError:
            pass  # the harness's way of saying the node exited before it was ready
        else:
            raise AssertionError("the node started with an empty raft state under its old identity:\n"
                                 + "\n".join(node.output[seen:]))
        assert node.process.returncode == 1
        said = "\n".join(node.output[seen:])
        assert "raft state is missing" in said and f"grouper cluster remove-node {node_id}" in said, said
        assert not (node.data_dir / "raft" / "raft.journal").exists()  # no raft member ever ran

        removed = cluster.nodes[0].cli("cluster", "remove-node", node_id)
        assert removed.returncode == 0, removed.stderr
        node.start()  # a new member now, through the join path
        assert any("joined the cluster" in line for line in node.output[seen:]), node.output[seen:]
        cluster.wait_for(lambda s: node_id in [m["node"] for m in s["members"] if m["raft_member"]],
                         "the member added again")
        consumer = clients.consumer(node, QUEUE, "back")
        cluster.wait_for(lambda s: {m["node"]: m["consumers"] for m in s["members"]}[node_id].get(QUEUE) == 1,
                         "its consumer known")
        clients.send(cluster.nodes[1], QUEUE, [grouped(f"g:{n}", "g") for n in range(3)])
        assert bodies(consumer.fetch_many(3)) == ["g:0", "g:1", "g:2"]
    finally:
        node.kill()
