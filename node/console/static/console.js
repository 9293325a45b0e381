// Grouper console: the page's whole logic, written here (no library, nothing fetched from elsewhere).
// Every number comes from the node's JSON API under /api; every action asks for confirmation first.
// Text is set with textContent only, so ids and names from the broker can never become markup.
// Queue names and group ids go in a query string or a JSON body, never in a URL's path, which the
// browser would normalise (a group named ".." would reach its queue's URL).
"use strict";

const REFRESH_MS = 3000; // the overview, cluster and queues views reload this often while shown
const REFRESHED_VIEWS = ["overview", "cluster", "queues"];
// Rates come from the node (it samples the members' counters, node/console/rates.py), so a page shows
// them on its first load; the first console took them between its own two polls and showed none then.
const state = {
  authorization: null, // "Basic ..." once logged in; kept in this page's memory only
  view: "overview",
  timer: null,
  expanded: new Set(), // queues whose per-node rows are shown
  groups: { queue: "", position: 0, nextPosition: 0, total: 0 }, // the page of groups shown
};

const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = {};
  if (state.authorization) headers["Authorization"] = state.authorization;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let answer = {};
  try { answer = await response.json(); } catch (error) { answer = { error: `the node answered ${response.status} without JSON` }; }
  if (!response.ok) throw new ApiError(response.status, answer.error || `HTTP ${response.status}`);
  return answer;
}

function showError(error) {
  const box = $("error");
  if (!error) { box.hidden = true; box.textContent = ""; return; }
  box.textContent = error.message || String(error);
  box.hidden = false;
  if (error.status === 401 && state.authorization === null) $("login").hidden = false;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function button(row, label, className, action) {
  const td = document.createElement("td");
  const element = document.createElement("button");
  element.textContent = label;
  element.className = className;
  element.addEventListener("click", action);
  td.appendChild(element);
  row.appendChild(td);
  return element;
}

function fillTable(id, rows, render) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement("tr");
    render(tr, row);
    body.appendChild(tr);
  }
}

function rate(value) {
  return value === null || value === undefined ? "-" : value.toFixed(1);
}

function nodeLabel(name, node) {
  if (!node) return "this node";
  return name && name !== node ? `${name} (raft ${node})` : node;
}

