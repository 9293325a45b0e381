"""The SASL server state machine, driven by bytes only.

Client frames are encoded and server frames decoded with proton's `Data`, not with the module under
test; SCRAM-SHA-256 is checked against RFC 7677's example and against a client written here with
hashlib and hmac alone (RFC 5802); proton's own client transport is pumped in memory for interop.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Data, Described, symbol, ulong

from node.amqp.sasl import AMQP_HEADER, SASL_HEADER, TLS_HEADER, SaslServer

INIT, CHALLENGE, RESPONSE, OUTCOME = 0x41, 0x42, 0x43, 0x44
OPEN_FRAME = b"\x00\x00\x00\x19\x02\x00\x00\x00\x00S\x10\xc0\x0c\x04\xa1\x00@p\x00\x00\x80\x00`\x7f\xff"

# RFC 7677 section 3
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SERVER_FIRST = f"r={RFC_CLIENT_NONCE}{RFC_SERVER_NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (f"c=biws,r={RFC_CLIENT_NONCE}{RFC_SERVER_NONCE},"
                    f"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


# ---- an independent SCRAM-SHA-256 client and key store (RFC 5802) -------------------------------


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def scram_keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes, bytes]:
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return client_key, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")


class ScramClient:
    def __init__(self, user: str, password: str, nonce: str):
        self.password, self.nonce = password, nonce
        self.first_bare = f"n={user},r={nonce}"

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: str) -> bytes:
        attributes = dict(item.split("=", 1) for item in server_first.split(","))
        assert attributes["r"].startswith(self.nonce)
        client_key, stored_key, server_key = scram_keys(
            self.password, base64.b64decode(attributes["s"]), int(attributes["i"]))
        without_proof = f"c=biws,r={attributes['r']}"
        auth_message = f"{self.first_bare},{server_first},{without_proof}".encode()
        proof = bytes(a ^ b for a, b in zip(client_key, _hmac(stored_key, auth_message)))
        self.server_signature = _hmac(server_key, auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verifies(self, server_final: str) -> bool:
        return server_final == "v=" + base64.b64encode(self.server_signature).decode()


class Users:
    """The authenticator: PLAIN passwords and SCRAM keys; `broken` makes every lookup raise."""

    def __init__(self, passwords: dict[str, str], salt: bytes = RFC_SALT, broken: bool = False):
        self.passwords, self.salt, self.broken = passwords, salt, broken

    def verify_plain(self, user: str, password: str) -> bool:
        if self.broken:
            raise RuntimeError(f"store unavailable while checking {password}")
        return self.passwords.get(user) == password

    def scram_auth_info(self, user: str):
        if self.broken:
            raise RuntimeError("store unavailable")
        if user not in self.passwords:
            return None
        _, stored_key, server_key = scram_keys(self.passwords[user], self.salt, 4096)
        return self.salt, stored_key, server_key, 4096


USERS = Users({"user": "pencil", "alice": "secret"})
ALL = ("ANONYMOUS", "PLAIN", "SCRAM-SHA-256", "EXTERNAL")


# ---- frames, encoded and decoded by proton ------------------------------------------------------


def frame(body: bytes, frame_type: int = 1) -> bytes:
    return (8 + len(body)).to_bytes(4, "big") + bytes((2, frame_type, 0, 0)) + body


def performative(code: int, *fields) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), list(fields)))
    return frame(bytes(data.encode()))


def init(mechanism: str, response: bytes | None = None) -> bytes:
    return performative(INIT, symbol(mechanism), response)


def response(data: bytes) -> bytes:
    return performative(RESPONSE, data)


def server_frames(output: bytes) -> list[tuple[int, list]]:
    """The performatives in the server's output, after its SASL header if there is one."""
    if output.startswith(SASL_HEADER):
        output = output[8:]
    frames = []
    while output:
        size = int.from_bytes(output[:4], "big")
        assert output[5] == 1 and output[4] == 2
        data = Data()
        data.decode(output[8:size])
        described = data.get_object()
        frames.append((int(described.descriptor), [bytes(v) if isinstance(v, memoryview) else v
                                                   for v in described.value]))
        output = output[size:]
    return frames


def outcome_code(output: bytes) -> int:
    code, fields = server_frames(output)[-1]
    assert code == OUTCOME
    return fields[0]


