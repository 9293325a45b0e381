"""The delivery audit job: judges drill delivery logs on Spark, per queue, as tests/drills/checker.py judges them.

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
- The verdicts and their counts equal checker.py's on the same lines, per queue: lost, duplicates,
  order violations (first acceptances out of order, and redeliveries after a later confirmed
  acceptance), exclusivity violations (a hold overlapping another consumer's earlier hold), refused
  delivered, unexpected, and the legal unconfirmed_delivered. Log order breaks ties of equal stamps as
  in the checker: the files as given (send files first), then line by line. A message's identity is
  (producer, group, sequence) and lives in one queue (a producer sends to one queue); an identity
  with a null part matches no send.
- Without send logs the job judges nothing that needs them (lost, refused delivered, unexpected,
  send-to-receive latency) and takes every delivered identity as accepted by the node, so the order
  checks still run; the report says so.
- Beyond the checker, per queue: duplicates whose every later delivery carried delivery-count > 0
  ("declared" redeliveries), groups whose consumer changed and why, the spread of groups and
  deliveries over consumers, latency percentiles. A consumer change is a delivery of a group to a
  consumer other than the one that received the group's previous delivery (by received_ms, then
  settled_ms, then log order). Its reason, looked for between the previous delivery's and this
  one's received_ms: an admin action on the group or the whole queue, else "consumer_gone" (the
  previous consumer detached, or its previous delivery was dropped or left unconfirmed by a lost
  connection), else "rebalance" (some consumer attached to the queue meanwhile), else
  "unexplained" (normal in shared queues, where a group is free whenever none of its messages is
  unsettled).
- Only Spark operators touch the lines (windows, aggregations, joins); the driver collects small
  per-queue and per-consumer aggregates and a few examples of each verdict, never the logs.
- At most one malformed line per file is allowed: a writer killed mid-line leaves one torn tail.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Iterable

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from pipeline import audit_chart, audit_report
from pipeline.audit_progress import AuditProgress

EXAMPLES_MAX = 5  # examples of each verdict per queue
PERCENTILES = (0.5, 0.9, 0.99)
PERCENTILE_ACCURACY = 10_000  # percentile_approx: relative error 1/10,000 of the row count
REFUSED_OUTCOMES = ("rejected", "released", "modified")
KINDS = ("send", "delivery", "attach", "detach", "admin", "enqueue")
NO_QUEUE = "(no queue)"  # the report's name for lines without a queue
IDENTITY = ["producer", "group", "sequence"]
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


def audit(spark: SparkSession, files: LogFiles) -> dict:
    """The report (plain data, see pipeline.audit_report) of the logs in `files`."""
    lines = _read(spark, files.all_paths).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with AuditProgress(spark, 1 + _Judgement.STEPS) as progress:
            progress.step("reading the lines")
            kinds = _check_lines(lines, files.all_paths)
            sends_logged = bool(files.send_paths) or kinds.get("send", 0) > 0
            return _Judgement(lines, sends_logged).report(files, kinds, progress)
    finally:
        lines.unpersist()


def _read(spark: SparkSession, paths: tuple[Path, ...]) -> DataFrame:
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


def _check_lines(lines: DataFrame, paths: tuple[Path, ...]) -> dict[str, int]:
    """Lines per kind; raises AuditInputError for unreadable lines or unknown kinds."""
    counts = (lines.groupBy("file_index", F.col("_corrupt_record").isNotNull().alias("malformed"), "kind")
              .count().collect())
    kinds: dict[str, int] = {}
    malformed: dict[int, int] = {}
    for row in counts:
        if row["file_index"] is None:  # a bug of ours, not of the logs: _read could not name the file
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


def _queue() -> F.Column:
    return F.coalesce(F.col("queue"), F.lit(NO_QUEUE))


def _flag(condition) -> F.Column:
    return F.when(condition, 1).otherwise(0)


def _identity_text() -> F.Column:
    return F.concat_ws("", F.coalesce("producer", F.lit("?")), F.lit("/"), F.coalesce("group", F.lit("?")),
                       F.lit("#"), F.coalesce(F.col("sequence").cast("string"), F.lit("?")))


class _Judgement:
    """The job's frames over one read of the logs; `report()` runs it, in STEPS."""

    STEPS = 4  # the progress.step calls of report()

    def __init__(self, lines: DataFrame, sends_logged: bool):
        self.sends_logged = sends_logged
        self.lines = lines
        self.deliveries = self._deliveries(lines).persist(StorageLevel.MEMORY_AND_DISK)
        self.sends = lines.filter(F.col("kind") == "send").select(
            _queue().alias("queue"), *IDENTITY, "sent_ms", "outcome", *LOG_ORDER)
        self.identities = self._identities().persist(StorageLevel.MEMORY_AND_DISK)
        self.events = lines.filter(F.col("kind").isin("attach", "detach", "admin")).select(
            "kind", _queue().alias("queue"), "group", "consumer", "action", "at_ms").persist()
        self.timeline = self._timeline().persist(StorageLevel.MEMORY_AND_DISK)

    def unpersist(self) -> None:
        for frame in (self.deliveries, self.identities, self.events, self.timeline):
            frame.unpersist()

    # ---- frames -------------------------------------------------------------------------------------

    @staticmethod
    def _deliveries(lines: DataFrame) -> DataFrame:
        by_identity = Window.partitionBy(*IDENTITY).orderBy("received_ms", *LOG_ORDER)
        # a line marked after_close never reached a consumer that could hold it: the checker leaves it out too
        return (lines.filter((F.col("kind") == "delivery") & ~F.coalesce("after_close", F.lit(False)))
                .select(_queue().alias("queue"), *IDENTITY, "consumer", "received_ms", "settled_ms", "outcome",
                        F.coalesce("delivery_count", F.lit(0)).alias("delivery_count"),
                        F.coalesce("settle_confirmed", F.lit(True)).alias("confirmed"), *LOG_ORDER)
                .withColumn("index", F.row_number().over(by_identity) - 1)
                .withColumn("redelivery", (F.col("index") > 0) | (F.col("delivery_count") > 0))
                .withColumn("accepted", F.col("outcome") == "accepted")
                .withColumn("confirmed_acceptance", F.col("accepted") & F.col("confirmed")))

    def _timeline(self) -> DataFrame:
        """Each group's deliveries in order (received_ms, then settled_ms, then log order) with what came
        before them: the previous delivery (for consumer changes) and the run of holds they belong to.

        A hold is a confirmed, settled delivery; a run is a maximal sequence of one consumer's holds in
        that order. Consumer changes and overlapping holds share this one shuffle and sort."""
        in_group = Window.partitionBy("queue", "group").orderBy("received_ms", "settled_ms", *LOG_ORDER)
        before = in_group.rowsBetween(Window.unboundedPreceding, -1)
        hold = (F.col("confirmed") & (F.col("outcome") != "dropped") & F.col("settled_ms").isNotNull()
                & F.col("consumer").isNotNull())  # a hold nobody is named for clashes with no one
        starts_run = F.col("hold") & (F.col("previous_holder").isNull() | (F.col("previous_holder") != F.col("consumer")))
        return (self.deliveries
                .select("queue", "group", "consumer", "received_ms", "settled_ms", hold.alias("hold"),
                        _identity_text().alias("identity"), *LOG_ORDER,
                        F.lag("consumer").over(in_group).alias("previous_consumer"),
                        F.lag("received_ms").over(in_group).alias("previous_received_ms"),
                        F.lag((F.col("outcome") == "dropped") | ~F.col("confirmed")).over(in_group)
                        .alias("previous_lost"),
                        F.last(F.when(hold, F.col("consumer")), ignorenulls=True).over(before).alias("previous_holder"))
                .withColumn("run", F.sum(_flag(starts_run)).over(in_group.rowsBetween(Window.unboundedPreceding,
                                                                                     Window.currentRow)))
                .drop("previous_holder"))

    def _identities(self) -> DataFrame:
        """One row per identity delivered or sent: what its deliveries and its send say."""
        accepted, confirmed = F.col("accepted"), F.col("confirmed_acceptance")
        delivered = self.deliveries.groupBy(*IDENTITY).agg(
            F.min_by("queue", "index").alias("delivered_queue"),
            F.min_by("consumer", "index").alias("first_consumer"),
            F.min("received_ms").alias("first_received_ms"),
            F.count(F.lit(1)).alias("lines"),
            F.max(_flag(accepted)).alias("any_accepted"),
            F.min(F.when(accepted, F.col("received_ms"))).alias("first_accepted_ms"),
            F.sum(_flag(confirmed)).alias("confirmed_acceptances"),
            F.min(F.when(confirmed, F.col("received_ms"))).alias("first_confirmed_received_ms"),
            F.min(F.when(confirmed, F.col("settled_ms"))).alias("first_confirmed_settled_ms"),
            F.max("received_ms").alias("last_received_ms"),
            F.min(F.when(F.col("index") > 0, _flag(F.col("delivery_count") > 0))).alias("later_all_declared"))
        if not self.sends_logged:
            return (delivered.withColumn("queue", F.col("delivered_queue"))
                    .withColumn("send_outcome", F.lit(None).cast("string"))
                    .withColumn("sent_ms", F.lit(None).cast("long"))
                    .withColumn("accepted_send", F.lit(True)))
        # a producer logs each identity once; should one appear twice, the node's acceptance wins
        sent = self.sends.groupBy(*IDENTITY).agg(
            F.max_by("queue", F.struct(*LOG_ORDER)).alias("send_queue"),
            F.when(F.max(_flag(F.col("outcome") == "accepted")) == 1, F.lit("accepted"))
            .otherwise(F.max_by("outcome", F.struct(*LOG_ORDER))).alias("send_outcome"),
            F.min(F.when(F.col("outcome") == "accepted", F.col("sent_ms"))).alias("sent_ms"))
        return (delivered.join(sent, IDENTITY, "full_outer")
                .withColumn("queue", F.coalesce("send_queue", "delivered_queue"))
                .withColumn("accepted_send", F.coalesce(F.col("send_outcome") == "accepted", F.lit(False))))

    # ---- verdicts: frames of (queue, group, example) ------------------------------------------------

    def _identity_verdict(self, condition) -> DataFrame:
        return self.identities.filter(condition).select("queue", "group", _identity_text().alias("example"))

    def verdicts(self) -> dict[str, DataFrame]:
        delivered = F.col("lines").isNotNull()
        frames = {
            "duplicates": self._identity_verdict(
                (F.col("confirmed_acceptances") > 1) | ((F.col("confirmed_acceptances") >= 1)
                                                        & (F.col("last_received_ms") > F.col("first_confirmed_received_ms")))),
            "order_violations": self._first_acceptances_out_of_order().unionByName(
                self._redeliveries_after_later_acceptances()),
            "exclusivity_violations": self._overlapping_holds(),
        }
        frames["duplicates_declared"] = self._identity_verdict(
            F.col("later_all_declared") == 1).join(frames["duplicates"], ["queue", "group", "example"], "left_semi")
        if self.sends_logged:
            frames["lost"] = self._identity_verdict(F.col("accepted_send") & (F.coalesce("any_accepted", F.lit(0)) == 0))
            frames["refused_delivered"] = self._identity_verdict(delivered & F.col("send_outcome").isin(*REFUSED_OUTCOMES))
            frames["unexpected"] = self._identity_verdict(delivered & F.col("send_outcome").isNull())
            frames["unconfirmed_delivered"] = self._identity_verdict(delivered & (F.col("send_outcome") == "timeout"))
        return frames

    def _first_acceptances_out_of_order(self) -> DataFrame:
        stream = Window.partitionBy("queue", "group", "producer").orderBy("first_accepted_ms", "sequence")
        earlier = stream.rowsBetween(Window.unboundedPreceding, -1)
        return (self.identities.filter(F.col("accepted_send") & (F.col("any_accepted") == 1))
                .withColumn("highest", F.greatest(F.coalesce(F.max("sequence").over(earlier), F.lit(0)), F.lit(0)))
                .filter(F.col("sequence") < F.col("highest"))
                .select("queue", "group", F.format_string("%s/%s/%s: #%d first accepted after #%d", "queue", "group",
                                                          "producer", "sequence", "highest").alias("example")))

    def _redeliveries_after_later_acceptances(self) -> DataFrame:
        """A redelivery of s received after a confirmed acceptance of t > s was sent (settled) strictly earlier."""
        accepted = self.identities.filter("accepted_send")
        redeliveries = (self.deliveries.filter("redelivery").select(*IDENTITY, "received_ms")
                        .join(accepted.select(*IDENTITY, "queue"), IDENTITY)
                        .select("queue", "group", "producer", "sequence", F.col("received_ms").alias("at_ms"),
                                F.lit(0).alias("is_acceptance")))
        # redeliveries are rare: only their streams' acceptances are needed, not every message's
        streams = redeliveries.select("queue", "group", "producer").distinct()
        acceptances = (accepted.filter(F.col("confirmed_acceptances") > 0)
                       .join(streams, ["queue", "group", "producer"], "left_semi")
                       .select("queue", "group", "producer", "sequence",
                               F.col("first_confirmed_settled_ms").alias("at_ms"), F.lit(1).alias("is_acceptance")))
        # at equal times a redelivery sorts first: only acceptances settled strictly earlier count
        timeline = Window.partitionBy("queue", "group", "producer").orderBy("at_ms", "is_acceptance").rowsBetween(
            Window.unboundedPreceding, Window.currentRow)
        return (acceptances.unionByName(redeliveries)
                .withColumn("highest", F.max(F.when(F.col("is_acceptance") == 1, F.col("sequence"))).over(timeline))
                .filter((F.col("is_acceptance") == 0) & F.col("highest").isNotNull())
                .withColumn("highest", F.greatest("highest", F.lit(0)))
                .filter(F.col("highest") > F.col("sequence"))
                .select("queue", "group", "producer", "sequence", "highest").distinct()
                .select("queue", "group", F.format_string("%s/%s/%s: #%d redelivered after the acceptance of #%d",
                                                          "queue", "group", "producer", "sequence", "highest")
                        .alias("example")))

    def _overlapping_holds(self) -> DataFrame:
        """Holds received while another consumer still held an earlier hold of the group.

        Every earlier hold of another consumer lies in an earlier run, so what other consumers held
        before a hold is known per run: for each run and each other consumer of the group, the latest
        end of that consumer's earlier runs. Runs are few (one per change of consumer), so the cost
        is one pass over the holds, not holds times consumers."""
        holds = self.timeline.filter("hold")
        runs = holds.groupBy("queue", "group", "run").agg(F.first("consumer").alias("consumer"),
                                                         F.max("settled_ms").alias("until_ms"))
        shared = (runs.groupBy("queue", "group").agg(F.collect_set("consumer").alias("consumers"))
                  .filter(F.size("consumers") > 1))
        earlier_runs = Window.partitionBy("queue", "group", "other").orderBy("run").rowsBetween(
            Window.unboundedPreceding, -1)
        others = (runs.join(shared, ["queue", "group"])
                  .withColumn("other", F.explode("consumers"))
                  .withColumn("other_held_until_ms", F.max(F.when(F.col("consumer") == F.col("other"),
                                                                  F.col("until_ms"))).over(earlier_runs))
                  .filter((F.col("consumer") != F.col("other")) & F.col("other_held_until_ms").isNotNull())
                  .select("queue", "group", "run", "other", "other_held_until_ms"))
        runs_held_until = others.groupBy("queue", "group", "run").agg(
            F.max("other_held_until_ms").alias("others_held_until_ms"))
        overlapping = (holds.join(runs_held_until, ["queue", "group", "run"])
                       .filter(F.col("others_held_until_ms") > F.col("received_ms")))
        # overlapping holds are few: naming the other consumers joins them again
        return (overlapping.join(others, ["queue", "group", "run"])
                .filter(F.col("other_held_until_ms") > F.col("received_ms"))
                .groupBy("queue", "group", *LOG_ORDER)
                .agg(F.format_string("%s/%s: %s received %s at %d while %s held the group until %d", F.first("queue"),
                                     F.first("group"), F.first("consumer"), F.first("identity"),
                                     F.first("received_ms"), F.min("other"), F.max("other_held_until_ms"))
                     .alias("example"))
                .select("queue", "group", "example"))

    # ---- consumer changes ---------------------------------------------------------------------------

    def consumer_changes(self) -> DataFrame:
        """(queue, group, reason, example) per change of a group's consumer."""
        changes = (self.timeline
                   .select("queue", "group", "consumer", "received_ms", "previous_consumer", "previous_received_ms",
                           "previous_lost")
                   .filter(F.col("previous_consumer").isNotNull() & (F.col("consumer") != F.col("previous_consumer"))))
        events = self.events
        changes = _last_event_before(changes, events.filter(F.col("kind") == "detach"), ["queue", "previous_consumer"],
                                     "consumer", "last_detach")
        changes = _last_event_before(changes, events.filter(F.col("kind") == "attach"), ["queue"], None, "last_attach")
        admin = events.filter(F.col("kind") == "admin")
        changes = _last_event_before(changes, admin.filter(F.col("group").isNotNull()), ["queue", "group"], None,
                                     "last_group_admin")
        changes = _last_event_before(changes, admin.filter(F.col("group").isNull()), ["queue"], None,
                                     "last_queue_admin")
        since = F.col("previous_received_ms")
        admin_action = (F.when(F.col("last_group_admin.at_ms") >= since, F.col("last_group_admin.action"))
                        .when(F.col("last_queue_admin.at_ms") >= since, F.col("last_queue_admin.action")))
        reason = (F.when(admin_action.isNotNull(), admin_action)
                  .when(F.col("previous_lost") | (F.col("last_detach.at_ms") >= since), F.lit("consumer_gone"))
                  .when(F.col("last_attach.at_ms") >= since, F.lit("rebalance"))
                  .otherwise(F.lit("unexplained")))
        return changes.select("queue", "group", reason.alias("reason"), F.format_string(
            "%s/%s: %s -> %s at %d", "queue", "group", "previous_consumer", "consumer", "received_ms").alias("example"))

    # ---- spread and latency: one rollup each, rows per (queue, consumer) and per queue ------------------

    def delivery_stats(self) -> DataFrame:
        """Rows per (queue, consumer) (`level` 0) and per queue (`level` 1).

        No distinct count over the deliveries: next to percentile_approx it makes Spark expand every
        line and build a percentile sketch per (consumer, group) (measured on 1 M deliveries: this
        step took 49 s of a 126 s audit, 25 s without). Groups are counted on a small (queue,
        consumer, group) aggregate and joined."""
        held = F.when((F.col("outcome") != "dropped") & F.col("settled_ms").isNotNull(),
                      F.col("settled_ms") - F.col("received_ms"))
        figures = [F.count(F.lit(1)).alias("deliveries"), F.sum(_flag(F.col("accepted"))).alias("accepted"),
                   F.sum(_flag(F.col("redelivery"))).alias("redeliveries"), *_percentiles(held, "receive_to_settle_ms")]
        held_groups = self.deliveries.select("queue", "consumer", "group").distinct()
        figured = self.deliveries.groupBy("queue", "consumer").agg(*figures).alias("figured")
        counted = held_groups.groupBy("queue", "consumer").agg(F.count(F.lit(1)).alias("groups")).alias("counted")
        by_consumer = (figured.join(counted, (F.col("figured.queue") == F.col("counted.queue"))  # a null consumer too
                                    & F.col("figured.consumer").eqNullSafe(F.col("counted.consumer")))
                       .select("figured.*", "counted.groups")
                       .withColumn("consumers", F.lit(1)).withColumn("level", F.lit(0)))
        by_queue = (self.deliveries.groupBy("queue").agg(*figures)
                    .join(held_groups.groupBy("queue").agg(F.countDistinct("group").alias("groups")), "queue")
                    .withColumn("consumers", F.lit(None).cast("long")).withColumn("level", F.lit(1)))
        return by_consumer.unionByName(by_queue.withColumn("consumer", F.lit(None).cast("string")))

    def identity_stats(self) -> DataFrame:
        """Per queue (`level` 1) the identities delivered and accepted and send to receive; the latter also
        per queue and first consumer (`level` 0)."""
        latency = F.col("first_received_ms") - F.col("sent_ms")
        delivered = F.col("lines").isNotNull()
        identities = self.identities.withColumnRenamed("first_consumer", "consumer")
        by_consumer = (identities.filter(F.col("sent_ms").isNotNull() & delivered).groupBy("queue", "consumer")
                       .agg(F.lit(0).alias("level"), *_percentiles(latency, "send_to_receive_ms")))
        by_queue = identities.groupBy("queue").agg(
            F.sum(_flag(delivered)).alias("identities_delivered"),
            F.sum(F.coalesce("any_accepted", F.lit(0))).alias("delivered"), F.lit(1).alias("level"),
            *_percentiles(latency, "send_to_receive_ms"))
        return by_queue.withColumn("consumer", F.lit(None).cast("string")).unionByName(
            by_consumer, allowMissingColumns=True)

    def send_counts(self) -> DataFrame:
        return self.sends.groupBy("queue").agg(
            F.count(F.lit(1)).alias("lines"), F.sum(_flag(F.col("outcome") == "accepted")).alias("accepted"),
            F.sum(_flag(F.col("outcome").isin(*REFUSED_OUTCOMES))).alias("refused"),
            F.sum(_flag(F.col("outcome") == "timeout")).alias("timed_out"))

    # ---- the report -----------------------------------------------------------------------------------

    def findings(self) -> DataFrame:
        """Every verdict and consumer change as (finding, queue, group, example); "change" counts them all,
        "change:REASON" by reason."""
        frames = [frame.select(F.lit(name).alias("finding"), "queue", "group", "example")
                  for name, frame in self.verdicts().items()]
        changes = self.consumer_changes()
        frames.append(changes.select(F.lit("change").alias("finding"), "queue", "group", "example"))
        frames.append(changes.select(F.concat(F.lit("change:"), "reason").alias("finding"), "queue", "group",
                                     "example"))
        return reduce(DataFrame.unionByName, frames)

    def report(self, files: LogFiles, kinds: dict[str, int], progress: AuditProgress) -> dict:
        try:
            progress.step("delivery statistics")
            delivery_stats = _rows(self.delivery_stats())
            progress.step("identity statistics")
            identity_stats = _rows(self.identity_stats())
            progress.step("send counts")
            sends = _rows(self.send_counts()) if self.sends_logged else []
            progress.step("findings")
            findings = _counted(self.findings())
            return audit_report.assemble(files=files, kinds=kinds, sends_logged=self.sends_logged,
                                         delivery_stats=delivery_stats, identity_stats=identity_stats,
                                         sends=sends, findings=findings)
        finally:
            self.unpersist()


