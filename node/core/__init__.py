"""The pure cores of a node, one package per subject.

Rules (tests/unit/test_imports.py checks the first two):
- Pure: nothing here imports an adapter (node/amqp, node/peer, node/admin, node/store, ...), handler/,
  proton, grpc, pysyncobj, threading, socket or time. Time comes in as `now_ms`; decisions go out as
  effects (effects.py), which each adapter carries out through one table.
- One-way: cluster/ imports dispatch/; dispatch/ imports access/; access/ and replication/ import no other
  subject. The top-level modules (effects, errors, durability, group_map, tally) serve every subject; the
  node shell (shell.py) sits above dispatch and cluster and runs the commit cycle for both.
- Errors are data (errors.py): what went wrong, whose fault, whether a retry helps; never a wire form.
"""
