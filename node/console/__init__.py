"""The web console on the node's HTTP port: one page (static/ in this package) and the JSON API it calls.

Rules:
- Owns nothing and reads no node state itself. Every answer comes from the node's own admin API,
  called in process (node.admin.local) as the browser: its credentials and its address, so the admin
  API's identification and throttle, its permissions (service.QUEUES_MANAGED), its spanning of the
  cluster, its messages and its one path into the engine loop (LoopControl through the bridge) apply
  unchanged. Only what the HTTP server's probe already serves comes from it, read as /readyz and
  /metrics read it: this node's readiness, its route decisions (count by outcome, percentiles) and its
  refusal counters. The overview, the queues summed cluster-wide, the rates and the hot groups are
  node.console.views' (issue 32).
- Credentials: HTTP basic auth in each /api call's Authorization header, checked here first by an
  Authenticator over the node's users file and its one failed-login throttle, keyed by the browser's
  address, so a refused password goes no further (and counts once). /api answers 401 without a
  WWW-Authenticate challenge, so the page shows its own login form rather than the browser's dialog.
  The page and its static files hold no data and are served to anyone. A node without users is open;
  /api/session says so and the page shows it.
- Actions are POSTs with a JSON body (Content-Type application/json: a form on another site cannot
  send one without a CORS preflight, which this server never grants), and need what the admin method
  needs: manage on the queue. The page asks for confirmation before it sends one. node.http_port.hosts
  checks Host and Origin before any of it (DNS rebinding, cross-site posts).
- Paths name only what to do (ROUTES); queue names and group ids travel in the query of a view and
  the body of an action, never in a path, which a browser normalises ("..", "%2e%2e").
- Answers are JSON. A failure is {"error": text} with the status from STATUS_BY_ADMIN_ERROR; the text
  is the admin API's, which says who is at fault and what to do. Nothing secret is ever sent back.
- Bounded: request bodies BODY_MAX_BYTES, group pages as node.admin.group_pages bounds them, member
  readiness asked with MEMBER_TIMEOUT_MS each.
"""

from __future__ import annotations

import json
import logging
from concurrent import futures
from importlib import resources
from urllib.parse import parse_qs

from node.admin.client import AdminClient, AdminError
from node.admin.callers import Authenticator, Unauthenticated
from node.admin.local import LocalAdmin
from node.core.errors import GrouperError
from node.core.dispatch.settings import QueueSettings
from node.console.overview import named_groups, node_name, percentiles
from node.console.views import Views

log = logging.getLogger("grouper.console")

JSON = "application/json; charset=utf-8"
BODY_MAX_BYTES = 64 * 1024  # a queue's settings are a few hundred bytes
MEMBER_TIMEOUT_MS = 1000  # each member's own status, asked for the cluster view's readiness column
PAGE_SIZE_DEFAULT = 50  # groups per page when the page does not say
STATIC_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
                "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
                "/console/chart.js": ("chart.js", "text/javascript; charset=utf-8"),
                "/console/console.css": ("console.css", "text/css; charset=utf-8")}
