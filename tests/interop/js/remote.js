'use strict';
// A rhea client under remote control, for tests/interop/rhea_client.py.
//
// Reads one JSON command a line on stdin and prints one JSON event a line on stdout: the events of
// tests/interop/client.py (attached, detached, message, outcome, drained, error). Rules:
// - One process is one AMQP connection, opened by the first command (connect); links are named by
//   the test and every event names its link.
// - This script decides nothing: no credit, no outcome and no detach unless a command asks for it
//   (credit_window 0, autoaccept off). It reports what rhea reported, the node's frames as rhea
//   decoded them (a null terminus in the node's attach is null here).
// - A consumer's outcome goes out unsettled; the delivery is settled here once the node has
//   settled it, and only then reported (settled), so the test knows the node applied it.
// - A command that throws is reported as an error event; the test fails on it.
// - A receiver may carry a JMS selector (rhea's filter.selector); the attached event then reports the
//   node's source filter set as {key: {descriptor, value}} (null when it has none).
// - connect may carry a username and password (rhea then authenticates with SASL PLAIN); the node
//   letting the client in is reported as an opened event, a refusal as an error event with its condition.
// - stdin closing ends the process: the connection is closed, and the process exits at the latest
//   EXIT_GRACE_MS later.

const rhea = require('rhea');
const readline = require('readline');

const EXIT_GRACE_MS = 2000; // time for the close frames to leave before the process exits anyway

const container = rhea.create_container({ id: 'grouper-interop-rhea' });
let connection = null;
const links = new Map(); // link name -> rhea sender or receiver
const held = new Map(); // "link/number" -> a delivery this consumer has not settled yet
const counts = new Map(); // link name -> deliveries numbered so far (sent or received)
let closing = false; // set once stdin closes: a disconnect then is ours, not an error
const settling = new Map(); // a consumer's delivery whose outcome is sent -> its number, until the node settles it

function emit(event) {
  process.stdout.write(JSON.stringify(event) + '\n');
}

function next(linkName) {
  const number = (counts.get(linkName) || 0) + 1;
  counts.set(linkName, number);
  return number;
}

function terminus(value) {
  // rhea keeps a null terminus of the attach frame as its typed null (type.name 'Null', value null)
  if (value === null || value === undefined || (value.type && value.type.name === 'Null')) return null;
  return { address: value.address === undefined ? null : value.address,
    distribution_mode: value.distribution_mode === undefined ? null : value.distribution_mode };
}

function filterSet(source) {
  // the source's filter set as {key: {descriptor, value}}; null when the node's attach has none
  if (!source || source.type || !source.filter) return null;
  const found = {};
  for (const [key, entry] of Object.entries(source.filter)) {
    const descriptor = entry && entry.descriptor !== undefined ? entry.descriptor : null;
    found[key] = { descriptor: descriptor === null ? null : String(descriptor.value !== undefined ? descriptor.value : descriptor),
      value: entry && entry.value !== undefined ? (entry.value.value !== undefined ? entry.value.value : entry.value) : entry };
  }
  return found;
}

function attached(context, link) {
  const attach = link.remote.attach; // the node's attach frame, as rhea decoded it
  emit({ event: 'attached', link: link.name, role: link.is_receiver() ? 'receiver' : 'sender',
    source: terminus(attach.source), target: terminus(attach.target), filter: filterSet(attach.source) });
}

function detached(context, link) {
  const detach = link.remote.detach;
  const error = detach.error;
  emit({ event: 'detached', link: link.name, closed: Boolean(detach.closed),
    condition: error ? String(error.condition) : null, description: error && error.description ? String(error.description) : null });
}

function outcome(state) {
  return (context) => {
    const error = context.delivery.remote_state && context.delivery.remote_state.error;
    emit({ event: 'outcome', link: context.sender.name, delivery: context.delivery.interop_number, state,
      condition: error ? String(error.condition) : null });
  };
}