def server(mechanisms=ALL, users=USERS, **options) -> SaslServer:
    options.setdefault("started_ms", 0)
    options.setdefault("exchange_timeout_ms", 10_000)
    return SaslServer(mechanisms, users, **options)


def run(sasl: SaslServer, *chunks: bytes, now_ms: int = 1):
    """Feed chunks; returns (all output, last state, rest gathered, last step)."""
    output, rest, step = b"", b"", None
    for chunk in chunks:
        step = sasl.received(chunk, now_ms)
        output += step.output
        rest += step.rest
    return output, step.state, rest, step


# ---- mechanisms ---------------------------------------------------------------------------------


def test_the_server_answers_the_sasl_header_with_its_own_and_the_offered_mechanisms():
    output, state, _, _ = run(server(("PLAIN", "ANONYMOUS")), SASL_HEADER)
    assert state == "pending"
    assert output.startswith(SASL_HEADER)
    [(code, fields)] = server_frames(output)
    assert code == 0x40 and list(fields[0]) == [symbol("PLAIN"), symbol("ANONYMOUS")]


def test_anonymous_authenticates_as_anonymous_and_hands_the_pipelined_amqp_header_to_proton():
    output, state, rest, step = run(server(), SASL_HEADER + init("ANONYMOUS", b"trace") + AMQP_HEADER + OPEN_FRAME)
    assert (state, step.identity, step.mechanism) == ("authenticated", "anonymous", "ANONYMOUS")
    assert outcome_code(output) == 0
    assert rest == AMQP_HEADER + OPEN_FRAME


def test_anonymous_is_refused_with_code_1_when_the_listener_does_not_offer_it():
    output, state, _, step = run(server(("PLAIN",)), SASL_HEADER + init("ANONYMOUS"))
    assert (state, outcome_code(output)) == ("failed", 1)
    assert "'ANONYMOUS'" in step.failure and "['PLAIN']" in step.failure and step.fault == "client"


def test_plain_with_the_right_password_authenticates_the_user():
    output, state, _, step = run(server(), SASL_HEADER, init("PLAIN", b"\x00alice\x00secret"))
    assert (state, step.identity, step.mechanism, outcome_code(output)) == ("authenticated", "alice", "PLAIN", 0)


def test_plain_accepts_an_authorization_id_equal_to_the_user_and_refuses_another():
    assert run(server(), SASL_HEADER + init("PLAIN", b"alice\x00alice\x00secret"))[1] == "authenticated"
    output, state, _, step = run(server(), SASL_HEADER + init("PLAIN", b"root\x00alice\x00secret"))
    assert (state, outcome_code(output)) == ("failed", 1)
    assert "secret" not in step.failure


@pytest.mark.parametrize("credentials", [b"\x00alice\x00Zq9Guess", b"\x00mallory\x00secret", b"alice:secret",
                                         b"\x00\x00secret", b"\x00alice\x00Qx7\x00Vb2", b"\x00alice\x00\xff\xfe"])
def test_plain_with_bad_credentials_fails_with_code_1_and_no_password_in_the_reason(credentials):
    output, state, rest, step = run(server(), SASL_HEADER + init("PLAIN", credentials) + AMQP_HEADER)
    assert (state, outcome_code(output), rest, step.identity) == ("failed", 1, b"", None)
    for secret in ("Zq9Guess", "secret", "Qx7", "Vb2"):
        assert secret not in step.failure


def test_plain_without_a_response_fails_with_code_1():
    assert outcome_code(run(server(), SASL_HEADER + init("PLAIN"))[0]) == 1


def test_a_failing_authenticator_is_the_nodes_fault_code_2_and_the_password_stays_out_of_the_log():
    output, state, _, step = run(server(users=Users({}, broken=True)), SASL_HEADER + init("PLAIN", b"\x00a\x00hunter2"))
    assert (state, outcome_code(output), step.fault) == ("failed", 2, "node")
    assert "hunter2" not in step.failure and "RuntimeError" in step.failure


def test_external_takes_the_identity_of_the_tls_client_certificate():
    sasl = server(external_identity="CN=app1")
    output, state, _, step = run(sasl, SASL_HEADER + init("EXTERNAL", b""))
    assert (state, step.identity, step.mechanism, outcome_code(output)) == ("authenticated", "CN=app1", "EXTERNAL", 0)
    assert run(server(external_identity="CN=app1"), SASL_HEADER + init("EXTERNAL", b"CN=app1"))[1] == "authenticated"
    output, state, _, _ = run(server(external_identity="CN=app1"), SASL_HEADER + init("EXTERNAL", b"CN=root"))
    assert (state, outcome_code(output)) == ("failed", 1)


