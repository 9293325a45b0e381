"""Group dispatch on one node: queues, their groups and consumers, messages, settings and
addresses, paging and cold tails. Pure: time comes in as `now_ms`; effects go out (node/core/effects.py);
never imports the cluster protocol, an adapter, proton, grpc, threading, socket or time.
"""
