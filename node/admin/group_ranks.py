"""A node's top groups of a queue by backlog, head age or owner: the console's "hot groups" (issue 32).

Rules:
- Runs on the engine loop thread, one bounded batch per call (LoopControl posts the batches through
  the bridge, as the queue purge does), so a million groups never hold the loop for one long turn: a
  batch looks at GROUPS_PER_BATCH groups and keeps only the best `keep` seen so far (heapq, O(n log k)).
  Nothing is sorted whole and nothing of a million groups is sent anywhere: an answer is a page of at
  most group_pages.PAGE_SIZE_MAX rows within the first RANK_DEPTH_MAX ranks.
- Reads a core `Queue` and changes nothing but what `Group.head()` itself drops (settled tombstones at a
  group's head), as node/admin/group_pages.py. No clock: `now_ms` is an argument.
- Groups that come or go between two batches may be missed or counted with the state they had when
  their batch looked: a ranking of a busy queue is a snapshot taken over a few loop turns.
- Orders: "backlog" (messages, available + acquired, most first), "head_age" (the oldest available
  message's arrival, oldest first; groups with none waiting are left out), "owner" (groups with an owner,
  by owner id; groups without one are left out). Ties keep the order the groups arrived in, so a
  ranking of an unchanged queue is the same every time.
"""

from __future__ import annotations

import heapq
from itertools import islice

from node.admin.group_pages import consumer_rows, group_row
from node.core.errors import InvalidField

ORDERS = ("backlog", "head_age", "owner")
RANK_DEPTH_MAX = 1000  # ranks a ranked page reaches (position + page_size): "the top", not a listing
GROUPS_PER_BATCH = 20_000  # groups looked at per engine loop turn: 10-50 ms on the 2-core CI machine


def check_order(order: str, position: int, page_size: int) -> None:
    if order not in ORDERS:
        raise InvalidField(f"order: expected one of {', '.join(ORDERS)} (or empty for arrival order), got "
                           f"{order[:40]!r}")
    if position + page_size > RANK_DEPTH_MAX:
        raise InvalidField(f"position + page_size: a ranking reaches the first {RANK_DEPTH_MAX} groups, asked "
                           f"for up to rank {position + page_size}; narrow it with a prefix instead")


def _score(order: str, group):
    """The group's sort key (greatest ranks first: a number, cheap to compare), or None when the order
    leaves it out."""
    if order == "backlog":
        return group.available_count + group.acquired
    if order == "head_age":
        head = group.head()
        return -head.enqueued_at_ms if head is not None and head.enqueued_at_ms else None
    return None if group.consumer is None else str(group.consumer.id)  # as the page shows it


def rank_batch(queue, order: str, prefix: str, keep: int, top: list, position: int,
               batch_max: int = GROUPS_PER_BATCH) -> tuple[list, int, bool]:
    """Look at up to `batch_max` groups from dict position `position`: (the best `keep` of `top` and
    those, as [(score, group key)], best first; the next position; whether every group was looked at).
    A group no better than the keep-th kept is skipped at once: on a steady queue most are."""
    groups = queue.groups
    found = []
    looked = 0
    owner = order == "owner"
    floor = top[-1][0] if len(top) >= keep else None
    for group in islice(groups.values(), position, None):
        looked += 1
        score = _score(order, group)
        if score is not None and (floor is None or (score < floor if owner else score > floor)) \
                and (not prefix or str(group.key).startswith(prefix)):
            found.append((score, group.key))
        if looked >= batch_max:
            break
    # stable selections: equal scores keep the queue's order, so an unchanged queue ranks alike each time
    if owner:  # owner ids ascending (their string form, as the page shows them)
        best = heapq.nsmallest(keep, [*top, *found], key=lambda item: item[0])
    else:
        best = heapq.nlargest(keep, [*top, *found], key=lambda item: item[0])
    next_position = position + looked
    return best, next_position, looked < batch_max or next_position >= len(groups)


def ranked_page(queue, top: list, position: int, page_size: int, now_ms: int,
                label_of=lambda consumer_id: "", client_of=lambda consumer_id: "") -> dict:
    """The page of ranks [position, position + page_size) of `top` as group_pages.group_page answers,
    rows as they stand now (a group gone since its batch is left out)."""
    rows = []
    for _score_value, key in top[position:position + page_size]:
        group = queue.groups.get(key)
        if group is not None:
            rows.append(group_row(key, group, now_ms))
    return {"groups": rows, "next_position": position + len(rows), "groups_total": len(queue.groups),
            "scanned": len(queue.groups), "ranked": len(top), "consumers": consumer_rows(queue, label_of, client_of)}


def rank(queue, order: str, prefix: str, position: int, page_size: int, now_ms, label_of=lambda c: "",
         batch_max: int = GROUPS_PER_BATCH, run=lambda fn: fn(), client_of=lambda c: "") -> dict:
    """The whole ranking, each batch through `run` (LoopControl: the bridge; tests: a plain call);
    `queue()`: the core Queue, looked up again each batch; `now_ms()`: the clock."""
    check_order(order, position, page_size)
    top: list = []
    scan_position, done = 0, False
    while not done:
        top, scan_position, done = run(lambda top=top, scan_position=scan_position: rank_batch(
            queue(), order, prefix, position + page_size, top, scan_position, batch_max))
    return run(lambda: ranked_page(queue(), top, position, page_size, now_ms(), label_of, client_of))
