"""`grouper send`, `grouper receive` and `grouper browse`: a newcomer's first grouped messages.

Rules:
- Clarity over speed: python-qpid-proton's BlockingConnection, one message at a time, each send
  waiting for its outcome. `grouper perf` (node/tools/perf.py) is the fast one.
- `send` numbers the messages of each group 1, 2, ... in the application property SEQ_PROPERTY and
  gives each the message id GROUP-SEQ, so `receive` can show a group's order at a glance; with several
  --group flags the messages go round-robin over the groups. It also names the message's identity as
  node traces read it (node/amqp/codec.py: "producer", one name per run, and "sequence", the same
  number), so a traced queue's `grouper audit` judges what `send` sent instead of calling it unexpected.
- `receive` accepts each message after printing it; with --hold it settles none of them and keeps the
  link open until Ctrl-C (or --hold-s), so the node keeps those groups with this consumer meanwhile and
  another receiver gets none of their messages. Closing releases them to the next consumer, their
  delivery count raised.
- `browse` attaches with distribution mode copy: it prints and never consumes.
- None of them creates a queue unless given --create: without it each link carries the
  EXISTING_QUEUE_CAPABILITY, and the node refuses an unknown name, naming the queues close to it
  (a typo must not make a cluster-wide queue). Other clients keep the node's auto-create.
- A consumer is named as the console and `grouper groups` name it: CONTAINER/LINK.
- Connecting and logging in is node/tools/session.py's.
- Each line is `key=value` pairs, one message a line, in a fixed order (tests and grep read it).
- Faults: no node listening, a port that is not AMQP, refused credentials, a mechanism missing, an
  unknown queue: one line on stderr naming the fault and what to do, exit status EXIT_FAILED; bad
  flags exit EXIT_USAGE.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from node.admin.arguments import positive_int
from node.core.errors import InvalidConfig
from node.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from node.tools.session import (AMQP_NODE_DEFAULT, AMQP_NODE_ENV, CA_ENV, CONNECT_TIMEOUT_S, PASSWORD_ENV, USER_ENV,
                                Session, ToolError)

SEQ_PROPERTY = "seq"  # application property: the message's number within its group, from 1
RECEIVE_TIMEOUT_S_DEFAULT = 2.0  # `receive` without --count, and `browse`: stop after this long without a message
COUNT_DEFAULT = 10  # messages `send` sends without --count
HOLD_SLICE_S = 0.1  # `receive --hold`: how often it reads the connection and whether it was told to let go
BODY_PRINTED_MAX_CHARS = 60  # a longer body is cut in the printed line
CREATE_HELP = ("create the queue if it does not exist (a node with auto-create on: in a cluster, on every node); "
               "without it an unknown queue is refused, naming the queues close to it")


# ---- flags -----------------------------------------------------------------------------------

def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def connection_flags() -> argparse.ArgumentParser:
    """--node and the credentials, spelled as the admin commands spell them (README: Security)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--node", metavar="URL", help=f"the node's AMQP address, HOST:PORT or amqp[s]://HOST:PORT "
                                                      f"(default ${AMQP_NODE_ENV} or {AMQP_NODE_DEFAULT}, node0 "
                                                      f"of `grouper up`)")
    who = parent.add_argument_group("credentials (README: Security)")
    who.add_argument("--user", metavar="NAME", help=f"log in as NAME (default ${USER_ENV}): SCRAM-SHA-256 on a "
                                                    f"plain port, PLAIN over TLS; the password comes from "
                                                    f"--password-stdin, ${PASSWORD_ENV} or a prompt")
    who.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    who.add_argument("--ca", metavar="PEM", help=f"talk TLS (amqps), trusting these CAs (default ${CA_ENV})")
    return parent


def register(subparsers) -> None:
    connection = connection_flags()
    send = subparsers.add_parser("send", parents=[connection], help="send grouped messages to a queue",
                                 description="Send --count messages round-robin over the --group(s), each "
                                             "numbered within its group, waiting for each outcome.")
    send.add_argument("queue", metavar="QUEUE")
    send.add_argument("--group", metavar="G", action="append", required=True,
                      help="group id; give it several times to spread the messages over several groups")
    send.add_argument("--count", type=positive_int, default=COUNT_DEFAULT, metavar="N",
                      help=f"messages in all (default {COUNT_DEFAULT})")
    send.add_argument("--body", metavar="TEXT", help="body of every message (default 'GROUP #SEQ')")
    # durable by default, as a JMS producer's PERSISTENT: a durable queue journals only durable messages
    send.add_argument("--durable", action=argparse.BooleanOptionalAction, default=True,
                      help="mark the messages durable (default); --no-durable sends them as AMQP's default, "
                           "lost with the node on a crash even on a durable queue")
    send.add_argument("--create", action="store_true", help=CREATE_HELP)
    send.set_defaults(run=lambda args: _run(_send, args))

    receive = subparsers.add_parser("receive", parents=[connection], help="consume messages from a queue",
                                    description="Print and accept each message (group, seq, id, delivery "
                                                "count, consumer); --hold leaves them unsettled until Ctrl-C.")
    receive.add_argument("queue", metavar="QUEUE")
    receive.add_argument("--count", type=positive_int, metavar="N", help="stop after N messages")
    receive.add_argument("--timeout-s", type=_positive_float, default=RECEIVE_TIMEOUT_S_DEFAULT, metavar="S",
                         help=f"stop after S seconds without a message (default {RECEIVE_TIMEOUT_S_DEFAULT})")
    receive.add_argument("--hold", action="store_true",
                         help="settle nothing and stay attached until Ctrl-C: the node keeps these groups "
                              "with this consumer meanwhile")
    receive.add_argument("--hold-s", type=_positive_float, metavar="S", help="with --hold: let go after S seconds")
    receive.add_argument("--create", action="store_true", help=CREATE_HELP)
    receive.set_defaults(run=lambda args: _run(_receive, args))

    browse = subparsers.add_parser("browse", parents=[connection], help="print a queue's messages without "
                                                                       "consuming them")
    browse.add_argument("queue", metavar="QUEUE")
    browse.add_argument("--count", type=positive_int, metavar="N", help="stop after N messages")
    browse.add_argument("--timeout-s", type=_positive_float, default=RECEIVE_TIMEOUT_S_DEFAULT, metavar="S",
                        help=f"stop after S seconds without a message (default {RECEIVE_TIMEOUT_S_DEFAULT})")
    browse.add_argument("--create", action="store_true", help=CREATE_HELP)
    browse.set_defaults(run=lambda args: _run(_browse, args))


