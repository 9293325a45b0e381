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
- With a raft secret, pysyncobj encrypts and authenticates every message (Fernet: AES-CBC and
  HMAC-SHA256, keyed from the secret) and each end's messages carry the nonce the other end chose
  for the connection, so a message recorded on one connection is refused on another. A stranger
  without the secret is closed on its first message, before pysyncobj unpickles a byte of it;
  without a secret anything reaching the port is unpickled, so a cluster on a shared network needs
  one. `with_secrets` gives several: the first encrypts, every one decrypts (a rotation in steps).
- An incoming connection gets HANDSHAKE_TIMEOUT_S and HANDSHAKE_BYTES_MAX to say who it is, and at
  most HANDSHAKES_MAX wait at once; refusals are logged once per source address and reason,
  remembering at most REFUSALS_REMEMBERED_MAX pairs.
- Runs on pysyncobj's tick thread only, like the rest of the transport.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from cryptography.fernet import InvalidToken, MultiFernet
from pysyncobj.encryptor import getEncryptor
from pysyncobj.transport import TCPTransport

log = logging.getLogger("grouper.handler")

HELLO = "grouper-raft-hello"  # first element of the first message on every raft connection this node dials
REFUSALS_REMEMBERED_MAX = 1000  # (source, reason) pairs already logged; the oldest is forgotten first
EXCERPT_CHARS_MAX = 80  # of a first message that is not a hello, quoted in the warning
HANDSHAKE_TIMEOUT_S = 10.0  # an incoming connection that has not named itself by then is closed
HANDSHAKE_BYTES_MAX = 64 << 10  # buffered from an incoming connection before it named itself (a hello is ~300 B)
TICK_PAUSE_NOTED_MS = 100  # a longer gap between two ticks of this member is remembered for the election log
TICK_PAUSES_KEPT = 64
TICK_PAUSES_WINDOW_S = 10.0  # the election log line reports the tick pauses of this last stretch
HANDSHAKES_MAX = 32  # incoming connections that have not named themselves yet; more are closed at once
# dialled connections a member closes in a row during the key exchange before that is logged: a member
# that is going down may close one or two, one with another secret closes every connectionRetryTime
KEY_EXCHANGES_CLOSED_BEFORE_WARNING = 3
# pysyncobj 0.3.17's TcpConnection keeps these privately; read only to bound unauthenticated connections
_SOCKET_ATTRIBUTE = "_TcpConnection__socket"
_READ_BUFFER_ATTRIBUTE = "_TcpConnection__readBuffer"

UNDECRYPTABLE = ("its message does not decrypt with this node's raft secret: it has another raft_secret_file, or "
                 "none, or it is no Grouper member")
CLOSED_IN_KEY_EXCHANGE = (f"the member closed {KEY_EXCHANGES_CLOSED_BEFORE_WARNING} connections in a row before "
                          f"the key exchange completed: it likely has another raft_secret_file, or none")


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


def raft_encryptor(secrets) -> MultiFernet:
    """pysyncobj's key derivation for each secret (so its `syncobj_admin -password` still works); the
    first secret encrypts, every one decrypts."""
    if not secrets:
        raise ValueError("raft_encryptor needs at least one secret")
    return MultiFernet([getEncryptor(secret) for secret in secrets])


class _Reporting:
    """One incoming connection's encryptor: says so when a message does not authenticate."""

    def __init__(self, encryptor, on_invalid):
        self._encryptor = encryptor
        self._on_invalid = on_invalid

    def encrypt_at_time(self, data, current_time):
        return self._encryptor.encrypt_at_time(data, current_time)

    def extract_timestamp(self, token):
        try:
            return self._encryptor.extract_timestamp(token)  # checks the HMAC: a wrong key fails here
        except InvalidToken:
            self._on_invalid()
            raise  # pysyncobj closes the connection

    def decrypt(self, token):
        return self._encryptor.decrypt(token)


def source_of(conn) -> str:
    """The address an accepted raft connection comes from, for the log."""
    try:
        return str(getattr(conn, _SOCKET_ATTRIBUTE).getpeername()[0])
    except (AttributeError, OSError, IndexError, TypeError):
        return "unknown"


