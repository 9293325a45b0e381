"""The main table's rows: which systems and variants run, the matrix of groups x prefetch x durable,
the ordering probe, the security rows (a TLS node beside the plain one) and the paced rows. Plain
data: it starts nothing and measures nothing (interleave.py runs the rows)."""

from __future__ import annotations

from dataclasses import dataclass

SYSTEMS = ("grouper", "rabbitmq", "activemq")
VARIANTS = {
    "grouper": ("grouper",),
    "grouper-tls": ("grouper-tls",),  # run with grouper when --security yes; not a --systems choice
    "rabbitmq": ("rabbitmq-queue", "rabbitmq-hash-sac"),
    "activemq": ("activemq",),
}
LABELS = {
    "grouper": "Grouper, exclusive groups (AMQP 1.0)",
    "grouper-tls": "Grouper over TLS, SASL PLAIN (AMQP 1.0)",
    "rabbitmq-queue": "RabbitMQ plain queue, no groups (AMQP 1.0)",
    "rabbitmq-hash-sac": "RabbitMQ hash exchange + 4 SAC queues (AMQP 1.0)",
    "activemq": "ActiveMQ Classic, JMSXGroupID (STOMP)",
}
GROUP_AWARE = {"grouper", "grouper-tls", "rabbitmq-hash-sac", "activemq"}
# ActiveMQ measured ~61 us/msg of broker CPU warm against 131-170 cold: a JIT needs ~100k messages
WARMUP_MESSAGES = {"grouper": 20_000, "grouper-tls": 20_000, "rabbitmq": 20_000, "activemq": 100_000}
CONSUMERS = 4
PACED_FRACTION = 0.5  # paced rows send at this fraction of the system's maximum rate (its unpaced row)
PACED_KEY = (1000, 100, False)  # the unpaced row whose throughput sets the pace
SECURITY_KEYS = ((1000, 100, False), (1000, 100, True))  # (groups, prefetch, durable) of the security rows


@dataclass(frozen=True)
class Row:
    variant: str
    groups: int
    prefetch: int
    durable: bool
    messages: int
    consumers: int = CONSUMERS
    warmup: bool = False
    rate_per_s: int = 0  # paced rows: the producer's send rate; 0 sends as fast as the broker lets it
    paced: bool = False

    @property
    def system(self) -> str:
        return next(system for system, variants in VARIANTS.items() if self.variant in variants)

    @property
    def queue(self) -> str:
        kind = "warmup" if self.warmup else f"g{self.groups}-p{self.prefetch}-{'d' if self.durable else 'n'}"
        return f"bench-{self.variant}-{kind}{'-paced' if self.paced else ''}"

    def key(self) -> tuple:
        return (self.groups, self.prefetch, self.durable)


def matrix(variants, messages: int, groups_list, prefetch_list, durable_list, probe_groups: int) -> list[Row]:
    rows = [Row(variant, groups, prefetch, durable, messages)
            for variant in variants for groups in groups_list for prefetch in prefetch_list
            for durable in durable_list]
    if probe_groups:  # ordering probe: more groups than ActiveMQ's default group map holds (1024)
        rows += [Row(variant, probe_groups, max(prefetch_list), False, messages) for variant in variants]
    return rows


def security_rows(rows: list[Row], messages: int) -> list[Row]:
    """The secured node's rows: the SECURITY_KEYS among the matrix's Grouper rows."""
    keys = [key for key in SECURITY_KEYS if any(row.variant == "grouper" and row.key() == key for row in rows)]
    return [Row("grouper-tls", groups, prefetch, durable, messages) for groups, prefetch, durable in keys]


def paced_rows(variants, messages: int) -> list[Row]:
    groups, prefetch, durable = PACED_KEY
    return [Row(variant, groups, prefetch, durable, messages, paced=True) for variant in variants]