# the page's own files only: no inline script, nothing from elsewhere
STATIC_HEADERS = {"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
                  "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
API_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
# Every API is a method and a fixed path. A queue's name and a group's id travel in the query (views)
# or the JSON body (actions), never in the path: a browser resolves "." and ".." segments (and their
# encoded forms, %2e%2e) before it sends, so a group named ".." once turned ".../groups/../purge" into
# the whole queue's purge (issue 26)
ROUTES = {("GET", "/api/session"), ("GET", "/api/overview"), ("GET", "/api/cluster"), ("GET", "/api/queues"),
          ("GET", "/api/groups"),
          ("POST", "/api/queues"), ("POST", "/api/queues/delete"), ("POST", "/api/queues/purge"),
          ("POST", "/api/queues/reroute"), ("POST", "/api/groups/reset"), ("POST", "/api/groups/purge"),
          ("POST", "/api/groups/move")}
ROUTE_NAMES = ("GET /api/session", "/api/overview", "/api/cluster", "/api/queues",
               "/api/groups?queue=Q (&order=backlog|head_age|owner)", "and POSTs /api/queues "
               "(a queue's settings)", '/api/queues/delete, /api/queues/purge, /api/queues/reroute with {"queue": Q}',
               '/api/groups/reset, /api/groups/purge, /api/groups/move with {"queue": Q, "group": G}')
# the admin API's gRPC status -> HTTP status; absent: 500
STATUS_BY_ADMIN_ERROR = {
    "INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409, "FAILED_PRECONDITION": 409, "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504,
}


class ConsoleError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Console:
    def __init__(self, probe, security, admin_servicer, *, admin_credentials=None, admin_server_name: str = ""):
        """`probe`: what node.http_port's endpoints ask (readiness); `security`: node.security.Security or
        None (open); `admin_servicer`: this node's AdminServicer; the other members' admin ports are
        dialled with `admin_credentials` (TLS) and `admin_server_name`, as the members dial each other."""
        self._probe = probe
        self._security = security
        self._authenticator = Authenticator(security)
        self._admin_servicer = admin_servicer
        self._admin_credentials = admin_credentials
        self._admin_server_name = admin_server_name
        self._members_pool = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="console-members")
        self._views = Views(probe, self._members_pool, self._member_states)

    @staticmethod
    def serves(path: str) -> bool:
        return path in STATIC_FILES or path == "/api" or path.startswith("/api/")

    def answer(self, method: str, target: str, authorization: str | None, source: str, now_ms: int,
               content_type: str = "", body: bytes = b"") -> tuple[int, str, bytes, dict]:
        """(status, content type, body, headers) for `method` on `target` (path and query); `now_ms`: a
        monotonic clock (rates are measured on it)."""
        path, _, query = target.partition("?")
        if path in STATIC_FILES:
            if method != "GET":
                return _failure(405, f"{path} is a page: GET it")
            name, kind = STATIC_FILES[path]
            return 200, kind, resources.files(__package__).joinpath("static", name).read_bytes(), STATIC_HEADERS
        try:
            result = self._api(method, path, {key: values[-1] for key, values in parse_qs(query).items()},
                               authorization, source, now_ms, content_type, body)
            return 200, JSON, json.dumps(result).encode(), API_HEADERS
        except ConsoleError as error:
            return _failure(error.status, error.message)
        except AdminError as error:
            return _failure(STATUS_BY_ADMIN_ERROR.get(error.status, 500), error.message)
        except GrouperError as error:  # a setting the node's own check refused
            return _failure(400, error.description)

    def _api(self, method, path, query, authorization, source, now_ms, content_type, body):
        if method == "POST" and content_type.split(";")[0].strip().lower() != "application/json":
            raise ConsoleError(415, "console actions take a JSON body: send Content-Type application/json")
        if len(body) > BODY_MAX_BYTES:
            raise ConsoleError(413, f"the request body is over {BODY_MAX_BYTES} bytes; a queue's settings fit "
                                    f"in far less")
        if (method, path) not in ROUTES:
            raise ConsoleError(404, f"no console API {method} {path}: the page calls {', '.join(ROUTE_NAMES)}")
        caller = self._identify(authorization, source, now_ms)
        with LocalAdmin(self._admin_servicer, source, caller.forwarded) as admin:
            if method == "GET":
                return self._view(path, admin, caller, query, now_ms)
            return _act(path, admin, _json_object(body))

    def _view(self, path: str, admin: AdminClient, caller, query: dict, now_ms: int) -> dict:
        if path == "/api/session":
            return {"open": self._authenticator.open, "user": caller.user}
        if path == "/api/overview":
            return self._views.overview(admin, caller, now_ms)
        if path == "/api/cluster":
            return self._cluster(admin, caller)
        if path == "/api/queues":
            return self._views.queues(admin, now_ms)
        assert path == "/api/groups", path
        queue, prefix, node = _name(query, "queue", "query"), query.get("prefix", ""), query.get("node", "")
        position, page_size = _integer(query, "position", 0), _integer(query, "page_size", PAGE_SIZE_DEFAULT)
        if query.get("order"):  # hot groups: ranked on each member, merged (node.console.views)
            return self._views.ranked_groups(admin, queue, prefix, position, page_size, query["order"], node)
        page = admin.group_page(queue, prefix, position, page_size, node)
        return {**page, "groups": named_groups(page, node, {})}

    def _identify(self, authorization, source, now_ms):
        if authorization is None and not self._authenticator.open:
            raise ConsoleError(401, "this node has a users file: log in with the name and password of a user "
                                    "(`grouper user add` makes one)")
        try:
            return self._authenticator.identify(authorization, None, now_ms, source)
        except Unauthenticated as error:
            raise ConsoleError(401, error.description) from None

    def _cluster(self, admin: AdminClient, caller) -> dict:
        status = admin.cluster_status()
        states = self._member_states(status, caller)
        if status["clustered"]:
            status["route_decisions"] = self._route_decisions()
        for member in status["members"]:
            member["ready"], member["not_ready_reason"] = states[member["node"]][:2]
            member["name"] = node_name(member["node"], member.get("amqp_address", ""))
        return status

    def _member_states(self, status: dict, caller) -> dict:
        """{node: (ready, reason, last_applied, commit_index)}, each member asked at once, as it says of itself."""
        ready, reason = self._probe.readiness()
        asked = {member["node"]: self._members_pool.submit(self._member_readiness, member["admin_address"], caller)
                 for member in status["members"]
                 if status["clustered"] and member["node"] != status["node"] and member["admin_address"]}
        states = {status["node"]: (ready, reason, status.get("last_applied", 0), status.get("commit_index", 0))}
        for member in status["members"]:
            if member["node"] in asked:
                states[member["node"]] = asked[member["node"]].result()
            elif member["node"] not in states:
                states[member["node"]] = (False, "not registered yet", 0, 0)
        return states

    def _route_decisions(self) -> dict | None:
        """This node's waits for a group's route: count by outcome and latency percentiles (bucket
        bounds, as /metrics exports them); None when the engine loop does not answer in time."""
        try:
            cluster = self._probe.metrics_snapshot()["cluster"]
        except TimeoutError:
            return None
        return {"outcomes": dict(cluster["decisions"]),
                "latency_ms": percentiles(cluster["decision_latency"]),
                "raft_latency_ms": percentiles(cluster["raft_decision_latency"])}

    def _member_readiness(self, address: str, caller) -> tuple[bool, str, int, int]:
        """What a member says of itself: it answers, knows a leader and has a quorum; and its raft log's
        last applied and commit indexes (0, 0 when it does not answer)."""
        try:
            with AdminClient(address, MEMBER_TIMEOUT_MS, credentials=self._admin_credentials,
                             metadata=caller.forwarded, server_name=self._admin_server_name) as client:
                own = client.cluster_status(local_only=True)
        except AdminError as error:
            return False, f"does not answer: {error.message}", 0, 0
        indexes = own.get("last_applied", 0), own.get("commit_index", 0)
        if not own["leader"]:
            return (False, "knows no raft leader", *indexes)
        if not own["has_quorum"]:
            return (False, "has no quorum", *indexes)
        return (True, "", *indexes)

