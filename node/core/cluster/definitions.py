"""Queue definitions: the cluster-wide definitions (handler/queue_definitions.py) applied to this node's
broker, the config file's seeds, and the queues this node makes or ends on a client's behalf.

Rules (docs/cluster-protocol.md tells them whole):
- A definition is applied to the broker; a queue differing in a fixed field is declared again only if it
  is empty and has no consumer (regrouping held messages splits groups). A deletion drops the queue.
- Each change is applied once: the revision of the last one applied is journalled (QUEUES_MARK), and a
  replayed log skips what was applied before; once the replica is current (`ready`) every definition is
  applied again where this node differs. The config file's queues are seeds: the cluster's wins.
- A queue made here for a client (the broker's `made`) is proposed as a definition at the end of the
  batch that made it, ahead of its claims; a subscription that ended here (`ended`) is deleted
  cluster-wide once its definition committed; failed proposals are made again after
  DEFINITION_RETRY_INTERVAL_MS. On a CONFLICT the cluster's definition applies here. A temporary
  subscription names its node (TEMPORARY_OF), which deletes those no live link holds; every node
  deletes those of a node marked down.
- Imports only context.py and feed.py of this package.
"""
from __future__ import annotations

import dataclasses
import logging

from node.core.cluster.context import QUEUES_MARK, Context
from node.core.cluster.feed import CONFLICT, MALFORMED, TEMPORARY_OF, fixed_changes, settings_values
from node.core.effects import Declared, ProposeDefinition, ProposeQueueDeletion, ProposeQueueSeeds, QueueDeleted
from node.core.errors import AlreadyExists, GrouperError
from node.core.dispatch.settings import QueueSettings

log = logging.getLogger("grouper.cluster")

SEED_RETRY_INTERVAL_MS = 1000  # config-file queues not yet proposed as definitions are proposed again this often
DEFINITION_RETRY_INTERVAL_MS = 1000  # a failed proposal of a queue made or ended here is made again this soon


