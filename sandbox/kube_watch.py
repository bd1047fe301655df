"""Watch on a cluster's list endpoints, as the API server's watch cache serves it.

Every change to a cluster's objects is an event with the object's new ``resourceVersion`` (a delete takes a version of
its own, as etcd's revision does). The last :data:`HISTORY` events are kept: a watch from a version still in that
window replays what followed it, an older one gets the watch cache's ``410 Expired`` as an ERROR event
(``too old resource version: N (M)``; k8s.io/apiserver pkg/storage/cacher/watch_cache.go, ``getAllEventsSinceLocked``).
A watch without a version, or from ``0``, starts with an ADDED event per object that exists, as a fresh
list-then-watch would see it. With a selector, an object that starts to match arrives as ADDED and one that stops
matching as DELETED (cacher.go, ``watchCacheInterval`` filtering with the previous object). The stream ends after
``timeoutSeconds`` (a BOOKMARK first when the client allows them), and ``sendInitialEvents=true`` ends its initial
events with the ``k8s.io/initial-events-end`` bookmark (the WatchList protocol, KEP-3157).
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# Events kept for watches that resume from a resourceVersion (the watch cache keeps about this many per type).
HISTORY = 1000
# The API server's default --min-request-timeout is 1800 s; a watch asks for less with timeoutSeconds.
MAX_WATCH_S = 1800
INITIAL_EVENTS_END = "k8s.io/initial-events-end"

Key = tuple[str, str, str, str]
Matcher = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class Change:
    """One change to one object: its type, the object after it (for a delete: as it was), and before it."""

    revision: int
    type: str
    key: Key
    obj: dict[str, Any]
    previous: dict[str, Any] | None


class ExpiredError(Exception):
    """A watch from a resourceVersion older than the kept history."""

    def __init__(self, wanted: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {wanted} ({oldest})")


@dataclass
class History:
    """The recent changes of one cluster's objects, and the watches waiting for the next ones."""

    changes: deque[Change] = field(default_factory=lambda: deque(maxlen=HISTORY))
    # The newest snapshot of each object, so a change knows what the object was before it (objects are edited in
    # place by their controllers before they are stored again).
    snapshots: dict[Key, dict[str, Any]] = field(default_factory=dict)
    watchers: set[asyncio.Queue[Change]] = field(default_factory=set)

    def record(self, revision: int, key: Key, obj: dict[str, Any] | None) -> None:
        """Record a stored object (``obj``) or a removed one (None) at ``revision``; wake the watches."""
        previous = self.snapshots.get(key)
        if obj is None:
            if previous is None:
                return
            del self.snapshots[key]
            gone = copy.deepcopy(previous)
            gone["metadata"]["resourceVersion"] = str(revision)
            change = Change(revision, "DELETED", key, gone, previous)
        else:
            snapshot = copy.deepcopy(obj)
            self.snapshots[key] = snapshot
            change = Change(revision, "MODIFIED" if previous is not None else "ADDED", key, snapshot, previous)
        self.changes.append(change)
        for queue in self.watchers:
            queue.put_nowait(change)

    def since(self, revision: int, current: int) -> list[Change]:
        """The changes after ``revision``; :class:`ExpiredError` when some of them are no longer kept."""
        oldest = self.changes[0].revision if self.changes else current + 1
        if revision < oldest - 1 and len(self.changes) == self.changes.maxlen:
            raise ExpiredError(revision, oldest)
        return [change for change in self.changes if change.revision > revision]

    def subscribe(self) -> asyncio.Queue[Change]:
        """A queue that gets every change from now on (call :meth:`unsubscribe` when done)."""
        queue: asyncio.Queue[Change] = asyncio.Queue()
        self.watchers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Change]) -> None:
        """Stop feeding ``queue``."""
        self.watchers.discard(queue)


