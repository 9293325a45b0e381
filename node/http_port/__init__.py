"""The node's HTTP port: server (the endpoints, TLS, who may read what), probes (what /readyz and
/metrics read of a running node), metrics (the Prometheus collector), hosts (the names the port answers
to). The web console (node/console) is served by it. Nothing here is imported by this package's
__init__: node.config imports node.http_port.hosts alone."""
