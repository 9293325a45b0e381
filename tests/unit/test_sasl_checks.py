"""The SASL server's hooks for its adapter (node/amqp/sasl.py): the `held` hook refusing attempts
unchecked, PLAIN checks deferred to the adapter (`check`, `checked`, `check_refused`), and the
claimed user each step names."""

from __future__ import annotations

from node.amqp.sasl import AMQP_HEADER, SASL_HEADER
from tests.unit.test_sasl import USERS, ScramClient, init, outcome_code, response, run, server, server_frames

OPEN = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # an empty AMQP frame, standing for what follows the header


class Counting:
    def __init__(self):
        self.checks = 0

    def verify_plain(self, user, password):
        self.checks += 1
        return USERS.verify_plain(user, password)

    def scram_auth_info(self, user):
        return USERS.scram_auth_info(user)


def test_a_held_plain_attempt_is_refused_unchecked_naming_why():
    users = Counting()
    asked = []
    sasl = server(users=users, held=lambda user: asked.append(user) or "too many failed logins in a row")
    output, state, _, step = run(sasl, SASL_HEADER + init("PLAIN", b"\x00alice\x00secret"))
    assert (state, outcome_code(output), step.held, step.user, users.checks) == ("failed", 1, True, "alice", 0)
    assert asked == ["alice"] and "too many failed logins in a row; refused unchecked" in step.failure


def test_a_held_scram_attempt_is_refused_at_the_proof_after_a_normal_challenge():
    sasl = server(held=lambda user: "held")
    client = ScramClient("alice", "secret", "fyko+d2lbbFgONRv9qkxdawL")
    output, state, _, _ = run(sasl, SASL_HEADER + init("SCRAM-SHA-256", client.first()))
    assert state == "pending" and server_frames(output)[-1][0] == 0x42
    challenge = server_frames(output)[-1][1][0].decode()
    output, state, _, step = run(sasl, response(client.final(challenge)))
    assert (state, outcome_code(output), step.held, step.user) == ("failed", 1, True, "alice")


def test_a_deferred_plain_check_is_handed_out_once_and_what_follows_waits_for_its_answer():
    users = Counting()
    sasl = server(users=users, defer_plain=True)
    output, state, rest, step = run(sasl, SASL_HEADER + init("PLAIN", b"\x00alice\x00secret") + AMQP_HEADER)
    assert (state, step.check, rest, users.checks) == ("pending", ("alice", "secret"), b"", 0)
    assert [code for code, _ in server_frames(output)] == [0x40]  # mechanisms only, no outcome yet
    later = sasl.received(OPEN, now_ms=2)
    assert (later.state, later.check, later.output) == ("pending", None, b"")
    step = sasl.checked(True)
    assert (step.state, step.identity, step.user, outcome_code(step.output)) == ("authenticated", "alice", "alice", 0)
    assert step.rest == AMQP_HEADER + OPEN


def test_a_deferred_check_that_fails_or_raises_or_cannot_run_ends_the_exchange():
    for answer, code, fault in ((False, 1, "client"), (RuntimeError("db"), 2, "node")):
        sasl = server(defer_plain=True)
        run(sasl, SASL_HEADER + init("PLAIN", b"\x00alice\x00guess"))
        step = sasl.checked(answer)
        assert (step.state, outcome_code(step.output), step.fault, step.rest) == ("failed", code, fault, b"")
        assert "guess" not in step.failure
    sasl = server(defer_plain=True)
    run(sasl, SASL_HEADER + init("PLAIN", b"\x00alice\x00secret"))
    step = sasl.check_refused("busy")
    assert (step.state, outcome_code(step.output), step.fault, step.held) == ("failed", 4, "node", False)
    assert sasl.checked(True).state == "failed"  # a late answer changes nothing


def test_a_deferred_check_outlived_by_the_exchange_deadline_fails_it():
    sasl = server(defer_plain=True, exchange_timeout_ms=100)
    run(sasl, SASL_HEADER + init("PLAIN", b"\x00alice\x00secret"))
    step = sasl.received(b"x", now_ms=200)
    assert (step.state, outcome_code(step.output)) == ("failed", 4)
    assert sasl.checked(True).state == "failed"
