"""The "grouper" format's options: parsed and checked once, on the driver, before any task runs.

Rules:
- A mapping of strings in, a frozen dataclass out, or `OptionError` naming the option, what is
  wrong with its value (with the unit) and what to write instead. Pure but for the security
  options: the files and the variable they name are read once here, so a wrong path fails on the
  driver (pipeline/security.py; the tasks read them again where they run).
- There is no password option: a password in the options would show in Spark's plans and logs. It
  comes from a file (passwordFile) or an environment variable (passwordEnv).
- Spark passes option names case-insensitively; they are compared in lower case here. An unknown
  option is an error (a misspelt `groupColum` would otherwise be silently ignored).
- Limits are named constants with their unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.security import NO_SECURITY, CredentialError, Security, check_combination, check_files

TIMEOUT_MAX_MS = 3_600_000  # one wait for the node: connect, attach, credit, a settlement
WINDOW_MAX_MESSAGES = 100_000  # unsettled deliveries one sink task keeps in flight
READ_MAX_MESSAGES = 10_000_000  # messages one batch read may hold (they sit in memory until read)
LINKS_MAX = 1000  # consumer links one reader opens (each holds up to the node's link_unsettled_max)
PARTITIONS_MAX = 1000


class OptionError(ValueError):
    def __init__(self, option: str, problem: str):
        super().__init__(f"grouper option {option!r}: {problem}")
        self.option = option


@dataclass(frozen=True)
class Connect:
    nodes: tuple[str, ...]  # AMQP addresses host:port; a task uses one, trying the others if it is down
    queue: str
    timeout_ms: int  # longest wait for the node at any one step
    group_header: str  # "" = the group id is properties.group-id (or JMSXGroupID); else this property
    security: Security = field(default=NO_SECURITY)  # credentials and TLS (names and paths, never a password)

    def nodes_for_task(self, index: int) -> list[str]:
        """The nodes in the order task `index` tries them: spread over nodes, each tried once."""
        start = index % len(self.nodes)
        return list(self.nodes[start:] + self.nodes[:start])


@dataclass(frozen=True)
class SinkOptions:
    connect: Connect
    group_column: str
    body_column: str
    property_columns: tuple[str, ...]  # columns sent as application properties of the same name
    message_id_column: str  # "" = no message-id
    durable: bool  # the message header's durable flag
    window_messages: int  # unsettled deliveries per task


@dataclass(frozen=True)
class SourceOptions:
    connect: Connect
    browse: bool  # True: copies, nothing consumed; False: drain (consume, accept when read)
    max_messages: int  # a batch read stops after this many (over all partitions)
    idle_timeout_ms: int  # ...or when nothing has arrived for this long (0: when nothing is available now)
    partitions: int  # drain: competing consumers, one per Spark task
    link_unsettled_max: int  # the node's cap on unsettled deliveries per consumer link
    body_as_string: bool
    max_messages_per_batch: int  # streaming: a micro-batch holds at most this many


SECURITY_KEYS = {"user", "passwordfile", "passwordenv", "tls", "cafile", "certfile", "keyfile"}
_CONNECT_KEYS = {"nodes", "queue", "timeoutms", "groupheader"} | SECURITY_KEYS
_PASSWORD_KEYS = {"password", "passwd"}  # refused with a pointer to passwordFile and passwordEnv
SINK_KEYS = _CONNECT_KEYS | {"groupcolumn", "bodycolumn", "propertycolumns", "messageidcolumn", "durable",
                             "unsettledmaxmessages"}
SOURCE_KEYS = _CONNECT_KEYS | {"mode", "maxmessages", "idletimeoutms", "partitions", "linkunsettledmax",
                               "bodytype", "maxmessagesperbatch"}
SPARK_KEYS = {"path"}  # Spark adds `path` when load()/save() get one; it means nothing here
SPARK_OWNED_KEYS = {"checkpointlocation"}  # Spark's own streaming options, passed along to the source and sink


def _lower(options) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in dict(options).items()}


def _check_known(values: dict[str, str], known: set[str], kind: str) -> None:
    for key in sorted(values):
        if key in SPARK_KEYS:
            raise OptionError(key, f"the {kind} takes no path; name the queue with option 'queue'")
        if key in _PASSWORD_KEYS:
            raise OptionError(key, "a password is never an option (Spark shows options in plans and logs); put it "
                                   "in a file and give its path as passwordFile (e.g. a mounted Kubernetes Secret), "
                                   "or name an environment variable with passwordEnv")
        if key not in known and key not in SPARK_OWNED_KEYS:
            raise OptionError(key, f"unknown {kind} option; known options are "
                                   f"{', '.join(sorted(known))} (case does not matter)")


def _integer(values: dict[str, str], key: str, default: int, low: int, high: int, unit: str) -> int:
    text = values.get(key)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(key, f"{text!r} is not an integer number of {unit}") from None
    if not low <= value <= high:
        raise OptionError(key, f"{value} {unit} is out of range; use {low}..{high} {unit}")
    return value


def _boolean(values: dict[str, str], key: str, default: bool) -> bool:
    text = values.get(key)
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(key, f"{text!r} is not true or false")
    return lowered == "true"


def _name(values: dict[str, str], key: str, default: str) -> str:
    text = values.get(key, default).strip()
    if not text:
        raise OptionError(key, "must not be empty")
    return text


def _connect(values: dict[str, str]) -> Connect:
    if not values.get("nodes", "").strip():
        raise OptionError("nodes", "required: the AMQP address of one or more Grouper nodes, "
                                   "e.g. .option('nodes', '127.0.0.1:5672,127.0.0.1:5682')")
    nodes = tuple(part.strip() for part in values["nodes"].split(",") if part.strip())
    for node in nodes:
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError("nodes", f"{node!r} is not HOST:PORT (a node's AMQP address, e.g. 127.0.0.1:5672)")
    if not values.get("queue", "").strip():
        raise OptionError("queue", "required: the name of the Grouper queue")
    return Connect(nodes, values["queue"].strip(), _integer(values, "timeoutms", 30_000, 1, TIMEOUT_MAX_MS, "ms"),
                   values.get("groupheader", "").strip(), _security(values, nodes))


def _security(values: dict[str, str], nodes: tuple[str, ...]) -> Security:
    paths = {key: values.get(key, "").strip() for key in ("passwordfile", "passwordenv", "cafile", "certfile",
                                                          "keyfile")}
    for key in ("user", *paths):
        if key in values and not values[key].strip():
            raise OptionError(key, "is empty; leave the option out instead")
    security = Security(user=values.get("user", "").strip(), password_file=paths["passwordfile"],
                        password_env=paths["passwordenv"], ca_file=paths["cafile"], cert_file=paths["certfile"],
                        key_file=paths["keyfile"],
                        tls=_boolean(values, "tls", bool(paths["cafile"] or paths["certfile"])))
    try:
        check_combination(security, [node.rpartition(":")[0].strip("[]") for node in nodes])
        check_files(security)
    except CredentialError as error:
        raise OptionError(error.option, error.problem) from None
    return security


def parse_sink(options) -> SinkOptions:
    values = _lower(options)
    _check_known(values, SINK_KEYS, "sink")
    properties = tuple(part.strip() for part in values.get("propertycolumns", "").split(",") if part.strip())
    if len(set(properties)) != len(properties):
        raise OptionError("propertycolumns", f"names a column twice: {', '.join(properties)}")
    return SinkOptions(
        connect=_connect(values),
        group_column=_name(values, "groupcolumn", "group"),
        body_column=_name(values, "bodycolumn", "body"),
        property_columns=properties,
        message_id_column=values.get("messageidcolumn", "").strip(),
        durable=_boolean(values, "durable", True),
        window_messages=_integer(values, "unsettledmaxmessages", 1000, 1, WINDOW_MAX_MESSAGES, "messages"),
    )


def parse_source(options) -> SourceOptions:
    values = _lower(options)
    _check_known(values, SOURCE_KEYS, "source")
    mode = values.get("mode", "browse").strip().lower()
    if mode not in ("browse", "drain"):
        raise OptionError("mode", f"{values['mode']!r} is neither 'browse' (read copies, consume nothing) nor "
                                  f"'drain' (consume, accepting once the read is complete)")
    body_type = values.get("bodytype", "binary").strip().lower()
    if body_type not in ("binary", "string"):
        raise OptionError("bodytype", f"{values['bodytype']!r} is neither 'binary' nor 'string'")
    partitions = _integer(values, "partitions", 1, 1, PARTITIONS_MAX, "partitions")
    if mode == "browse" and partitions > 1:
        raise OptionError("partitions", "a browse reads every message, so several partitions would each read "
                                        "all of them; use 1, or mode 'drain' to split messages between tasks")
    link_unsettled_max = _integer(values, "linkunsettledmax", 1000, 1, 1_000_000, "messages")
    return SourceOptions(
        connect=_connect(values),
        browse=mode == "browse",
        max_messages=_integer(values, "maxmessages", 10_000, 1, READ_MAX_MESSAGES, "messages"),
        idle_timeout_ms=_integer(values, "idletimeoutms", 0, 0, TIMEOUT_MAX_MS, "ms"),
        partitions=partitions,
        link_unsettled_max=link_unsettled_max,
        body_as_string=body_type == "string",
        max_messages_per_batch=_integer(values, "maxmessagesperbatch", 500, 1, READ_MAX_MESSAGES, "messages"),
    )
