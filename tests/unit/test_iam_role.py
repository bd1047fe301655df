"""The custom-role file (include/iam/nemo-rl-gke-role.yaml) equals the permissions of the API methods the code calls.

:data:`CALLS` maps every Google API method the package calls to the IAM permissions Google checks for it (Google's
permission reference for each API), with the line of code that makes the call. The test fails when a call's
evidence is gone from the code (the table must lose the method), when a method's permission is missing from the file,
and when the file grants a permission no method needs.
"""

from __future__ import annotations

import re

import pytest
import yaml

from nemo_rl_gke.gcp.iam import MAX_PER_CALL, ROLE_FILE, granting_role, role_permissions
from tests.paths import ROOT

PKG = ROOT / "plugins" / "nemo_rl_gke"
# method -> (permissions Google checks, (file under plugins/nemo_rl_gke, text of the call)).
CALLS: dict[str, tuple[tuple[str, ...], tuple[str, str]]] = {
    # Compute Engine: the networks, subnets, firewall and peering range share get/insert_unary/delete_unary.
    "compute.networks.get": (("compute.networks.get",), ("gcp/resources/compute.py", 'client_name = "networks"')),
    "compute.networks.insert": (("compute.networks.create",), ("gcp/resources/compute.py", "client.insert_unary")),
    "compute.networks.delete": (("compute.networks.delete",), ("gcp/resources/compute.py", "client.delete_unary")),
    "compute.networks.removePeering": (
        ("compute.networks.removePeering",),
        ("gcp/resources/peering.py", 'compute("networks").remove_peering_unary'),
    ),
    "compute.subnetworks.get": (("compute.subnetworks.get",), ("gcp/resources/compute.py", '"subnetworks"')),
    "compute.subnetworks.insert": (("compute.subnetworks.create",), ("gcp/resources/compute.py", '"subnetworks"')),
    "compute.subnetworks.delete": (("compute.subnetworks.delete",), ("gcp/resources/compute.py", '"subnetworks"')),
    "compute.firewalls.get": (("compute.firewalls.get",), ("gcp/resources/compute.py", '"firewalls"')),
    # A firewall rule changes its network's policy: insert and delete also check networks.updatePolicy.
    "compute.firewalls.insert": (
        ("compute.firewalls.create", "compute.networks.updatePolicy"),
        ("gcp/resources/compute.py", '"firewalls"'),
    ),
    "compute.firewalls.delete": (
        ("compute.firewalls.delete", "compute.networks.updatePolicy"),
        ("gcp/resources/compute.py", '"firewalls"'),
    ),
    "compute.globalAddresses.get": (
        ("compute.globalAddresses.get",),
        ("gcp/resources/compute.py", '"global_addresses"'),
    ),
    "compute.globalAddresses.insert": (
        ("compute.globalAddresses.create",),
        ("gcp/resources/compute.py", '"global_addresses"'),
    ),
    "compute.globalAddresses.delete": (
        ("compute.globalAddresses.delete",),
        ("gcp/resources/compute.py", '"global_addresses"'),
    ),
    "compute.globalOperations.get": (
        ("compute.globalOperations.get",),
        ("gcp/lease.py", 'compute("global_operations")'),
    ),
    "compute.regionOperations.get": (("compute.regionOperations.get",), ("gcp/resources/compute.py", "regions/")),
    "compute.projects.get": (("compute.projects.get",), ("gcp/lease.py", 'compute("projects")')),
    "compute.projects.setCommonInstanceMetadata": (
        ("compute.projects.setCommonInstanceMetadata",),
        ("gcp/lease.py", "set_common_instance_metadata_unary"),
    ),
    "compute.reservations.get": (("compute.reservations.get",), ("gcp/live_checks.py", "hook.reservations_client.get")),
    "compute.networkProfiles.get": (
        ("compute.networkProfiles.get",),
        ("gcp/live_checks.py", "hook.network_profiles_client.get"),
    ),
    "compute.regions.get": (("compute.regions.get",), ("gcp/live_checks.py", "hook.regions_client.get")),
    # GKE: node pools are checked as changes of their cluster; creating nodes acts as their service account.
    "container.projects.locations.clusters.create": (
        ("container.clusters.create", "iam.serviceAccounts.actAs"),
        ("plan/gke.py", 'method="projects.locations.clusters.create"'),
    ),
    "container.projects.locations.clusters.get": (
        ("container.clusters.get",),
        ("gcp/resources/gke.py", 'f"get_{self.api_noun}"'),
    ),
    "container.projects.locations.clusters.delete": (
        ("container.clusters.delete",),
        ("plan/gke.py", 'method="projects.locations.clusters.delete"'),
    ),
    "container.projects.locations.clusters.nodePools.create": (
        ("container.clusters.update", "iam.serviceAccounts.actAs"),
        ("plan/gke.py", 'method="projects.locations.clusters.nodePools.create"'),
    ),
    "container.projects.locations.clusters.nodePools.delete": (
        ("container.clusters.update",),
        ("plan/gke.py", 'method="projects.locations.clusters.nodePools.delete"'),
    ),
    "container.projects.locations.clusters.nodePools.setSize": (
        ("container.clusters.update",),
        ("gcp/resources/gke.py", "container_client.set_node_pool_size"),
    ),
    "container.projects.locations.operations.list": (
        ("container.operations.list",),
        ("gcp/resources/gke.py", "container_client.list_operations"),
    ),
    "container.projects.locations.operations.get": (
        ("container.operations.get",),
        ("gcp/resources/gke.py", 'OperationRef("container"'),
    ),
    # The Kubernetes API's endpoint and CA come from the cluster resource (sync and async clients).
    "container.clusters.get (kube access)": (
        ("container.clusters.get",),
        ("kube/async_client.py", 'get_json("container", f"/v1/{self.cluster_path}")'),
    ),
    # Managed Lustre.
    "lustre.projects.locations.instances.get": (
        ("lustre.instances.get",),
        ("gcp/resources/lustre.py", "lustre_client.get_instance"),
    ),
    "lustre.projects.locations.instances.create": (
        ("lustre.instances.create",),
        ("gcp/resources/lustre.py", "lustre_client.create_instance"),
    ),
    "lustre.projects.locations.instances.delete": (
        ("lustre.instances.delete",),
        ("gcp/resources/lustre.py", "lustre_client.delete_instance"),
    ),
    "lustre.projects.locations.instances.exportData": (
        ("lustre.instances.exportData",),
        ("gcp/resources/lustre.py", "lustre_client.export_data"),
    ),
    "lustre.projects.locations.instances.importData": (
        ("lustre.instances.importData",),
        ("gcp/resources/lustre.py", "lustre_client.import_data"),
    ),
    "lustre.projects.locations.operations.list": (
        ("lustre.operations.list",),
        ("gcp/resources/lustre.py", "lustre_client.list_operations"),
    ),
    "lustre.projects.locations.operations.get": (
        ("lustre.operations.get",),
        ("gcp/resources/lustre.py", 'OperationRef("lustre"'),
    ),
    # Service Networking (the private services peering).
    "servicenetworking.services.connections.list": (
        ("servicenetworking.services.get",),
        ("gcp/resources/peering.py", "connections.list("),
    ),
    "servicenetworking.services.connections.create": (
        ("servicenetworking.services.addPeering",),
        ("gcp/resources/peering.py", "connections.create("),
    ),
    "servicenetworking.services.connections.patch": (
        ("servicenetworking.services.addPeering",),
        ("gcp/resources/peering.py", "connections.patch("),
    ),
    "servicenetworking.services.connections.deleteConnection": (
        ("servicenetworking.services.deleteConnection",),
        ("gcp/resources/peering.py", "connections().deleteConnection("),
    ),
    "servicenetworking.operations.get": (
        ("servicenetworking.operations.get",),
        ("gcp/resources/peering.py", 'OperationRef("servicenetworking"'),
    ),
    # Resource Manager, Service Usage, Cloud Storage: the project number and the live preflight.
    "cloudresourcemanager.projects.get": (
        ("resourcemanager.projects.get",),
        ("gcp/hooks.py", "self.resourcemanager.projects().get("),
    ),
    "serviceusage.services.batchGet": (("serviceusage.services.get",), ("gcp/live_checks.py", ".services().batchGet(")),
    "serviceusage.services.consumerQuotaMetrics.get": (
        ("serviceusage.quotas.get",),
        ("gcp/live_checks.py", ".consumerQuotaMetrics().get("),
    ),
    "storage.buckets.get": (("storage.buckets.get",), ("gcp/live_checks.py", "buckets.get(bucket=")),
    "storage.buckets.getIamPolicy": (
        ("storage.buckets.getIamPolicy",),
        ("gcp/live_checks.py", "buckets.getIamPolicy("),
    ),
    # The pending-checkpoint records: one object per run in the export bucket.
    "storage.objects.insert": (("storage.objects.create",), ("gcp/pending.py", "storage.objects().insert(")),
    "storage.objects.delete": (("storage.objects.delete",), ("gcp/pending.py", "storage.objects().delete(")),
    "storage.objects.list": (("storage.objects.list",), ("gcp/pending.py", "storage.objects().list(")),
    # The base model's remembered evaluation score: one object per key in the export bucket (gcp/baselines.py).
    "storage.objects.get": (("storage.objects.get",), ("gcp/baselines.py", "storage.objects().get(")),
}
# The discovery clients' resources: a call is ``resource().method(`` or ``resource.method(`` on a saved one.
DISCOVERY_RESOURCES = ("projects", "services", "connections", "consumerQuotaMetrics", "buckets", "objects")
# Calls that need no permission of their own (GKE's API permissions page lists none for getServerConfig).
FREE_CALLS = {
    "cloudresourcemanager.projects.testIamPermissions": ("gcp/iam.py", "projects.testIamPermissions("),
    "container.projects.locations.getServerConfig": ("gcp/live_checks.py", "container_client.get_server_config"),
}


