"""The users file: round trips, atomic 0600 saves without passwords, PLAIN and SCRAM checks against the
stored keys, the first administrator from the environment, and a named error for every malformed key."""

from __future__ import annotations

import copy
import json
import os
import stat

import pytest
import scramp

from node import users as users_module
from node.core.access.roles import ADMINISTRATOR, ANONYMOUS, Grant, Permission
from node.core.errors import AlreadyExists, InvalidConfig, NotAllowed, NotFound
from node.users import (DEFAULT_PASSWORD_ENV, DEFAULT_PASSWORD_FILE_ENV, DEFAULT_USER_ENV, ITERATIONS_DEFAULT,
                        UserDatabase, bootstrap)
from node.users_file import stamp

WRITER = [Grant(frozenset({Permission.SEND}), ("orders.*",))]


@pytest.fixture
def database() -> UserDatabase:
    database = UserDatabase()
    database.set_role("orders-writer", WRITER)
    database.add_user("alice", "alice-secret", [ADMINISTRATOR])
    database.add_user("bob", "bob-secret-phrase", ["orders-writer"])
    return database


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "users.json")


# ---- round trip and saving -------------------------------------------------------------------------

def test_a_saved_database_loads_back_the_same(database, path):
    database.set_roles(ANONYMOUS, ["orders-writer"])
    database.save(path)
    loaded = UserDatabase.load(path)
    assert loaded.to_dict() == database.to_dict()
    assert loaded.users() == [("alice", (ADMINISTRATOR,)), ("bob", ("orders-writer",))]
    assert loaded.roles() == {"orders-writer": tuple(WRITER)}
    assert loaded.anonymous_roles == ("orders-writer",)
    assert loaded.verify_plain("bob", "bob-secret-phrase")
    access = loaded.access()
    assert access.allows("bob", Permission.SEND, "orders.eu")
    assert not access.allows("bob", Permission.CONSUME, "orders.eu")
    assert access.allows(ANONYMOUS, Permission.SEND, "orders.eu")
    assert access.allows("alice", Permission.MANAGE, "anything")


def test_the_file_has_the_documented_shape(database, path):
    database.save(path)
    data = json.loads(open(path).read())
    assert data["version"] == 1
    assert data["roles"] == {"orders-writer": [{"permissions": ["send"], "queues": ["orders.*"]}]}
    assert data["anonymous_roles"] == []
    assert data["users"]["bob"]["roles"] == ["orders-writer"]
    assert set(data["users"]["bob"]["scram_sha_256"]) == {"salt", "iterations", "stored_key", "server_key"}
    assert data["users"]["bob"]["scram_sha_256"]["iterations"] == ITERATIONS_DEFAULT


def test_the_file_holds_no_password(database, path):
    database.save(path)
    text = open(path).read()
    assert "bob-secret-phrase" not in text and "alice-secret" not in text


def test_the_file_is_readable_by_its_owner_only_even_over_a_looser_one(database, path):
    with open(path, "w") as file:
        file.write("{}")
    os.chmod(path, 0o644)
    database.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_save_replaces_the_file_whole_and_leaves_no_temporary_behind(database, path, monkeypatch):
    database.save(path)
    before = open(path).read()
    database.add_user("carol", "carol-secret")

    def failing_replace(source, destination):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk gone"):
        database.save(path)
    assert open(path).read() == before
    assert os.listdir(os.path.dirname(path)) == ["users.json"]


def test_save_creates_the_directory(database, tmp_path):
    path = str(tmp_path / "data" / "users.json")
    database.save(path)
    assert UserDatabase.load(path).users() == database.users()


def test_stamp_changes_when_the_file_does(database, path):
    assert stamp(path) is None
    database.save(path)
    first = stamp(path)
    database.add_user("carol", "carol-secret")
    database.save(path)
    assert stamp(path) not in (None, first)


# ---- passwords and SCRAM ----------------------------------------------------------------------------

def test_verify_plain_accepts_the_right_password_only(database):
    assert database.verify_plain("bob", "bob-secret-phrase")
    assert not database.verify_plain("bob", "alice-secret")
    assert not database.verify_plain("bob", "")
    assert not database.verify_plain("nobody", "bob-secret-phrase")