class Definitions:
    def __init__(self, context: Context, queue_seeds: tuple):
        self.context = context
        self.broker = context.broker
        self.queue_seeds = tuple(queue_seeds)
        self.definitions: dict[str, dict] = {}  # name -> settings dict, as the replica holds them
        self.deleted_names: set[str] = set()  # deleted cluster-wide and not defined again, as the replica knows
        self.definitions_revision = 0  # the highest revision the feed carried
        self.definitions_applied = 0  # revision of the last definition change applied here (journalled)
        self.seeded = not self.queue_seeds
        self.seeding = False
        self.seed_due_ms = 0
        self.replica_ready = False
        self.defining: dict[str, dict] = {}  # name -> values proposed, outcome not heard yet
        self.define_again: dict[str, dict] = {}  # name -> values whose proposal failed, proposed again when due
        self.to_delete: set[str] = set()  # names to delete cluster-wide, proposed when no define is in flight
        self.deleting: set[str] = set()  # deletions proposed, outcome not heard yet
        self.committed_unseen: set[str] = set()  # definitions this node made committed, not applied here yet
        self.due_ms = 0  # when failed proposals are made again

    # ---- the feed ------------------------------------------------------------------------------------

    def applied(self, payload, effects: list) -> None:
        """QUEUES: definition changes in log order."""
        for revision, name, values in payload:
            self._definition(revision, name, values, effects)

    def applied_all(self, payload, effects: list) -> None:
        """QUEUES_ALL: a snapshot replaces what was known."""
        revision, definitions, deleted = payload
        self.definitions = dict(definitions)
        self.deleted_names = set(deleted) - set(definitions)
        self.definitions_revision = max(self.definitions_revision, revision)
        if revision > self.definitions_applied:
            # deletions this node has not applied (a name deleted, then defined again, is not one)
            for name, deleted_revision in sorted(deleted.items(), key=lambda item: (item[1], item[0])):
                if name not in definitions and deleted_revision > self.definitions_applied:
                    self._definition(deleted_revision, name, None, effects)
            for name in sorted(definitions):
                self._apply(name, definitions[name], effects)
            self.definitions_applied = revision
            if self.context.journalled:
                effects.append(Declared({"name": QUEUES_MARK, "revision": revision}))
        self.committed_unseen.clear()  # the snapshot holds every definition committed so far
        if self.replica_ready:
            self._delete_own_ended()

    def _definition(self, revision: int, name: str, values: dict | None, effects: list) -> None:
        self.definitions_revision = max(self.definitions_revision, revision)
        self.committed_unseen.discard(name)
        if values is None:
            self.definitions.pop(name, None)
            self.deleted_names.add(name)
        else:
            self.definitions[name] = values
            self.deleted_names.discard(name)
        if revision <= self.definitions_applied:
            return  # applied before a restart (the log is being replayed); `ready` reconciles the rest
        self.definitions_applied = revision
        if self.context.journalled:
            effects.append(Declared({"name": QUEUES_MARK, "revision": revision}))
        if values is not None:
            self._apply(name, values, effects)
            if self.replica_ready and values.get(TEMPORARY_OF) == self.context.node_id \
                    and name not in self.defining and name not in self.broker.temporary:
                self.to_delete.add(name)  # its link ended before the definition got here, or the process did
            return
        queue = self.broker.queues.get(name)
        if queue is not None:
            durable = queue.settings.durable
            self.context.broker_effects(self.broker.delete_queue(name), effects)
            effects.append(QueueDeleted(name, durable))
            log.info("queue %r deleted cluster-wide (definition revision %d)", name, revision)

    def _apply(self, name: str, values: dict, effects: list) -> None:
        try:
            settings = QueueSettings.from_dict(settings_values(values), where=f"cluster definition of queue {name!r}")
        except GrouperError as error:  # a newer node's setting this one cannot read: keep what is here
            log.error("cannot apply the cluster's definition of queue %r here: %s; upgrade this node", name, error)
            return
        queue = self.broker.queues.get(name)
        if queue is not None and queue.settings == settings:
            return
        if queue is not None:
            # whole records: to_dict leaves out an empty address, which must still count as a change
            fixed = fixed_changes(dataclasses.asdict(queue.settings), dataclasses.asdict(settings))
            if not fixed:
                self.broker.redefine_queue(settings)
                self.context.broker_effects([], effects)  # journals the new declaration
                return
            stats = queue.stats()
            if stats["depth_messages"] or stats["consumers"]:
                log.warning("queue %r here differs from its cluster-wide definition in %s and holds %d messages "
                            "and %d consumers: it keeps its settings, since regrouping them would split groups; "
                            "delete the queue and add it again to apply the definition", name, ", ".join(fixed),
                            stats["depth_messages"], stats["consumers"])
                return
            self.context.broker_effects(self.broker.delete_queue(name), effects)
        self.broker.declare_queue(settings)
        self.context.broker_effects([], effects)  # journals the declaration

    def ready(self, now_ms: int, down: set, effects: list) -> None:
        """The replica has caught up with the log; `down`: the nodes marked down."""
        self.replica_ready = True
        for name in sorted(self.definitions):  # what a replay skipped: the config file may have said otherwise
            self._apply(name, self.definitions[name], effects)
        for values in self.queue_seeds:  # declared from the config file at recovery, deleted cluster-wide
            queue = self.broker.queues.get(values["name"])
            if values["name"] in self.deleted_names and queue is not None and not queue.stats()["depth_messages"] \
                    and not queue.stats()["consumers"]:
                self.context.broker_effects(self.broker.delete_queue(values["name"]), effects)
                effects.append(QueueDeleted(values["name"], queue.settings.durable))
        self._delete_own_ended()  # its links ended with the process
        self.delete_temporary_of(down)
        self._define_recovered(effects)
        self.propose_seeds(now_ms, effects)
        self._propose_again(effects)

    # ---- seeds -----------------------------------------------------------------------------------------

    def queues_seeded(self) -> None:
        """Every config-file queue was proposed as a seed, and the proposals committed."""
        self.seeded, self.seeding = True, False

    def queue_seeds_failed(self, now_ms: int) -> None:
        self.seeding = False
        self.seed_due_ms = now_ms + SEED_RETRY_INTERVAL_MS

    def propose_seeds(self, now_ms: int, effects: list) -> None:
        if self.seeded or self.seeding or not self.replica_ready or now_ms < self.seed_due_ms:
            return
        self.seeding = True
        effects.append(ProposeQueueSeeds(self.queue_seeds))

    # ---- queues made and ended on a client's behalf ----------------------------------------------------

    @property
    def pending(self) -> set[str]:
        """Queues whose definition or deletion this node has yet to propose, or to see committed."""
        local = self.broker.local
        return {settings.name for settings, _ in local.made} | set(local.ended) | set(
            self.defining) | set(self.define_again) | self.committed_unseen | self.to_delete | self.deleting

    def tick(self, now_ms: int, effects: list) -> None:
        self.propose_seeds(now_ms, effects)
        if self.broker.local.made or self.broker.local.ended:
            self.take_made(effects)
        if (self.define_again or self.to_delete) and now_ms >= self.due_ms:
            self._propose_again(effects)

    def take_made(self, effects: list) -> None:
        broker = self.broker
        made, ended = broker.local.take_queues()
        self.to_delete.update(ended)  # first: what ended and was made again in one batch, in that order
        for settings, temporary in made:
            name = settings.name
            queue = broker.queues.get(name)
            if queue is None or queue.settings is not settings:
                continue  # gone again (a refused send, a link that failed), or redefined meanwhile
            if name in self.to_delete or name in self.deleting:
                if not settings.address:
                    # a forward that reached this node after the subscription's link ended here: the
                    # queue it made goes with the subscription's deletion
                    continue
                self.to_delete.discard(name)  # subscribed again since it ended: a deletion proposed goes first
            values = settings.to_dict()
            if temporary:
                values[TEMPORARY_OF] = self.context.node_id
            self.define_again.pop(name, None)
            if self.definitions.get(name) != values or name in self.deleting:
                self.defining[name] = values
                effects.append(ProposeDefinition(values))
        if ended:
            self._propose_deletions(effects)

    def _define_recovered(self, effects: list) -> None:
        """Queues recovered from the journal with no definition and no deletion in the log: made here
        for clients before a restart whose definition never committed (no majority, then a crash).
        Config-file queues are seeds, with rules of their own."""
        unknown = set(self.broker.queues) - set(self.definitions) - self.deleted_names - self.pending \
            - {values["name"] for values in self.queue_seeds}
        for name in sorted(unknown):
            values = self.broker.queues[name].settings.to_dict()
            self.defining[name] = values
            effects.append(ProposeDefinition(values))

    def _propose_deletions(self, effects: list) -> None:
        for name in sorted(self.to_delete):
            if name in self.defining or name in self.committed_unseen:
                continue  # deleted once its definition is in (`definition_proposed`, the feed)
            self.to_delete.discard(name)
            self.define_again.pop(name, None)  # a queue that ended is not defined again
            if name in self.definitions and name not in self.deleting:
                self.deleting.add(name)
                effects.append(ProposeQueueDeletion(name, self.definitions_revision))

    def _propose_again(self, effects: list) -> None:
        again, self.define_again = self.define_again, {}
        for name, values in sorted(again.items()):
            queue = self.broker.queues.get(name)
            if queue is None or self.definitions.get(name) == values or name in self.defining:
                continue
            self.defining[name] = values
            effects.append(ProposeDefinition(values))
        if self.replica_ready:  # what a replaying replica holds may be deleted already
            self._propose_deletions(effects)

    def _delete_own_ended(self) -> None:
        """This node's temporary subscriptions that no live link holds here are deleted cluster-wide."""
        me = self.context.node_id
        self.to_delete.update(name for name, values in self.definitions.items()
                              if values.get(TEMPORARY_OF) == me and name not in self.defining
                              and name not in self.broker.temporary)

    def delete_temporary_of(self, nodes: set) -> None:
        if nodes:
            self.to_delete.update(name for name, values in self.definitions.items()
                                  if values.get(TEMPORARY_OF) in nodes)

    def definition_proposed(self, values: dict, reason: str | None, outcome, held, now_ms: int) -> list:
        """The outcome of a ProposeDefinition: reason None once applied, with the command's
        (outcome, the definition held); else why it failed."""
        name = values["name"]
        if self.defining.get(name) is values:
            del self.defining[name]
        effects: list = []
        if reason is not None:
            log.info("proposing queue %r as a cluster-wide definition failed (%s); retrying in %d ms",
                     name, reason, DEFINITION_RETRY_INTERVAL_MS)
            self.define_again[name] = values
            self.due_ms = now_ms + DEFINITION_RETRY_INTERVAL_MS
        elif outcome not in (CONFLICT, MALFORMED) and name not in self.definitions:
            self.committed_unseen.add(name)  # in the log; the replica here applies it a moment later
        elif outcome == CONFLICT and held is not None:
            self._conflict(name, values, held, effects)
        if name in self.to_delete:
            self._propose_deletions(effects)
        return effects

    def _conflict(self, name: str, values: dict, held: dict, effects: list) -> None:
        differing = sorted(key for key in set(values) | set(held) if values.get(key) != held.get(key))
        log.warning("queue %r made here differs from its cluster-wide definition in %s: the cluster's "
                    "definition applies", name, ", ".join(differing))
        queue = self.broker.queues.get(name)
        if queue is not None and queue.settings.to_dict() == settings_values(values) \
                and not queue.depth_messages and queue.consumers:
            # its consumers attached with settings the cluster refused (another node defined the
            # name first): detached, saying so, as an attach would be once the definition is here
            refusal = AlreadyExists(
                f"queue {name!r} is defined cluster-wide with other settings than this attach made it with "
                f"({', '.join(differing)} differ): attach again without address parameters, or with the "
                f"cluster's")
            self.context.broker_effects(self.broker.delete_queue(name, refusal), effects)
        self._apply(name, held, effects)

    def deletion_proposed(self, name: str, reason: str | None, now_ms: int) -> list:
        """The outcome of a ProposeQueueDeletion: reason None once applied, else why it failed."""
        self.deleting.discard(name)
        if reason is not None:
            log.info("deleting queue %r cluster-wide failed (%s); retrying in %d ms", name, reason,
                     DEFINITION_RETRY_INTERVAL_MS)
            self.to_delete.add(name)
            self.due_ms = now_ms + DEFINITION_RETRY_INTERVAL_MS
        return []
