"""The cluster section's tables, one function per measured part (throughput rows, placement, latency,
leader kill, owner kill, stability, profile), each from the report's plain numbers to markdown lines.
Renders only: it reads no node and no file, so `--render-only` writes the same text from the JSON."""

from __future__ import annotations

from bench.cluster_profile import PROFILE_DURATION_S
from bench.decision_latency import PROBE_EXISTING_MESSAGES, PROBE_INTERVAL_S, PROBE_NEW_GROUPS
from bench.failover import LEADER_PROBE_INTERVAL_S, OWNER_GROUPS, OWNER_PROBE_INTERVAL_S, STEADY_BEFORE_KILL_S
from bench.node_readings import DECISION_TARGET_MS
from bench.probes import RECONNECT_INTERVAL_S
from bench.workloads import BACKGROUND_GROUPS, GROUPS, PREFETCH


def _n(value, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def render_flows(report: dict) -> list[str]:
    lines = ["### 1. Throughput and broker CPU per message", "",
             f"{GROUPS:,} groups, prefetch {PREFETCH}, durable queue and messages, 1 producer (the `bench/run.py` "
             "client), consumers accept at once. Broker CPU = utime+stime of every node process and its raft "
             "member process ÷ messages; the "
             "per-node column shows where it went (node 1 receives from the producer).", "",
             "| row | msgs/s | broker CPU µs/msg | per node µs/msg (1 / 2 / 3) | ×(a) CPU | p50 ms | p99 ms "
             "| client CPU µs/msg | groups split | lost / dup | load start → end | CPU steal % | raft elections |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    flows = report.get("flows", [])
    base = next((row for row in flows if row.get("key") == "a" and row.get("unique")), None)
    for row in flows:
        label = f"({row.get('key')}) {row.get('label', '')}"
        if "failed" in row or not row.get("unique"):
            reason = row.get("failed") or "; ".join(row.get("errors", []))
            lines.append(f"| {label} | FAILED: {reason.replace('|', '/')[:200]} | | | | | | | | | | | |")
            continue
        ratio = row["broker_cpu_us_per_msg"] / base["broker_cpu_us_per_msg"] if base else None
        per_node = " / ".join(_n(value) for value in row["node_cpu_us_per_msg"])
        notes = f" ({'; '.join(row['errors'])[:120]})" if row["errors"] else ""
        if row.get("routes_by_node"):  # cumulative over the rows run so far: placement's spread
            notes += f" [routes per node so far: {' / '.join(str(count) for count in row['routes_by_node'])}]"
        lines.append(f"| {label}{notes} | {_n(row['throughput_per_s'])} | {_n(row['broker_cpu_us_per_msg'])} "
                     f"| {per_node} | {_n(ratio, 2)} | {_n(row['latency_p50_ms'], 1)} | {_n(row['latency_p99_ms'], 1)} "
                     f"| {_n(row['client_cpu_us_per_msg'])} | {row['groups_split']} / {row['groups_seen']} "
                     f"| {row['lost']} / {row['duplicates']} | {row['load_start']:.2f} → {row['load_end']:.2f} "
                     f"| {_n(row.get('steal_pct'), 1)} | {row.get('elections', '—')} |")
    lines += ["", "p50/p99 here are saturation latencies (the producer runs flat out, see the main table's "
              "method); idle latencies are in section 2."]
    lines += render_placement(flows)
    ceiling = next((row for row in flows if row.get("key") == "c" and row.get("unique")), None)
    if ceiling is not None:
        lines += ["", f"**Decision ceiling** (row c): {ceiling['decisions_per_s']:,} new-group route decisions per "
                  f"second through one raft group ({ceiling['distinct_groups']:,} distinct groups among "
                  f"{ceiling['messages']:,} messages at {_n(ceiling['throughput_per_s'])} msgs/s). Each engine "
                  "batch proposes the new groups it met as one raft entry, so decisions per entry grow with the "
                  "load."]
        lines += ["", "Above the decision ceiling (row c): what one raft group does, and routes sharded over several "
                  "raft groups, backed by the simulation: [docs/cluster-ceiling.md](cluster-ceiling.md)."]
    if "idle_cpu_pct_cluster" in report:
        idle = " / ".join(f"{pct:.1f}" for pct in report["idle_cpu_pct_cluster"])
        lines += ["", f"With no clients at all a cluster node uses {idle} % of a core (nodes 1 / 2 / 3: raft "
                  f"heartbeats, timers); the single node {report.get('idle_cpu_pct_single', 0):.1f} %. At the rows' "
                  "rates that fixed cost is part of each row's CPU per message."]
    lines.append("")
    return lines


def elections_note(result: dict, caused: int = 0) -> str:
    note = f"; CPU steal {result['steal_pct']:.1f}%" if "steal_pct" in result else ""
    if "elections" not in result:
        return note
    note += f"; raft leader elections in the node logs during the phase (its load wait included): {result['elections']}"
    if caused:
        note += f", {caused} of them expected (one per leader kill)"
    if result["elections"] > caused:
        note += " — **the leader changed without being killed: the numbers of this phase include that churn**"
    return note


def failed_line(result: dict) -> str:
    return f"FAILED: {str(result.get('failed', 'not run'))[:300]}\n"


def render_latency(report: dict) -> list[str]:
    latency = report.get("latency", {})
    lines = ["### 2. Route-decision and forwarding latency (half load)", ""]
    if "failed" in latency or not latency:
        return lines + [failed_line(latency)]
    lines += [f"Under a background load through all 3 nodes (one lean producer per node on its own queue, "
              f"{BACKGROUND_GROUPS:,} groups, durable, one consumer per node) asked for "
              f"{latency.get('half_load_per_s', 0):,} msgs/s (half of row b1's throughput) and measured at "
              f"{latency.get('background_per_s', 0):,} msgs/s during the probes. "
              f"One probe message every {PROBE_INTERVAL_S * 1000:.0f} ms. Consumers on nodes "
              f"{' and '.join(map(str, latency['consumer_nodes']))}; the raft leader is node {latency['leader_node']}. "
              f"Each producer node sends {PROBE_NEW_GROUPS} messages, each the first of a brand-new group: *accept* "
              "is send → producer acceptance (route decided in the raft log, message journalled here or in the "
              "outbound store), *receive* is send → consumer receipt, *decision* is the raft decision alone as "
              "the nodes time it (claim proposed → route known on the engine loop; p50 and p99 interpolated "
              f"within 0.5 ms buckets, the share within {DECISION_TARGET_MS:.0f} ms exact); *raft part* is the "
              "part of it the node's raft member times (claim received → route applied there: the raft round "
              "trip, without the node's engine loop on either side); *CPU wait* is how long the threads of each "
              "node process waited, runnable, for a core, per second of the probes (from /proc schedstat). Load "
              f"{latency['load_start']:.2f} → {latency['load_end']:.2f}{elections_note(latency)}.", "",
              "| producer node | role | placed on the producer's node | decision p50 ms | decision p99 ms "
              f"| decisions within {DECISION_TARGET_MS:.0f} ms | raft part p50 ms | raft part p99 ms "
              "| CPU wait ms/s, node 1 / 2 / 3 | accept p50 ms | accept p99 ms | accept max ms "
              "| receive p50 ms | receive p99 ms | not accepted |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in latency["new_groups"]:
        role = ("leader" if row["is_leader"] else "follower") + (", has consumers" if row["has_consumers"] else
                                                                  ", no consumers")
        decision = row.get("decision", {})
        member = decision.get("member", {})
        lines.append(f"| {row['producer_node']} | {role} | {row['placed_on_producer_node']} / {row['sent']} "
                     f"| {_n(decision.get('p50_ms'), 2)} | {_n(decision.get('p99_ms'), 2)} "
                     f"| {_n(decision.get('within_target_pct'), 1)}% of {decision.get('count', '—')} "
                     f"| {_n(member.get('p50_ms'), 2)} | {_n(member.get('p99_ms'), 2)} "
                     f"| {' / '.join(map(str, row.get('cpu_wait_ms_per_s') or ['—']))} "
                     f"| {_n(row['accept']['p50_ms'], 2)} | {_n(row['accept']['p99_ms'], 2)} "
                     f"| {_n(row['accept']['max_ms'], 2)} | {_n(row['receive']['p50_ms'], 2)} "
                     f"| {_n(row['receive']['p99_ms'], 2)} | {row['not_accepted']} |")
    existing = latency["existing"]
    lines += ["", f"Then node {existing['producer_node']} (a follower with consumers) sends "
              f"{PROBE_EXISTING_MESSAGES} messages to groups that already have a route: *local* ones are owned by "
              "its node, *forwarded* ones by another node (stored in the outbound store, forwarded over gRPC, "
              "stored again at the owner).", "",
              "| groups | messages | accept p50 ms | accept p99 ms | receive p50 ms | receive p99 ms | receive max ms |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for kind in ("local", "forwarded"):
        accept, receive = existing[f"{kind}_accept"], existing[f"{kind}_receive"]
        lines.append(f"| {kind} | {receive['count']} | {_n(accept['p50_ms'], 2)} | {_n(accept['p99_ms'], 2)} "
                     f"| {_n(receive['p50_ms'], 2)} | {_n(receive['p99_ms'], 2)} | {_n(receive['max_ms'], 2)} |")
    if existing["missing"]:
        lines.append(f"\n{existing['missing']} probe messages were not accepted or not received.")
    if latency.get("existing_raft_decisions") is not None:
        lines.append(f"\nRaft decisions the three nodes timed while those {PROBE_EXISTING_MESSAGES} messages to "
                     f"routed groups were sent: {latency['existing_raft_decisions']} (a cached route costs no raft "
                     "round trip).")
    return lines + [""]


PLACEMENT_EVEN_PCT = 20.0  # issue "A cluster people can run": groups per consumer within this of even


def placement_spread(row: dict) -> dict:
    """Groups per consumer by node (consumers numbered node by node, as measure_flow starts them) and
    the largest distance of any consumer from the even share, in percent."""
    counts = row.get("groups_per_consumer") or []
    by_node, first = [], 0
    for node in sorted(row.get("consumers_by_node", {}), key=int):
        count = row["consumers_by_node"][node]
        by_node.append(counts[first:first + count])
        first += count
    even = sum(counts) / len(counts) if counts else 0
    worst = max((abs(count - even) / even * 100 for count in counts), default=None) if even else None
    return {"by_node": by_node, "even": even, "worst_pct": worst}


def render_placement(flows: list) -> list[str]:
    rows = {row.get("key"): row for row in flows if row.get("unique") and row.get("groups_per_consumer")}
    if "b1" not in rows:
        return []
    lines = ["", "**Placement** (producer on node 1, consumers 4 / 2 / 2 on nodes 1 / 2 / 3): where the "
             f"{GROUPS:,} groups went, each counted at the consumer that received its first message; even is "
             f"{GROUPS / sum(rows['b1']['consumers_by_node'].values()):.0f} per consumer (target: every consumer "
             f"within ±{PLACEMENT_EVEN_PCT:.0f}%).", "",
             "| placement | groups per consumer, node 1 / node 2 / node 3 | worst consumer vs even | "
             "node CPU share 1 / 2 / 3 | msgs/s |", "|---|---|---:|---|---:|"]
    for key, name in (("b1", "balanced (default)"), ("b1-local", "local")):
        row = rows.get(key)
        if row is None:
            continue
        spread = placement_spread(row)
        cpu = row["node_cpu_us_per_msg"]
        share = " / ".join(f"{value / sum(cpu) * 100:.0f}%" for value in cpu) if sum(cpu) else "—"
        groups = " / ".join(" ".join(str(count) for count in node) for node in spread["by_node"])
        lines.append(f"| {name} | {groups} | {_n(spread['worst_pct'], 0)}% | {share} "
                     f"| {_n(row['throughput_per_s'])} |")
    return lines


def render_stability(report: dict) -> list[str]:
    stability = report.get("stability")
    if stability is None:
        return []
    lines = ["### 5. Leadership under full load", ""]
    if "failed" in stability:
        return lines + [failed_line(stability)]
    if stability.get("run"):  # measured by another run (`--phases stability`) and added to this report
        lines += [f"Measured in a run of its own ({stability['run']}).", ""]
    return lines + [
        f"One lean producer per node, as fast as credit allows, {BACKGROUND_GROUPS:,} groups, durable, one consumer "
        f"per node, for {stability['seconds']} s with nobody killed: {stability['received']:,} messages received "
        f"({stability['throughput_per_s']:,} msgs/s), node CPU {stability['node_cpu_pct']} % of a core (node and "
        f"raft member). Raft terms before → after: {stability['terms_before']} → {stability['terms_after']}"
        f"{elections_note(stability)}. Election timeout 200-500 ms. "
        f"Load {stability['load_start']:.2f} → {stability['load_end']:.2f}.", ""]


def render_leader(report: dict) -> list[str]:
    leader = report.get("leader_kill", {})
    lines = ["### 3. Leader kill", ""]
    if "failed" in leader or not leader:
        return lines + [failed_line(leader)]
    lines += [f"A producer on a surviving node sends a brand-new group every {LEADER_PROBE_INTERVAL_S * 1000:.0f} ms "
              "(so every message needs a route decision); consumers on all 3 nodes. After "
              f"{STEADY_BEFORE_KILL_S:.0f} s the raft leader is killed with SIGKILL. *Kill → first accept* is the time "
              "from the kill to the producer's first acceptance of a message sent after the kill; *kill → new leader* "
              "is read from the new leader's log line (wall clock, ms). The killed node is "
              "then restarted and the next repetition waits until it is a connected member again. Load "
              f"{leader['load_start']:.2f} → {leader['load_end']:.2f}"
              f"{elections_note(leader, len(leader['repetitions']))}.", "",
              "| # | killed (leader) | producer | new leader | kill → new leader ms | kill → first accept ms "
              "| last accept before → first after ms | longest send → accept ms | sent / not accepted "
              "| restart → ready s | restart → member s |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for number, row in enumerate(leader["repetitions"], 1):
        lines.append(f"| {number} | {row['killed_node']} | {row['producer_node']} | {row['new_leader_node'] or '—'} "
                     f"| {_n(row.get('kill_to_new_leader_ms'))} "
                     f"| {_n(row['kill_to_first_accept_ms'])} | {_n(row['gap_between_accepts_ms'])} "
                     f"| {_n(row['longest_send_to_accept_ms'])} | {row['sent']} / {row['not_accepted']} "
                     f"| {_n(row['restart_to_ready_s'], 2)} | {_n(row['restart_to_member_s'], 2)} |")
    return lines + [""]


def render_owner(report: dict) -> list[str]:
    owner = report.get("owner_kill", {})
    lines = ["### 4. Owner kill", ""]
    if "failed" in owner or not owner:
        return lines + [failed_line(owner)]
    lines += [f"{OWNER_GROUPS} busy groups live on a follower with the only consumer; a producer on another node "
              f"sends to them (~{1 / OWNER_PROBE_INTERVAL_S:.0f} msgs/s, all forwarded). After 2 s the owner is "
              "killed with SIGKILL and restarted at once (same data dir and ports); its consumer redials every "
              f"{RECONNECT_INTERVAL_S * 1000:.0f} ms. *First delivery* is the consumer's first receipt after the "
              "kill; *first outage message* is the first receipt of a message sent after the kill (held in the "
              "producer node's outbound store, forwarded when the owner is back). Load "
              f"{owner['load_start']:.2f} → {owner['load_end']:.2f}{elections_note(owner)}.", "",
              "| # | owner | producer | restart → ready ms | restart → consumer attached ms | restart → first delivery ms "
              "| kill → first delivery ms | restart → first outage message ms | ready → first outage message ms "
              "| kill → first outage message ms | sent during outage | lost | redelivered |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for number, row in enumerate(owner["repetitions"], 1):
        lines.append(f"| {number} | {row['owner_node']} | {row['producer_node']} | {_n(row['restart_to_ready_s'] * 1000)} "
                     f"| {_n(row['restart_to_consumer_attached_ms'])} | {_n(row['restart_to_first_delivery_ms'])} "
                     f"| {_n(row['kill_to_first_delivery_ms'])} | {_n(row['restart_to_first_outage_message_ms'])} "
                     f"| {_n(row.get('ready_to_first_outage_message_ms'))} "
                     f"| {_n(row['kill_to_first_outage_message_ms'])} | {row['sent_during_outage']} | {row['lost']} "
                     f"| {row['redelivered']} |")
    return lines + [""]


def render_profile(report: dict) -> list[str]:
    profile = report.get("profile", {})
    lines = ["### Where the CPU goes in (b2)", ""]
    if "failed" in profile or not profile:
        return lines + [f"Not profiled: {profile.get('failed', 'not run')}", ""]
    lines += [f"py-spy (`record -f raw --nonblocking --threads`, {PROFILE_DURATION_S} s at 100 Hz) on node 1 (receives "
              "every message and forwards it) and node 2 (an owner) during an extra, unmeasured (b2) flow "
              f"({profile['flow_throughput_per_s']:,} msgs/s under the profiler). Share of samples, each sample "
              "charged to the innermost frame in one of these parts of the code:", "",
              "| part | forwarding node % | owner % |", "|---|---:|---:|"]
    forwarder, owner = profile.get("forwarder", {}), profile.get("owner", {})
    names = list(dict.fromkeys([*forwarder.get("categories_pct", {}), *owner.get("categories_pct", {})]))
    for name in names:
        lines.append(f"| {name} | {_n(forwarder.get('categories_pct', {}).get(name), 1)} "
                     f"| {_n(owner.get('categories_pct', {}).get(name), 1)} |")
    lines += ["", "| thread | forwarding node % | owner % |", "|---|---:|---:|"]
    threads = list(dict.fromkeys([*forwarder.get("threads_pct", {}), *owner.get("threads_pct", {})]))[:8]
    for name in threads:
        lines.append(f"| {name} | {_n(forwarder.get('threads_pct', {}).get(name), 1)} "
                     f"| {_n(owner.get('threads_pct', {}).get(name), 1)} |")
    for role, summary in (("forwarding node", forwarder), ("owner", owner)):
        top = "; ".join(f"`{leaf}` {pct}%" for leaf, pct in list(summary.get("top_leaves_pct", {}).items())[:6])
        lines.append(f"\nTop leaf frames, {role}: {top}")
    return lines + [""]