def test_verify_plain_derives_a_key_for_an_unknown_user_too(database, monkeypatch):
    derived = []
    real = users_module.derive
    monkeypatch.setattr(users_module, "derive", lambda *args: derived.append(args[1]) or real(*args))
    assert not database.verify_plain("nobody", "guess")
    assert not database.verify_plain("bob", "guess")
    assert derived == [ITERATIONS_DEFAULT, ITERATIONS_DEFAULT]


def test_set_password_replaces_the_old_one(database):
    database.set_password("bob", "new-secret-phrase", iterations=8192)
    assert database.verify_plain("bob", "new-secret-phrase")
    assert not database.verify_plain("bob", "bob-secret-phrase")
    assert database.scram_auth_info("bob")[3] == 8192


def _scram_login(database: UserDatabase, user: str, password: str) -> None:
    server = scramp.ScramMechanism("SCRAM-SHA-256").make_server(database.scram_auth_info)
    client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    server.set_client_final(client.get_client_final())
    client.set_server_final(server.get_server_final())


def test_scram_auth_info_lets_a_scramp_server_authenticate_a_scramp_client(database, path):
    database.save(path)
    _scram_login(UserDatabase.load(path), "bob", "bob-secret-phrase")


def test_a_scramp_server_refuses_a_wrong_password_and_an_unknown_user(database):
    with pytest.raises(scramp.ScramException):
        _scram_login(database, "bob", "wrong")
    with pytest.raises(scramp.ScramException):
        _scram_login(database, "nobody", "bob-secret-phrase")
    assert database.scram_auth_info("nobody") is None


def test_scram_auth_info_is_salt_stored_key_server_key_iterations(database):
    salt, stored_key, server_key, iterations = database.scram_auth_info("bob")
    assert (type(salt), type(stored_key), type(server_key), type(iterations)) == (bytes, bytes, bytes, int)
    assert (salt, stored_key, server_key, iterations) == scramp.ScramMechanism().make_auth_info(
        "bob-secret-phrase", iteration_count=iterations, salt=salt)


# ---- editing rules ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, problem", [
    ("", "1..255 characters"),
    ("x" * 256, "1..255 characters"),
    ("bo\tb", "control character"),
    (ANONYMOUS, "reserved"),
])
def test_bad_user_names_are_refused(database, name, problem):
    with pytest.raises(InvalidConfig, match=problem):
        database.add_user(name, "secret")


@pytest.mark.parametrize("password, iterations, problem", [
    ("", ITERATIONS_DEFAULT, "must not be empty"),
    ("x" * 1025, ITERATIONS_DEFAULT, "longer than 1024"),
    ("secret-pass-phrase", 4095, "4096..10000000"),
])
def test_bad_passwords_and_iterations_are_refused(database, password, iterations, problem):
    with pytest.raises(InvalidConfig, match=problem):
        database.add_user("carol", password, iterations=iterations)


def test_user_changes_name_existing_and_missing_users(database):
    with pytest.raises(AlreadyExists):
        database.add_user("bob", "again")
    with pytest.raises(NotFound):
        database.delete_user("nobody")
    with pytest.raises(NotFound):
        database.set_password("nobody", "secret")
    with pytest.raises(InvalidConfig, match="unknown role 'nope'"):
        database.add_user("carol", "secret", ["nope"])
    database.delete_user("bob")
    assert [name for name, _ in database.users()] == ["alice"]


def test_set_roles_replaces_a_users_roles_or_the_anonymous_ones(database):
    database.set_roles("bob", [ADMINISTRATOR, "orders-writer"])
    assert dict(database.users())["bob"] == (ADMINISTRATOR, "orders-writer")
    database.set_roles(ANONYMOUS, ["orders-writer"])
    assert database.anonymous_roles == ("orders-writer",)


def test_a_role_in_use_cannot_be_deleted(database):
    with pytest.raises(NotAllowed, match="still given to bob"):
        database.delete_role("orders-writer")
    database.set_roles("bob", [])
    database.delete_role("orders-writer")
    assert database.roles() == {}
    with pytest.raises(NotFound):
        database.delete_role("orders-writer")


def test_administrator_cannot_be_redefined_or_deleted(database):
    with pytest.raises(InvalidConfig, match="built in"):
        database.set_role(ADMINISTRATOR, WRITER)
    with pytest.raises(InvalidConfig, match="built in"):
        database.delete_role(ADMINISTRATOR)


