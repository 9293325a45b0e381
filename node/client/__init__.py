"""The one AMQP 1.0 client library of Grouper's own tools: `grouper perf`, bench/ and the Spark pipeline.

Rules:
- proton's C engine only through node/amqp/engine.py (`lib`, `ffi`), never proton's Python classes and
  never `cproton` directly: a cffi call costs ~0.1 us, a proton wrapper object several.
- Two ways to drive it over the same endpoint (endpoint.py: socket, transport, session):
  - the load generators' pump (pump.py, traffic.py): every connection of a process on one selectors
    loop, messages from templates (encoding.py), a few us of client CPU per message;
  - the blocking client (connection.py, links.py, acquisition.py): one connection driven by the
    thread that uses it, every wait bounded, for the pipeline's Spark tasks.
- No policy of its callers: what to send, what to count and how to word a refused login are theirs.
"""
