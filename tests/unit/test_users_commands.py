"""`grouper user` and `grouper role` on a users file in a temporary directory, through `node.cli.main`."""

from __future__ import annotations

import io
import json
import os
import stat

import pytest

from node import cli
from node.admin import users_commands
from node.core.access.roles import ADMINISTRATOR, ANONYMOUS, Permission
from node.users import UserDatabase

RELOAD_NOTE = "pick the change up while they run"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def users_file(tmp_path) -> str:
    return str(tmp_path / "users.json")


@pytest.fixture
def run(users_file, monkeypatch, capsys):
    """Runs `grouper ARGS --users-file FILE` with `stdin` as its standard input; returns (code, out, err)."""
    def run_(*argv, stdin: str = "", location: tuple = ("--users-file", users_file)):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = cli.main([*argv, *location])
        out, err = capsys.readouterr()
        return code, out, err
    return run_


@pytest.fixture
def populated(run):
    assert run("user", "add", "alice", "--role", ADMINISTRATOR, "--password-stdin", stdin="alice-secret\n")[0] == 0
    assert run("role", "set", "orders-writer", "--allow", "send:orders.*")[0] == 0
    assert run("user", "add", "bob", "--role", "orders-writer", "--password-stdin", stdin="bob-secret-phrase\n")[0] == 0


def load(users_file) -> UserDatabase:
    return UserDatabase.load(users_file)


# ---- user add ----------------------------------------------------------------------------------------

def test_user_add_creates_the_file_and_says_nodes_reload_it(run, users_file):
    code, out, err = run("user", "add", "alice", "--role", ADMINISTRATOR, "--password-stdin",
                         stdin="s3cret-pass-phrase\n")
    assert (code, err) == (0, "")
    assert out == (f"added user alice with roles administrator in {users_file}; nodes started with --users-file "
                   f"{users_file} pick the change up while they run\n")
    assert load(users_file).verify_plain("alice", "s3cret-pass-phrase")
    assert load(users_file).users() == [("alice", (ADMINISTRATOR,))]
    assert stat.S_IMODE(os.stat(users_file).st_mode) == 0o600
    assert "s3cret" not in open(users_file).read()


def test_data_dir_means_its_users_json_and_defaults_to_data(run, tmp_path, monkeypatch):
    assert run("user", "add", "alice", "--password-stdin", stdin="s3cret-pass-phrase\n",
               location=("--data-dir", str(tmp_path / "node0")))[0] == 0
    assert load(str(tmp_path / "node0" / "users.json")).users() == [("alice", ())]
    monkeypatch.chdir(tmp_path)
    assert run("user", "add", "bob", "--password-stdin", stdin="s3cret-pass-phrase\n", location=())[0] == 0
    assert load(str(tmp_path / "data" / "users.json")).users() == [("bob", ())]


def test_user_add_asks_twice_on_a_terminal(run, users_file, monkeypatch):
    answers = iter(["s3cret-pass-phrase", "s3cret-pass-phrase"])
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    monkeypatch.setattr("sys.stdin", Terminal())
    assert cli.main(["user", "add", "alice", "--users-file", users_file]) == 0
    assert load(users_file).verify_plain("alice", "s3cret-pass-phrase")


def test_two_different_entries_on_a_terminal_change_nothing(users_file, monkeypatch, capsys):
    answers = iter(["s3cret-pass-phrase", "s3cert-pass-phrase"])
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    monkeypatch.setattr("sys.stdin", Terminal())
    assert cli.main(["user", "add", "alice", "--users-file", users_file]) == 2
    assert "the two entries differ" in capsys.readouterr().err
    assert not os.path.exists(users_file)


def test_without_a_terminal_the_password_must_come_from_stdin(run, users_file):
    code, _, err = run("user", "add", "alice")
    assert code == 2
    assert "--password-stdin" in err
    assert not os.path.exists(users_file)


def test_an_empty_password_line_is_refused(run, users_file):
    code, _, err = run("user", "add", "alice", "--password-stdin", stdin="\n")
    assert code == 2
    assert "empty" in err
    assert not os.path.exists(users_file)


def test_a_password_is_never_taken_from_the_command_line(run):
    assert run("user", "add", "alice", "--password", "s3cret-pass-phrase")[0] == 2


def test_adding_an_existing_user_fails_without_asking_for_a_password(run, populated):
    code, _, err = run("user", "add", "bob", "--password-stdin", stdin="another-pass-phrase\n")
    assert code == 1
    assert "user 'bob' exists already; `grouper user passwd bob`" in err


