"""Raft connections that name both ends: pysyncobj's TCP transport with a handshake the acceptor checks.

pysyncobj's handshake names only the dialer: of two members, the one with the greater address dials
and sends its own address first. A dialer whose address for a member is stale (a restarted pod's old
IP, now another pod's; a cached DNS answer) reached whichever node listens there, which took the
connection as the dialer's; the dialer took the answers for the member it meant and never redialled.
Here the dialer's first message also names the member it meant to reach, and the acceptor closes a
connection not meant for it, with a warning naming both; the dialer sees the connection drop and
redials every `connectionRetryTime`, resolving the name again once its `dnsCacheTime` has passed.

Rules:
- `judge_hello` is the whole decision and is pure: the first message and this node's address in,
  accept or refuse (with the reason) out. The transport only carries it out.
- Every member runs this handshake. A dialer that sends pysyncobj's bare address (an older Grouper,
  another pysyncobj application) is refused, with a warning; an older Grouper refuses this one's
  hello. So a cluster moves to this version all at once, not member by member.
- pysyncobj's utility connections (a list first: `syncobj_admin`) and read-only members ('readonly'
  first) go to pysyncobj unchanged. Grouper opens neither.
- Runs on pysyncobj's tick thread only, like the rest of the transport.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pysyncobj.transport import TCPTransport

log = logging.getLogger("grouper.handler")

HELLO = "grouper-raft-hello"  # first element of the first message on every raft connection this node dials
REFUSAL_LOG_INTERVAL_S = 10.0  # one warning per refusal reason this often: a refused dialer redials every 0.2 s
REFUSALS_TRACKED_MAX = 64  # refusal reasons remembered for that; the memory is cleared when full
EXCERPT_CHARS_MAX = 80  # of a first message that is not a hello, quoted in the warning


def hello(dialer_address: str, meant_for_address: str) -> tuple:
    """The dialer's first message: who dials, and which member it meant to reach."""
    return (HELLO, dialer_address, meant_for_address)


@dataclass(frozen=True)
class HelloVerdict:
    dialer_address: str  # the member that dialled, as it names itself; "" when the message does not say
    refusal: str = ""  # why the connection is closed, for the log; "" when it is meant for this node


def judge_hello(message, self_address: str) -> HelloVerdict:
    """Is this connection, whose first message is `message`, meant for the node at `self_address`?"""
    if not (isinstance(message, tuple) and len(message) == 3 and message[0] == HELLO
            and isinstance(message[1], str) and isinstance(message[2], str)):
        return HelloVerdict("", f"the dialer's first message, {repr(message)[:EXCERPT_CHARS_MAX]}, is not a "
                                f"Grouper raft hello naming both ends; closing the connection: the dialer runs "
                                f"an older Grouper or is no Grouper at all (every member must run this version)")
    _, dialer_address, meant_for_address = message
    if meant_for_address != self_address:
        return HelloVerdict(dialer_address, (
            f"member {dialer_address} dialled {meant_for_address} but reached this node, {self_address}: its "
            f"address for {meant_for_address} is stale (an IP reused after a restart, or a cached DNS answer); "
            f"closing the connection, so {dialer_address} redials and resolves {meant_for_address} again"))
    return HelloVerdict(dialer_address)


class RaftTransport(TCPTransport):
    """pysyncobj's TCPTransport (camelCase overrides are its names); give it as SyncObj's transportClass."""

    def __init__(self, syncObj, selfNode, otherNodes):
        # refusal reason -> (monotonic time of its last warning in s, refusals since then)
        self._refusals_logged: dict[str, tuple[float, int]] = {}
        super().__init__(syncObj, selfNode, otherNodes)

    def _sendSelfAddress(self, conn):
        if self._selfIsReadonlyNode:
            super()._sendSelfAddress(conn)
            return
        node = self._connToNode(conn)  # an outgoing connection always belongs to the member it dials
        conn.send(hello(self._selfNode.address, node.address if node is not None else ""))

    def _onIncomingMessageReceived(self, conn, message):
        key_exchange = self._syncObj.encryptor and not conn.sendRandKey
        if key_exchange or isinstance(message, list) or message == "readonly":
            super()._onIncomingMessageReceived(conn, message)
            return
        verdict = judge_hello(message, self._selfNode.address)
        if verdict.refusal:
            self._warn_refused(verdict.refusal)
            conn.disconnect()  # the rest of what the dialer sent is dropped with the connection
            self._unknownConnections.discard(conn)
            return
        super()._onIncomingMessageReceived(conn, verdict.dialer_address)  # pysyncobj's: unknown dialers are closed

    def _warn_refused(self, reason: str) -> None:
        now_s = time.monotonic()
        logged_s, since = self._refusals_logged.get(reason, (None, 0))
        if logged_s is not None and now_s - logged_s < REFUSAL_LOG_INTERVAL_S:
            self._refusals_logged[reason] = (logged_s, since + 1)
            return
        if len(self._refusals_logged) >= REFUSALS_TRACKED_MAX:
            self._refusals_logged.clear()
        self._refusals_logged[reason] = (now_s, 0)
        repeated = f" ({since} more refused alike in the last {now_s - logged_s:.0f} s)" if since else ""
        log.warning("raft connection refused: %s%s", reason, repeated)