function age(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms / 60000)} min`;
}

// ---- login ------------------------------------------------------------------------------------

function basic(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return "Basic " + btoa(binary);
}

async function startSession() {
  try {
    const session = await api("GET", "/api/session");
    $("login").hidden = true;
    $("open-notice").hidden = !session.open;
    $("who").textContent = session.open ? "open node (no users)" : `logged in as ${session.user}`;
    $("tabs").hidden = false;
    showError(null);
    show(state.view);
  } catch (error) {
    if (error.status === 401) {
      state.authorization = null;
      $("login").hidden = false;
      $("tabs").hidden = true;
    }
    showError(error);
  }
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  state.authorization = basic($("login-user").value, $("login-password").value);
  $("login-password").value = "";
  startSession();
});

// ---- views ------------------------------------------------------------------------------------

function show(view) {
  state.view = view;
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== `view-${view}`;
  for (const tab of document.querySelectorAll("#tabs button")) tab.classList.toggle("active", tab.dataset.view === view);
  clearInterval(state.timer);
  refresh();
  if (REFRESHED_VIEWS.includes(view)) state.timer = setInterval(refresh, REFRESH_MS);
}

async function refresh() {
  try {
    if (state.view === "overview") await loadOverview();
    else if (state.view === "cluster") await loadCluster();
    else if (state.view === "queues") await loadQueues();
    else if (state.view === "groups") await loadGroupChoices();
    else if (state.view === "consumers") await loadConsumers();
    showError(null);
  } catch (error) {
    showError(error);
  }
}

for (const tab of document.querySelectorAll("#tabs button")) tab.addEventListener("click", () => show(tab.dataset.view));

async function loadOverview() {
  const view = await api("GET", "/api/overview");
  const health = $("health");
  health.textContent = view.health;
  health.className = `badge ${view.health}`;
  $("overview-leader").textContent = !view.clustered ? "a single node (no cluster)"
    : view.leader ? nodeLabel(view.leader_name, view.leader) : "none: an election is under way";
  const ready = view.members.filter((member) => member.ready).length;
  $("overview-nodes").textContent = !view.clustered ? "1, this one" : `${ready} of ${view.members.length} ready: ` +
    view.members.map((member) => `${member.name} (${member.role})`).join(", ");
  const totals = view.totals;
  $("overview-totals").textContent = `${totals.depth_messages} on ${totals.queues} queue(s), ${totals.acquired_messages} ` +
    `in flight, ${totals.groups} group(s), ${totals.consumers} consumer(s)`;
  $("overview-rates").textContent = `in ${rate(totals.in_per_s)}/s, out ${rate(totals.out_per_s)}/s`;
  const alarms = view.alarms.length ? view.alarms : [{ level: "none", text: "none: every node answers and is ready" }];
  const list = $("alarms");
  list.replaceChildren();
  for (const alarm of alarms) {
    const item = document.createElement("li");
    item.className = alarm.level;
    item.textContent = alarm.text;
    list.appendChild(item);
  }
  $("chart-span").textContent = `${Math.round(view.history_ms / 60000)} minutes at most`;
  drawRateChart($("rate-chart"), view.series, view.history_ms);
  fillTable("overview-queues", view.queues, (tr, queue) => {
    tr.dataset.queue = queue.name;
    cell(tr, queue.name);
    for (const value of [queue.depth_messages, queue.acquired_messages, queue.consumers, queue.groups]) cell(tr, value, "number");
    cell(tr, rate(queue.in_per_s), "number rate-in");
    cell(tr, rate(queue.out_per_s), "number rate-out");
  });
}

async function loadCluster() {
  const status = await api("GET", "/api/cluster");
  const nameOf = new Map(status.members.map((member) => [member.node, member.name]));
  $("cluster-node").textContent = status.clustered ? nodeLabel(nameOf.get(status.node), status.node) : "a single node (no cluster)";
  $("leader").textContent = status.clustered ? (status.leader ? nodeLabel(nameOf.get(status.leader), status.leader)
    : "none: an election is under way") : "-";
  $("term").textContent = status.clustered ? status.term : "-";
  $("quorum").textContent = status.clustered ? (status.has_quorum ? "yes" : "NO") : "-";
  $("routes").textContent = status.routes;
  $("decisions").textContent = describeDecisions(status.route_decisions, status.clustered);
  fillTable("members", status.members, (tr, member) => {
    tr.dataset.node = member.node;
    cell(tr, nodeLabel(member.name, member.node));
    cell(tr, !status.clustered ? "alone" : member.node === status.leader ? "leader" : member.raft_member ? "follower" : "not a raft member", "role");
    cell(tr, member.ready ? "ready" : `not ready: ${member.not_ready_reason}`, member.ready ? "good" : "bad");
    cell(tr, member.down ? "marked down" : member.connected ? "up" : "no link", member.down ? "bad" : "");
    cell(tr, member.amqp_address);
    cell(tr, member.routes, "number");
    cell(tr, status.outbound[member.node] || 0, "number");  // messages this node holds for it, not taken yet
    cell(tr, (status.outbound_bytes || {})[member.node] || 0, "number");  // what outbound_max_bytes bounds
  });
}

function describeDecisions(decisions, clustered) {
  if (!clustered) return "-";
  if (!decisions) return "unknown: the engine loop did not answer in time";
  const outcomes = Object.entries(decisions.outcomes).map(([outcome, count]) => `${outcome} ${count}`).join(", ") || "none yet";
  const bound = (ms) => ms === null ? "over the last bucket" : `under ${ms} ms`;
  const latency = (tally) => tally.count ? `p50 ${bound(tally.p50)}, p99 ${bound(tally.p99)}` : "none";
  return `${outcomes}; wait for a route: ${latency(decisions.latency_ms)}; raft decision: ${latency(decisions.raft_latency_ms)}`;
}

async function loadQueues() {
  const answer = await api("GET", "/api/queues");
  $("queues-note").textContent = [answer.note, ...answer.missing.map((row) => `${row.node_name} did not answer: ${row.error}`)]
    .filter(Boolean).join("; ");
  const rows = [];
  for (const queue of answer.queues) {
    rows.push({ queue });
    if (state.expanded.has(queue.name)) for (const share of queue.nodes) rows.push({ share, of: queue.name });
  }
  fillTable("queues", rows, (tr, row) => row.queue ? queueRow(tr, row.queue, answer.clustered) : shareRow(tr, row.share));
}

function queueRow(tr, queue, clustered) {
  tr.dataset.queue = queue.name;
  cell(tr, queue.name);
  for (const value of [queue.depth_messages, queue.depth_bytes, queue.acquired_messages, queue.consumers,
                       queue.groups, queue.owned_groups]) cell(tr, value, "number");
  cell(tr, rate(queue.in_per_s), "number rate-in");
  cell(tr, rate(queue.out_per_s), "number rate-out");
  cell(tr, queue.enqueued_total, "number");
  cell(tr, queue.delivered_total, "number");
  const nodes = cell(tr, clustered ? "" : "this node");
  if (clustered) {
    const toggle = document.createElement("button");
    toggle.className = "per-node";
    toggle.textContent = state.expanded.has(queue.name) ? `Hide (${queue.nodes.length})` : `Per node (${queue.nodes.length})`;
    toggle.addEventListener("click", () => {
      if (!state.expanded.delete(queue.name)) state.expanded.add(queue.name);
      loadQueues().catch(showError);
    });
    nodes.appendChild(toggle);
  }
  const purge = button(tr, "Purge", "danger purge", () => purgeQueue(queue.name));
  const reroute = document.createElement("button");
  reroute.textContent = "Reroute";
  reroute.className = "reroute";
  reroute.addEventListener("click", () => rerouteQueue(queue.name));
  purge.parentElement.appendChild(reroute);
  const remove = document.createElement("button");
  remove.textContent = "Delete";
  remove.className = "danger delete";
  remove.addEventListener("click", () => deleteQueue(queue.name));
  purge.parentElement.appendChild(remove);
}

function shareRow(tr, share) {  // one node's part of the queue above it
  tr.className = "node-share";
  tr.dataset.node = share.node;
  cell(tr, `on ${nodeLabel(share.node_name, share.node)}`);
  for (const value of [share.depth_messages, share.depth_bytes, share.acquired_messages, share.consumers,
                       share.groups, share.owned_groups]) cell(tr, value, "number");
  cell(tr, rate(share.in_per_s), "number");
  cell(tr, rate(share.out_per_s), "number");
  cell(tr, share.enqueued_total, "number");
  cell(tr, share.delivered_total, "number");
  cell(tr, "");
  cell(tr, "");
}

$("add-queue").addEventListener("submit", async (event) => {
  event.preventDefault();
  const name = $("add-queue-name").value.trim();
  let settings = {};
  try {
    settings = $("add-queue-settings").value.trim() ? JSON.parse($("add-queue-settings").value) : {};
  } catch (error) {
    showError(new Error(`the settings are not JSON (${error.message}): give an object such as {"group_header": "JMSXGroupID"}`));
    return;
  }
  if (!window.confirm(`Add queue ${name} (in a cluster: on every node)?`)) return;
  try {
    await api("POST", "/api/queues", { ...settings, name });
    $("add-queue-name").value = "";
    await loadQueues();
    showError(null);
  } catch (error) { showError(error); }
});

async function purgeQueue(name) {
  if (!window.confirm(`Purge queue ${name} (on every node of a cluster)? The available messages of every group ` +
                      "are deleted, and so are those in no group; messages delivered and not yet settled stay with " +
                      "their consumers.")) return;
  try {
    const result = await api("POST", "/api/queues/purge", { queue: name });
    await loadQueues();
    $("queues-result").textContent = `queue ${name}: ${result.messages_purged} message(s) purged` +
      (result.messages_left ? `; ${result.messages_left} arrived while it ran and stay` : "");
    showError(null);
  } catch (error) { showError(error); }
}

// Qpid's reroute: the messages of a queue (the first N, or all) or of one group go to another queue or
// multicast address, each group in order; what stayed, and why, is shown as an error
async function reroute(queue, group, resultId, reload) {
  const what = group === null ? `queue ${queue}` : `group ${group} of queue ${queue}`;
  const destination = (window.prompt(`Reroute the available messages of ${what} to which queue or multicast address?`) || "").trim();
  if (!destination) return;
  const body = { queue, to: destination };
  if (group === null) {
    const count = (window.prompt(`How many, the first in queue order? Leave empty for every available message.`) || "").trim();
    if (count) {
      if (!/^[1-9][0-9]*$/.test(count)) { showError(new Error(`the count must be a whole number >= 1, got ${count}`)); return; }
      body.count = parseInt(count, 10);
    }
  } else {
    body.group = group;
  }
  const how = body.count ? `the first ${body.count} available messages` : "every available message";
  if (!window.confirm(`Reroute ${how} of ${what} to ${destination}? They leave ${queue} once stored there, each ` +
                      "group in order; a group with deliveries not yet settled stays whole.")) return;
  try {
    const result = await api("POST", "/api/queues/reroute", body);
    await reload();
    $(resultId).textContent = `${what}: ${result.messages_moved} message(s) rerouted to ${destination}`;
    showError(result.messages_stayed ? new Error(`${result.messages_stayed} message(s) stayed in ${queue}: ${result.stayed_reason}`) : null);
  } catch (error) { showError(error); }
}

function rerouteQueue(name) { return reroute(name, null, "queues-result", loadQueues); }

async function deleteQueue(name) {
  if (!window.confirm(`Delete queue ${name} (on every node of a cluster)?`)) return;
  try {
    await api("POST", "/api/queues/delete", { queue: name, force: false });
  } catch (error) {
    if (error.status !== 409 || !window.confirm(`${error.message}\n\nDelete it anyway, dropping its messages?`)) {
      showError(error);
      return;
    }
    try { await api("POST", "/api/queues/delete", { queue: name, force: true }); }
    catch (forced) { showError(forced); return; }
  }
  await loadQueues();
}

// ---- groups and consumers -------------------------------------------------------------------

function setOptions(select, values, labels) {
  const chosen = select.value;
  select.replaceChildren();
  values.forEach((value, index) => {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = labels[index];
    select.appendChild(option);
  });
  if (values.includes(chosen)) select.value = chosen;
}

async function loadGroupChoices() {
  const answer = await api("GET", "/api/queues");
  const names = answer.queues.map((queue) => queue.name);
  setOptions($("groups-queue"), names, names);
  const shares = new Map(answer.queues.flatMap((queue) => queue.nodes.map((share) => [share.node, share.node_name])));
  const nodes = answer.clustered ? ["", ...answer.members.map((member) => member.node)] : [""];
  setOptions($("groups-node"), nodes, nodes.map((node) => !node ? (answer.clustered ? "every node" : "this node")
    : `${nodeLabel(shares.get(node), node)}${node === answer.node ? ", this node" : ""}`));
  // back on the view: the same page of the same queue; another queue starts from its first page
  if (names.length) await loadGroups($("groups-queue").value === state.groups.queue ? state.groups.position : 0);
}

function groupQuery(position, pageSize, order) {
  const query = new URLSearchParams({ queue: $("groups-queue").value, prefix: $("groups-prefix").value,
                                      position: String(position), page_size: String(pageSize),
                                      node: $("groups-node").value, order });
  return `/api/groups?${query}`;
}

const ORDER_TITLES = { backlog: "Hot groups: largest backlog first", head_age: "Groups: oldest head message first",
                       owner: "Groups by owner", "": "Groups in arrival order" };

async function loadGroups(position) {
  const queue = $("groups-queue").value;
  if (!queue) return;
  const pageSize = Math.min(500, Math.max(1, parseInt($("groups-page-size").value, 10) || 50));
  const order = $("groups-order").value;
  const rankMax = 1000; // a ranking reaches this far (node/admin/group_ranks.py RANK_DEPTH_MAX)
  if (order && position >= rankMax) return null;
  const page = await api("GET", groupQuery(position, order ? Math.min(pageSize, rankMax - position) : pageSize, order));
  if ($("groups-queue").value !== queue || $("groups-order").value !== order) return page; // changed meanwhile
  $("groups").dataset.queue = queue;
  $("groups").dataset.order = order;
  $("groups-title").textContent = ORDER_TITLES[order];
  // a ranking pages by rank up to the node's bound (node/admin/group_ranks.py); arrival order by position
  const ranked = order !== "";
  const end = ranked ? (page.groups.length < pageSize ? position : page.next_position) : page.next_position;
  Object.assign(state.groups, { queue, position, nextPosition: end, total: ranked ? Math.min(rankMax, page.groups_total) : page.groups_total });
  const searched = ranked ? `the top ${position + 1} to ${position + page.groups.length} of ${page.groups_total} group(s)` +
      (page.missing && page.missing.length ? `; not asked: ${page.missing.map((row) => `${row.node_name} (${row.error})`).join(", ")}` : "")
    : page.next_position >= page.groups_total ? "every group looked at"
    : `looked at groups up to ${page.next_position} of ${page.groups_total}: Next page goes on`;
  $("groups-summary").textContent = `${page.groups.length} shown, from position ${position}; ${searched}.`;
  fillTable("groups", page.groups, (tr, group) => {
    tr.dataset.group = group.group;
    cell(tr, group.group, "group");
    const owner = cell(tr, group.consumer === null ? "none" : (group.owner_label || `consumer ${group.consumer}`), "owner");
    if (group.consumer !== null) {
      owner.dataset.consumer = group.consumer;
      owner.title = `consumer ${group.consumer} on ${group.node}` + (group.owner_client ? `, client ${group.owner_client}` : "");
    }
    cell(tr, group.messages, "number depth");
    cell(tr, group.acquired, "number");
    cell(tr, age(group.head_age_ms), "number");
    cell(tr, nodeLabel(group.node_name, group.node));
    const actions = button(tr, "Reset", "reset", () => groupAction(queue, group.group, "reset"));
    for (const [label, action, className] of [["Move", "move", "move"], ["Purge", "purge", "danger purge"]]) {
      const more = document.createElement("button");
      more.textContent = label;
      more.className = className;
      more.addEventListener("click", () => groupAction(queue, group.group, action));
      actions.parentElement.appendChild(more);
    }
    const rerouteGroup = document.createElement("button");
    rerouteGroup.textContent = "Reroute";
    rerouteGroup.className = "reroute";
    rerouteGroup.addEventListener("click", () => reroute(queue, group.group, "action-result",
                                                         () => loadGroups(state.groups.position)));
    actions.parentElement.appendChild(rerouteGroup);
  });
  return page;
}

const GROUP_ACTIONS = {
  reset: (queue, group) => `Reset group ${group} of queue ${queue}? Its owner lets go of it; its next message goes to any consumer.`,
  purge: (queue, group) => `Purge group ${group} of queue ${queue}? Its available messages are deleted.`,
  move: (queue, group, body) => `Move group ${group} of queue ${queue} to queue ${body.destination}? Its available messages go to the end of that queue, in order.`,
};
const GROUP_RESULTS = {
  reset: (group, result) => `group ${group}: ${result.groups_reset} owner(s) let go`,
  purge: (group, result) => `group ${group}: ${result.messages_purged} message(s) purged`,
  move: (group, result, body) => `group ${group}: ${result.messages_moved} message(s) moved to ${body.destination}`,
};

async function groupAction(queue, group, action) {
  const body = { queue, group };
  if (action === "move") {
    const destination = window.prompt(`Move group ${group} of queue ${queue} to which queue?`);
    if (!destination) return;
    body.destination = destination.trim();
  }
  if (!window.confirm(GROUP_ACTIONS[action](queue, group, body))) return;
  try {
    const result = await api("POST", `/api/groups/${action}`, body);
    await loadGroups(state.groups.position);
    $("action-result").textContent = GROUP_RESULTS[action](group, result, body);
    showError(null);
  } catch (error) { showError(error); }
}

$("groups-query").addEventListener("submit", (event) => {
  event.preventDefault();
  loadGroups(0).then(() => showError(null), showError);
});
$("groups-first").addEventListener("click", () => loadGroups(0).catch(showError));
for (const [header, order] of [["groups-sort-owner", "owner"], ["groups-sort-depth", "backlog"], ["groups-sort-age", "head_age"]]) {
  $(header).addEventListener("click", () => { $("groups-order").value = order; loadGroups(0).catch(showError); });
}
$("groups-next").addEventListener("click", () => {
  if (state.groups.nextPosition < state.groups.total) loadGroups(state.groups.nextPosition).catch(showError);
});

async function loadConsumers() {
  if (!$("groups-queue").value) await loadGroupChoices();
  if (!$("groups-queue").value) return;
  const page = await api("GET", groupQuery(0, 1, ""));  // this node's (or the chosen node's) consumers
  fillTable("consumers", page.consumers, (tr, consumer) => {
    tr.dataset.consumer = consumer.consumer;
    cell(tr, consumer.consumer);
    cell(tr, consumer.label);
    cell(tr, consumer.client, "client");
    cell(tr, consumer.groups_owned, "number");
    cell(tr, consumer.groups.join(", ") + (consumer.groups_owned > consumer.groups.length ? ", ..." : ""));
    cell(tr, consumer.unsettled, "number");
    cell(tr, consumer.credit, "number");
  });
}

startSession();