def test_external_is_not_offered_without_a_client_certificate():
    output, _, _, _ = run(server(), SASL_HEADER)
    assert symbol("EXTERNAL") not in list(server_frames(output)[0][1][0])
    assert outcome_code(run(server(), SASL_HEADER + init("EXTERNAL"))[0]) == 1


def test_a_listener_with_only_external_fails_a_client_without_certificate_at_once():
    output, state, _, step = run(server(("EXTERNAL",)), SASL_HEADER)
    assert state == "failed" and outcome_code(output) == 1 and "certificate" in step.failure


def test_unsupported_mechanism_names_are_refused_when_the_server_is_built():
    with pytest.raises(ValueError, match="GSSAPI"):
        server(("PLAIN", "GSSAPI"))


# ---- SCRAM-SHA-256 ------------------------------------------------------------------------------


def test_the_test_scram_client_reproduces_rfc_7677():
    client = ScramClient("user", "pencil", RFC_CLIENT_NONCE)
    assert client.final(RFC_SERVER_FIRST).decode() == RFC_CLIENT_FINAL
    assert client.verifies(RFC_SERVER_FINAL)


def test_scram_sha_256_follows_rfc_7677_byte_for_byte():
    sasl = server(scram_server_nonce=RFC_SERVER_NONCE)
    output, state, _, _ = run(sasl, SASL_HEADER + init("SCRAM-SHA-256", f"n,,n=user,r={RFC_CLIENT_NONCE}".encode()))
    assert state == "pending"
    assert server_frames(output)[-1] == (CHALLENGE, [RFC_SERVER_FIRST.encode()])
    output, state, _, step = run(sasl, response(RFC_CLIENT_FINAL.encode()))
    assert (state, step.identity, step.mechanism) == ("authenticated", "user", "SCRAM-SHA-256")
    assert server_frames(output) == [(OUTCOME, [0, RFC_SERVER_FINAL.encode()])]


def scram_exchange(user: str, password: str, sasl: SaslServer | None = None, nonce: str = "fyko+d2lbbFgONRv9qkxdawL"):
    """Run the test client against a server; returns (the client, the challenge, the outcome's fields, last step)."""
    sasl = sasl or server()
    client = ScramClient(user, password, nonce)
    output, _, _, _ = run(sasl, SASL_HEADER + init("SCRAM-SHA-256", client.first()))
    code, (server_first,) = server_frames(output)[-1]
    assert code == CHALLENGE
    output, _, _, step = run(sasl, response(client.final(server_first.decode())) + AMQP_HEADER)
    [(code, fields)] = server_frames(output)
    assert code == OUTCOME
    return client, server_first.decode(), fields, step


def test_scram_sha_256_authenticates_an_independent_client_which_verifies_the_server():
    client, _, fields, step = scram_exchange("alice", "secret")
    assert fields[0] == 0 and client.verifies(fields[1].decode())
    assert (step.state, step.identity, step.rest) == ("authenticated", "alice", AMQP_HEADER)


def test_scram_wrong_password_and_unknown_user_look_the_same_to_the_client():
    _, wrong_challenge, wrong_outcome, wrong = scram_exchange("alice", "guess")
    _, unknown_challenge, unknown_outcome, unknown = scram_exchange("nobody", "guess")
    assert wrong_outcome == unknown_outcome == [1]
    assert [part[:2] for part in wrong_challenge.split(",")] == [part[:2] for part in unknown_challenge.split(",")]
    assert len(wrong_challenge) == len(unknown_challenge)
    assert (wrong.state, wrong.rest, unknown.state, unknown.rest) == ("failed", b"", "failed", b"")
    assert "wrong password" in wrong.failure and "unknown user 'nobody'" in unknown.failure


def test_an_unknown_scram_user_gets_the_same_decoy_salt_every_time():
    key = b"k" * 32
    salts = {scram_exchange("nobody", "x", server(decoy_key=key))[1].split(",")[1] for _ in range(2)}
    assert len(salts) == 1


def test_an_authenticator_raising_lookup_error_means_an_unknown_user():
    class Missing(Users):
        def scram_auth_info(self, user):
            raise KeyError(user)

    _, _, fields, step = scram_exchange("alice", "secret", server(users=Missing({})))
    assert fields == [1] and "unknown user" in step.failure


