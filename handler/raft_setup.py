"""Raft setup: how this member's pysyncobj is configured and started.

Owns the pysyncobj configuration of a raft member (timeouts, files, snapshots, the transport) and the
two changes made to pysyncobj's private parts when it starts, each with its reason below. The leader
walks a diverged follower's log back by handler/raft_catch_up.py's rule (pysyncobj's own could send it
forward again at every tick and leave it behind for good). Raft connections go through
handler/raft_transport.py: the dialer names the member it meant to reach, and a node closes a
connection meant for another (a stale address, an IP reused after a restart), so the dialer redials
and resolves the name again. With `raft_secrets` every raft connection is encrypted and authenticated
with them (pysyncobj's password; see the transport). Runs once, on the thread that builds the member.
"""

from __future__ import annotations

import os

from pysyncobj import SyncObjConf

from handler.member_memory import RAFT_DUMP_FILE, RAFT_JOURNAL_FILE
from handler.raft_catch_up import CatchUpSyncObj
from handler.raft_transport import RaftTransport
from node.core.cluster.owner_lease import leader_fallback_ms

CONNECTION_RETRY_S = 0.2  # reconnect to a restarted member fast
DNS_CACHE_S = 1.0  # names are resolved again on each reconnect after this long (see raft_conf)
APPEND_ENTRIES_PERIOD_MAX_S = 0.05  # heartbeats at least this often, and 4 per shortest election timeout


def raft_conf(raft_dir: str, node_id: str, leader_watch, *, election_timeout_ms: tuple[int, int],
              bind_host: str, raft_secrets: tuple[str, ...]) -> SyncObjConf:
    election_timeout_min_ms, election_timeout_max_ms = election_timeout_ms
    return SyncObjConf(
        appendEntriesUseBatch=False,  # a follower's proposal waits ~200 ms for a batch otherwise
        raftMinTimeout=election_timeout_min_ms / 1000,
        raftMaxTimeout=election_timeout_max_ms / 1000,
        appendEntriesPeriod=min(APPEND_ENTRIES_PERIOD_MAX_S, election_timeout_min_ms / 4000),
        connectionRetryTime=CONNECTION_RETRY_S,
        # a leader cut off from its majority steps down this soon (pysyncobj's default: 30 s), so its heartbeats
        # stop renewing a cut-off owner's lease (node/core/cluster/owner_lease.py, issue 28)
        leaderFallbackTimeout=leader_fallback_ms(election_timeout_max_ms) / 1000,
        # a restarted pod comes back with a new IP (pysyncobj's default 600 s kept dialling the old one
        # for minutes), and a peer starting a moment after this one must not be written off for 30 s. A
        # pod that took the old IP closes the connection (RaftTransport), so the dialer does reconnect
        dnsCacheTime=DNS_CACHE_S,
        dnsFailCacheTime=DNS_CACHE_S,
        journalFile=os.path.join(raft_dir, RAFT_JOURNAL_FILE),
        fullDumpFile=os.path.join(raft_dir, RAFT_DUMP_FILE),
        # A snapshot is pickled and gzipped (level 9) in a forked child. In this thread it stopped the
        # heartbeats for as long as that takes: 3 s and more with a million routes (12 s measured at
        # load average 17 on the 2-core machine, bench/route_memory.py's state), far past the election
        # timeout, and the pickler's memo raised the member's resident set by ~70 MB. The member
        # process runs only raft and its channel (the node, with gRPC and proton, never forks); the
        # child only writes the dump and exits, at low priority (handler/member_priority.py: SNAPSHOT_CHILD_NICE)
        useFork=True,
        dynamicMembershipChange=True,
        onReady=leader_watch.ready,
        onStateChanged=leader_watch.state_changed,
        bindAddress=f"{bind_host}:{node_id.rsplit(':', 1)[1]}" if bind_host else None,
        # turns on pysyncobj's key exchange; the transport encrypts with every secret given
        password=raft_secrets[0] if raft_secrets else None,
    )


def start_raft(node_id: str, partners: list[str], raft_dir: str, replica, leader_watch, *,
               election_timeout_ms: tuple[int, int], bind_host: str, raft_secrets: tuple[str, ...]):
    """This member's pysyncobj, started (its tick thread runs), with `replica` its consumer."""
    conf = raft_conf(raft_dir, node_id, leader_watch, election_timeout_ms=election_timeout_ms,
                     bind_host=bind_host, raft_secrets=raft_secrets)
    syncobj = CatchUpSyncObj(node_id, list(partners), conf=conf, consumers=[replica],
                             transportClass=RaftTransport.with_secrets(raft_secrets) if raft_secrets
                             else RaftTransport)
    leader_watch.syncobj = syncobj
    syncobj._SyncObj__transport.on_member_lost = leader_watch.member_lost  # pysyncobj keeps it private
    syncobj.addOnTickCallback(leader_watch.note_leader)
    # pysyncobj rewrites its meta file once a second just to keep the commit index, which raft keeps
    # in memory only (a restarted member learns it from the leader's next heartbeat): the write
    # replaces the file by a rename, and ext4 makes a rename over a file wait for the new file's
    # data to reach the disk, so under the node's journal load it stalled this tick thread for
    # 100+ ms at a time (0.43 s of one 10 s profile) and heartbeats with it. The term and vote are
    # still written at once on every change, as raft requires.
    syncobj._SyncObj__raftLog.onOneSecondTimer = lambda: None
    return syncobj
