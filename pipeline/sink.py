"""The sink: Spark rows to Grouper messages, batch (`df.write`) and streaming (`df.writeStream`).

Rules:
- Every Spark task writes its partition over its own AMQP connection, in the partition's row
  order, keeping at most `unsettledMaxMessages` deliveries unsettled. A row counts as written only
  when the node settles it as accepted (for a durable queue: once it is in the journal).
- The first delivery the node does not accept fails the task, with the node's condition in the
  error. Rows sent before it stay in the queue: nothing can be unsent.
- Spark may run a task again (a failed task is retried, a slow one may be speculated), and the
  rerun sends the partition's rows again. Sent with a message id derived from a key
  (`messageIdColumn`), the copies can be recognised and dropped by consumers.
- Column types are checked on the driver, before any task starts, so a wrong type is one clear
  error naming the option and the column rather than a failure in every task.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (BinaryType, BooleanType, ByteType, DateType, DoubleType, FloatType, IntegerType,
                               LongType, ShortType, StringType, StructType, TimestampNTZType, TimestampType)

from pipeline import messages
from pipeline.amqp_client import AmqpConnection, ClientError, NodeUnreachable, Sender
from pipeline.options import Connect, OptionError, SinkOptions

log = logging.getLogger("grouper.pipeline")

PROPERTY_TYPES = (StringType, BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType,
                  BinaryType, TimestampType, TimestampNTZType, DateType)
MESSAGE_ID_TYPES = (StringType, IntegerType, LongType)


class SinkError(RuntimeError):
    """A task could not write its rows; the message names the node, the queue and the cause."""


def check_schema(options: SinkOptions, schema: StructType) -> None:
    """Raise OptionError unless every column an option names exists with a type the sink can send."""
    fields = {field.name: field.dataType for field in schema.fields}

    def column(option: str, name: str, allowed: tuple, allowed_text: str):
        if name not in fields:
            raise OptionError(option, f"the DataFrame has no column {name!r}; its columns are "
                                      f"{', '.join(fields) or '(none)'}")
        if not isinstance(fields[name], allowed):
            raise OptionError(option, f"column {name!r} is {fields[name].simpleString()}; it must be {allowed_text}"
                                      + (" (cast it, e.g. col(...).cast('string'))" if option == "groupColumn" else ""))

    column("groupColumn", options.group_column, (StringType,), "string: a group id is a string")
    column("bodyColumn", options.body_column, (StringType, BinaryType), "string or binary")
    for name in options.property_columns:
        column("propertyColumns", name, PROPERTY_TYPES,
               "string, boolean, an integer or floating type, binary, timestamp or date")
    if options.message_id_column:
        column("messageIdColumn", options.message_id_column, MESSAGE_ID_TYPES, "string, int or bigint")


def connect(connect_options: Connect, task_index: int, container_id: str) -> AmqpConnection:
    """A connection to the first reachable node, starting at one chosen by the task's index. Only an
    unreachable node sends the task to the next one: a refused login or certificate would be refused
    by every node alike."""
    failures = []
    for address in connect_options.nodes_for_task(task_index):
        try:
            return AmqpConnection(address, connect_options.timeout_ms, container_id, connect_options.security)
        except NodeUnreachable as error:
            failures.append(str(error))
    raise NodeUnreachable("no Grouper node could be reached: " + "; ".join(failures))


def task_identity() -> tuple[int, str]:
    """(partition index, a name unique to this task attempt) for link and container names."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    attempt = context.attemptNumber() if context is not None else 0
    return partition, f"spark-p{partition}-a{attempt}-{uuid.uuid4().hex[:8]}"


def write_batches(options: SinkOptions, batches, task_index: int, name: str) -> int:
    """Send every row of `batches` (pyarrow RecordBatches) in order; returns the rows accepted."""
    queue = options.connect.queue
    try:
        connection = connect(options.connect, task_index, name)
    except ClientError as error:
        raise SinkError(f"grouper sink, queue {queue!r}: {error}") from None
    try:
        producer = Sender(connection, queue, f"{name}-producer", options.window_messages)
        for batch in batches:
            _send_batch(options, producer, batch)
        producer.flush()
        producer.close()
        return producer.accepted
    except ClientError as error:
        raise SinkError(f"grouper sink: {error}") from None
    finally:
        connection.close()


def _send_batch(options: SinkOptions, producer: Sender, batch) -> None:
    columns = batch.schema.names
    groups = batch.column(columns.index(options.group_column)).to_pylist()
    bodies = batch.column(columns.index(options.body_column)).to_pylist()
    property_values = [(name, batch.column(columns.index(name)).to_pylist()) for name in options.property_columns]
    ids = (batch.column(columns.index(options.message_id_column)).to_pylist()
           if options.message_id_column else None)
    creation_ms = int(time.time() * 1000)  # stands in for the enqueue time a reader sees (see messages.decode)
    durable = options.durable
    group_header = options.connect.group_header
    encode = messages.encode
    send = producer.send
    for row in range(batch.num_rows):
        properties = {name: values[row] for name, values in property_values} if property_values else None
        message_id = ids[row] if ids is not None else None
        if message_id is not None and type(message_id) is not str:
            message_id = str(message_id)
        try:
            payload = encode(groups[row], bodies[row], properties, message_id, creation_ms, durable, group_header)
        except messages.UnsupportedValue as error:
            raise SinkError(f"grouper sink: a value of type {error} in propertyColumns cannot be sent as an "
                            f"AMQP application property; cast the column to string") from None
        send(payload)


@dataclass
class Written(WriterCommitMessage):
    partition: int
    accepted: int


class GrouperWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions):
        self.options = options

    def write(self, iterator) -> Written:
        partition, name = task_identity()
        return Written(partition, write_batches(self.options, iterator, partition, name))

    def commit(self, commit_messages) -> None:
        total = sum(message.accepted for message in commit_messages if message is not None)
        log.info("grouper sink: the node accepted %d messages for queue %r", total, self.options.connect.queue)

    def abort(self, commit_messages) -> None:
        accepted = sum(message.accepted for message in commit_messages if message is not None)
        log.warning("grouper sink: the write failed; %d messages the node accepted stay in queue %r "
                    "(a queue cannot take messages back)", accepted, self.options.connect.queue)


class GrouperStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch is written like a batch write: a task fails unless the node accepted all its rows."""

    def __init__(self, options: SinkOptions):
        self.options = options

    def write(self, iterator) -> Written:
        partition, name = task_identity()
        return Written(partition, write_batches(self.options, iterator, partition, name))

    def commit(self, commit_messages, batchId) -> None:
        total = sum(message.accepted for message in commit_messages if message is not None)
        log.info("grouper sink: micro-batch %d: the node accepted %d messages for queue %r", batchId, total,
                 self.options.connect.queue)

    def abort(self, commit_messages, batchId) -> None:
        log.warning("grouper sink: micro-batch %d failed; the messages the node accepted stay in queue %r and "
                    "the batch's rerun sends them again", batchId, self.options.connect.queue)