def test_a_failing_scram_authenticator_is_the_nodes_fault():
    output, state, _, step = run(server(users=Users({}, broken=True)),
                                 SASL_HEADER + init("SCRAM-SHA-256", b"n,,n=alice,r=abcdef"))
    assert (state, outcome_code(output), step.fault) == ("failed", 2, "node")


def test_unusable_stored_scram_keys_are_the_nodes_fault():
    output, state, _, step = run(server(users=Users({"alice": "secret"}, salt=b"short")),
                                 SASL_HEADER + init("SCRAM-SHA-256", b"n,,n=alice,r=abcdef"))
    assert (state, outcome_code(output), step.fault) == ("failed", 2, "node")
    assert "users file" in step.failure


@pytest.mark.parametrize("first", [None, b"", b"hello", b"p=tls-unique,,n=alice,r=abc", b"n,a=root,n=alice,r=x"])
def test_a_malformed_scram_client_first_fails_with_code_1(first):
    output, state, _, _ = run(server(), SASL_HEADER + init("SCRAM-SHA-256", first))
    assert (state, outcome_code(output)) == ("failed", 1)


def test_a_scram_client_final_with_another_nonce_fails_with_code_1():
    sasl = server()
    run(sasl, SASL_HEADER + init("SCRAM-SHA-256", b"n,,n=alice,r=abcdef"))
    output, state, _, _ = run(sasl, response(b"c=biws,r=abcdefXYZ,p=AAAA"))
    assert (state, outcome_code(output)) == ("failed", 1)


def test_the_amqp_header_before_the_scram_outcome_fails_the_exchange():
    output, state, _, step = run(server(), SASL_HEADER + init("SCRAM-SHA-256", b"n,,n=alice,r=abcdef") + AMQP_HEADER)
    assert (state, outcome_code(output)) == ("failed", 2) and "before" in step.failure


# ---- headers, frames and protocol errors --------------------------------------------------------


def test_a_plain_amqp_header_is_let_through_as_anonymous_when_allowed():
    output, state, rest, step = run(server(allow_plain_amqp=True), b"AMQ", b"P\x00\x01", b"\x00\x00" + OPEN_FRAME)
    assert (output, state, step.identity, step.mechanism) == (b"", "authenticated", "anonymous", None)
    assert rest == AMQP_HEADER + OPEN_FRAME


def test_a_plain_amqp_header_is_answered_with_the_sasl_header_when_sasl_is_required():
    output, state, rest, step = run(server(), AMQP_HEADER + OPEN_FRAME)
    assert (output, state, rest) == (SASL_HEADER, "failed", b"")
    assert "requires SASL" in step.failure


@pytest.mark.parametrize("opening", [TLS_HEADER, b"AMQP\x03\x01\x00\x01", b"GET / HTTP/1.1\r\n", b"\x16\x03\x01"])
def test_other_protocol_headers_are_answered_with_the_sasl_header_and_fail(opening):
    output, state, _, _ = run(server(), opening)
    assert (output, state) == (SASL_HEADER, "failed")


def test_a_frame_over_the_limit_fails_as_soon_as_its_size_arrives():
    sasl = server(frame_max_bytes=1024)
    output, state, _, step = run(sasl, SASL_HEADER, (1025).to_bytes(4, "big"))
    assert (state, outcome_code(output)) == ("failed", 2)
    assert "1025 bytes" in step.failure and "1024 bytes" in step.failure
    assert len(sasl._buffer) == 0


def test_empty_frames_are_ignored_and_symbolic_descriptors_understood():
    data = Data()
    data.put_object(Described(symbol("amqp:sasl-init:list"), [symbol("ANONYMOUS")]))
    output, state, _, _ = run(server(), SASL_HEADER + frame(b"") + frame(bytes(data.encode())))
    assert (state, outcome_code(output)) == ("authenticated", 0)


@pytest.mark.parametrize("frames, reason", [
    (frame(init("PLAIN")[8:], frame_type=0), "type 0"),
    (performative(0x47, symbol("x")), "unknown SASL performative"),
    (response(b"x"), "out of turn"),
    (performative(0x40, symbol("PLAIN")), "out of turn"),
    (performative(INIT, None), "mandatory"),
    (performative(INIT, 42), "type"),
    (frame(b"\x00\x53\x41\xc0\x10\x01\xa3\x05PLAIN"), "past"),
    (frame(b"\x41"), "described list"),
    (b"\x00\x00\x00\x04\x02\x01\x00\x00", "malformed frame"),
    (b"\x00\x00\x00\x0c\x01\x01\x00\x00\x00\x00\x00\x00", "data offset"),
])
def test_protocol_errors_fail_with_code_2(frames, reason):
    output, state, _, step = run(server(), SASL_HEADER + frames)
    assert (state, outcome_code(output), step.fault) == ("failed", 2, "client")
    assert reason in step.failure