container.on('receiver_open', (context) => attached(context, context.receiver));
container.on('sender_open', (context) => attached(context, context.sender));
container.on('receiver_close', (context) => detached(context, context.receiver));
container.on('sender_close', (context) => detached(context, context.sender));
container.on('receiver_error', () => {}); // reported by the close event that follows
container.on('sender_error', () => {});
container.on('accepted', outcome('accepted'));
container.on('rejected', outcome('rejected'));
container.on('released', outcome('released'));
container.on('modified', outcome('modified'));
container.on('message', (context) => {
  const receiver = context.receiver;
  const message = context.message;
  const number = next(receiver.name);
  held.set(`${receiver.name}/${number}`, context.delivery);
  emit({ event: 'message', link: receiver.name, delivery: number, body: message.body,
    group: message.group_id === undefined ? null : message.group_id,
    delivery_count: message.delivery_count || 0, first_acquirer: Boolean(message.first_acquirer) });
});
container.on('settled', (context) => {
  const number = settling.get(context.delivery);
  if (!context.receiver || number === undefined) return;
  settling.delete(context.delivery);
  context.delivery.update(true);
  emit({ event: 'settled', link: context.receiver.name, delivery: number });
});
container.on('receiver_drained', (context) => {
  context.receiver.drain = false;
  emit({ event: 'drained', link: context.receiver.name, credit: context.receiver.credit });
});
container.on('disconnected', (context) => {
  if (!closing) emit({ event: 'error', text: `disconnected: ${context.error || 'no error given'}` });
});
container.on('connection_open', () => emit({ event: 'opened' }));
container.on('error', (error) => emit({ event: 'error', text: String(error),
  condition: error.condition === undefined ? null : String(error.condition) }));


const commands = {
  connect({ host, port, username, password }) {
    const options = { host, port, reconnect: false };
    if (username) Object.assign(options, { username, password });
    connection = container.connect(options);
  },
  receiver({ link, address, browse, selector }) {
    const source = { address };
    if (browse) source.distribution_mode = 'copy';
    if (selector !== undefined && selector !== null) source.filter = rhea.filter.selector(selector); // numeric descriptor
    links.set(link, connection.open_receiver({ name: link, source, credit_window: 0, autoaccept: false }));
  },
  sender({ link, address }) {
    // no address: the anonymous relay, a target without an address
    links.set(link, connection.open_sender({ name: link, target: address === null ? {} : { address } }));
  },
  send({ link, messages }) {
    const sender = links.get(link);
    for (const fields of messages) {
      const message = { body: fields.body };
      if (fields.group !== null && fields.group !== undefined) message.group_id = fields.group;
      if (fields.to) message.to = fields.to;
      if (fields.properties) message.application_properties = fields.properties;
      sender.send(message).interop_number = next(link);
    }
  },
  flow({ link, credit }) {
    const receiver = links.get(link);
    receiver.drain = false;
    receiver.add_credit(credit);
  },
  drain({ link, credit }) {
    const receiver = links.get(link);
    receiver.drain = true;
    if (credit > 0) receiver.add_credit(credit);
    else receiver.drain_credit();
  },
  settle({ link, delivery, outcome: how }) {
    const key = `${link}/${delivery}`;
    const taken = held.get(key);
    held.delete(key);
    const states = { accept: () => rhea.message.accepted(), release: () => rhea.message.released(),
      modify: () => rhea.message.modified({ delivery_failed: true }), reject: () => rhea.message.rejected({}) };
    if (!states[how]) throw new Error(`unknown outcome ${how}`);
    // unsettled: the node settles it once applied (the 'settled' handler), then so do we
    taken.update(false, states[how]().described());
    settling.set(taken, delivery);
  },
  detach({ link, closed }) {
    if (closed) links.get(link).close();
    else links.get(link).detach(); // detach with closed=false: a suspended link
  },
};

function finish() {
  closing = true;
  if (connection && connection.is_open()) {
    connection.once('connection_close', () => process.exit(0));
    connection.close();
  } else {
    process.exit(0);
  }
  setTimeout(() => process.exit(0), EXIT_GRACE_MS).unref();
}

readline.createInterface({ input: process.stdin }).on('line', (line) => {
  if (!line.trim()) return;
  let command;
  try {
    command = JSON.parse(line);
    commands[command.op](command);
  } catch (error) {
    emit({ event: 'error', text: `${command ? command.op : line}: ${error.stack || error}` });
  }
}).on('close', finish);
