"""How a node asks the members of a secured cluster (node.membership.call_options): the CLI's
variables, TLS from the node's own admin and cluster settings, and never a password in the clear."""

from __future__ import annotations

from dataclasses import replace

import pytest

from node import certs
from node.admin.callers import basic_metadata
from node.config import NodeConfig
from node.core.errors import InvalidConfig
from node.membership import call_options

LOOPBACK_MEMBERS = ["127.0.0.1:5674", "localhost:5684"]
REMOTE_MEMBERS = ["127.0.0.1:5674", "node1:5674"]


def test_without_variables_a_node_asks_without_credentials_or_tls():
    assert call_options(NodeConfig(), REMOTE_MEMBERS, {}) == {"credentials": None}


def test_the_user_and_password_go_in_the_calls_metadata():
    options = call_options(NodeConfig(), LOOPBACK_MEMBERS, {"GROUPER_USER": "admin", "GROUPER_PASSWORD": "pw"})
    assert options == {"credentials": None, "metadata": basic_metadata("admin", "pw")}


@pytest.mark.parametrize("environ, key", [({"GROUPER_USER": "admin"}, "GROUPER_PASSWORD"),
                                          ({"GROUPER_USER": "admin", "GROUPER_PASSWORD": ""}, "GROUPER_PASSWORD"),
                                          ({"GROUPER_PASSWORD": "pw"}, "GROUPER_USER")])
def test_half_the_credentials_is_refused_naming_the_missing_variable(environ, key):
    with pytest.raises(InvalidConfig) as raised:
        call_options(NodeConfig(), LOOPBACK_MEMBERS, environ)
    assert raised.value.key == key


def test_a_password_never_crosses_the_network_without_admin_tls():
    with pytest.raises(InvalidConfig, match="node1:5674 unencrypted: give this node admin TLS"):
        call_options(NodeConfig(), REMOTE_MEMBERS, {"GROUPER_USER": "admin", "GROUPER_PASSWORD": "pw"})


def test_with_admin_tls_the_members_are_asked_over_tls_with_the_shared_server_name(tmp_path):
    certs.make_ca(tmp_path)
    cert_file, key_file = certs.make_leaf(tmp_path, "node0")
    config = replace(NodeConfig(), admin_tls_cert_file=str(cert_file), admin_tls_key_file=str(key_file),
                     cluster_tls_ca_file=str(tmp_path / certs.CA_CERT_FILE), cluster_tls_server_name="grouper")
    options = call_options(config, REMOTE_MEMBERS, {"GROUPER_USER": "admin", "GROUPER_PASSWORD": "pw"})
    assert options["credentials"] is not None and options["server_name"] == "grouper"
    assert options["metadata"] == basic_metadata("admin", "pw")
