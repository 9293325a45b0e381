"""What `grouper` answers when its surroundings are wrong: a bad environment variable, a stdout whose
reader went away (issue 25)."""

import os
import subprocess
import sys

import pytest

from node.cli import EXIT_BROKEN_PIPE
from node.config import load
from node.core.errors import InvalidConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("variable, value", [("GROUPER_AMQP_PORT", "five"), ("GROUPER_ALLOW_ANONYMOUS", "maybe")])
def test_a_bad_environment_variable_is_named_as_it_is_set(variable, value):
    with pytest.raises(InvalidConfig) as caught:
        load(environ={variable: value})
    assert caught.value.key == variable
    assert str(caught.value).startswith(f"{variable}: ")


def test_a_bad_flag_value_is_still_named_by_its_flag_key():
    with pytest.raises(InvalidConfig, match="^--amqp_port: expected an integer"):
        load(environ={}, overrides={"amqp_port": "five"})


@pytest.mark.parametrize("command, made", [
    (("certs", "ca", "--dir", "{dir}"), "ca.pem"),
    # the users commands map OSError to their own message: a pipe's reader gone is not a users-file fault
    (("user", "add", "alice", "--role", "administrator", "--password-stdin", "--data-dir", "{dir}"), "users.json"),
])
def test_a_command_whose_stdout_reader_went_away_exits_quietly(tmp_path, command, made):
    """`grouper ... | head -1` after head exited: no BrokenPipeError traceback, 141 as a shell shows."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command prints anything
    try:
        done = subprocess.run([sys.executable, "-m", "node.cli", *(part.format(dir=tmp_path) for part in command)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                              input="alice-password-long-enough\n", env={**os.environ, "PYTHONPATH": ROOT})
    finally:
        os.close(write_end)
    assert (tmp_path / made).exists()  # the command did its work; only its report had nowhere to go
    assert done.stderr == ""
    assert done.returncode == EXIT_BROKEN_PIPE