def test_adding_with_an_unknown_role_is_bad_input_and_creates_nothing(run, users_file):
    code, _, err = run("user", "add", "alice", "--role", "nope", "--password-stdin", stdin="s3cret-pass-phrase\n")
    assert code == 2
    assert "unknown role 'nope'" in err
    assert not os.path.exists(users_file)


def test_a_bad_user_name_is_bad_input(run):
    code, _, err = run("user", "add", "bo\tb", "--password-stdin", stdin="s3cret-pass-phrase\n")
    assert code == 2
    assert "control character" in err


def test_data_dir_of_a_grouper_up_cluster_writes_the_file_its_nodes_read_and_says_so(run, tmp_path):
    cluster = tmp_path / "cluster"
    (cluster / "node0").mkdir(parents=True)  # as `grouper up --data-dir` leaves it
    code, out, err = run("user", "add", "alice", "--password-stdin", stdin="s3cret-pass-phrase\n",
                         location=("--data-dir", str(cluster)))
    assert (code, err) == (0, "")
    assert load(str(cluster / "users.json")).users() == [("alice", ())]
    assert out.endswith(f"the nodes of `grouper up --data-dir {cluster}` read it and pick the change up while "
                        f"they run\n")


def test_a_plain_data_dir_names_the_nodes_that_read_the_file_and_no_others(run, tmp_path):
    code, out, _ = run("user", "add", "alice", "--password-stdin", stdin="s3cret-pass-phrase\n",
                       location=("--data-dir", str(tmp_path / "node0")))
    assert code == 0
    assert out.endswith(f"a node started with --data-dir {tmp_path / 'node0'} (and no --users-file), or with "
                        f"--users-file {tmp_path / 'node0' / 'users.json'}, reads it and picks the change up while "
                        f"it runs\n")
    assert "running nodes" not in out


def test_the_default_data_dir_beside_a_grouper_up_cluster_warns_that_the_cluster_reads_another_file(
        run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "cluster" / "node0").mkdir(parents=True)
    code, _, err = run("user", "add", "alice", "--password-stdin", stdin="s3cret-pass-phrase\n", location=())
    assert code == 0
    assert "the `grouper up` cluster in ./data/cluster does not read ./data/users.json; for its nodes give " \
           "--data-dir ./data/cluster" in err


def test_iterations_below_the_minimum_are_bad_usage(run):
    code, _, err = run("user", "add", "alice", "--iterations", "1000", "--password-stdin", stdin="s3cret-pass-phrase\n")
    assert code == 2
    assert "--iterations" in err


# ---- user passwd, delete, roles, list ------------------------------------------------------------

def test_user_passwd_replaces_the_password(run, users_file, populated):
    code, out, _ = run("user", "passwd", "bob", "--iterations", "8192", "--password-stdin", stdin="new-secret-phrase\n")
    assert code == 0
    assert RELOAD_NOTE in out
    database = load(users_file)
    assert database.verify_plain("bob", "new-secret-phrase") and not database.verify_plain("bob", "bob-secret-phrase")
    assert database.scram_auth_info("bob")[3] == 8192


def test_user_passwd_of_an_unknown_user_fails(run, populated):
    code, _, err = run("user", "passwd", "nobody", "--password-stdin", stdin="s3cret-pass-phrase\n")
    assert code == 1
    assert "there is no user 'nobody'" in err


def test_user_delete_removes_the_user(run, users_file, populated):
    assert run("user", "delete", "bob")[0] == 0
    assert [name for name, _ in load(users_file).users()] == ["alice"]
    code, _, err = run("user", "delete", "bob")
    assert code == 1
    assert "there is no user 'bob'" in err


def test_user_roles_replaces_a_users_roles_and_the_anonymous_ones(run, users_file, populated):
    assert run("user", "roles", "bob", "--role", ADMINISTRATOR, "--role", "orders-writer")[0] == 0
    assert dict(load(users_file).users())["bob"] == (ADMINISTRATOR, "orders-writer")
    code, out, _ = run("user", "roles", ANONYMOUS, "--role", "orders-writer")
    assert code == 0
    assert out.startswith("set the roles of anonymous clients to orders-writer")
    assert load(users_file).access().allows(ANONYMOUS, Permission.SEND, "orders.eu")