def _run(command, args: argparse.Namespace) -> int:
    session = None
    try:
        session = Session(args)
        return command(session, args)
    except ToolError as error:
        print(f"grouper {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except InvalidConfig as error:
        print(f"grouper {args.command}: bad input: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if session is not None:
            session.close()


# ---- the commands ----------------------------------------------------------------------------

def message_line(message, consumer: str) -> str:
    properties = message.properties or {}
    body = message.body
    if isinstance(body, (bytes, memoryview)):
        body = bytes(body).decode("utf-8", "replace")
    body = str(body)
    if len(body) > BODY_PRINTED_MAX_CHARS:
        body = body[:BODY_PRINTED_MAX_CHARS - 3] + "..."
    return (f"group={message.group_id} seq={properties.get(SEQ_PROPERTY, '-')} id={message.id} "
            f"delivery-count={message.delivery_count} consumer={consumer} body={body!r}")


def _send(session: Session, args: argparse.Namespace) -> int:
    from proton import Message
    from proton.utils import SendException

    from node.amqp.codec import TRACE_PRODUCER_KEY, TRACE_SEQUENCE_KEY  # here: the parser never imports proton

    sender = session.sender(args.queue)
    producer = f"grouper-send-{os.getpid()}-{int(time.time() * 1000)}"  # one identity per run: sequences restart at 1
    next_seq = dict.fromkeys(args.group, 0)
    for number in range(args.count):
        group = args.group[number % len(args.group)]
        next_seq[group] += 1
        seq = next_seq[group]
        body = args.body if args.body is not None else f"{group} #{seq}"
        message = Message(id=f"{group}-{seq}", group_id=group, durable=args.durable, body=body,
                          properties={SEQ_PROPERTY: seq, TRACE_PRODUCER_KEY: producer, TRACE_SEQUENCE_KEY: seq})
        try:
            sender.send(message, timeout=CONNECT_TIMEOUT_S)
        except SendException as error:
            raise ToolError(f"the node at {session.where} did not accept message {message.id} to {args.queue!r} "
                            f"(outcome {error.state}); {number} sent before it") from None
        except Exception as error:
            raise ToolError(session.describe(error, queue=args.queue)) from None
        print(f"sent group={group} seq={seq} id={message.id}", flush=True)
    print(f"{args.count} message(s) accepted by {session.where} into {args.queue}", flush=True)
    return EXIT_OK


def _take(session: Session, receiver, args: argparse.Namespace, settle) -> int:
    """Print messages until --count or --timeout-s of quiet; `settle` runs after each line."""
    from proton import Timeout

    count = 0
    while args.count is None or count < args.count:
        try:
            message = receiver.receive(timeout=args.timeout_s)
        except Timeout:
            break
        except Exception as error:
            raise ToolError(session.describe(error, queue=args.queue)) from None
        print(message_line(message, session.consumer), flush=True)
        settle(receiver)
        count += 1
    return count


def _receive(session: Session, args: argparse.Namespace) -> int:
    receiver = session.receiver(args.queue)
    count = _take(session, receiver, args, (lambda _: None) if args.hold else (lambda link: link.accept()))
    if not args.hold:
        print(f"{count} message(s) received and accepted", flush=True)
        return EXIT_OK
    # Ctrl-C and SIGTERM let go: the connection is closed, so the node hands the messages on at once. They
    # only set a flag here: a KeyboardInterrupt raised inside proton's event processing can leave its
    # container with work it never finishes, and BlockingConnection.close() then waits for it for ever
    letting_go: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, frame: letting_go.append(number))
    until = f"for {args.hold_s:g} s" if args.hold_s else "until Ctrl-C"
    print(f"holding {count} message(s) unsettled {until}; their groups stay with this consumer", flush=True)
    deadline = time.monotonic() + args.hold_s if args.hold_s else None
    container = session.connection.container
    container.timeout = HOLD_SLICE_S  # process() waits at most this long for the node, then the flag is read
    while not letting_go and (deadline is None or time.monotonic() < deadline):
        # process the connection (heartbeats) in short slices; the one credit the last wait left open may
        # still bring a message: it is printed and held too
        container.process()
        while receiver.fetcher.has_message:
            print(message_line(receiver.fetcher.pop(), session.consumer), flush=True)
        time.sleep(HOLD_SLICE_S)
    return EXIT_OK


def _browse(session: Session, args: argparse.Namespace) -> int:
    receiver = session.receiver(args.queue, browse=True)

    def settle(link) -> None:  # a browser's copies carry no outcome; settle what the node left unsettled
        if link.fetcher.unsettled:
            link.settle()

    count = _take(session, receiver, args, settle)
    print(f"{count} message(s) browsed, none consumed", flush=True)
    return EXIT_OK
