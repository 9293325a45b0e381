"""Issue 26 finding 4: SCRAM must not tell which users exist. The SASL server (node/amqp/sasl.py) with a
real users file (node/users.py, node/user_decoys.py) answers a known and an unknown user alike: the
same salt length and iteration count, the same salt on every ask and on every node reading the file,
the same failure; and a PLAIN check of an unknown user derives the same key work."""

from __future__ import annotations

import base64
import json

import pytest

from node import users as users_module
from node.amqp.sasl import SASL_HEADER
from node.core.access.roles import ADMINISTRATOR
from node.users import ITERATIONS_DEFAULT, UserDatabase
from tests.unit.test_sasl import CHALLENGE, ScramClient, init, response, run, server, server_frames

PASSWORD = "correct horse battery"


@pytest.fixture
def users_file(tmp_path) -> str:
    database = UserDatabase()
    database.add_user("admin", PASSWORD, [ADMINISTRATOR])
    database.add_user("app", PASSWORD)
    path = str(tmp_path / "users.json")
    database.save(path)
    return path


def server_first(users: UserDatabase, user: str) -> dict[str, str]:
    """The server-first message's attributes (r, s, i) for a client claiming `user`."""
    client = ScramClient(user, "guess", "fyko+d2lbbFgONRv9qkxdawL")
    output = run(server(("SCRAM-SHA-256",), users=users), SASL_HEADER + init("SCRAM-SHA-256", client.first()))[0]
    code, (message,) = server_frames(output)[-1]
    assert code == CHALLENGE
    return dict(part.split("=", 1) for part in message.decode().split(","))


def failed_outcome(users: UserDatabase, user: str) -> tuple[bytes, str]:
    client = ScramClient(user, "guess", "fyko+d2lbbFgONRv9qkxdawL")
    sasl = server(("SCRAM-SHA-256",), users=users)
    output = run(sasl, SASL_HEADER + init("SCRAM-SHA-256", client.first()))[0]
    challenge = server_frames(output)[-1][1][0].decode()
    output, state, _, _ = run(sasl, response(client.final(challenge)))
    return output, state


def test_a_known_and_an_unknown_user_get_salts_of_one_length_and_one_iteration_count(users_file):
    users = UserDatabase.load(users_file)
    known, unknown = server_first(users, "admin"), server_first(users, "nobody")
    assert len(base64.b64decode(known["s"])) == len(base64.b64decode(unknown["s"])) == 32
    assert known["i"] == unknown["i"] == str(ITERATIONS_DEFAULT)
    assert sorted(known) == sorted(unknown) and len(known["r"]) == len(unknown["r"])


def test_an_unknown_user_gets_the_same_salt_every_time_and_from_every_node_reading_the_file(users_file):
    node_a, node_b = UserDatabase.load(users_file), UserDatabase.load(users_file)  # two nodes, one file
    salts = {server_first(users, "nobody")["s"] for users in (node_a, node_b, node_a)}
    assert len(salts) == 1
    assert server_first(node_a, "nobody")["s"] != server_first(node_a, "somebody")["s"]


def test_a_wrong_password_and_an_unknown_user_fail_with_the_same_bytes(users_file):
    users = UserDatabase.load(users_file)
    assert failed_outcome(users, "admin") == failed_outcome(users, "nobody")
    assert failed_outcome(users, "nobody")[1] == "failed"


def test_the_decoy_copies_the_iteration_count_most_users_have(tmp_path):
    database = UserDatabase()
    for name in ("a", "b"):
        database.add_user(name, PASSWORD, iterations=8192)
    database.add_user("c", PASSWORD)
    assert database.scram_decoy("nobody")[3] == 8192
    assert len(database.scram_decoy("nobody")[0]) == len(database.scram_auth_info("a")[0])


def test_a_file_without_a_decoy_secret_gets_a_stable_one_and_keeps_it_when_next_saved(users_file):
    data = json.loads(open(users_file).read())
    assert len(base64.b64decode(data.pop("decoy_secret"))) == 32  # written at creation
    with open(users_file, "w") as file:
        json.dump(data, file)  # as a file written before decoy_secret existed
    before = UserDatabase.load(users_file).scram_decoy("nobody")
    assert UserDatabase.load(users_file).scram_decoy("nobody") == before  # another node, the same decoy
    database = UserDatabase.load(users_file)
    database.add_user("carol", PASSWORD)  # the next `grouper user add`
    database.save(users_file)
    assert "decoy_secret" in json.loads(open(users_file).read())
    assert UserDatabase.load(users_file).scram_decoy("nobody") == before


def test_two_files_with_different_secrets_give_different_decoys(tmp_path, users_file):
    other = UserDatabase.load(users_file)
    other._decoy_secret = None  # as if created anew: a fresh random secret
    other.save(str(tmp_path / "other.json"))
    assert UserDatabase.load(users_file).scram_decoy("nobody") != \
        UserDatabase.load(str(tmp_path / "other.json")).scram_decoy("nobody")


def test_a_bad_decoy_secret_is_refused_naming_the_key(users_file):
    data = json.loads(open(users_file).read())
    data["decoy_secret"] = base64.b64encode(b"short").decode()
    with open(users_file, "w") as file:
        json.dump(data, file)
    with pytest.raises(users_module.InvalidConfig, match="decoy_secret: must be 32 bytes"):
        UserDatabase.load(users_file)


def test_plain_derives_with_the_decoys_salt_and_iterations_for_an_unknown_user(users_file, monkeypatch):
    database = UserDatabase.load(users_file)
    derived = []
    real = users_module.derive
    monkeypatch.setattr(users_module, "derive", lambda *args: derived.append(args[1:]) or real(*args))
    assert not database.verify_plain("nobody", "guess")
    assert not database.verify_plain("admin", "guess")
    (unknown_iterations, unknown_salt), (known_iterations, known_salt) = derived
    assert (unknown_iterations, len(unknown_salt)) == (known_iterations, len(known_salt))
    assert unknown_salt == database.scram_decoy("nobody")[0]
