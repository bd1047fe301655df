"""What Kubernetes' PersistentVolume controller does with statically provisioned volumes and their claims.

A claim that names its volume (``spec.volumeName``) binds to it when the volume exists and is free or reserved for
that claim (``spec.claimRef``): both turn ``Bound``, the volume's ``claimRef`` gets the claim's uid, and the claim's
status its access modes and capacity. Either may come first: the second one binds both. A claim without its volume
stays ``Pending``; a free volume is ``Available``. When a bound claim is deleted, a ``Retain`` volume turns
``Released`` (a ``Delete`` one goes); when a bound volume is deleted, its claim turns ``Lost``. As
``pkg/controller/volume/persistentvolume/pv_controller.go`` (syncUnboundClaim, syncVolume) decides, without the
dynamic provisioning, the retries and the events.
"""

from __future__ import annotations

from typing import Any

from sandbox.kube_cluster import KubeCluster

PV = ("v1", "persistentvolumes")
PVC = ("v1", "persistentvolumeclaims")


def _reserved_for(volume: dict[str, Any], claim: dict[str, Any]) -> bool:
    """The volume is free, or its claimRef names this claim (by namespace and name, and uid once it has one)."""
    ref = (volume.get("spec") or {}).get("claimRef")
    if not ref:
        return True
    meta = claim["metadata"]
    same = ref.get("namespace") == meta.get("namespace") and ref.get("name") == meta["name"]
    return same and ref.get("uid") in (None, "", meta.get("uid"))


def _bind(cluster: KubeCluster, volume: dict[str, Any], claim: dict[str, Any]) -> None:
    meta = claim["metadata"]
    spec = volume.setdefault("spec", {})
    spec["claimRef"] = {
        **(spec.get("claimRef") or {}),
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": meta.get("namespace"),
        "name": meta["name"],
        "uid": meta.get("uid"),
    }
    volume["status"] = {"phase": "Bound"}
    claim["status"] = {
        "phase": "Bound",
        "accessModes": list(spec.get("accessModes") or []),
        "capacity": dict(spec.get("capacity") or {}),
    }
    cluster.put(*PV, volume)
    cluster.put(*PVC, claim)


def claim_created(cluster: KubeCluster, claim: dict[str, Any]) -> None:
    """A new claim: bound to the volume it names when that volume is there for it, else Pending."""
    claim["status"] = {"phase": "Pending"}
    name = (claim.get("spec") or {}).get("volumeName")
    volume = cluster.get(*PV, None, name) if name else None
    if volume is not None and (volume.get("status") or {}).get("phase") != "Bound" and _reserved_for(volume, claim):
        _bind(cluster, volume, claim)


def volume_created(cluster: KubeCluster, volume: dict[str, Any]) -> None:
    """A new volume: bound to a waiting claim that names it (its claimRef's, if it has one), else Available."""
    volume["status"] = {"phase": "Available"}
    name = volume["metadata"]["name"]
    for claim in cluster.of(*PVC):
        waiting = (claim.get("status") or {}).get("phase") == "Pending"
        if waiting and (claim.get("spec") or {}).get("volumeName") == name and _reserved_for(volume, claim):
            _bind(cluster, volume, claim)
            return


def claim_deleted(cluster: KubeCluster, claim: dict[str, Any]) -> None:
    """A deleted claim releases its volume: Released under Retain, gone under Delete."""
    name = (claim.get("spec") or {}).get("volumeName")
    volume = cluster.get(*PV, None, name) if name else None
    if volume is None or (volume.get("spec") or {}).get("claimRef", {}).get("uid") != claim["metadata"].get("uid"):
        return
    if (volume.get("spec") or {}).get("persistentVolumeReclaimPolicy", "Retain") == "Delete":
        cluster.remove(*PV, None, name)
        return
    volume["status"] = {"phase": "Released"}
    cluster.put(*PV, volume)


def volume_deleted(cluster: KubeCluster, volume: dict[str, Any]) -> None:
    """A deleted volume leaves its bound claim Lost."""
    ref = (volume.get("spec") or {}).get("claimRef") or {}
    claim = cluster.get(*PVC, ref.get("namespace"), ref.get("name", "")) if ref.get("name") else None
    if claim is not None and (claim.get("spec") or {}).get("volumeName") == volume["metadata"]["name"]:
        claim["status"] = {**(claim.get("status") or {}), "phase": "Lost"}
        cluster.put(*PVC, claim)