@dataclass(frozen=True)
class Scope:
    """What one watch sees: a type, a namespace (None: all) and the selectors' verdict on an object."""

    group_version: str
    plural: str
    namespace: str | None
    matches: Matcher

    def event(self, change: Change) -> dict[str, Any] | None:
        """The watch event ``change`` is for this watch, or None when the watch does not see it."""
        gv, plural, namespace, _ = change.key
        if (gv, plural) != (self.group_version, self.plural):
            return None
        if self.namespace is not None and namespace != self.namespace:
            return None
        now = change.type != "DELETED" and self.matches(change.obj)
        before = change.previous is not None and self.matches(change.previous)
        if change.type == "DELETED":
            kind = "DELETED" if before else None
        elif now:
            kind = "MODIFIED" if before else "ADDED"
        else:
            kind = "DELETED" if before else None
        return None if kind is None else {"type": kind, "object": change.obj}

    def initial(self, objects: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ADDED events a watch from "now" starts with: one per object it sees."""
        return [{"type": "ADDED", "object": copy.deepcopy(obj)} for obj in objects if self.matches(obj)]


class InvalidWatchError(ValueError):
    """A watch request the API server refuses (400), with its message."""


@dataclass(frozen=True)
class WatchRequest:
    """What a watch asks for: where it starts, how long it lasts, and which extra events it wants."""

    since: int | None
    timeout_s: float
    send_initial: bool
    bookmarks: bool

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> WatchRequest:
        """From the request's query; :class:`InvalidWatchError` for what the API server refuses."""
        try:
            since = parse_version(query.get("resourceVersion", ""))
            timeout = int(query.get("timeoutSeconds") or MAX_WATCH_S)
        except ValueError as exc:
            raise InvalidWatchError(str(exc)) from exc
        send_initial = query.get("sendInitialEvents") == "true"
        if send_initial and query.get("resourceVersionMatch") != "NotOlderThan":
            raise InvalidWatchError('resourceVersionMatch: Forbidden: sendInitialEvents requires "NotOlderThan"')
        return cls(
            since, float(min(max(timeout, 0), MAX_WATCH_S)), send_initial, query.get("allowWatchBookmarks") == "true"
        )

    def opening(
        self, scope: Scope, objects: Iterator[dict[str, Any]], history: History, revision: int, kind: str
    ) -> list[dict[str, Any]]:
        """The events the stream starts with: the current objects (no version, ``0``, or a WatchList), or what
        followed the version asked for (an ERROR event when that is no longer kept)."""
        if self.since is None or self.send_initial:
            events = scope.initial(objects)
            if self.send_initial:
                events.append(bookmark(kind, scope.group_version, revision, initial_end=True))
            return events
        try:
            backlog = history.since(self.since, revision)
        except ExpiredError as exc:
            return [expired(exc)]
        return [event for event in (scope.event(change) for change in backlog) if event is not None]


def parse_version(text: str) -> int | None:
    """A watch's resourceVersion: None for "" and "0" (start with the current state), else the revision.

    Raises ValueError for anything but a non-negative integer, as the API server refuses it."""
    if text in ("", "0"):
        return None
    if not text.isascii() or not text.isdigit():
        raise ValueError(f'invalid resource version "{text}"')
    return int(text)


def bookmark(kind: str, api_version: str, revision: int, *, initial_end: bool = False) -> dict[str, Any]:
    """A BOOKMARK event: an object of the watched kind with only its resourceVersion (and, ending the initial
    events of a WatchList, the annotation that says so)."""
    metadata: dict[str, Any] = {"resourceVersion": str(revision)}
    if initial_end:
        metadata["annotations"] = {INITIAL_EVENTS_END: "true"}
    return {"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": metadata}}


def expired(error: ExpiredError) -> dict[str, Any]:
    """The ERROR event a watch from a compacted version gets (HTTP 200; the Status is the event's object)."""
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": str(error),
            "reason": "Expired",
            "code": 410,
        },
    }
