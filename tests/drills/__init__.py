"""Failover drills: a delivery log format, a checker of the logs, and a load driver that writes them."""