# ---- the first administrator ------------------------------------------------------------------------

def test_bootstrap_creates_the_file_with_the_default_user_as_administrator(path):
    assert bootstrap(path, {DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_ENV: "s3cret-pass-phrase"}) == "admin"
    database = UserDatabase.load(path)
    assert database.users() == [("admin", (ADMINISTRATOR,))]
    assert database.verify_plain("admin", "s3cret-pass-phrase")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_bootstrap_reads_a_password_file_stripping_one_trailing_newline(path, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret-pass-phrase \n")
    assert bootstrap(path, {DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_FILE_ENV: str(secret)}) == "admin"
    assert UserDatabase.load(path).verify_plain("admin", "s3cret-pass-phrase ")


def test_bootstrap_strips_only_one_newline_and_refuses_the_next(path, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret-pass-phrase\n\n")  # SASLprep forbids control characters in a password
    with pytest.raises(InvalidConfig, match="control characters") as caught:
        bootstrap(path, {DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_FILE_ENV: str(secret)})
    assert caught.value.key == DEFAULT_PASSWORD_FILE_ENV


def test_bootstrap_leaves_an_existing_file_alone(database, path):
    database.save(path)
    before = open(path).read()
    assert bootstrap(path, {DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_ENV: "s3cret-pass-phrase"}) is None
    assert open(path).read() == before


def test_bootstrap_without_the_variables_creates_nothing(path):
    assert bootstrap(path, {}) is None
    assert not os.path.exists(path)


@pytest.mark.parametrize("environ, culprit", [
    ({DEFAULT_USER_ENV: "admin"}, DEFAULT_PASSWORD_ENV),
    ({DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_ENV: ""}, DEFAULT_PASSWORD_ENV),
    ({DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_ENV: "a", DEFAULT_PASSWORD_FILE_ENV: "/x"}, DEFAULT_PASSWORD_ENV),
    ({DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_FILE_ENV: "/nonexistent/password"}, DEFAULT_PASSWORD_FILE_ENV),
    ({DEFAULT_PASSWORD_ENV: "s3cret-pass-phrase"}, DEFAULT_USER_ENV),
    ({DEFAULT_USER_ENV: "ad\nmin", DEFAULT_PASSWORD_ENV: "s3cret-pass-phrase"}, DEFAULT_USER_ENV),
])
def test_bootstrap_names_the_variable_at_fault_and_creates_nothing(path, environ, culprit):
    with pytest.raises(InvalidConfig) as caught:
        bootstrap(path, environ)
    assert caught.value.key == culprit
    assert not os.path.exists(path)


def test_bootstrap_refuses_an_empty_password_file(path, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("\n")
    with pytest.raises(InvalidConfig) as caught:
        bootstrap(path, {DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_FILE_ENV: str(secret)})
    assert caught.value.key == DEFAULT_PASSWORD_FILE_ENV


# ---- malformed files ---------------------------------------------------------------------------------

def _without(data: dict, *keys) -> dict:
    data = copy.deepcopy(data)
    target = data
    for key in keys[:-1]:
        target = target[key]
    del target[keys[-1]]
    return data


def _with(data: dict, *keys_and_value) -> dict:
    data = copy.deepcopy(data)
    *keys, last, value = keys_and_value
    target = data
    for key in keys:
        target = target[key]
    target[last] = value
    return data


MALFORMED = [
    (lambda d: [], "users.json: must be a JSON object"),
    (lambda d: _with(d, "extra", 1), "users.json: extra: unknown key"),
    (lambda d: _without(d, "version"), "users.json: version: must be 1, found None"),
    (lambda d: _with(d, "version", 2), "users.json: version: must be 1, found 2"),
    (lambda d: _with(d, "version", True), "users.json: version: must be 1"),
    (lambda d: _with(d, "roles", []), "users.json: roles: must be a JSON object"),
    (lambda d: _with(d, "roles", "orders-writer", []), "users.json: roles.orders-writer: must be a list of at least"),
    (lambda d: _with(d, "roles", "orders-writer", 0, "extra", 1),
     "users.json: roles.orders-writer.0.extra: unknown key"),
    (lambda d: _with(d, "roles", "orders-writer", 0, "permissions", ["sned"]),
     "users.json: roles.orders-writer.0.permissions: unknown permission 'sned'"),
    (lambda d: _with(d, "roles", "orders-writer", 0, "permissions", "send"),
     "users.json: roles.orders-writer.0.permissions: must be a list of strings"),
    (lambda d: _with(d, "roles", "orders-writer", 0, "queues", ["ord*"]),
     "users.json: roles.orders-writer.0.queues: queue pattern 'ord*'"),
    (lambda d: _with(d, "roles", "orders-writer", 0, "queues", []),
     "users.json: roles.orders-writer.0.queues: a grant needs"),
    (lambda d: _with(d, "roles", ADMINISTRATOR, d["roles"]["orders-writer"]),
     "users.json: roles.administrator: is built in"),
    (lambda d: _with(d, "roles", "", d["roles"]["orders-writer"]), "users.json: roles.: a name must be"),
    (lambda d: _with(d, "anonymous_roles", ["x"]), "users.json: anonymous_roles: unknown role 'x'"),
    (lambda d: _with(d, "anonymous_roles", "orders-writer"), "users.json: anonymous_roles: must be a list"),
    (lambda d: _with(d, "users", "bob", "roles", ["x"]), "users.json: users.bob.roles: unknown role 'x'"),
    (lambda d: _with(d, "users", "bob", "extra", 1), "users.json: users.bob.extra: unknown key"),
    (lambda d: _with(d, "users", ANONYMOUS, d["users"]["bob"]), "users.json: users.anonymous: 'anonymous' is reserved"),
    (lambda d: _with(d, "users", "bo\x01b", d["users"]["bob"]), "control character"),
    (lambda d: _without(d, "users", "bob", "scram_sha_256"), "users.json: users.bob.scram_sha_256: missing"),
    (lambda d: _without(d, "users", "bob", "scram_sha_256", "server_key"),
     "users.json: users.bob.scram_sha_256.server_key: missing"),
    (lambda d: _with(d, "users", "bob", "scram_sha_256", "password", "x"),
     "users.json: users.bob.scram_sha_256.password: unknown key"),
    (lambda d: _with(d, "users", "bob", "scram_sha_256", "salt", "not base64!"),
     "users.json: users.bob.scram_sha_256.salt: not valid base64"),
    (lambda d: _with(d, "users", "bob", "scram_sha_256", "salt", "c2hvcnQ="),
     "users.json: users.bob.scram_sha_256.salt: must be at least 12 bytes"),
    (lambda d: _with(d, "users", "bob", "scram_sha_256", "stored_key", "c2hvcnQ="),
     "users.json: users.bob.scram_sha_256.stored_key: must be 32 bytes"),
    (lambda d: _with(d, "users", "bob", "scram_sha_256", "server_key", 7),
     "users.json: users.bob.scram_sha_256.server_key: must be a base64 string"),
    (lambda d: _with(d, "users", "bob", "scram_sha_256", "iterations", 1000),
     "users.json: users.bob.scram_sha_256.iterations: must be an integer 4096..10000000"),
    (lambda d: _with(d, "users", "bob", "scram_sha_256", "iterations", "4096"),
     "users.json: users.bob.scram_sha_256.iterations: must be an integer"),
]


@pytest.mark.parametrize("malform, message", MALFORMED)
def test_a_malformed_file_is_refused_naming_the_file_and_the_key(database, path, malform, message):
    with open(path, "w") as file:
        json.dump(malform(database.to_dict()), file)
    with pytest.raises(InvalidConfig) as caught:
        UserDatabase.load(path)
    description = caught.value.description
    assert description.startswith(path)
    assert message.removeprefix("users.json") in description


@pytest.mark.parametrize("text, problem", [
    ("{", "not valid JSON"),
    ('{"version": 1, "version": 1}', "the key 'version' appears twice"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_a_file_that_is_not_json_is_refused_naming_the_file(path, text, problem):
    with open(path, "wb") as file:
        file.write(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InvalidConfig, match=problem) as caught:
        UserDatabase.load(path)
    assert caught.value.key == path


def test_a_missing_file_is_refused_saying_how_to_create_one(path):
    with pytest.raises(InvalidConfig, match="no users file here; `grouper user add NAME --role administrator`"):
        UserDatabase.load(path)