def _last_event_before(changes: DataFrame, events: DataFrame, keys: list[str], event_key: str | None,
                       name: str) -> DataFrame:
    """Adds `name` = struct(at_ms, action) of the last event at or before each change's received_ms,
    events and changes matched on `keys` (the events' column `event_key` standing for keys[-1])."""
    renamed = events.withColumnRenamed(event_key, keys[-1]) if event_key else events
    marks = renamed.select(*keys, F.col("at_ms").alias("timeline_ms"), F.lit(0).alias("is_change"),
                           F.struct("at_ms", "action").alias("mark"))
    rows = changes.select("*", F.col("received_ms").alias("timeline_ms"), F.lit(1).alias("is_change"),
                          F.lit(None).cast("struct<at_ms:bigint,action:string>").alias("mark"))
    timeline = Window.partitionBy(*keys).orderBy("timeline_ms", "is_change").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    return (rows.unionByName(marks, allowMissingColumns=True)
            .withColumn(name, F.max("mark").over(timeline))  # the latest at_ms: structs order by their first field
            .filter(F.col("is_change") == 1).drop("timeline_ms", "is_change", "mark"))


def _percentiles(column, name: str) -> list:
    return [F.percentile_approx(column, list(PERCENTILES), PERCENTILE_ACCURACY).alias(name),
            F.max(column).alias(f"{name}_max")]


