"""SCRAM-SHA-256 (RFC 5802, RFC 7677) for one SASL exchange: scramp's server, and the decoy an unknown
user meets.

Rules:
- Pure: messages in, messages out; no sockets, threads or clock. node/amqp/sasl.py frames the
  messages, owns the exchange's phases and asks the `held` hook; this object holds one exchange's
  SCRAM state and nothing else.
- An unknown user gets the authenticator's decoy (`scram_decoy`, asked for every user so both cost
  the same: a salt of a real one's length, the same iteration count, the same every time) and fails
  at the proof exactly as a wrong password does, so the client cannot tell them apart. An
  authenticator without `scram_decoy` gets one made from `decoy_key` (one per process by default).
- Failures are SaslError: code 1 for the client's messages and a wrong proof; code 2 with fault
  "node" when the authenticator failed or the stored keys it gave are unusable. They name the user,
  never a password or a proof.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from scramp import ScramException, ScramMechanism

from node.amqp.sasl_frames import OUTCOME_AUTH, OUTCOME_SYS, SaslError, shown, text

DECOY_ITERATION_COUNT = 4096  # what an unknown SCRAM user is told; should match the users file's count
_DECOY_KEY_PROCESS = secrets.token_bytes(32)  # one per process unless the adapter passes its own


class ScramExchange:
    def __init__(self, authenticator, server_nonce: str | None, decoy_key: bytes | None):
        self._authenticator = authenticator
        self._decoy_key = decoy_key or _DECOY_KEY_PROCESS
        self._server = ScramMechanism("SCRAM-SHA-256").make_server(self._auth_info, s_nonce=server_nonce)
        self.user: str | None = None  # claimed in the client-first message, once scramp asked for its keys
        self._user_known = True
        self._authenticator_error: Exception | None = None

    def first(self, response: bytes | None) -> bytes:
        """The server-first message answering sasl-init's client-first `response`."""
        if not response:
            raise SaslError(OUTCOME_AUTH, "SCRAM-SHA-256: the client sent no client-first message in sasl-init")
        try:
            self._server.set_client_first(text(response, "SCRAM-SHA-256's client-first message"))
            return self._server.get_server_first().encode()
        except ScramException as error:
            raise self._failure(error, "client-first") from None

    def final(self, response: bytes) -> bytes:
        """The server-final message (the outcome's additional data) once the client's proof holds."""
        try:
            self._server.set_client_final(text(response, "SCRAM-SHA-256's client-final message"))
            return self._server.get_server_final().encode()
        except ScramException as error:
            raise self._failure(error, "client-final") from None

    def _auth_info(self, user: str) -> tuple:
        self.user = user
        decoy_of = getattr(self._authenticator, "scram_decoy", None)
        decoy_info = None
        try:
            decoy_info = decoy_of(user) if decoy_of is not None else None  # for every user: the same work
            info = self._authenticator.scram_auth_info(user)
        except LookupError:
            info = None
        except Exception as error:
            self._authenticator_error = error
            raise
        if info is not None:
            return info
        self._user_known = False
        if decoy_info is not None:
            return decoy_info
        decoy = hmac.new(self._decoy_key, b"decoy\x00" + user.encode(), hashlib.sha256).digest()
        return decoy[:16], decoy, decoy, DECOY_ITERATION_COUNT  # no proof can hash to this stored key

    def _failure(self, error: ScramException, message: str) -> SaslError:
        user = shown(self.user)
        if self._authenticator_error is not None:
            return SaslError(OUTCOME_SYS, f"SCRAM-SHA-256: the authenticator failed for user {user} "
                                          f"({type(self._authenticator_error).__name__}): a node bug", fault="node")
        if message == "client-first" and self.user is not None:  # scramp rejected what the authenticator gave
            return SaslError(OUTCOME_SYS, f"SCRAM-SHA-256: the stored keys of user {user} are unusable ({error}): "
                                          f"fix the users file", fault="node")
        if message == "client-final" and getattr(error.server_error, "value", None) == "invalid-proof":
            why = "wrong password for" if self._user_known else "unknown"
            return SaslError(OUTCOME_AUTH, f"SCRAM-SHA-256: {why} user {user}")
        return SaslError(OUTCOME_AUTH, f"SCRAM-SHA-256: the client's {message} message was rejected ({error})")
