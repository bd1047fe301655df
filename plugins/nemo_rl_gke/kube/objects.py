"""The Kubernetes objects of a run in four groups, and applying or deleting a group idempotently with ownership.

Groups, in apply order: the NCCL RDMA installer (from its configured source), the network mapping (GKENetworkParamSet
and Network per NIC), the Lustre PV and PVC (with the instance's IP from its mountPoint), and the RayCluster with its
service account. Every object is validated against its schema right before it is applied, carries the run's
ownership labels, and is applied server-side; an object this package did not make is adopted only when the conf says
so, and is never deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.kube.client import KubeHook, ObjectRef
from nemo_rl_gke.kube.validation import validate_manifest
from nemo_rl_gke.plan.manifests import LUSTRE_IP_PLACEHOLDER, load_nccl_installer, rendered_group
from nemo_rl_gke.run.ownership import RUN_KEY, Owner, owner_from_labels, reader
from nemo_rl_gke.run.topology import LUSTRE, NCCL_INSTALLER, kube_groups

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.spec import RunSpec

log = logging.getLogger(__name__)

GROUPS = tuple(step.task_id for step in kube_groups())


class InvalidManifestError(ValueError):
    """A manifest failed schema validation at apply time."""


class NotOwnedObjectError(RuntimeError):
    """An object of the same name exists, was not made by this package, and the conf does not adopt."""


@dataclass(frozen=True)
class ObjectResult:
    """What happened to one object: created, configured, unchanged, adopted, deleted, absent or kept-unowned."""

    ref: ObjectRef
    action: str
    resource_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form for XCom."""
        return {"object": str(self.ref), "action": self.action, "resourceVersion": self.resource_version}


def lustre_ip(spec: RunSpec, gcp: GcpHook) -> str:
    """The Lustre instance's IP: the address part of its mountPoint (``IP@tcp:/filesystem``)."""
    instance = resources(spec, reader())[LUSTRE].get(gcp)
    mount_point = str((instance or {}).get("mountPoint") or "")
    if "@" not in mount_point:
        raise RuntimeError(f"Lustre instance {spec.lustre_name} reports no mountPoint yet ({mount_point!r})")
    return mount_point.split("@", 1)[0]


def group_objects(
    spec: RunSpec,
    group: str,
    owner: Owner,
    *,
    lustre_address: str = LUSTRE_IP_PLACEHOLDER,
    deployment: Deployment | None = None,
) -> list[dict[str, Any]]:
    """The objects of one group. For deletion only the identities matter, so the IP may stay a placeholder.

    ``owner`` labels every object; ``deployment`` judges where the NCCL installer may come from (None: defaults).
    """
    if group == NCCL_INSTALLER:
        return load_nccl_installer(spec, owner, deployment)
    return rendered_group(spec, group, owner, lustre_ip=lustre_address)


def _recorded_owner(obj: dict[str, Any]) -> Owner | None:
    return owner_from_labels(obj.get("metadata", {}).get("labels"))


def _keep_creator(obj: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The object with the creating run's label of the version in the cluster: re-applying never rewrites who
    created it (and an unchanged object stays unchanged, resourceVersion included)."""
    created_by = (before.get("metadata", {}).get("labels") or {}).get(RUN_KEY)
    if not created_by:
        return obj
    metadata = {**obj["metadata"], "labels": {**obj["metadata"].get("labels", {}), RUN_KEY: created_by}}
    return {**obj, "metadata": metadata}


def apply_objects(kube: KubeHook, objects: list[dict[str, Any]], owner: Owner, *, adopt: bool) -> list[ObjectResult]:
    """Validate and server-side apply each object in order; unchanged objects keep their resourceVersion.

    An object of another deployment or run group is refused, or with ``adopt`` used as it is and never changed.
    """
    for obj in objects:
        problems = validate_manifest(obj)
        if problems:
            raise InvalidManifestError(f"{ObjectRef.of(obj)} is not valid: " + "; ".join(problems))
    results = []
    for obj in objects:
        ref = ObjectRef.of(obj)
        before = kube.get(ref)
        if before is not None and not owner.owns(_recorded_owner(before)):
            if not adopt:
                found = _recorded_owner(before)
                raise NotOwnedObjectError(
                    f"{ref} exists in the cluster but is not this run group's ({owner}): "
                    f"{f'it belongs to {found}' if found else 'its labels name no owner of this package'}. Fix: "
                    "delete or rename it, or set adopt_existing=true to use it as it is (teardown will then leave "
                    "it in place)."
                )
            # Adopted means used as it is: applying would stamp our labels on it, and teardown would then delete it.
            version = str(before.get("metadata", {}).get("resourceVersion", ""))
            log.info("%s: adopted as it is (resourceVersion %s)", ref, version)
            results.append(ObjectResult(ref, "adopted", version))
            continue
        after = kube.apply(obj if before is None else _keep_creator(obj, before))
        version = str(after.get("metadata", {}).get("resourceVersion", ""))
        if before is None:
            action = "created"
        elif before.get("metadata", {}).get("resourceVersion") == version:
            action = "unchanged"
        else:
            action = "configured"
        log.info("%s: %s (resourceVersion %s)", ref, action, version)
        results.append(ObjectResult(ref, action, version))
    return results


def delete_objects(kube: KubeHook, objects: list[dict[str, Any]], owner: Owner) -> list[ObjectResult]:
    """Delete each object in reverse apply order; 404 is done, and an object of another deployment or group is
    kept."""
    results = []
    for obj in reversed(objects):
        ref = ObjectRef.of(obj)
        actual = kube.get(ref)
        if actual is None:
            results.append(ObjectResult(ref, "absent"))
        elif not owner.owns(_recorded_owner(actual)):
            log.warning("%s is not this run group's (%s): keeping it", ref, _recorded_owner(actual))
            results.append(ObjectResult(ref, "kept-unowned"))
        else:
            results.append(ObjectResult(ref, "deleted" if kube.delete(ref) else "absent"))
            log.info("%s: %s", ref, results[-1].action)
    return results
