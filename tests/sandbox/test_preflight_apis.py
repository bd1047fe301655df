"""The APIs preflight_live reads, as the sandbox serves them: testIamPermissions, the GPU-family quota, buckets."""

from __future__ import annotations

from nemo_rl_gke.gcp.iam import role_permissions
from sandbox import formats
from tests.sandbox.conftest import PROJECT
from tests.sandbox.helpers import raw

TEST = f"/v1/projects/{PROJECT}:testIamPermissions"
GPU_METRIC = (
    f"/v1beta1/projects/{PROJECT}/services/compute.googleapis.com/consumerQuotaMetrics/"
    "compute.googleapis.com%2Fgpus_per_gpu_family?view=FULL"
)


def test_test_iam_permissions_answers_the_granted_subset(sandbox):
    asked = ["compute.networks.create", "compute.projects.setCommonInstanceMetadata", "bigquery.datasets.create"]
    status, body = raw(sandbox.url, "POST", TEST, {"permissions": asked})
    # Granted: what the role file lists; a permission outside it is not held.
    assert (status, body) == (200, {"permissions": asked[:2]})
    sandbox.seed({"iam_denied": {PROJECT: ["compute.projects.setCommonInstanceMetadata"]}})
    try:
        assert raw(sandbox.url, "POST", TEST, {"permissions": asked}) == (200, {"permissions": asked[:1]})
        # Nothing granted: Google omits the empty list.
        assert raw(sandbox.url, "POST", TEST, {"permissions": asked[1:]}) == (200, {})
    finally:
        sandbox.seed({"iam_denied": {PROJECT: []}})


def test_test_iam_permissions_refuses_wildcards_bad_names_and_too_many(sandbox):
    for permissions, message in [
        (["storage.*"], "wildcards"),
        (["not a permission"], "is not valid"),
        (list(role_permissions()) * 3, "exceeds the limit 100"),
    ]:
        status, body = raw(sandbox.url, "POST", TEST, {"permissions": permissions})
        assert status == 400 and message in body["error"]["message"], body


def test_the_gpu_family_quota_has_a_bucket_per_region_and_family(sandbox):
    status, body = raw(sandbox.url, "GET", GPU_METRIC)
    assert status == 200, body
    assert body["metric"] == "compute.googleapis.com/gpus_per_gpu_family"
    buckets = body["consumerQuotaLimits"][0]["quotaBuckets"]
    assert {
        "effectiveLimit": "64",
        "defaultLimit": "64",
        "dimensions": {"region": "us-central1", "gpu_family": "NVIDIA_B200"},
    } in buckets
    assert not [b for b in buckets if b["dimensions"]["region"] == "us-west1"]
    sandbox.seed({"iam_denied": {PROJECT: ["serviceusage.quotas.get"]}})
    try:
        status, body = raw(sandbox.url, "GET", GPU_METRIC)
        assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
    finally:
        sandbox.seed({"iam_denied": {PROJECT: []}})


def test_buckets_exist_only_when_seeded_and_show_their_bindings(sandbox):
    status, body = raw(sandbox.url, "GET", "/storage/v1/b/ckpt-bucket")
    assert status == 404 and body["error"]["message"] == "The specified bucket does not exist."
    sandbox.seed(
        {"buckets": [{"project": PROJECT, "name": "ckpt-bucket", "lustre_agent_role": "roles/storage.objectUser"}]}
    )
    status, body = raw(sandbox.url, "GET", "/storage/v1/b/ckpt-bucket")
    assert status == 200 and body["projectNumber"] == formats.project_number(PROJECT)
    status, policy = raw(sandbox.url, "GET", "/storage/v1/b/ckpt-bucket/iam")
    agent = f"serviceAccount:service-{formats.project_number(PROJECT)}@gcp-sa-lustre.iam.gserviceaccount.com"
    assert {"role": "roles/storage.objectUser", "members": [agent]} in policy["bindings"]
    assert {"role": "roles/storage.legacyBucketReader", "members": [f"projectViewer:{PROJECT}"]} in policy["bindings"]
    sandbox.seed({"iam_denied": {PROJECT: ["storage.buckets.getIamPolicy"]}})
    try:
        status, body = raw(sandbox.url, "GET", "/storage/v1/b/ckpt-bucket/iam")
        assert status == 403 and "storage.buckets.getIamPolicy" in body["error"]["message"]
    finally:
        sandbox.seed({"iam_denied": {PROJECT: []}})


def test_every_guarded_route_exists_and_checks_only_role_file_permissions():
    from sandbox.apis import router
    from sandbox.iam import ROUTE_PERMISSIONS

    routes = {(r.method, r.template) for r in router().routes}
    assert set(ROUTE_PERMISSIONS) <= routes
    assert {p for ps in ROUTE_PERMISSIONS.values() for p in ps} <= set(role_permissions())


def test_a_call_without_its_permission_gets_its_apis_403(sandbox):
    sandbox.seed({"iam_denied": {PROJECT: ["container.clusters.create", "compute.networks.create"]}})
    try:
        status, body = raw(sandbox.url, "POST", f"/v1/projects/{PROJECT}/locations/us-central1/clusters", {})
        assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
        assert "container.clusters.create" in body["error"]["message"]
        status, body = raw(sandbox.url, "POST", f"/compute/v1/projects/{PROJECT}/global/networks", {"name": "n"})
        assert status == 403 and body["error"]["errors"][0]["reason"] == "forbidden"
        assert (
            body["error"]["message"]
            == f"Required 'compute.networks.create' permission for 'projects/{PROJECT}/global/networks'"
        )
    finally:
        sandbox.seed({"iam_denied": {PROJECT: []}})
    # Granted again: the same bad body now reaches the handler and its own 400.
    status, _ = raw(sandbox.url, "POST", f"/v1/projects/{PROJECT}/locations/us-central1/clusters", {})
    assert status == 400
