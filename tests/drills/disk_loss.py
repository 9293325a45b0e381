"""The disk-loss fault of the nemesis campaign (issue 28): a node loses its whole data directory and rejoins empty.

What `DiskLoss` does to node `victim` of a tests.integration.cluster.Cluster:
1. `lose(victim)`: kill -9 (the node, then its raft member), then delete everything in its data directory:
   journal, raft state, replica journals. The directory itself stays, empty: in a campaign with disk rounds it
   is a tmpfs mount point.
2. `rejoin(victim)`, after the hold: start it empty through the safe-rejoin path that exists today
   (node/membership.py; README "Cluster"; tests/integration/test_rejoin.py): as a NEW member, with --join.
   Never as a founding member with an empty raft log under its old identity, which could vote twice in a term.
3. `remove_old(...)`, once the round's clients are back at it: `grouper cluster remove-node OLD-ID` through a
   live member. The old identity's routes are dropped, and its groups placed afresh.

Why a new identity, and why join before remove: on one machine every node runs on 127.0.0.1 with ports of its
own, and --join asks a member "at the member's host and this node's own admin port". So, as test_rejoin does,
the reborn node takes a loopback host of its own (127.0.0.N, a fresh one each time) and a live member's admin
port number; its raft address, its identity, changes with the host. (Production nodes have hosts of their own
and keep their identity: there the README's order, remove then join, applies.) Joining first keeps the
reborn member, where the round's consumers come back, in the cluster when the dead identity's routes are
dropped: removed first, with every consumer of the busy groups at the dead node, those groups would be placed
where they were sent, where no consumer is, and wait for ever.

The identity check (membership.refuse_lost_identity) does not ask members on the node's own host, so in this
one-machine cluster a plain restart on the empty directory would NOT be refused: it would run an empty raft
log under the old identity. This module never does that; a production node on its own host is refused.

Rules: every wait is bounded (the harness's start timeout, the management CLI's timeout); nothing here judges
a round (tests/drills/nemesis.py does, like every other round).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.integration.cluster import Cluster, free_ports

LOOPBACK_PREFIX = "127.0.0."
FIRST_REBORN_HOST = 2  # 127.0.0.1 is the founding members' host; reborn nodes take .2, .3, ...
REPLACED_FLAGS = ("--host", "--raft-port", "--peers", "--join")  # the flags a rebirth sets anew (each but --join takes a value)


def wipe(data_dir: Path) -> int:
    """Delete everything inside `data_dir`, keeping the (now empty) directory; returns the bytes deleted."""
    deleted = 0
    for entry in sorted(Path(data_dir).iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            deleted += sum(path.stat().st_size for path in entry.rglob("*") if path.is_file())
            shutil.rmtree(entry)
        else:
            deleted += entry.stat().st_size
            entry.unlink()
    return deleted


def rebirth_args(args: tuple, host: str, raft_port: int, member: str) -> tuple:
    """A node's command-line arguments with its host, raft port and peers replaced: a new member that joins
    through `member` (a raft address). Every other flag is kept as it was."""
    kept: list[str] = []
    skip = False
    for word in args:
        if skip:
            skip = False
            continue
        if word in REPLACED_FLAGS:
            skip = word != "--join"
            continue
        kept.append(word)
    return ("--host", host, "--raft-port", str(raft_port), "--peers", member, "--join", *kept)


class DiskLoss:
    """Disk losses in one cluster; remembers which loopback hosts its reborn nodes took."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.rebirths = 0

    def lose(self, victim: int) -> int:
        """kill -9 node `victim` and delete its data; returns the bytes deleted."""
        node = self.cluster.nodes[victim]
        node.kill()  # returns once its raft member is gone too
        return wipe(node.data_dir)

    def rejoin(self, victim: int, member: int) -> str:
        """Start node `victim` again, empty, as a new member that joins through node `member` (a live one);
        returns its new node id. The cluster's `node_ids` and `raft_ports` name it from then on."""
        cluster = self.cluster
        node, helper = cluster.nodes[victim], cluster.nodes[member]
        host = f"{LOOPBACK_PREFIX}{FIRST_REBORN_HOST + self.rebirths}"
        self.rebirths += 1
        [raft_port] = free_ports(1)
        node.args = rebirth_args(node.args, host, raft_port, cluster.node_ids[member])
        # --join asks the member at its host and THIS node's admin port: take the member's port number
        node._admin_port = int(helper.admin_address.rsplit(":", 1)[1])
        # named before it starts: if the start fails, whoever restarts it later starts this new member
        cluster.node_ids[victim] = f"{host}:{raft_port}"
        cluster.raft_ports[victim] = raft_port
        node.start()  # joins before it reports ready (node/membership.py): raises if it could not
        return cluster.node_ids[victim]

    def remove_old(self, old_id: str, via: int) -> str:
        """`grouper cluster remove-node old_id` through node `via`; returns what the CLI said."""
        result = self.cluster.nodes[via].cli("cluster", "remove-node", old_id)
        if result.returncode:
            raise AssertionError(f"remove-node {old_id} through {self.cluster.node_ids[via]} failed "
                                 f"({result.returncode}): {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout.strip()