def _rows(frame: DataFrame) -> list[dict]:
    return [row.asDict(recursive=True) for row in frame.collect()]


def _counted(frame: DataFrame) -> list[dict]:
    """Per finding and queue: the count, the groups involved and the first examples (sorted)."""
    first = Window.partitionBy("finding", "queue").orderBy("example")
    return _rows(frame.withColumn("rank", F.row_number().over(first))
                 .groupBy("finding", "queue")
                 .agg(F.count(F.lit(1)).alias("count"), F.countDistinct("group").alias("groups"),
                      F.sort_array(F.collect_list(F.when(F.col("rank") <= EXAMPLES_MAX, F.col("example"))))
                      .alias("examples")))


# ---- running it ------------------------------------------------------------------------------------

def session(driver_memory: str = "4g", master: str = "local[*]") -> SparkSession:
    """A local Spark session bound to loopback (else Spark binds the machine's external interface)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master(master).appName("grouper-audit")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", driver_memory)
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def shuffle_partitions(files: LogFiles) -> int:
    """One shuffle partition per SHUFFLE_PARTITION_INPUT_BYTES of logs: a few for a drill, hundreds for a
    day of traffic; every stage pays a task per partition, which dominates on small logs."""
    return _partitions_for(sum(path.stat().st_size for path in files.all_paths))


def _partitions_for(size_bytes: int) -> int:
    return max(SHUFFLE_PARTITIONS_MIN, min(SHUFFLE_PARTITIONS_MAX, size_bytes // SHUFFLE_PARTITION_INPUT_BYTES + 1))


def run(log_paths: Iterable[str | Path], send_paths: Iterable[str | Path] = (), *, spark: SparkSession | None = None,
        json_path: str | Path | None = None, text_path: str | Path | None = None,
        png_path: str | Path | None = None, driver_memory: str = "4g") -> dict:
    """Audit the logs; write the JSON report, text summary and chart where asked; return the report."""
    files = LogFiles.of(log_paths, send_paths)
    owned = spark is None and SparkSession.getActiveSession() is None  # stopped here, once the report is made
    if spark is None:
        spark = session(driver_memory)
        if owned:
            spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions(files)))
    try:
        report = audit(spark, files)
    finally:
        if owned:
            spark.stop()
    if json_path is not None:
        audit_report.write_json(report, Path(json_path))
    if text_path is not None:
        Path(text_path).write_text(audit_report.summary(report) + "\n")
    if png_path is not None:
        audit_chart.draw(report, Path(png_path))
    return report
