"""The API objects of one sandbox GKE cluster: what the Kubernetes API serves and the KubeRay emulation writes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sandbox import formats
from sandbox.kube_watch import History


@dataclass
class KubeCluster:
    """The API objects of one GKE cluster."""

    cluster_id: str
    cluster_key: str
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    revision: int = 0
    # What changed lately, for watches (:mod:`sandbox.kube_watch`).
    history: History = field(default_factory=History, repr=False)

    def next_version(self) -> str:
        """A new resourceVersion (one counter per cluster, as etcd's revision)."""
        self.revision += 1
        return str(self.revision)

    def get(self, gv: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One object, or None."""
        return self.objects.get((gv, plural, namespace or "", name))

    def put(self, gv: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` (a new or changed object) with a fresh resourceVersion."""
        meta = obj["metadata"]
        meta["resourceVersion"] = self.next_version()
        key = (gv, plural, meta.get("namespace", ""), meta["name"])
        self.objects[key] = obj
        self.history.record(self.revision, key, obj)
        return obj

    def remove(self, gv: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Drop one object; returns it, or None if it was not there. The delete takes a resourceVersion of its own."""
        key = (gv, plural, namespace or "", name)
        obj = self.objects.pop(key, None)
        if obj is not None:
            self.history.record(int(self.next_version()), key, None)
        return obj

    def of(self, gv: str, plural: str, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        """Objects of one type, in one namespace or all of them."""
        for (o_gv, o_plural, o_ns, _), obj in sorted(self.objects.items()):
            if o_gv == gv and o_plural == plural and (namespace is None or o_ns == namespace):
                yield obj

    def new_object(self, gv: str, kind: str, name: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """A server-made object (pod, service, event) with the server's metadata filled in."""
        obj = {"apiVersion": gv, "kind": kind, **body}
        meta = obj.setdefault("metadata", {})
        meta["name"] = name
        if namespace is not None:
            meta["namespace"] = namespace
        server_metadata(meta)
        return obj


def server_metadata(meta: dict[str, Any]) -> None:
    """Fill in what the API server sets on a new object."""
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("creationTimestamp", formats.kube_time(time.time()))
    meta.setdefault("generation", 1)
