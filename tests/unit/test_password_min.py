"""A new password has at least password_chars_min characters (issue 26 finding 7: a one-character
administrator password was accepted): `grouper user add` and `passwd`, the first administrator from
the environment, and the setting itself. A login only compares: its length is never judged."""

from __future__ import annotations

import io

import pytest

from node import cli, config
from node.core.access.roles import ADMINISTRATOR
from node.core.errors import InvalidConfig
from node.users import DEFAULT_PASSWORD_ENV, DEFAULT_USER_ENV, PASSWORD_CHARS_MIN_DEFAULT, UserDatabase, bootstrap

LONG_ENOUGH = "twelve chars"


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GROUPER_PASSWORD_CHARS_MIN", raising=False)
    users_file = str(tmp_path / "users.json")

    def run_(*argv, stdin: str):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = cli.main([*argv, "--users-file", users_file])
        return (code, *capsys.readouterr())
    run_.users_file = users_file
    return run_


def test_the_default_minimum_is_twelve_characters_in_the_node_and_the_users_file():
    assert config.NodeConfig().password_chars_min == PASSWORD_CHARS_MIN_DEFAULT == len(LONG_ENOUGH) == 12


def test_user_add_refuses_a_one_character_administrator_password_saying_how_many_are_needed(run):
    code, _, err = run("user", "add", "admin", "--role", ADMINISTRATOR, "--password-stdin", stdin="x\n")
    assert code == 2
    assert "has 1 characters, fewer than the 12 required (password_chars_min)" in err
    assert run("user", "add", "admin", "--role", ADMINISTRATOR, "--password-stdin", stdin=LONG_ENOUGH + "\n")[0] == 0


def test_user_passwd_refuses_a_short_password_and_keeps_the_old_one(run):
    run("user", "add", "app", "--password-stdin", stdin=LONG_ENOUGH + "\n")
    code, _, err = run("user", "passwd", "app", "--password-stdin", stdin="eleven char\n")
    assert code == 2 and "has 11 characters" in err
    assert UserDatabase.load(run.users_file).verify_plain("app", LONG_ENOUGH)


def test_the_minimum_comes_from_the_environment_or_the_nodes_config_file(run, tmp_path, monkeypatch):
    node_config = tmp_path / "node.toml"
    node_config.write_text("[node]\npassword_chars_min = 20\n")
    code, _, err = run("user", "add", "a", "--config", str(node_config), "--password-stdin", stdin=LONG_ENOUGH + "\n")
    assert code == 2 and "fewer than the 20 required" in err
    monkeypatch.setenv("GROUPER_PASSWORD_CHARS_MIN", "4")
    assert run("user", "add", "a", "--config", str(node_config), "--password-stdin", stdin="four\n")[0] == 0


def test_the_first_administrator_from_the_environment_needs_the_minimum_too(tmp_path):
    path = str(tmp_path / "users.json")
    with pytest.raises(InvalidConfig, match="has 1 characters") as caught:
        bootstrap(path, {DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_ENV: "x"})
    assert caught.value.key == DEFAULT_PASSWORD_ENV
    assert bootstrap(path, {DEFAULT_USER_ENV: "admin", DEFAULT_PASSWORD_ENV: "x" * 5}, password_chars_min=5) == "admin"


def test_a_login_with_a_short_password_is_only_compared():
    database = UserDatabase()
    database.add_user("app", "abc", password_chars_min=3)
    assert database.verify_plain("app", "abc") and not database.verify_plain("app", "x")


@pytest.mark.parametrize("value", [0, 1025])
def test_a_minimum_that_cannot_be_met_or_checks_nothing_is_refused(value):
    with pytest.raises(InvalidConfig, match="password_chars_min: must be 1..1024"):
        config.load(None, {}, {"password_chars_min": value})
