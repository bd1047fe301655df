"""The sandbox's watch as the API server's watch cache answers it: versions, selectors, expiry, bookmarks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sandbox.kube_cluster import KubeCluster
from sandbox.kube_selectors import label_selector

from sandbox import kube_watch

CM = ("v1", "configmaps")


def _cm(cluster: KubeCluster, name: str, labels: dict[str, str], data: str = "1") -> dict[str, Any]:
    obj = cluster.new_object("v1", "ConfigMap", name, "default", {"data": {"x": data}})
    obj["metadata"]["labels"] = labels
    return cluster.put(*CM, obj)


def _scope(selector: str = "", namespace: str | None = "default") -> kube_watch.Scope:
    labels = label_selector(selector)
    return kube_watch.Scope("v1", "configmaps", namespace, lambda o: labels(o["metadata"].get("labels") or {}))


def _opening(cluster: KubeCluster, query: dict[str, str], scope: kube_watch.Scope) -> list[dict[str, Any]]:
    wanted = kube_watch.WatchRequest.parse(query)
    return wanted.opening(scope, cluster.of(*CM, "default"), cluster.history, cluster.revision, "ConfigMap")


def _summary(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["object"]["metadata"].get("name", ""), e["object"]["metadata"]["resourceVersion"]) for e in events
    ]


def test_a_watch_from_a_version_replays_what_followed_it_and_a_delete_has_a_version_of_its_own() -> None:
    cluster = KubeCluster("1", "k")
    _cm(cluster, "a", {"app": "x"})
    listed = cluster.revision
    obj = _cm(cluster, "a", {"app": "x"}, data="2")
    cluster.remove(*CM, "default", "a")
    events = _opening(cluster, {"resourceVersion": str(listed)}, _scope())
    assert _summary(events) == [("MODIFIED", "a", obj["metadata"]["resourceVersion"]), ("DELETED", "a", "3")]
    # The deleted object is as it was, under the delete's version; the MODIFIED one is a snapshot, not the live dict.
    assert events[1]["object"]["data"] == {"x": "2"}
    obj["data"]["x"] = "edited in place"
    assert events[0]["object"]["data"] == {"x": "2"}


def test_without_a_version_or_from_0_the_watch_starts_with_every_object_it_sees() -> None:
    cluster = KubeCluster("1", "k")
    _cm(cluster, "a", {"app": "x"})
    _cm(cluster, "b", {"app": "y"})
    for query in ({}, {"resourceVersion": "0"}):
        assert _summary(_opening(cluster, query, _scope("app=x"))) == [("ADDED", "a", "1")]


def test_an_object_that_starts_or_stops_matching_the_selector_arrives_as_added_or_deleted() -> None:
    cluster = KubeCluster("1", "k")
    _cm(cluster, "a", {"app": "y"})
    start = cluster.revision
    _cm(cluster, "a", {"app": "x"})  # now matches
    _cm(cluster, "a", {"app": "x"}, data="2")  # still matches
    _cm(cluster, "a", {"app": "z"})  # no longer
    _cm(cluster, "a", {"app": "w"})  # never seen
    events = _opening(cluster, {"resourceVersion": str(start)}, _scope("app=x"))
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[2]["object"]["metadata"]["labels"] == {"app": "z"}


def test_other_namespaces_and_kinds_are_not_seen_unless_the_watch_is_on_all_namespaces() -> None:
    cluster = KubeCluster("1", "k")
    other = cluster.new_object("v1", "ConfigMap", "o", "other", {})
    cluster.put(*CM, other)
    cluster.put("v1", "secrets", cluster.new_object("v1", "Secret", "s", "default", {}))
    assert _opening(cluster, {"resourceVersion": "0"}, _scope()) == []
    assert _summary(_opening(cluster, {"resourceVersion": "0"}, _scope(namespace=None))) == []  # objects: default only
    change = cluster.history.changes[0]
    assert _scope(namespace=None).event(change) == {"type": "ADDED", "object": change.obj}
    assert _scope().event(change) is None and _scope(namespace=None).event(cluster.history.changes[1]) is None


def test_a_version_older_than_the_kept_history_gets_410_expired_as_an_error_event() -> None:
    cluster = KubeCluster("1", "k")
    for i in range(kube_watch.HISTORY + 5):
        _cm(cluster, "a", {}, data=str(i))
    oldest = cluster.history.changes[0].revision
    events = _opening(cluster, {"resourceVersion": "2"}, _scope())
    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: 2 ({oldest})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]
    assert len(_opening(cluster, {"resourceVersion": str(oldest - 1)}, _scope())) == kube_watch.HISTORY


def test_send_initial_events_ends_them_with_the_initial_events_end_bookmark() -> None:
    cluster = KubeCluster("1", "k")
    _cm(cluster, "a", {})
    query = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"}
    events = _opening(cluster, query, _scope())
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"] == {
        "resourceVersion": str(cluster.revision),
        "annotations": {"k8s.io/initial-events-end": "true"},
    }
    with pytest.raises(kube_watch.InvalidWatchError, match="NotOlderThan"):
        kube_watch.WatchRequest.parse({"sendInitialEvents": "true"})


@pytest.mark.parametrize("version", ["abc", "-1", "1.5", "٣"])
def test_a_version_that_is_not_a_revision_is_refused(version: str) -> None:
    with pytest.raises(kube_watch.InvalidWatchError, match="invalid resource version"):
        kube_watch.WatchRequest.parse({"resourceVersion": version})


def test_the_timeout_is_the_clients_within_the_servers_limit() -> None:
    assert kube_watch.WatchRequest.parse({"timeoutSeconds": "5"}).timeout_s == 5
    assert kube_watch.WatchRequest.parse({}).timeout_s == kube_watch.MAX_WATCH_S
    assert kube_watch.WatchRequest.parse({"timeoutSeconds": "99999"}).timeout_s == kube_watch.MAX_WATCH_S


def test_a_subscribed_watch_gets_each_change_until_it_unsubscribes() -> None:
    async def scenario() -> list[str]:
        cluster = KubeCluster("1", "k")
        queue = cluster.history.subscribe()
        _cm(cluster, "a", {})
        cluster.remove(*CM, "default", "a")
        cluster.history.unsubscribe(queue)
        _cm(cluster, "b", {})
        return [(await queue.get()).type for _ in range(queue.qsize())]

    assert asyncio.run(scenario()) == ["ADDED", "DELETED"]
