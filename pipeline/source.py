"""The source: a queue's messages as rows, batch (`spark.read`) and streaming (`spark.readStream`).

Rules:
- Batch, mode "browse": one task reads copies of the available messages; nothing is consumed.
- Batch, mode "drain": each task is a competing consumer. It takes up to its share of
  `maxMessages`, hands every row to Spark, and only then accepts them all (waiting until the node
  has applied the accepts). If the read fails or Spark stops reading early, it releases them
  instead, in order, so each message goes back to its place in its group. The Data Source API
  tells a reader nothing about the rest of the job, so a failure downstream of a completed read
  does not bring the messages back: `drained()` accepts only after the caller's own work succeeded.
- A read ends at `maxMessages`, or when nothing has arrived for `idleTimeoutMs` (0: as soon as the
  node has nothing available, which a drain round trip tells without waiting).
- Streaming: the link that holds a micro-batch's messages lives in the driver's stream reader,
  because that is the object whose `commit` Spark calls. The reader takes messages in
  `latestOffset`, ships them to the tasks inside the input partitions, and accepts them when the
  batch is committed. A failed batch stops the query, and `stop` (or, if the driver dies, the
  dropped connection) releases what it held, in order: at-least-once.
- Offsets count messages taken by this reader. They cannot replay a batch after a restart: the
  messages of a batch that never committed were released when the old reader's connection
  closed and come back as redeliveries (`delivery_count` > 0) in later batches.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
import zlib

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from pipeline import messages
from pipeline.amqp_client import Acquisition, ClientError
from pipeline.options import LINKS_MAX, OptionError, SourceOptions, parse_source
from pipeline.sink import connect, task_identity

log = logging.getLogger("grouper.pipeline")

SCHEMA_BINARY = ("`group` string, body binary, properties map<string,string>, message_id string, "
                 "delivery_count int, enqueued_at timestamp")
SCHEMA_STRING = SCHEMA_BINARY.replace("body binary", "body string")


class SourceError(RuntimeError):
    """A read could not get its messages; the message names the node, the queue and the cause."""


def schema_text(options: SourceOptions) -> str:
    return SCHEMA_STRING if options.body_as_string else SCHEMA_BINARY


def _links_max(options: SourceOptions, max_messages: int) -> int:
    if options.browse:
        return 1
    return max(1, min(LINKS_MAX, -(-max_messages // options.link_unsettled_max)))


def _decode(options: SourceOptions, taken) -> list[tuple]:
    header, as_string = options.connect.group_header, options.body_as_string
    return [messages.decode(item.payload, header, as_string) for item in taken]


class ReadShare(InputPartition):
    def __init__(self, index: int, max_messages: int):
        super().__init__(index)
        self.index = index
        self.max_messages = max_messages


def read_share(options: SourceOptions, index: int, max_messages: int, name: str):
    """Rows of one batch-read task; a drain accepts them only after the last row was handed over."""
    queue = options.connect.queue
    try:
        connection = connect(options.connect, index, name)
    except ClientError as error:
        raise SourceError(f"grouper source, queue {queue!r}: {error}") from None
    acquisition = Acquisition(connection, queue, options.browse, options.link_unsettled_max,
                              _links_max(options, max_messages), name)
    completed = False
    try:
        try:
            taken = acquisition.take(max_messages, options.idle_timeout_ms)
            rows = _decode(options, taken)
        except ClientError as error:
            raise SourceError(f"grouper source: {error}") from None
        yield from rows
        if not options.browse:
            acquisition.accept(taken)
        completed = True
    finally:
        try:
            if not completed and not options.browse and not connection.failure:
                acquisition.release_all()  # in arrival order: each returns to its place in its group
        finally:
            connection.close()


@contextlib.contextmanager
def drained(spark, **options):
    """A DataFrame of messages taken from a queue, accepted only if the with-block succeeds.

    The messages are held by a link in this (the driver's) process while the block runs; an
    exception in the block releases them, in order. The rows pass through the driver, so bound
    them with maxMessages. Options are the source's, without mode and partitions."""
    for key in options:
        if key.lower() in ("mode", "partitions"):
            raise OptionError(key.lower(), "drained() always drains, in one reader; leave it out")
    parsed = parse_source({**options, "mode": "drain"})
    queue = parsed.connect.queue
    name = f"spark-drained-{uuid.uuid4().hex[:8]}"
    try:
        connection = connect(parsed.connect, 0, name)
    except ClientError as error:
        raise SourceError(f"grouper source, queue {queue!r}: {error}") from None
    acquisition = Acquisition(connection, queue, False, parsed.link_unsettled_max,
                              _links_max(parsed, parsed.max_messages), name)
    succeeded = False
    try:
        try:
            taken = acquisition.take(parsed.max_messages, parsed.idle_timeout_ms)
            rows = _decode(parsed, taken)
        except ClientError as error:
            raise SourceError(f"grouper source: {error}") from None
        yield spark.createDataFrame(rows, schema_text(parsed))
        acquisition.accept(taken)
        succeeded = True
    finally:
        try:
            if not succeeded and not connection.failure:
                acquisition.release_all()
        finally:
            connection.close()


class GrouperReader(DataSourceReader):
    def __init__(self, options: SourceOptions):
        self.options = options

    def partitions(self):
        count = self.options.partitions
        base, extra = divmod(self.options.max_messages, count)
        shares = [ReadShare(index, base + (1 if index < extra else 0)) for index in range(count)]
        return [share for share in shares if share.max_messages > 0]

    def read(self, partition: ReadShare):
        _, name = task_identity()
        yield from read_share(self.options, partition.index, partition.max_messages, name)


class BatchRows(InputPartition):
    """A slice of one micro-batch's messages, already decoded on the driver."""

    def __init__(self, rows: list[tuple]):
        super().__init__(len(rows))
        self.rows = rows


class GrouperStreamReader(DataSourceStreamReader):
    """Driver side of the streaming source. Spark also builds one on each executor, only to call
    `read`, so the constructor must not connect."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._connection = None
        self._acquisition: Acquisition | None = None
        self._held: list[tuple[int, object, tuple]] = []  # (offset, Taken, row), in arrival order
        self._received = 0  # offset of the last message taken

    def _connect(self) -> Acquisition:
        if self._acquisition is None:
            options = self.options
            name = f"spark-stream-{uuid.uuid4().hex[:8]}"
            try:
                self._connection = connect(options.connect, 0, name)
                # two micro-batches may be held at once: the last committed one is accepted only
                # when the next is planned (see latestOffset)
                self._acquisition = Acquisition(self._connection, options.connect.queue, False,
                                                options.link_unsettled_max,
                                                _links_max(options, 2 * options.max_messages), name)
            except ClientError as error:
                self._close()
                raise SourceError(f"grouper source, queue {options.connect.queue!r}: {error}") from None
        return self._acquisition

    def initialOffset(self) -> dict:
        return {"received": 0}

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.options.max_messages_per_batch)

    def latestOffset(self, start: dict, limit) -> dict:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        acquisition = self._connect()
        # Spark plans the next batch only once the previous one (ending at `start`) has completed
        # and is in its commit log, but calls commit() for it only when a batch with new data is
        # planned. Accepting here keeps a quiet queue's last batch from being redelivered after a stop.
        self._accept_through(start["received"])
        self._received = max(self._received, start["received"])
        if isinstance(limit, ReadMaxRows):
            count_max = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            count_max = self.options.max_messages  # still bounded: the driver holds them in memory
        else:
            count_max = self.options.max_messages_per_batch
        try:
            taken = acquisition.take(count_max, 0)
            rows = _decode(self.options, taken)
        except ClientError as error:
            raise SourceError(f"grouper source: {error}") from None
        for item, row in zip(taken, rows):
            self._received += 1
            self._held.append((self._received, item, row))
        return {"received": self._received}

    def partitions(self, start: dict, end: dict):
        first, last = start["received"], end["received"]
        rows = [row for offset, _, row in self._held if first < offset <= last]
        if not rows:
            if last > first:
                log.warning("grouper source: batch (%d, %d] is not held by this reader (a restart?); its "
                            "messages were released and come back as redeliveries", first, last)
            return []
        count = min(self.options.partitions, len(rows))
        slices: list[list[tuple]] = [[] for _ in range(count)]
        for row in rows:  # a group's messages stay together, in arrival order
            group = row[0]
            slices[zlib.crc32(group.encode("utf-8")) % count if group is not None else 0].append(row)
        return [BatchRows(chunk) for chunk in slices if chunk]

    def read(self, partition: BatchRows):
        return iter(partition.rows)

    def commit(self, end: dict) -> None:
        self._accept_through(end["received"])

    def _accept_through(self, offset: int) -> None:
        done = [item for received, item, _ in self._held if received <= offset]
        if not done:
            return
        try:
            self._acquisition.accept(done)
        except ClientError as error:
            raise SourceError(f"grouper source: accepting a committed batch failed: {error}") from None
        self._held = [entry for entry in self._held if entry[0] > offset]

    def stop(self) -> None:
        try:
            if self._acquisition is not None and self._held and not self._connection.failure:
                self._acquisition.release([item for _, item, _ in self._held])  # in arrival order
                self._held = []
        finally:
            self._close()

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
            self._acquisition = None