class RaftTransport(TCPTransport):
    """pysyncobj's TCPTransport (camelCase overrides are its names); give it as SyncObj's transportClass,
    or `with_secrets(...)` when SyncObjConf has a password."""

    def __init__(self, syncObj, selfNode, otherNodes, encryptor=None):
        if encryptor is not None and not syncObj.encryptor:
            raise ValueError("an encryptor needs SyncObjConf(password=...): pysyncobj runs the key exchange only then")
        self._encryptor = encryptor or syncObj.encryptor  # None: plaintext
        self._refusals_logged: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._exchanging_keys: set = set()  # outgoing connections between connect and the peer's key
        self._key_exchanges_closed: dict[str, int] = {}  # member -> in a row; members are few
        # why an election started, for its log line: when each member was last heard from, and the
        # recent pauses of this member's own tick loop (a starved member cannot hear its leader)
        self.heard_at_s: dict[str, float] = {}  # member address -> monotonic time of its last message
        self.tick_pauses: deque = deque(maxlen=TICK_PAUSES_KEPT)  # (monotonic end, pause ms), long ones only
        self._last_tick_s: float | None = None
        self.on_member_lost = None  # fn(node), tick thread: a member's connection closed
        super().__init__(syncObj, selfNode, otherNodes)

    @classmethod
    def with_secrets(cls, secrets):
        """A transportClass for SyncObj that encrypts with the first of `secrets` and accepts every one."""
        return functools.partial(cls, encryptor=raft_encryptor(secrets))

    # ---- outgoing ------------------------------------------------------------------------------

    def addNode(self, node):
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None and self._encryptor is not None:
            conn.encryptor = self._encryptor

    def _sendSelfAddress(self, conn):
        if self._selfIsReadonlyNode:
            super()._sendSelfAddress(conn)
            return
        node = self._connToNode(conn)  # an outgoing connection always belongs to the member it dials
        conn.send(hello(self._selfNode.address, node.address if node is not None else ""))

    def _onOutgoingConnected(self, conn):
        if self._encryptor is not None:
            self._exchanging_keys.add(conn)
        super()._onOutgoingConnected(conn)

    def _onOutgoingMessageReceived(self, conn, message):
        self._exchanging_keys.discard(conn)
        node = self._connToNode(conn)
        if node is not None:
            self._key_exchanges_closed.pop(node.address, None)
        super()._onOutgoingMessageReceived(conn, message)

    def _onDisconnected(self, conn):
        if conn in self._exchanging_keys:
            self._exchanging_keys.discard(conn)
            node = self._connToNode(conn)
            member = node.address if node is not None else "?"
            closed = self._key_exchanges_closed[member] = self._key_exchanges_closed.get(member, 0) + 1
            if closed >= KEY_EXCHANGES_CLOSED_BEFORE_WARNING:
                self._log_once("raft connection to %s closed: %s", member, CLOSED_IN_KEY_EXCHANGE)
        super()._onDisconnected(conn)

    # ---- incoming ------------------------------------------------------------------------------

    def _onNewIncomingConnection(self, conn):
        super()._onNewIncomingConnection(conn)
        conn.grouper_source = source_of(conn)
        conn.grouper_accepted_s = time.monotonic()
        if self._encryptor is not None:
            conn.encryptor = _Reporting(self._encryptor, functools.partial(self._refused, conn, UNDECRYPTABLE))
        if len(self._unknownConnections) > HANDSHAKES_MAX:
            self._refuse(conn, f"more than {HANDSHAKES_MAX} raft connections are in their handshake at once")

    def _onIncomingMessageReceived(self, conn, message):
        key_exchange = self._syncObj.encryptor and not conn.sendRandKey
        if key_exchange or isinstance(message, list) or message == "readonly":
            super()._onIncomingMessageReceived(conn, message)
            return
        verdict = judge_hello(message, self._selfNode.address)
        if verdict.refusal:
            self._refuse(conn, verdict.refusal)  # the rest of what the dialer sent is dropped with the connection
            return
        super()._onIncomingMessageReceived(conn, verdict.dialer_address)  # pysyncobj's: unknown dialers are closed

    def _onNodeDisconnected(self, node):
        super()._onNodeDisconnected(node)
        if self.on_member_lost is not None:
            self.on_member_lost(node)

    def _onMessageReceived(self, node, message):
        super()._onMessageReceived(node, message)
        # after pysyncobj took the message in (a leader's commit index with it): the owner's lease counts
        # this contact only once what it committed is applied (raft_status.py leader_contact_age_ms)
        self.heard_at_s[node.address] = time.monotonic()

    def pulse(self, now_s: float) -> str:
        """Why this member may have lost its leader: whom it heard from when, and its own tick pauses."""
        heard = ", ".join(f"{member} {(now_s - at_s) * 1000:.0f} ms ago"
                          for member, at_s in sorted(self.heard_at_s.items()))
        recent = [pause_ms for at_s, pause_ms in self.tick_pauses if now_s - at_s <= TICK_PAUSES_WINDOW_S]
        pauses = (f"its tick loop paused up to {max(recent):.0f} ms ({len(recent)} pauses over "
                  f"{TICK_PAUSE_NOTED_MS} ms) in the last {TICK_PAUSES_WINDOW_S:.0f} s" if recent else
                  f"its tick loop never paused over {TICK_PAUSE_NOTED_MS} ms in the last {TICK_PAUSES_WINDOW_S:.0f} s")
        return f"last heard from: {heard or 'nobody'}; {pauses}"

    def _onTick(self):
        now_s = time.monotonic()
        if self._last_tick_s is not None and (now_s - self._last_tick_s) * 1000 > TICK_PAUSE_NOTED_MS:
            self.tick_pauses.append((now_s, (now_s - self._last_tick_s) * 1000))
        self._last_tick_s = now_s
        super()._onTick()
        if self._unknownConnections:
            self._sweep_handshakes(time.monotonic())

    def _sweep_handshakes(self, now_s: float) -> None:
        for conn in list(self._unknownConnections):
            if now_s - getattr(conn, "grouper_accepted_s", now_s) > HANDSHAKE_TIMEOUT_S:
                self._refuse(conn, f"it did not complete the raft handshake within {HANDSHAKE_TIMEOUT_S:.0f} s")
            elif len(getattr(conn, _READ_BUFFER_ATTRIBUTE, b"")) > HANDSHAKE_BYTES_MAX:
                self._refuse(conn, f"it sent more than {HANDSHAKE_BYTES_MAX} bytes before naming itself")

    def _refuse(self, conn, reason: str) -> None:
        self._refused(conn, reason)
        self._unknownConnections.discard(conn)
        conn.disconnect()

    def _refused(self, conn, reason: str) -> None:
        self._log_once("raft connection refused (from %s): %s", getattr(conn, "grouper_source", "unknown"), reason)

    def _log_once(self, template: str, source: str, reason: str) -> None:
        key = (source, reason)
        if key in self._refusals_logged:
            return
        self._refusals_logged[key] = None
        if len(self._refusals_logged) > REFUSALS_REMEMBERED_MAX:
            self._refusals_logged.popitem(last=False)
        log.warning(template + " (logged once per source and reason)", source, reason)