def test_a_second_sasl_init_fails_with_code_2():
    sasl = server()
    run(sasl, SASL_HEADER + init("SCRAM-SHA-256", b"n,,n=alice,r=abcdef"))
    output, state, _, step = run(sasl, init("PLAIN", b"\x00alice\x00secret"))
    assert (state, outcome_code(output)) == ("failed", 2) and "second sasl-init" in step.failure


def test_input_after_a_failure_is_ignored_and_after_success_passes_through():
    failed = server()
    run(failed, AMQP_HEADER)
    assert run(failed, SASL_HEADER + init("ANONYMOUS"))[:3] == (b"", "failed", b"")
    succeeded = server()
    run(succeeded, SASL_HEADER + init("ANONYMOUS"))
    assert run(succeeded, OPEN_FRAME)[:3] == (b"", "authenticated", OPEN_FRAME)


def test_an_exchange_that_takes_too_long_expires_with_code_4():
    sasl = server(started_ms=1_000, exchange_timeout_ms=500)
    run(sasl, SASL_HEADER, now_ms=1_100)
    assert not sasl.expired(1_500) and sasl.expired(1_501)
    output, state, _, step = run(sasl, init("ANONYMOUS"), now_ms=1_501)
    assert (state, outcome_code(output)) == ("failed", 4) and "500 ms" in step.failure
    assert not sasl.expired(10_000)  # over: the adapter has closed it


def test_a_finished_exchange_never_expires():
    sasl = server(exchange_timeout_ms=500)
    run(sasl, SASL_HEADER + init("ANONYMOUS"))
    assert not sasl.expired(10_000)


# ---- fragments and fuzzing ----------------------------------------------------------------------

_SCRAM_CLIENT = ScramClient("user", "pencil", RFC_CLIENT_NONCE)
STREAMS = {
    "anonymous": SASL_HEADER + init("ANONYMOUS") + AMQP_HEADER + OPEN_FRAME,
    "plain": SASL_HEADER + init("PLAIN", b"\x00alice\x00secret") + AMQP_HEADER + OPEN_FRAME,
    "plain refused": SASL_HEADER + init("PLAIN", b"\x00alice\x00nope") + AMQP_HEADER,
    "scram": (SASL_HEADER + init("SCRAM-SHA-256", _SCRAM_CLIENT.first())
              + response(_SCRAM_CLIENT.final(RFC_SERVER_FIRST)) + AMQP_HEADER + OPEN_FRAME),
    "plain amqp": AMQP_HEADER + OPEN_FRAME,
}


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[start:end] for start, end in zip([0, *points], [*points, len(data)])]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(STREAMS)), st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_any_split_of_the_client_stream_gives_the_same_result(name, cuts, allow_plain):
    def result(chunks):
        sasl = server(scram_server_nonce=RFC_SERVER_NONCE, allow_plain_amqp=allow_plain)
        output, state, rest, step = run(sasl, *chunks)
        return output, state, rest, step.identity, step.mechanism, step.failure

    whole = result([STREAMS[name]])
    assert result(split(STREAMS[name], cuts)) == whole
    assert whole[1] == ("failed" if name == "plain refused" or (name == "plain amqp" and not allow_plain)
                        else "authenticated")


OUTPUT_MAX_BYTES = 8 + 64 + 64  # header, mechanisms, one outcome: garbage never earns a challenge


def assert_failed_or_pending(sasl: SaslServer, chunks: list[bytes]) -> None:
    output = b""
    for chunk in chunks:
        step = sasl.received(chunk, 1)
        output += step.output
        assert step.state in ("pending", "failed")
        assert step.rest == b"" and step.identity is None
    assert len(output) <= OUTPUT_MAX_BYTES
    assert len(sasl._buffer) <= sasl.frame_max_bytes


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=600), max_size=6))
def test_random_bytes_after_the_sasl_header_never_raise(chunks):
    assert_failed_or_pending(server(("PLAIN", "SCRAM-SHA-256"), frame_max_bytes=512), [SASL_HEADER, *chunks])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=4))