def _failure(status: int, message: str) -> tuple[int, str, bytes, dict]:
    return status, JSON, json.dumps({"error": message}).encode(), API_HEADERS


def _act(path: str, admin: AdminClient, body: dict) -> dict:
    """A POST: what it names is in `body`, the path says only what to do."""
    if path == "/api/queues":
        return {"queue": admin.add_queue(QueueSettings.from_dict(body, where="settings"))}
    queue = _name(body, "queue")
    if path == "/api/queues/delete":
        admin.delete_queue(queue, force=body.get("force") is True)
        return {"deleted": queue}
    if path == "/api/queues/purge":
        purged, left = admin.purge_queue(queue)
        return {"messages_purged": purged, "messages_left": left}
    if path == "/api/queues/reroute":
        return _reroute(admin, queue, body)
    group = body.get("group")
    if not isinstance(group, str):
        raise ConsoleError(400, f'{path} needs {{"queue": QUEUE, "group": GROUP}} in its body: "group" is the '
                                f'group id (a string), got {type(group).__name__}')
    if path == "/api/groups/reset":
        return {"groups_reset": admin.reset_groups(queue, group)}
    if path == "/api/groups/purge":
        return {"messages_purged": admin.purge_group(queue, group, None)}
    assert path == "/api/groups/move", path
    destination = body.get("destination")
    if not isinstance(destination, str) or not destination:
        raise ConsoleError(400, 'a move needs {"destination": QUEUE} in its body: the queue to move the group\'s '
                                'available messages to')
    return {"messages_moved": admin.move_group(queue, group, destination, None)}


def _name(values: dict, key: str, where: str = "body") -> str:
    """A queue's name from the body (or the query): a non-empty string."""
    value = values.get(key)
    if not isinstance(value, str) or not value:
        raise ConsoleError(400, f'the request\'s {where} needs "{key}": the name of the queue to act on or show '
                                f"(a non-empty string), got {value!r}"[:300])
    return value


def _reroute(admin: AdminClient, queue: str, body: dict) -> dict:
    """{"to": ADDRESS, "group": G (optional), "count": N (optional)}: as `grouper queue reroute`."""
    destination, group, count = body.get("to"), body.get("group"), body.get("count")
    if not isinstance(destination, str) or not destination:
        raise ConsoleError(400, 'a reroute needs {"to": ADDRESS} in its body: the queue or multicast address to '
                                'move the messages to')
    if group is not None and not isinstance(group, str):
        raise ConsoleError(400, f'"group" must be a group id (a string) or absent, got {type(group).__name__}')
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise ConsoleError(400, f'"count" must be a whole number >= 1 or absent (every message), got {count!r}')
    moved, stayed, reason = admin.reroute_queue(queue, destination, group, count)
    return {"messages_moved": moved, "messages_stayed": stayed, "stayed_reason": reason}


def _json_object(body: bytes) -> dict:
    try:
        value = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as error:
        raise ConsoleError(400, f"the request body is not JSON ({error}); send a JSON object") from None
    if not isinstance(value, dict):
        raise ConsoleError(400, f"the request body is JSON {type(value).__name__}; send a JSON object")
    return value


def _integer(query: dict, key: str, default: int) -> int:
    text = query.get(key)
    if text is None:
        return default
    if not text.isascii() or not text.isdigit():
        raise ConsoleError(400, f"query parameter {key}: expected a whole number >= 0, got {text[:40]!r}")
    return int(text)
