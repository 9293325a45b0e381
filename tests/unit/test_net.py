"""Is a host this machine's loopback? One answer for the node, its tools, bench/ and the pipeline."""

from __future__ import annotations

import pytest

from node.net import is_loopback, is_loopback_address


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "::1%lo", "[::1%lo]", "localhost",
                                  "LocalHost"])
def test_loopback_addresses_and_localhost_are_loopback(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.1", "0.0.0.0", "::", "192.168.1.7", "fe80::1%eth0", "2001:db8::1",
                                  "node1", "localhost.example.com", "my-localhost", "127.0.0.1.example.com",
                                  "", None, "garbage!", "127.0.0.256", "[", "%lo", "::1:5672:x"])
def test_other_addresses_names_and_garbage_are_not(host):
    assert not is_loopback(host)


def test_a_name_is_never_resolved_even_one_that_points_at_this_machine():
    assert not is_loopback("ip6-localhost")  # /etc/hosts often maps it to ::1; another host's file may not


@pytest.mark.parametrize("address, loopback", [("127.0.0.1:5673", True), ("[::1]:5673", True),
                                               ("localhost:5674", True), ("10.1.2.3:5673", False),
                                               ("[2001:db8::1]:5673", False), ("node1:5674", False),
                                               (":5673", False), ("5673", False)])
def test_an_address_is_loopback_when_its_host_is(address, loopback):
    assert is_loopback_address(address) is loopback
