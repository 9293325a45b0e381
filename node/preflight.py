"""Start-up checks of one node (before anything listens) and the banner it prints once it serves.

Rules:
- Each check raises a `GrouperError` that names what is wrong and what to change; none changes anything.
- The banner is one write to stdout: tests and `grouper up` read the addresses from it, and the engine
  loop already logs to stderr (often the same pipe), so a line written in two parts could be split.
- `node` is a node.runtime.Node, taken as it comes (runtime imports this module, not back).
"""

from __future__ import annotations

import os
import socket
import sys

from node.config import NodeConfig
from node.core.errors import GrouperError


def check_port_free(host: str, port: int, what: str) -> None:
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener will: TIME_WAIT is no conflict
        probe.bind((host, port))
    except OSError as error:
        raise GrouperError(f"cannot listen for {what} on {host}:{port}: {error.strerror}; is another process "
                           f"using the port?") from None
    finally:
        probe.close()


def on_mounted_volume(path: str) -> bool:
    """True if `path` lies under a mount point other than /. A device comparison alone is not enough:
    on Docker's vfs driver a volume and the container's root are on the same host device."""
    try:
        with open("/proc/self/mountinfo") as handle:  # field 5: the mount point, octal-escaped
            points = [line.split()[4].encode().decode("unicode_escape") for line in handle if line.strip()]
    except OSError:  # no /proc: fall back to the device check
        return os.stat(path).st_dev != os.stat("/").st_dev
    return any(point != "/" and (path == point or path.startswith(point.rstrip("/") + "/")) for point in points)


def check_data_dir(config: NodeConfig) -> None:
    """With require_data_volume, the data dir must exist on a file system other than the root's."""
    if not config.require_data_volume:
        return
    path = os.path.abspath(config.data_dir)
    if not os.path.isdir(path):
        raise GrouperError(f"data dir {path} does not exist: mount the data volume there (require_data_volume "
                           f"is on, so it is not created)")
    if not on_mounted_volume(path):
        raise GrouperError(f"data dir {path} is on the root file system, not a mounted volume: its journal would "
                           f"vanish with the container; mount a volume there, or set require_data_volume false")


def print_banner(node) -> None:
    """The addresses this node listens on and how it is secured, then "ready"."""
    config = node.config
    banner = [f"amqp: {config.host}:{node.amqp_port}", f"admin: {config.host}:{node.admin_port}",
              f"http: {config.host}:{node.health.port}"]
    if node.amqps_port is not None:
        banner.append(f"amqps: {config.host}:{node.amqps_port}")
    banner.append(f"security: {node.security.describe()}")
    if node.cluster is not None:
        banner.append(f"node: {config.node_id}")
        from node.peer.cluster_secrets import describe
        if node.peer_port is not None:
            banner.append(f"peer: {config.host}:{node.peer_port}")
        banner.append(f"cluster security: {describe(node.cluster_tls, node.raft_secrets)}")
    banner.append("ready")
    # one write: the engine loop already serves and logs (to stderr, often the same pipe), and print()
    # writes a line and its newline apart, so a log line could land inside an address line
    sys.stdout.write("".join(line + "\n" for line in banner))
    sys.stdout.flush()
