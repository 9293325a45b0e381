"""The delivery audit's input: the log files, read in one Spark scan, and their lines checked.

The logs are JSON lines; any file may hold any kind of line, told apart by "kind":
  send, delivery: exactly as tests/drills/checker.py describes them (its docstring is the contract).
  attach, written by a consumer when the node has opened its receiving link:
    {"kind": "attach", "consumer": str, "node": str, "queue": str, "at_ms": int}
  detach, written by a consumer when its link or connection has ended (closed, lost or refused), stamped
  when the end began (its own close, or the node's detach of its link; the node may give the groups
  away before the close completes):
    {"kind": "detach", "consumer": str, "node": str, "queue": str, "at_ms": int, "condition": str | null}
  admin, written by whoever ran a management command that frees groups (`grouper group reset`, `group move`):
    {"kind": "admin", "action": "reset" | "move" | str, "queue": str, "group": str | null (every group),
     "at_ms": int}
  enqueue, written only by a node tracing a queue (node/amqp/tracer.py), where the message entered its queue
  (a forwarded one: at its group's node). Counted (the report's "lines"), judged by nothing: the send line
  of the producer's node says whether the node took the message:
    {"kind": "enqueue", "node": str, "queue": str, "group": str | null, "producer": str | null,
     "sequence": int | null, "at_ms": int}
  A node tracing a queue writes its send, delivery, attach and detach lines in these same formats (its own
  clock; README "Auditing deliveries"), so its trace files are judged as client logs are.

Rules:
- At most one malformed line per file is allowed: a writer killed mid-line leaves one torn tail.
  More, or a line of an unknown kind, is an AuditInputError naming the file.
- A line's log order (LOG_ORDER) is its file's place in the paths given, then its place in the file:
  the verdicts break ties of equal stamps with it, as tests/drills/checker.py does.
- Only Spark reads the lines; the driver collects counts per file and kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

KINDS = ("send", "delivery", "attach", "detach", "admin", "enqueue")
LOG_ORDER = ["file_index", "block_start_bytes", "row_id"]  # the files as given, then line by line
MALFORMED_LINES_PER_FILE_MAX = 1  # a torn last line
SHUFFLE_PARTITION_INPUT_BYTES = 64 * 1024 * 1024  # of JSON logs per shuffle partition
SHUFFLE_PARTITIONS_MIN, SHUFFLE_PARTITIONS_MAX = 2, 2000


LINE_SCHEMA = StructType([StructField(name, kind) for name, kind in [
    ("kind", StringType()), ("queue", StringType()), ("group", StringType()), ("producer", StringType()),
    ("sequence", LongType()), ("consumer", StringType()), ("outcome", StringType()),
    ("sent_ms", LongType()), ("received_ms", LongType()), ("settled_ms", LongType()),
    ("delivery_count", LongType()), ("settle_confirmed", BooleanType()), ("at_ms", LongType()),
    ("action", StringType()), ("after_close", BooleanType()), ("_corrupt_record", StringType())]])


class AuditInputError(ValueError):
    """The logs cannot be judged: a file is missing or holds lines the job cannot read."""


@dataclass(frozen=True)
class LogFiles:
    send_paths: tuple[Path, ...]
    log_paths: tuple[Path, ...]

    @classmethod
    def of(cls, log_paths: Iterable[str | Path], send_paths: Iterable[str | Path] = ()) -> "LogFiles":
        files = cls(_expand(send_paths), _expand(log_paths))
        if not files.log_paths:
            raise AuditInputError("no delivery log given: name at least one JSON-lines file or directory")
        return files

    @property
    def all_paths(self) -> tuple[Path, ...]:
        return (*self.send_paths, *self.log_paths)


def _expand(paths: Iterable[str | Path]) -> tuple[Path, ...]:
    """Files as given; a directory stands for its *.jsonl files, sorted by name."""
    expanded = []
    for path in map(Path, paths):
        if path.is_dir():
            expanded += sorted(path.glob("*.jsonl"))
        elif path.is_file():
            expanded.append(path)
        else:
            raise AuditInputError(f"{path}: no such file or directory; pass the drill's log files or their directory")
    return tuple(expanded)


def read_lines(spark: SparkSession, paths: tuple[Path, ...]) -> DataFrame:
    """Every file in one read: a frame per file, unioned, made a plan of one scan per file, and a rotated
    node trace is hundreds of files. A line's file_index is its file's place in `paths`, told by the
    name Spark reads it under (a file given twice takes its first place)."""
    index_by_uri: dict[str, int] = {}
    for index, path in enumerate(paths):
        index_by_uri.setdefault(path.resolve().as_uri(), index)
    index_of = F.create_map(*[F.lit(value) for uri, index in index_by_uri.items() for value in (uri, index)])
    # Spark gives each small file a task of its own; every stage after would pay for each. The columns
    # are made in the scan, before the tasks are merged, so row_id still grows line by line in a block
    tasks = _partitions_for(sum(path.stat().st_size for path in paths))
    return (spark.read.schema(LINE_SCHEMA).json([str(path) for path in paths])
            .select("*", index_of[F.input_file_name()].alias("file_index"),
                    F.input_file_block_start().alias("block_start_bytes"),
                    F.monotonically_increasing_id().alias("row_id"))
            .coalesce(tasks))


def check_lines(lines: DataFrame, paths: tuple[Path, ...]) -> dict[str, int]:
    """Lines per kind; raises AuditInputError for unreadable lines or unknown kinds."""
    counts = (lines.groupBy("file_index", F.col("_corrupt_record").isNotNull().alias("malformed"), "kind")
              .count().collect())
    kinds: dict[str, int] = {}
    malformed: dict[int, int] = {}
    for row in counts:
        if row["file_index"] is None:  # a bug of ours, not of the logs: read_lines could not name the file
            raise AssertionError(f"{row['count']} lines read from a file not among {', '.join(map(str, paths))}")
        if row["malformed"]:
            malformed[row["file_index"]] = malformed.get(row["file_index"], 0) + row["count"]
        elif row["kind"] not in KINDS:
            raise AuditInputError(f"{paths[row['file_index']]}: {row['count']} lines of kind {row['kind']!r}; "
                                  f"the audit reads only {', '.join(KINDS)}")
        else:
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + row["count"]
    for index, count in sorted(malformed.items()):
        if count > MALFORMED_LINES_PER_FILE_MAX:
            raise AuditInputError(f"{paths[index]}: {count} lines are not JSON objects of the log format; at most "
                                  f"{MALFORMED_LINES_PER_FILE_MAX} (a torn last line) is allowed per file")
    kinds["malformed"] = sum(malformed.values())
    return kinds


def shuffle_partitions(files: LogFiles) -> int:
    """One shuffle partition per SHUFFLE_PARTITION_INPUT_BYTES of logs: a few for a drill, hundreds for a
    day of traffic; every stage pays a task per partition, which dominates on small logs."""
    return _partitions_for(sum(path.stat().st_size for path in files.all_paths))


def _partitions_for(size_bytes: int) -> int:
    return max(SHUFFLE_PARTITIONS_MIN, min(SHUFFLE_PARTITIONS_MAX, size_bytes // SHUFFLE_PARTITION_INPUT_BYTES + 1))
