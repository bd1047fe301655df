"""The Managed Lustre instance of a run, as Lustre v1 REST requests (gcloud.md §8, FACTS §4).

The instance is zonal (the GPU nodes' zone) and reaches NET through the Service Networking peering, which must exist
before the create. Its capacity tier cannot change later; preflight has checked capacity and throughput already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.cloud import lustre_v1

from nemo_rl_gke.plan.api import ApiRequest, message_body, with_query
from nemo_rl_gke.run.ownership import records_description, records_uri

if TYPE_CHECKING:
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec

SERVICE = "lustre"
API_PREFIX = "/v1/"


def lustre_create_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Create the instance (``lustre instances create L --gke-support-enabled ...``).

    The body is the Instance itself; its ID is the ``instanceId`` query parameter. ``network`` is the relative path
    gcloud resolves ``--network`` to. The labels are the owner's (deployment, group, creating run); gcloud sends none.
    The description names where the instance's checkpoint records live (:mod:`nemo_rl_gke.gcp.pending`), once.
    """
    instance = lustre_v1.Instance(
        filesystem=spec.lustre_filesystem,
        capacity_gib=spec.lustre_capacity_gib,
        per_unit_storage_throughput=spec.lustre_throughput,
        network=spec.network_path(spec.network),
        # The tutorial passes it; the API now calls it deprecated and unneeded for GKE, and still accepts it.
        gke_support_enabled=True,
        labels=owner.labels,
        description=records_description(records_uri(spec)),
    )
    return ApiRequest(
        service=SERVICE,
        method="projects.locations.instances.create",
        http_method="POST",
        path=with_query(f"{API_PREFIX}{spec.lustre_parent}/instances", instanceId=spec.lustre_name),
        body=message_body(instance),
        resource=f"Lustre instance {spec.lustre_name}",
        message=instance,
    )


def lustre_delete_request(spec: RunSpec) -> ApiRequest:
    """Delete the instance, and with it every file on it: teardown sends it only after the checkpoint export."""
    return ApiRequest(
        service=SERVICE,
        method="projects.locations.instances.delete",
        http_method="DELETE",
        path=API_PREFIX + spec.lustre_path,
        body=None,
        resource=f"Lustre instance {spec.lustre_name}",
        message=lustre_v1.DeleteInstanceRequest(name=spec.lustre_path),
    )
