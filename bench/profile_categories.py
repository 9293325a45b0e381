"""Where a node's CPU goes, by part of the code: the one table that charges a py-spy sample to a part
of Grouper (or of a library it runs), by the path of the sample's innermost frame that falls in one.

A part is a list of path prefixes, relative to the repository root or to site-packages: a module
moved within a package stays in its part, and a new package needs one line here. The first part
(in table order) with a prefix of the frame's path wins, so a narrower prefix goes above a wider
one ("node/core/cluster/" above "node/core/"). Also here: which samples wait rather than run (a
socket, a condition, the disk), which are not CPU and are left out of the shares. Reads nothing but
the journal's source (where it syncs): never a node, never a profile's file."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# (part, path prefixes): first match wins, innermost frame first
CATEGORIES = (
    ("journal (node/store/)", ("node/store/",)),
    ("peer forwarding: gRPC, protobuf, node/peer/", ("node/peer/", "grpc/", "google/protobuf/", "proto/")),
    ("raft (pysyncobj, handler/)", ("pysyncobj/", "handler/")),
    # the route cache and the outbound store serve forwarding only: they go where the protocol goes
    ("cluster protocol and routes (node/core/cluster/, node/cluster*.py)",
     ("node/core/cluster/", "node/cluster.py", "node/cluster_proposals.py", "node/core/group_map.py")),
    ("queues (node/core/dispatch/queue*)", ("node/core/dispatch/queue",)),
    ("dispatch core (node/core/: broker, access, settings, the node shell)", ("node/core/",)),
    ("AMQP engine loop (node/amqp/)", ("node/amqp/",)),
    ("proton event machinery and proton-c calls", ("proton/", "cproton", "_proton")),
    ("admin service (cluster status polls)", ("node/admin/",)),
    ("metrics and probes (node/http_port/)", ("node/http_port/", "node/http/", "prometheus_client/")),
)
# the parts a forwarded message adds, and the parts that move AMQP frames (the report's breakdown)
FORWARDING_CATEGORIES = (CATEGORIES[1][0], CATEGORIES[3][0])
AMQP_CATEGORIES = (CATEGORIES[6][0], CATEGORIES[7][0])

# A sample whose innermost frame waits (for a socket, a condition, a reply, the disk) is not CPU.
WAITING = re.compile(r"^(?:[\w.]*\.)?(?:wait|poll|select|_blocking|_serve|sleep|run_forever|_run_once|epoll_wait) \("
                     r"|^_worker \(concurrent/futures/thread\.py:81\)"
                     r"|fsync|__pthread_cond|pthread_cond|do_futex|__futex")
FRAME_PATH = re.compile(r"\((?P<path>[^:)]+)(?::\d+)?\)\s*$")
JOURNAL_SYNCING_MODULES = ("writer", "compaction", "recovery", "files")  # node/store/'s modules that sync


def fsync_frames(root: Path = REPO_ROOT) -> re.Pattern:
    """The journal's `os.fsync` and synced-write (`os.pwritev`, RWF_DSYNC) lines: py-spy shows a thread
    waiting for the disk there (C is not a frame)."""
    places = []
    for module in JOURNAL_SYNCING_MODULES:
        try:
            source = (root / "node" / "store" / f"{module}.py").read_text().splitlines()
        except OSError:
            continue
        places += [rf"{module}\.py:{number}" for number, line in enumerate(source, 1)
                   if "os.fsync(" in line or "os.pwritev(" in line]
    return re.compile(rf"node/store/(?:{'|'.join(places) or '0'})\)")


def frame_path(frame: str) -> str:
    """The path of 'function (path/to/file.py:line)', cut to the repository or to site-packages."""
    match = FRAME_PATH.search(frame)
    if not match:
        return ""
    path = match["path"]
    for marker in ("/site-packages/", "/dist-packages/", f"{REPO_ROOT}/"):
        if marker in path:
            return path[path.index(marker) + len(marker):]
    return path


def category(frames: list[str]) -> str:
    """The part of the innermost frame of `frames` (outermost first) that falls in one, else "other"."""
    for frame in reversed(frames):
        path = frame_path(frame)
        for name, prefixes in CATEGORIES:
            if path.startswith(prefixes):
                return name
    return "other"
