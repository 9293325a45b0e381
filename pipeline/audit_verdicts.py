"""The delivery audit's verdicts, as frames of (queue, group, example), the same as tests/drills/checker.py's.

Rules:
- Per queue: lost, duplicates (and the "declared" ones, redelivered with delivery-count > 0), order
  violations (first acceptances out of order, and redeliveries after a later confirmed acceptance),
  exclusivity violations (a hold overlapping another consumer's earlier hold), refused delivered,
  unexpected, and the legal unconfirmed_delivered. The last four, and lost, need send logs.
- A consumer change (a delivery of a group to another consumer than its previous delivery's) gets the
  reason pipeline/audit.py's header gives: an admin action, consumer_gone, rebalance or unexplained.
- Only Spark operators: the frames are plans over pipeline/audit.py's persisted frames; nothing is
  collected here.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.audit_input import LOG_ORDER

REFUSED_OUTCOMES = ("rejected", "released", "modified")
NO_QUEUE = "(no queue)"  # the report's name for lines without a queue
IDENTITY = ["producer", "group", "sequence"]


def queue_column() -> F.Column:
    return F.coalesce(F.col("queue"), F.lit(NO_QUEUE))


def flag(condition) -> F.Column:
    return F.when(condition, 1).otherwise(0)


def identity_text() -> F.Column:
    return F.concat_ws("", F.coalesce("producer", F.lit("?")), F.lit("/"), F.coalesce("group", F.lit("?")),
                       F.lit("#"), F.coalesce(F.col("sequence").cast("string"), F.lit("?")))


class Verdicts:
    """The verdicts and consumer changes over one judgement's frames: identities, deliveries, each
    group's timeline and the attach, detach and admin events."""

    def __init__(self, identities: DataFrame, deliveries: DataFrame, timeline: DataFrame, events: DataFrame,
                 sends_logged: bool):
        self.identities, self.deliveries, self.timeline, self.events = identities, deliveries, timeline, events
        self.sends_logged = sends_logged

    def _identity_verdict(self, condition) -> DataFrame:
        return self.identities.filter(condition).select("queue", "group", identity_text().alias("example"))

    def frames(self) -> dict[str, DataFrame]:
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
        changes = last_event_before(changes, events.filter(F.col("kind") == "detach"), ["queue", "previous_consumer"],
                                     "consumer", "last_detach")
        changes = last_event_before(changes, events.filter(F.col("kind") == "attach"), ["queue"], None, "last_attach")
        admin = events.filter(F.col("kind") == "admin")
        changes = last_event_before(changes, admin.filter(F.col("group").isNotNull()), ["queue", "group"], None,
                                     "last_group_admin")
        changes = last_event_before(changes, admin.filter(F.col("group").isNull()), ["queue"], None,
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


def last_event_before(changes: DataFrame, events: DataFrame, keys: list[str], event_key: str | None,
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
