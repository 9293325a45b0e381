"""The server side of the AMQP 1.0 SASL exchange (part 5.3), served before any byte reaches proton.

Rules:
- Pure: bytes in, bytes out. No sockets, threads or clocks; time arrives as `now_ms`. The adapter
  writes `SaslStep.output`, and once the state is "authenticated" hands `rest` (the client's AMQP
  header and whatever followed it) to a proton transport that has no SASL layer.
- Nothing is buffered but one partial frame, and a frame announced over `frame_max_bytes` fails the
  exchange as soon as its 4 size bytes arrive. While a deferred PLAIN check runs (`defer_plain`),
  what arrives is kept for proton; the adapter stops reading meanwhile, so that is one read at most.
- Decoding reads only inside the current frame and fails only with SaslError; the exchange then ends
  with a sasl-outcome (code 1 for the client's credentials or mechanism, 2 for broken protocol or
  a failing authenticator, 4 for a timeout or a node too busy to check) and every later byte is
  ignored.
- Failure reasons go to the node's log: they name the user, never a password or a raw response.
- SCRAM-SHA-256 is node/amqp/sasl_scram.py's (scramp, and the decoy an unknown user meets); PLAIN,
  EXTERNAL and ANONYMOUS are short enough to live here.
- Credentials are checked only after the adapter's `held` hook, given the claimed user, let them:
  a held attempt is refused unchecked (PLAIN before any key derivation, SCRAM-SHA-256 before the
  proof). With `defer_plain` the PLAIN check itself is the adapter's: the step carries `check`
  (user, password), and the adapter answers with `checked` once it has verified them, on its own
  time and thread; this object is still touched by one thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from node.amqp.sasl_frames import (CHALLENGE, INIT, MECHANISMS, OUTCOME, OUTCOME_AUTH, OUTCOME_OK, OUTCOME_SYS,
                                   OUTCOME_SYS_TEMP, PERFORMATIVE_BY_NAME, RESPONSE, Fields, SaslError, binary,
                                   decode_performative, frame, next_frame, performative, shown, symbol_array, text,
                                   ubyte)
from node.amqp.sasl_scram import ScramExchange

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
SUPPORTED_MECHANISMS = ("ANONYMOUS", "PLAIN", "SCRAM-SHA-256", "EXTERNAL")
ANONYMOUS_IDENTITY = "anonymous"


class Authenticator(Protocol):
    def verify_plain(self, user: str, password: str) -> bool: ...

    def scram_auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int] | None: ...  # None: unknown

    # optional: what an unknown user is told, shaped as a real user's auth info and the same every time
    def scram_decoy(self, user: str) -> tuple[bytes, bytes, bytes, int] | None: ...


@dataclass(frozen=True)
class SaslStep:
    output: bytes  # write to the socket (after a failure: then close it)
    state: str  # "pending", "authenticated" or "failed"
    identity: str | None = None  # the authenticated user, or "anonymous"
    mechanism: str | None = None  # None when a plain AMQP header was let through
    rest: bytes = b""  # authenticated only: the bytes for proton, from the client's AMQP header on
    failure: str | None = None  # failed only: why, for the node's log
    fault: str | None = None  # failed only: "client" or "node"
    user: str | None = None  # the user name the client claimed, if it got that far (failed or authenticated)
    check: tuple[str, str] | None = None  # pending, with defer_plain: (user, password) for the adapter to verify
    held: bool = False  # failed only: refused unchecked because the `held` hook held the attempt


class SaslServer:
    def __init__(self, mechanisms: tuple[str, ...], authenticator: Authenticator | None, *,
                 started_ms: int, exchange_timeout_ms: int, frame_max_bytes: int = 4096,
                 allow_plain_amqp: bool = False, external_identity: str | None = None,
                 scram_server_nonce: str | None = None, decoy_key: bytes | None = None,
                 held: Callable[[str], str | None] | None = None, defer_plain: bool = False):
        unknown = [name for name in mechanisms if name not in SUPPORTED_MECHANISMS]
        if unknown:
            raise ValueError(f"SASL mechanisms {unknown} are not supported; use some of {SUPPORTED_MECHANISMS}")
        self.offered = tuple(name for name in mechanisms if name != "EXTERNAL" or external_identity is not None)
        self.authenticator = authenticator
        self.started_ms = started_ms
        self.exchange_timeout_ms = exchange_timeout_ms
        self.frame_max_bytes = frame_max_bytes
        self.allow_plain_amqp = allow_plain_amqp
        self.external_identity = external_identity
        self.scram_server_nonce = scram_server_nonce  # tests fix it; None draws a random one
        self.decoy_key = decoy_key  # for an authenticator without scram_decoy (node/amqp/sasl_scram.py)
        self.held = held  # the claimed user -> why attempts for it are held now, or None
        self.defer_plain = defer_plain
        self.phase = "header"  # header -> init [-> response | checking] -> authenticated | failed
        self.mechanism: str | None = None
        self.identity: str | None = None
        self.failure: str | None = None
        self.fault: str | None = None
        self.user: str | None = None  # claimed
        self._held = False
        self._check: tuple[str, str] | None = None  # the deferred PLAIN check, until `checked`
        self._buffer = bytearray()
        self._scram: ScramExchange | None = None

    # ---- the adapter's calls -----------------------------------------------------------------

    def received(self, data: bytes, now_ms: int) -> SaslStep:
        if self.phase == "authenticated":
            return self._step(b"", rest=bytes(data))
        if self.phase == "failed":
            return self._step(b"")
        output: list[bytes] = []
        if self.phase == "checking" and not self.expired(now_ms):
            self._buffer += data
            return SaslStep(b"", "pending")  # the check was handed out once, with the step that asked for it
        if self.expired(now_ms):
            self._fail(SaslError(OUTCOME_SYS_TEMP, f"the client did not finish the SASL exchange within "
                                                   f"{self.exchange_timeout_ms} ms (exchange_timeout_ms)"), output)
            return self._step(b"".join(output))
        self._buffer += data
        position = 0
        try:
            while self.phase in ("header", "init", "response"):
                consumed = self._read_header(output) if self.phase == "header" else self._read_frame(position, output)
                if consumed == 0:
                    break
                position += consumed
        except SaslError as error:
            self._fail(error, output)
        rest = b""
        if self.phase == "authenticated":
            rest = bytes(self._buffer[position:])
            self._buffer.clear()
        elif self.phase == "failed":
            self._buffer.clear()
        else:
            del self._buffer[:position]
        return self._step(b"".join(output), rest=rest)

    def checked(self, verified: bool | BaseException) -> SaslStep:
        """The adapter's answer to a step's `check`: whether the password is right, or the exception
        its check raised (the node's fault)."""
        if self.phase != "checking":  # failed meanwhile (expired): nothing more to say
            return self._step(b"")
        user, _ = self._check
        self._check = None
        output: list[bytes] = []
        try:
            self._plain_outcome(user, verified, output)
        except SaslError as error:
            self._fail(error, output)
        rest = bytes(self._buffer) if self.phase == "authenticated" else b""
        self._buffer.clear()
        return self._step(b"".join(output), rest=rest)

    def check_refused(self, reason: str) -> SaslStep:
        """The adapter could not run a step's `check` (too busy): a temporary failure, not the client's."""
        if self.phase != "checking":
            return self._step(b"")
        output: list[bytes] = []
        self._fail(SaslError(OUTCOME_SYS_TEMP, reason, fault="node"), output)
        self._buffer.clear()
        return self._step(b"".join(output))

    def expired(self, now_ms: int) -> bool:
        pending = self.phase in ("header", "init", "response", "checking")
        return pending and now_ms - self.started_ms > self.exchange_timeout_ms

    # ---- reading -----------------------------------------------------------------------------

    def _read_header(self, output: list) -> int:
        received = bytes(self._buffer[:8])
        if received == AMQP_HEADER and self.allow_plain_amqp:
            self._succeed(None, ANONYMOUS_IDENTITY)
            return 0  # the AMQP header itself is proton's: nothing consumed
        if received == SASL_HEADER:
            output.append(SASL_HEADER + frame(performative(MECHANISMS, symbol_array(self.offered))))
            self.phase = "init"
            if not self.offered:
                raise SaslError(OUTCOME_AUTH, "the client presented no TLS certificate and EXTERNAL is the only "
                                              "mechanism of this listener: the client must present a certificate")
            return 8
        if any(known.startswith(received) for known in (SASL_HEADER, AMQP_HEADER, TLS_HEADER)):
            if len(received) < 8:
                return 0
            output.append(SASL_HEADER)
            if received == AMQP_HEADER:
                raise SaslError(OUTCOME_AUTH, "the client opened without SASL and this listener requires SASL "
                                              "authentication: configure the client with a user and password")
            raise SaslError(OUTCOME_AUTH, "the client asked for TLS inside AMQP (AMQP protocol id 2); this "
                                          "listener takes TLS on the socket: connect with amqps")
        output.append(SASL_HEADER)
        raise SaslError(OUTCOME_AUTH, f"the client opened with {received!r}, not AMQP 1.0's SASL header: "
                                      f"not an AMQP 1.0 client, or the wrong port")

    def _read_frame(self, position: int, output: list) -> int:
        size, body = next_frame(self._buffer, position, self.frame_max_bytes)
        if body:  # an empty frame is a heartbeat
            self._on_performative(*decode_performative(body), output)
        return size

    def _on_performative(self, code: int, fields: Fields, output: list) -> None:
        if code == INIT and self.phase == "init":
            mechanism = fields.symbol(0, "mechanism", mandatory=True)
            if mechanism not in self.offered:
                raise SaslError(OUTCOME_AUTH, f"the client asked for SASL mechanism {shown(mechanism)}; this "
                                              f"listener offers {list(self.offered)}: configure the client for one")
            self.mechanism = mechanism
            self._start(mechanism, fields.binary(1, "initial-response"), output)
        elif code == RESPONSE and self.phase == "response":
            self._finish_scram(fields.binary(0, "response", mandatory=True), output)
        elif code == INIT:
            raise SaslError(OUTCOME_SYS, "the client sent a second sasl-init: a client bug")
        elif code in PERFORMATIVE_BY_NAME.values():
            raise SaslError(OUTCOME_SYS, f"the client sent SASL performative 0x{code:02x} out of turn (expected "
                                         f"{'sasl-init' if self.phase == 'init' else 'sasl-response'}): a client bug")
        else:
            raise SaslError(OUTCOME_SYS, f"the client sent an unknown SASL performative 0x{code:x}: a client bug")

    # ---- mechanisms --------------------------------------------------------------------------

    def _start(self, mechanism: str, response: bytes | None, output: list) -> None:
        if mechanism == "ANONYMOUS":
            self._succeed_with_outcome(ANONYMOUS_IDENTITY, output)
        elif mechanism == "EXTERNAL":
            authorization = text(response or b"", "EXTERNAL's authorization id")
            if authorization and authorization != self.external_identity:
                self.user = authorization
                raise SaslError(OUTCOME_AUTH, f"EXTERNAL: the certificate of {shown(self.external_identity)} "
                                              f"may not act for {shown(authorization)}")
            self.user = authorization or self.external_identity
            self._succeed_with_outcome(self.external_identity, output)
        elif mechanism == "PLAIN":
            self._plain(response, output)
        else:
            self._start_scram(response, output)

    def _plain(self, response: bytes | None, output: list) -> None:
        parts = (response or b"").split(b"\x00")
        if len(parts) != 3 or not parts[1]:
            raise SaslError(OUTCOME_AUTH, "PLAIN: the client's response is not authzid NUL user NUL password")
        authorization, user, password = (text(part, "PLAIN's response") for part in parts)
        self.user = user
        if authorization and authorization != user:
            raise SaslError(OUTCOME_AUTH, f"PLAIN: user {shown(user)} may not act for {shown(authorization)}")
        self._refuse_if_held(user)
        if self.defer_plain:
            self.phase, self._check = "checking", (user, password)
            return
        try:
            verified = self.authenticator.verify_plain(user, password)
        except Exception as error:  # handed on: _plain_outcome names it without its message
            verified = error
        self._plain_outcome(user, verified, output)

    def _plain_outcome(self, user: str, verified: bool | BaseException, output: list) -> None:
        if isinstance(verified, BaseException):  # the authenticator is the node's: not the client's fault
            raise SaslError(OUTCOME_SYS, f"PLAIN: the authenticator failed for user {shown(user)} "
                                         f"({type(verified).__name__}): a node bug", fault="node")
        if not verified:
            raise SaslError(OUTCOME_AUTH, f"PLAIN: unknown user or wrong password for user {shown(user)}")
        self._succeed_with_outcome(user, output)

    def _refuse_if_held(self, user: str) -> None:
        reason = self.held(user) if self.held is not None else None
        if reason:
            self._held = True
            raise SaslError(OUTCOME_AUTH, f"{self.mechanism}: {reason}; refused unchecked")

    def _start_scram(self, response: bytes | None, output: list) -> None:
        self._scram = ScramExchange(self.authenticator, self.scram_server_nonce, self.decoy_key)
        try:
            server_first = self._scram.first(response)
        finally:
            self.user = self._scram.user  # claimed, if the client got that far
        self.phase = "response"
        output.append(frame(performative(CHALLENGE, binary(server_first))))

    def _finish_scram(self, response: bytes, output: list) -> None:
        self._refuse_if_held(self._scram.user)
        server_final = self._scram.final(response)
        self._succeed_with_outcome(self._scram.user, output, additional_data=server_final)

    # ---- outcomes ----------------------------------------------------------------------------

    def _succeed_with_outcome(self, identity: str, output: list, additional_data: bytes | None = None) -> None:
        fields = ubyte(OUTCOME_OK) + (binary(additional_data) if additional_data is not None else b"")
        output.append(frame(performative(OUTCOME, fields, count=2 if additional_data is not None else 1)))
        self._succeed(self.mechanism, identity)

    def _succeed(self, mechanism: str | None, identity: str) -> None:
        self.phase, self.mechanism, self.identity = "authenticated", mechanism, identity

    def _fail(self, error: SaslError, output: list) -> None:
        if self.phase != "header":
            output.append(frame(performative(OUTCOME, ubyte(error.code))))
        self.phase, self.failure, self.fault, self.identity = "failed", error.description, error.fault, None
        self._check = None  # no password kept past the exchange

    def _step(self, output: bytes, rest: bytes = b"") -> SaslStep:
        state = self.phase if self.phase in ("authenticated", "failed") else "pending"
        return SaslStep(output, state, self.identity, self.mechanism, rest, self.failure, self.fault, self.user,
                        self._check if self.phase == "checking" else None, self._held)

