"""The engine loop's one effect table (node/amqp/executor.py) has a row for every effect the node shell hands
out that is not the cluster link's: an effect added to node/core/effects.py without a row fails here, not as a
KeyError on a live node."""

from __future__ import annotations

import inspect

from node.amqp.executor import EffectExecutor
from node.core import effects

# the cluster protocol's sends, which the node shell handles itself (node/core/shell.py)
INSIDE_THE_SHELL = {effects.EnqueueLocal, effects.AcceptWhenStored, effects.AfterFlush}
# the cluster link's rows (node/cluster.py ClusterLink._carry): raft proposals, forwarding, replies, exit
CLUSTER_ROWS = {effects.SubmitForward, effects.ReadOutbound, effects.ProposeClaim, effects.ProposeTouch,
                effects.ProposeMoveClear, effects.ProposeQueueSeeds, effects.QueueDeleted, effects.ProposeDefinition,
                effects.ProposeQueueDeletion, effects.ReportConsumers, effects.Register, effects.Reply,
                effects.StopNode}


def test_every_effect_the_shell_hands_the_engine_loop_has_a_row_in_its_table():
    every = {kind for _, kind in inspect.getmembers(effects, inspect.isclass) if kind.__module__ == effects.__name__}
    table = EffectExecutor(server=None).table
    assert every - INSIDE_THE_SHELL - CLUSTER_ROWS - set(table) == set()
    assert set(table) & CLUSTER_ROWS == set()  # the cluster link adds those
