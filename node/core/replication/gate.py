"""What waits for backups: a producer's accept, a consumer's settlement confirmation, each released once
every backup it waits on holds its entry durably (docs/replication.md, "Synchronous").

Rules:
- Pure: no threads, sockets or clock. The owner registers a target (`wait`) once its own journal made
  the change durable, with the repl_seq each in-sync backup's stream gave that change; it tells the
  gate every backup's new high water (`acked`) and every backup that left the in-sync set (`dropped`),
  and carries out the releases these return.
- A target is released once, when every backup it waits on acknowledged a high water at or above its
  repl_seq, or left the in-sync set. Releases come back in registration order. A target does not wait
  behind earlier ones waiting on other backups: one slow backup holds up only what waits on it.
- High waters are kept per backup, so an acknowledgement that came before the registration (the
  backup's disk was faster than the owner's) counts: such a target, or one with no backup to wait on,
  is released by `wait` itself.
- A backup's marks count repl_seqs of the current epoch only: when the owner's epoch moves on (it was
  promoted away) `abandon` hands back every target still waiting, which the owner must refuse, not
  confirm (their changes may be on no backup), and forgets every mark.
"""

from __future__ import annotations

import heapq
import itertools


class ReplicaGate:
    def __init__(self):
        self._targets: dict[int, object] = {}  # registration number -> target, while it waits
        self._remaining: dict[int, int] = {}  # registration number -> backups it still waits on
        self._waits: dict[str, list] = {}  # backup -> heap of (repl_seq, registration number)
        self._high_waters: dict[str, int] = {}  # backup -> the highest it acknowledged in this epoch
        self._numbers = itertools.count(1)

    @property
    def waiting_count(self) -> int:
        return len(self._targets)

    def high_water_of(self, backup: str) -> int:
        return self._high_waters.get(backup, 0)

    def wait(self, target, repl_seqs: dict[str, int]) -> bool:
        """Hold `target` until each backup in `repl_seqs` acknowledged its repl_seq. True: nothing to wait
        for (the caller releases it now); the gate keeps nothing of it."""
        due = [(backup, repl_seq) for backup, repl_seq in repl_seqs.items()
               if repl_seq > self._high_waters.get(backup, 0)]
        if not due:
            return True
        number = next(self._numbers)
        self._targets[number] = target
        self._remaining[number] = len(due)
        for backup, repl_seq in due:
            heapq.heappush(self._waits.setdefault(backup, []), (repl_seq, number))
        return False

    def acked(self, backup: str, high_water: int) -> list:
        """`backup` holds every repl_seq up to `high_water` durably: the targets that now wait on nothing."""
        if high_water <= self._high_waters.get(backup, 0):
            return []
        self._high_waters[backup] = high_water
        heap = self._waits.get(backup)
        done: list[int] = []
        while heap and heap[0][0] <= high_water:
            self._one_less(heapq.heappop(heap)[1], done)
        if heap == []:
            del self._waits[backup]
        return self._release(done)

    def dropped(self, backup: str) -> list:
        """`backup` left the in-sync set: nobody waits for it any more. Its mark stays (a later return to
        the set continues the same stream)."""
        done: list[int] = []
        for _, number in self._waits.pop(backup, ()):
            self._one_less(number, done)
        return self._release(done)

    def abandon(self) -> list:
        """The owner's epoch moved on: every target still waiting, in registration order, to be refused;
        the gate forgets everything."""
        targets = [self._targets[number] for number in sorted(self._targets)]
        self._targets.clear()
        self._remaining.clear()
        self._waits.clear()
        self._high_waters.clear()
        return targets

    def _one_less(self, number: int, done: list) -> None:
        remaining = self._remaining[number] - 1
        if remaining:
            self._remaining[number] = remaining
        else:
            del self._remaining[number]
            done.append(number)

    def _release(self, done: list) -> list:
        done.sort()
        return [self._targets.pop(number) for number in done]