@pytest.mark.parametrize("method", sorted({**CALLS, **FREE_CALLS}))
def test_every_method_in_the_table_is_still_called(method: str) -> None:
    path, text = CALLS[method][1] if method in CALLS else FREE_CALLS[method]
    assert text in (PKG / path).read_text(), f"{method}: {text!r} is no longer in {path}; drop it from the table"


def test_the_role_file_grants_exactly_what_the_called_methods_need() -> None:
    needed = {permission for permissions, _ in CALLS.values() for permission in permissions}
    granted = set(role_permissions())
    assert sorted(needed - granted) == [], "permissions a called method needs but the role file lacks"
    assert sorted(granted - needed) == [], "permissions in the role file that no called method needs"


def test_no_client_method_escapes_the_table() -> None:
    # The call shapes the package uses: client methods through hook.call, discovery requests through hook.execute.
    called = set()
    for source in PKG.rglob("*.py"):
        text = source.read_text()
        called |= set(re.findall(r"(\w+_client)\.(\w+)", text))
        called |= set(re.findall(rf"\b({'|'.join(DISCOVERY_RESOURCES)})(?:\(\))?\.(\w+)\(", text))
    known = {evidence[1] for _, evidence in CALLS.values()} | {text for _, text in FREE_CALLS.values()}
    unexplained = sorted(
        f"{client}.{method}"
        for client, method in called
        if method not in DISCOVERY_RESOURCES
        and not any(f"{method}" in text for text in known)
        and method not in {"call_api"}  # the Kubernetes API: RBAC, not IAM methods
    )
    assert unexplained == [], "API calls with no row in CALLS (add the method and its permissions)"


def test_the_role_file_is_what_gcloud_iam_roles_create_takes() -> None:
    role = yaml.safe_load(ROLE_FILE.read_text())
    assert set(role) == {"title", "description", "stage", "includedPermissions"}
    assert role["stage"] in {"ALPHA", "BETA", "GA", "DEPRECATED", "DISABLED", "EAP"}
    permissions = role["includedPermissions"]
    assert permissions == sorted(permissions) and len(set(permissions)) == len(permissions)
    assert all(re.fullmatch(r"[a-z]+\.[a-zA-Z]+\.[a-zA-Z]+", p) for p in permissions)
    # One testIamPermissions call checks them all.
    assert len(permissions) <= MAX_PER_CALL
    assert "compute.projects.setCommonInstanceMetadata" in permissions


def test_every_permission_has_a_predefined_role_and_the_readme_shows_the_file() -> None:
    for permission in role_permissions():
        assert granting_role(permission).startswith("roles/")
    readme = (ROOT / "README.md").read_text()
    assert "include/iam/nemo-rl-gke-role.yaml" in readme
    assert "gcloud iam roles create" in readme
    assert "compute.projects.setCommonInstanceMetadata" in readme
