"""One bounded page of a queue's groups on this node, and its consumers with the groups each has.

Rules:
- Runs on the engine loop thread (LoopControl posts it through the bridge) and reads a core `Queue`;
  it changes nothing but what `Group.head()` itself drops (settled tombstones at a group's head).
  No clock: `now_ms` is an argument.
- Bounded work per call, so a million groups never build a million-entry list: at most
  GROUPS_SCANNED_MAX groups are looked at and PAGE_SIZE_MAX rows returned. A prefix search that has
  not looked at every group yet says so through `next_position` < `groups_total`: the caller asks
  again. The one cost that grows with the groups is the skip to `position`, done by the dict
  iterator's own C loop, about 20 ns per group passed (measured on the 2-core CI machine at load
  average 6: 18 ms for a page at position 999,000 of a million groups, 7 ms for a prefix search over
  50,000, against 506 ms for ListGroups' full sorted list); a dict cannot seek.
- Groups come in the order they first arrived on the node (the queue's dict order): sorting a
  million ids per page is the cost this avoids. A position counts groups, so groups that end between
  two pages shift the next one: a view may miss or repeat a few rows while groups come and go.
- An id searched for exactly is found at once (a dict lookup) and listed first on the first page, on top
  of the page's `page_size` rows.
"""

from __future__ import annotations

from itertools import islice

from node.core.errors import InvalidField

PAGE_SIZE_MAX = 500  # rows per page
GROUPS_SCANNED_MAX = 50_000  # groups looked at per page: a few milliseconds of the engine loop
OWNED_SHOWN_MAX = 20  # group ids listed per consumer (groups_owned always counts them all)
PREFIX_LENGTH_MAX_CHARS = 1024  # longer than any group id worth searching for


def check_request(prefix: str, position: int, page_size: int) -> None:
    """InvalidField naming the field the caller must fix."""
    if not 1 <= page_size <= PAGE_SIZE_MAX:
        raise InvalidField(f"page_size: must be 1 to {PAGE_SIZE_MAX}, got {page_size}")
    if position < 0:
        raise InvalidField(f"position: must be >= 0 (0 = from the start, else the next_position of the page "
                           f"before), got {position}")
    if len(prefix) > PREFIX_LENGTH_MAX_CHARS:
        raise InvalidField(f"prefix: at most {PREFIX_LENGTH_MAX_CHARS} characters, got {len(prefix)}")


def group_row(key, group, now_ms: int) -> dict:
    consumer = group.consumer
    head = group.head()
    row = {"group": str(key), "messages": group.available_count + group.acquired, "acquired": group.acquired,
           "consumer": None if consumer is None else str(consumer.id), "head_age_ms": None}
    if head is not None and head.enqueued_at_ms:
        row["head_age_ms"] = max(0, now_ms - head.enqueued_at_ms)
    return row


def group_page(queue, prefix: str, position: int, page_size: int, now_ms: int,
               label_of=lambda consumer_id: "", scanned_max: int = GROUPS_SCANNED_MAX,
               client_of=lambda consumer_id: "") -> dict:
    """{groups, next_position, groups_total, scanned, consumers} for `queue` (a core Queue).
    `label_of(consumer id)` names a consumer for people (its container and link), `client_of` its
    client (address and user)."""
    check_request(prefix, position, page_size)
    groups = queue.groups
    rows = []
    exact = groups.get(prefix) if prefix else None
    if exact is not None and position == 0:
        rows.append(group_row(prefix, exact, now_ms))
    scanned = 0
    next_position = min(position, len(groups))
    found = 0
    # values, not items: the skip to `position` then makes no tuple per group passed (about 4x faster)
    for group in islice(groups.values(), position, None):  # at least one group per page: it moves on
        scanned += 1
        next_position += 1
        if group is not exact and (not prefix or str(group.key).startswith(prefix)):
            rows.append(group_row(group.key, group, now_ms))
            found += 1
        if found >= page_size or scanned >= scanned_max:
            break
    return {"groups": rows, "next_position": next_position, "groups_total": len(groups), "scanned": scanned,
            "consumers": consumer_rows(queue, label_of, client_of)}


def consumer_rows(queue, label_of, client_of=lambda consumer_id: "") -> list[dict]:
    rows = []
    for consumer_id, consumer in sorted(queue.consumers.items(), key=lambda item: str(item[0])):
        if consumer.browse:
            continue
        # its first OWNED_SHOWN_MAX groups, sorted for reading: never all of them
        shown = sorted(str(group.key) for group in islice(consumer.iter_assigned_groups(), OWNED_SHOWN_MAX))
        rows.append({"consumer": str(consumer_id), "label": label_of(consumer_id), "groups_owned": consumer.assigned_count,
                     "groups": shown, "unsettled": len(consumer.unsettled), "credit": consumer.credit,
                     "client": client_of(consumer_id)})
    return rows
