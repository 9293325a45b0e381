"""A secured node whose /metrics stay open (metrics_auth "open", the default) says so at start."""

from node.http_port.server import open_metrics_warning


def test_a_secured_node_says_at_start_when_its_metrics_are_open_beyond_this_machine():
    warning = open_metrics_warning("open", True, "0.0.0.0")
    assert "/metrics is open to anyone" in warning and 'metrics_auth = "basic"' in warning
    assert open_metrics_warning("basic", True, "0.0.0.0") is None
    assert open_metrics_warning("open", False, "0.0.0.0") is None  # an open node says it is open already
    assert open_metrics_warning("open", True, "127.0.0.1") is None