def test_user_list_shows_names_and_roles_never_keys(run, populated):
    code, out, _ = run("user", "list")
    assert code == 0
    assert out.splitlines() == ["USER         ROLES", "alice        administrator", "bob          orders-writer",
                                "(anonymous)  (none)"]
    code, out, _ = run("user", "list", "--json")
    assert json.loads(out) == {"users": {"alice": [ADMINISTRATOR], "bob": ["orders-writer"]}, "anonymous_roles": []}
    assert "key" not in out and "salt" not in out


# ---- roles -------------------------------------------------------------------------------------------

def test_role_set_merges_allows_of_the_same_permissions(run, users_file):
    code, out, _ = run("role", "set", "shop", "--allow", "send,consume:orders.*", "--allow", "consume,send:carts.#",
                       "--allow", "browse:#")
    assert code == 0
    assert RELOAD_NOTE in out
    data = json.load(open(users_file))
    assert data["roles"]["shop"] == [{"permissions": ["consume", "send"], "queues": ["orders.*", "carts.#"]},
                                     {"permissions": ["browse"], "queues": ["#"]}]


def test_role_list_shows_the_built_in_administrator_and_the_grants(run, populated):
    code, out, _ = run("role", "list")
    assert code == 0
    assert out.splitlines() == ["ROLE                      GRANTS",
                                "administrator (built in)  browse,consume,create,manage,send:#",
                                "orders-writer             send:orders.*"]
    assert json.loads(run("role", "list", "--json")[1])["orders-writer"] == [
        {"permissions": ["send"], "queues": ["orders.*"]}]


@pytest.mark.parametrize("allow, problem", [
    ("send", "expected PERMISSIONS:PATTERN"),
    ("sned:orders", "unknown permission 'sned'"),
    ("send:ord*", "mixes a wildcard with text"),
    ("send:", "empty queue pattern"),
])
def test_a_bad_allow_is_bad_usage_naming_the_flag(run, users_file, allow, problem):
    code, _, err = run("role", "set", "shop", "--allow", allow)
    assert code == 2
    assert "--allow" in err and problem in err
    assert not os.path.exists(users_file)


def test_administrator_cannot_be_set_or_deleted(run, populated):
    assert run("role", "set", ADMINISTRATOR, "--allow", "send:#")[0] == 2
    code, _, err = run("role", "delete", ADMINISTRATOR)
    assert code == 2
    assert "built in" in err


def test_a_role_in_use_is_not_deleted(run, users_file, populated):
    code, _, err = run("role", "delete", "orders-writer")
    assert code == 1
    assert "still given to bob" in err
    assert run("user", "roles", "bob")[0] == 0
    assert run("role", "delete", "orders-writer")[0] == 0
    assert load(users_file).roles() == {}


# ---- the file ----------------------------------------------------------------------------------------

def test_commands_other_than_user_add_and_role_set_need_an_existing_file(run, users_file):
    for argv in (("user", "list"), ("user", "delete", "bob"), ("user", "roles", "bob"), ("role", "list"),
                 ("role", "delete", "r")):
        code, _, err = run(*argv)
        assert code == 1
        assert f"there is no users file at {users_file}" in err
        assert "grouper user add NAME --role administrator" in err
    assert not os.path.exists(users_file)


def test_a_malformed_file_is_bad_input_naming_the_key(run, users_file, populated):
    data = json.load(open(users_file))
    data["users"]["bob"]["roles"] = ["x"]
    json.dump(data, open(users_file, "w"))
    code, _, err = run("user", "list")
    assert code == 2
    assert f"{users_file}: users.bob.roles: unknown role 'x'" in err


def test_a_file_that_cannot_be_written_fails_saying_so(run, tmp_path):
    (tmp_path / "not-a-directory").write_text("")
    location = ("--users-file", str(tmp_path / "not-a-directory" / "users.json"))
    code, _, err = run("user", "add", "alice", "--password-stdin", stdin="s3cret-pass-phrase\n", location=location)
    assert code == 1
    assert "cannot read or write" in err and "Secret" in err


def test_users_file_and_data_dir_exclude_each_other(run, tmp_path):
    assert run("user", "list", "--data-dir", str(tmp_path))[0] == 2


def test_the_commands_are_registered_on_the_grouper_parser():
    assert users_commands.DATA_DIR_DEFAULT == "./data"
    assert cli.main(["user", "--help"]) == 0
    assert cli.main(["role", "--help"]) == 0
