"""The raft member process's place among processes: its scheduling priority and its parent's death.

Owns how the member process asks the kernel for time and for its end:
- Scheduling. When the nodes (and their neighbours) keep every core busy, a member at the nodes'
  priority waits its turn on each wake-up, and a decision takes ~8 wake-ups across three members: at
  3,000 msgs/s through 3 nodes on 2 cores, nice -10 still left the member part of a decision at
  21 ms p99 (each wake-up waited ~0.5 ms on average), SCHED_RR at 2.2 ms. A real-time thread runs as
  soon as it wakes; the member uses little CPU (a few % at that load), and the kernel keeps 5% of
  every core for other work whatever real-time threads do (sched_rt_runtime_us). Both need
  CAP_SYS_NICE (a node run as root has it; a container usually does not), so it falls back to nice
  MEMBER_NICE, else the node's priority, and says which it got.
- pysyncobj's forked snapshot writer goes back to a normal, low priority: at the member's real-time
  priority it would keep a core from the nodes for the seconds a large table takes to pickle.
- The kernel kills the member when the node dies (belt and braces beside the channel's EOF).
Called on the member's main thread before any other thread starts (threads inherit the policy).
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # prctl(2): a signal for this process when its parent dies
MEMBER_RT_PRIORITY = 1  # SCHED_RR, the lowest real-time priority: above every normal thread, below the kernel's
MEMBER_NICE = -10  # the fallback without a real-time policy
SNAPSHOT_CHILD_NICE = 10  # pysyncobj's forked snapshot writer: below the nodes, it is never urgent


def die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the channel's EOF alone ends this process


def raise_priority() -> str:
    """Returns what it got, for the log."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(MEMBER_RT_PRIORITY))
        return f"real-time (SCHED_RR {MEMBER_RT_PRIORITY})"
    except (OSError, AttributeError) as error:
        refusal = getattr(error, "strerror", None) or str(error)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, MEMBER_NICE)
        return f"nice {MEMBER_NICE} (real-time scheduling refused: {refusal})"
    except OSError as error:
        # the usual case for a non-root node (a container): said once, not a fault
        return (f"the node's priority (real-time scheduling and nice {MEMBER_NICE} need CAP_SYS_NICE: "
                f"{error.strerror}); on a host whose cores the nodes keep busy, decisions slow down and the "
                f"raft leadership may move")


def snapshot_child_at_low_priority() -> None:
    """After a fork, in the child (os.register_at_fork): pysyncobj's snapshot writer (handler/raft_setup.py)."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, SNAPSHOT_CHILD_NICE)  # a lower priority needs no privilege
    except (OSError, AttributeError):
        pass  # not Linux: the child runs at the member's priority
