"""node.http_port.hosts: the names the HTTP port answers to and the pages that may act through it."""

from __future__ import annotations

import pytest

from node.config import load
from node.core.errors import InvalidConfig
from node.http_port.hosts import HostPolicy, parse_names, split_host

QUICK_START = HostPolicy(("127.0.0.1", "", "build-host"))  # host, advertise_host, the machine's name
EVERYWHERE = HostPolicy(("0.0.0.0", "node0", "node0", "grouper.example", "broker.internal"))


@pytest.mark.parametrize("host", ["127.0.0.1:5675", "127.0.0.1", "localhost:5675", "LocalHost.:5675",
                                  "[::1]:5675", "[::1]", "build-host:5675", "10.0.0.7:5675", "[fe80::1]:80",
                                  "localhost:80"])
def test_addresses_loopback_names_and_the_nodes_own_names_are_answered(host):
    assert QUICK_START.refusal("GET", host, None) is None


@pytest.mark.parametrize("host", ["rebind.attacker.example:5675", "attacker.example", "127.0.0.1.nip.io:5675",
                                  "localhost.attacker.example", "[not-an-address]:5675", "127.0.0.1:notaport",
                                  "127.0.0.1:70000", "", "a b", "localhost:5675, evil.example",
                                  "grouper.example:5675"])
def test_any_other_name_is_a_misdirected_request_saying_what_to_do(host):
    refusal = QUICK_START.refusal("GET", host, None)
    assert refusal is not None and refusal.status == 421
    assert "http_allowed_hosts" in refusal.message and "DNS rebinding" in refusal.message


def test_a_node_bound_everywhere_answers_the_names_the_operator_lists():
    for host in ("node0:5675", "grouper.example", "broker.internal:443", "GROUPER.EXAMPLE.", "172.18.0.3:5675",
                 "localhost:5675"):
        assert EVERYWHERE.refusal("GET", host, None) is None, host
    assert EVERYWHERE.refusal("GET", "node1:5675", None).status == 421


def test_a_star_lets_every_name_in_and_still_checks_origins():
    anything = HostPolicy(("127.0.0.1", *parse_names("*")))
    assert anything.refusal("GET", "whatever.example:5675", None) is None
    assert anything.refusal("POST", "whatever.example:5675", "http://whatever.example:5675") is None
    assert anything.refusal("POST", "whatever.example:5675", "http://elsewhere.example").status == 403


def test_a_request_without_host_comes_from_no_browser_and_is_answered():
    assert QUICK_START.refusal("GET", None, None) is None
    assert QUICK_START.refusal("POST", None, None) is None


@pytest.mark.parametrize("host, origin", [("127.0.0.1:5675", "http://127.0.0.1:5675"),
                                          ("localhost:5675", "http://LOCALHOST:5675"),
                                          ("[::1]:5675", "http://[::1]:5675"),
                                          ("127.0.0.1", "http://127.0.0.1:80"),
                                          ("127.0.0.1:80", "http://127.0.0.1")])
def test_a_post_from_the_consoles_own_page_is_taken(host, origin):
    assert QUICK_START.refusal("POST", host, origin) is None


@pytest.mark.parametrize("origin", ["http://attacker.example", "http://127.0.0.1:5676", "https://127.0.0.1:5675",
                                    "null", "http://localhost:5675", "127.0.0.1:5675", "http://127.0.0.1:5675/",
                                    ""])
def test_a_post_from_any_other_page_is_forbidden_saying_where_to_act(origin):
    refusal = QUICK_START.refusal("POST", "127.0.0.1:5675", origin)
    assert refusal is not None and refusal.status == 403
    assert "Origin" in refusal.message and "http://127.0.0.1:5675/" in refusal.message


def test_reads_are_not_asked_for_an_origin_and_posts_without_one_are_left_to_the_console():
    for method in ("GET", "HEAD", "OPTIONS"):
        assert QUICK_START.refusal(method, "127.0.0.1:5675", "http://attacker.example") is None
    assert QUICK_START.refusal("POST", "127.0.0.1:5675", None) is None  # the JSON body rule holds there
    assert QUICK_START.refusal("DELETE", "127.0.0.1:5675", "http://attacker.example").status == 403


def test_an_https_port_takes_posts_from_its_https_pages_only():
    secure = HostPolicy(("127.0.0.1",), "https")
    assert secure.refusal("POST", "127.0.0.1:5675", "https://127.0.0.1:5675") is None
    assert secure.refusal("POST", "127.0.0.1", "https://127.0.0.1:443") is None
    assert secure.refusal("POST", "127.0.0.1:5675", "http://127.0.0.1:5675").status == 403


def test_split_host_reads_names_addresses_and_ports():
    assert split_host("Example.COM.:8080") == ("example.com", 8080)
    assert split_host("[::1]:5675") == ("::1", 5675)
    assert split_host("[::1]") == ("::1", None)
    assert split_host("::1") is None  # an IPv6 Host needs its brackets
    assert split_host("x" * 254) is None
    assert split_host("host:0") is None


def test_the_setting_takes_names_separated_by_commas_and_refuses_anything_else():
    assert parse_names(" grouper.example, Broker.Internal. ,,*") == ("grouper.example", "broker.internal", "*")
    assert parse_names("") == ()
    for bad in ("grouper.example:5675", "http://grouper.example", "two words"):
        with pytest.raises(ValueError, match="is not a host name"):
            parse_names(bad)


def test_the_node_config_reads_and_checks_http_allowed_hosts():
    assert load(environ={"GROUPER_HTTP_ALLOWED_HOSTS": "grouper.example"}).http_allowed_hosts == "grouper.example"
    assert load(environ={}).http_allowed_hosts == ""
    with pytest.raises(InvalidConfig, match="http_allowed_hosts: 'https://x' is not a host name"):
        load(environ={"GROUPER_HTTP_ALLOWED_HOSTS": "https://x"})



def test_the_node_flag_http_allowed_hosts_reaches_the_config():
    from node.cli import NODE_FLAG_KEYS, build_parser
    from node.config import load

    args = build_parser().parse_args(["node", "--http-allowed-hosts", "broker.example,grouper"])
    overrides = {key: getattr(args, key) for key in NODE_FLAG_KEYS}
    assert load(overrides=overrides, environ={}).http_allowed_hosts == "broker.example,grouper"