def test_random_bytes_from_the_first_byte_never_raise(chunks):
    assert_failed_or_pending(server(("PLAIN",)), chunks)


_FIELD = st.one_of(st.none(), st.binary(max_size=300), st.integers(0, 255).map(lambda n: bytes((n,))))


@st.composite
def random_frames(draw) -> bytes:
    descriptor = draw(st.sampled_from([b"\x00\x53" + bytes((code,)) for code in range(0x3E, 0x48)]
                                      + [b"\x00\x80" + (0x41).to_bytes(8, "big"), b"\x00\xa3\x03abc"]))
    fields = b"".join(draw(st.lists(_FIELD.map(lambda f: b"\x40" if f is None else f), max_size=4)))
    count = draw(st.integers(0, 300))
    list_code = draw(st.sampled_from(["list0", "list8", "list32"]))
    if list_code == "list0":
        body = descriptor + b"\x45" + fields
    elif list_code == "list8":
        body = descriptor + bytes((0xC0, (len(fields) + 1) % 256, count % 256)) + fields
    else:
        body = descriptor + b"\xd0" + (len(fields) + 4).to_bytes(4, "big") + count.to_bytes(4, "big") + fields
    cut = draw(st.integers(0, len(body)))
    return frame(body[:cut] if draw(st.booleans()) else body)


@settings(max_examples=300, deadline=None)
@given(st.lists(random_frames(), min_size=1, max_size=4))
def test_random_frames_never_raise(frames):
    assert_failed_or_pending(server(("SCRAM-SHA-256",), frame_max_bytes=1024), [SASL_HEADER, *frames])


_SCRAM_TEXT = st.one_of(st.binary(max_size=200), st.text(max_size=100).map(str.encode),
                        st.lists(st.sampled_from(["n", "y", "p=tls-unique", "", "a=x", "n=alice", "r=abc", "r=",
                                                  "c=biws", "p=AAAA", "m=x", "=", "n=a=3D", "s=!!", "\u0627"]),
                                 max_size=6).map(lambda parts: ",".join(parts).encode()))


@settings(max_examples=300, deadline=None)
@given(_SCRAM_TEXT, _SCRAM_TEXT)
def test_random_scram_messages_never_raise_and_never_authenticate(first, final):
    sasl = server(scram_server_nonce="srv")
    steps = [sasl.received(SASL_HEADER + init("SCRAM-SHA-256", first), 1), sasl.received(response(final), 1)]
    assert all(step.state in ("pending", "failed") for step in steps)
    assert steps[-1].state == "failed"


# ---- interop: proton's own client transport, in memory ------------------------------------------


def pump_proton_client(mechanism: str, user: str, password: str, sasl: SaslServer, *, insecure: bool = True):
    """Exchange bytes between proton's client transport and `sasl` until neither has more to say."""
    transport, connection = proton.Transport(), proton.Connection()
    connection.user, connection.password = user, password
    client_sasl = transport.sasl()
    client_sasl.allowed_mechs(mechanism)
    client_sasl.allow_insecure_mechs = insecure
    transport.bind(connection)
    connection.open()
    rest, step = b"", None
    for _ in range(20):
        pending = transport.pending()
        if pending <= 0:
            break
        data = bytes(transport.peek(pending))
        transport.pop(pending)
        step = sasl.received(data, 1)
        rest += step.rest
        if step.output:
            transport.push(step.output)
    return client_sasl, step, rest


@pytest.mark.parametrize("mechanism, identity", [("PLAIN", "alice"), ("ANONYMOUS", "anonymous")])
def test_protons_client_authenticates_and_sends_its_amqp_header(mechanism, identity):
    client_sasl, step, rest = pump_proton_client(mechanism, "alice", "secret", server())
    assert client_sasl.outcome == proton.SASL.OK
    assert (step.state, step.identity, step.mechanism) == ("authenticated", identity, mechanism)
    assert rest.startswith(AMQP_HEADER) and len(rest) > 8  # the header and proton's open frame


def test_protons_client_sees_a_wrong_password_as_an_authentication_failure():
    client_sasl, step, rest = pump_proton_client("PLAIN", "alice", "wrong", server())
    assert client_sasl.outcome == proton.SASL.AUTH
    assert (step.state, rest) == ("failed", b"")
