"""A node given only its AMQP port takes its HTTP port from it (node/config/loading.py HTTP_PORT_OFFSET)."""

import pytest

from node.config import HTTP_PORT_OFFSET, load
from node.core.errors import InvalidConfig


def test_without_ports_the_http_port_is_5675():
    assert load(environ={}).http_port == 5675


def test_an_amqp_port_alone_moves_the_http_port_with_it():
    assert load(environ={}, overrides={"amqp_port": 5682}).http_port == 5682 + HTTP_PORT_OFFSET == 5685
    assert load(environ={"GROUPER_AMQP_PORT": "6000"}).http_port == 6003


def test_an_amqp_port_of_0_asks_for_any_http_port_too():
    assert load(environ={}, overrides={"amqp_port": 0}).http_port == 0


def test_a_given_http_port_wins_from_any_source():
    assert load(environ={}, overrides={"amqp_port": 5682, "http_port": 9000}).http_port == 9000
    assert load(environ={"GROUPER_HTTP_PORT": "9001"}, overrides={"amqp_port": 5682}).http_port == 9001


def test_an_amqp_port_too_high_to_derive_from_says_to_give_the_http_port():
    with pytest.raises(InvalidConfig, match="--http-port"):
        load(environ={}, overrides={"amqp_port": 65534})
