"""Service Networking (discovery client), Managed Lustre (REST client), Resource Manager and Service Usage."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1, lustre_v1
from google.longrunning import operations_pb2
from googleapiclient.errors import HttpError

from nemo_rl_gke.plan import gke, lustre, peering
from tests.sandbox.conftest import OWNER, PROJECT, SPEC, ZONE
from tests.sandbox.helpers import (
    FAST_POLLING,
    create_lustre,
    create_networks,
    create_peering,
    insert_compute,
    project_number,
    raw,
)


def _connections(clients):
    return clients.discovery("servicenetworking").services().connections()


def test_peering_requests_of_the_plan_succeed(clients, sandbox):
    create_networks(clients)
    assert insert_compute(clients, peering.peering_range_request(SPEC, OWNER)).done()
    number = project_number(clients)
    listed = _connections(clients).list(parent=peering.SERVICE_PARENT, network=SPEC.consumer_network_path(number))
    assert listed.execute().get("connections", []) == []
    create = peering.connection_create_request(SPEC, number)
    operation = _connections(clients).create(parent=peering.SERVICE_PARENT, body=create.body).execute()
    assert operation["name"].startswith("operations/pssn.")
    polled = clients.discovery("servicenetworking").operations().get(name=operation["name"]).execute()
    assert polled["done"] and "error" not in polled
    listed = _connections(clients).list(parent=peering.SERVICE_PARENT, network=SPEC.consumer_network_path(number))
    [connection] = listed.execute()["connections"]
    assert connection["reservedPeeringRanges"] == [SPEC.peering_range]
    assert connection["peering"] == "servicenetworking-googleapis-com"
    net = clients.networks.get(project=PROJECT, network=SPEC.network)
    assert [p.name for p in net.peerings] == ["servicenetworking-googleapis-com"]

    # A repeated create is not a 409: its operation ends in error (FACTS §4).
    again = _connections(clients).create(parent=peering.SERVICE_PARENT, body=create.body).execute()
    assert again["done"] and again["error"]["code"] == 9

    delete = peering.connection_delete_request(SPEC, number)
    operation = _connections(clients).deleteConnection(name=peering.ANY_CONNECTION, body=delete.body).execute()
    assert operation["done"] and "error" not in operation
    with pytest.raises(HttpError) as missing:
        _connections(clients).deleteConnection(name=peering.ANY_CONNECTION, body=delete.body).execute()
    assert missing.value.resp.status == 404
    assert clients.addresses.delete(project=PROJECT, address=SPEC.peering_range).done()


def test_peering_needs_the_project_number_and_a_peering_range(clients, sandbox):
    create_networks(clients)
    by_id = {"network": SPEC.network_path(SPEC.network), "reservedPeeringRanges": [SPEC.peering_range]}
    with pytest.raises(HttpError) as wrong:
        _connections(clients).create(parent=peering.SERVICE_PARENT, body=by_id).execute()
    assert wrong.value.resp.status == 400 and b"project number" in wrong.value.content
    number = project_number(clients)
    no_range = peering.connection_create_request(SPEC, number).body
    with pytest.raises(HttpError) as missing:
        _connections(clients).create(parent=peering.SERVICE_PARENT, body=no_range).execute()
    assert missing.value.resp.status == 400 and b"not found in network" in missing.value.content
    typo = {"network": SPEC.consumer_network_path(number), "reservedPeeringRange": [SPEC.peering_range]}
    status, answer = raw(sandbox.url, "POST", f"/v1/{peering.SERVICE_PARENT}/connections", typo)
    assert (status, answer["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert 'Unknown name "reservedPeeringRange"' in answer["error"]["message"]


def test_lustre_create_get_list_delete(clients, sandbox):
    create_networks(clients)
    create_peering(clients)
    instance = create_lustre(clients)
    assert instance.state == lustre_v1.Instance.State.ACTIVE
    assert instance.name == SPEC.lustre_path
    ip, filesystem = instance.mount_point.split("@tcp:/")
    assert filesystem == SPEC.lustre_filesystem
    address = clients.addresses.get(project=PROJECT, address=SPEC.peering_range)
    assert ip.startswith(address.address.rsplit(".", 2)[0])
    assert instance.capacity_gib == SPEC.lustre_capacity_gib and instance.labels == OWNER.labels
    assert clients.lustre.get_instance(name=SPEC.lustre_path).state == lustre_v1.Instance.State.ACTIVE
    assert [i.name for i in clients.lustre.list_instances(parent=SPEC.lustre_parent)] == [SPEC.lustre_path]
    _, body = raw(sandbox.url, "GET", f"/v1/{SPEC.lustre_path}")
    lustre_v1.Instance.from_json(json.dumps(body), ignore_unknown_fields=False)

    with pytest.raises(exceptions.Conflict):
        create_lustre(clients)
    # Lustre still uses the peering, and the network.
    number = project_number(clients)
    delete = peering.connection_delete_request(SPEC, number)
    # Refused inside the operation, not on the call (FACTS §13, §19).
    in_use = _connections(clients).deleteConnection(name=peering.ANY_CONNECTION, body=delete.body).execute()
    assert in_use["done"] and in_use["error"]["code"] == 9, in_use
    assert "still using this connection" in in_use["error"]["message"]
    with pytest.raises(exceptions.BadRequest):
        clients.networks.delete(project=PROJECT, network=SPEC.network)

    [item] = [i for i in sandbox.inventory() if i["kind"] == "lustre.instance"]
    data_dir = Path(item["data_dir"])
    (data_dir / "hello.txt").write_text("hi")
    request = lustre_v1.DeleteInstanceRequest(name=SPEC.lustre_path, request_id=str(uuid.uuid4()))
    deleted = clients.lustre.delete_instance(request=request)
    assert clients.lustre.delete_instance(request=request).operation.name == deleted.operation.name  # a retry
    deleted.result(timeout=30, polling=FAST_POLLING)
    assert not data_dir.exists()
    with pytest.raises(exceptions.NotFound):
        clients.lustre.get_instance(name=SPEC.lustre_path)
    with pytest.raises(exceptions.NotFound):
        clients.lustre.delete_instance(name=SPEC.lustre_path)


def test_lustre_create_runs_for_its_latency(clients, sandbox):
    create_networks(clients)
    create_peering(clients)
    sandbox.set_latency(scale=1.0, seconds={"lustre.instances.create": 0.5})
    operation = clients.lustre.create_instance(
        parent=SPEC.lustre_parent,
        instance_id=SPEC.lustre_name,
        instance=lustre.lustre_create_request(SPEC, OWNER).message,
    )
    assert not operation.done()
    assert clients.lustre.get_instance(name=SPEC.lustre_path).state == lustre_v1.Instance.State.CREATING
    assert operation.metadata.verb == "create"
    assert operation.result(timeout=10, polling=FAST_POLLING).state == lustre_v1.Instance.State.ACTIVE


@pytest.mark.parametrize(
    ("query", "change", "message"),
    [
        ("instanceId=Bad_Id", {}, "instanceId"),
        ("instanceId=ok", {"filesystem": "toolongname"}, "filesystem"),
        ("instanceId=ok", {"capacityGib": "20000"}, "capacityGib 20000"),
        ("instanceId=ok", {"perUnitStorageThroughput": "300"}, "perUnitStorageThroughput"),
        ("instanceId=ok", {"gkeSupport": True}, 'Unknown name "gkeSupport"'),
        ("instanceId=ok", {"network": "projects/x/global/networks/none"}, "not found"),
    ],
)
def test_lustre_rules(clients, sandbox, query, change, message):
    create_networks(clients)
    create_peering(clients)
    body = {**lustre.lustre_create_request(SPEC, OWNER).body, **change}
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.lustre_parent}/instances?{query}", body)
    assert status == 400, answer
    assert message in answer["error"]["message"]


def test_lustre_needs_the_peering(clients, sandbox):
    create_networks(clients)
    with pytest.raises(exceptions.BadRequest) as refused:
        create_lustre(clients)
    assert "private services access" in refused.value.message


def test_export_copies_files_to_the_bucket_directory(clients, sandbox):
    create_networks(clients)
    create_peering(clients)
    create_lustre(clients)
    [item] = [i for i in sandbox.inventory() if i["kind"] == "lustre.instance"]
    step = Path(item["data_dir"]) / "checkpoints" / "step_10"
    (step / "policy").mkdir(parents=True)
    (step / "training_info.json").write_text('{"current_step": 10}')
    (step / "policy" / "__0_0.distcp").write_bytes(b"x" * 10)
    request = lustre_v1.ExportDataRequest(
        name=SPEC.lustre_path,
        lustre_path=lustre_v1.LustrePath(path="/checkpoints"),
        gcs_path=lustre_v1.GcsPath(uri="gs://my-bucket/run-1/"),
    )
    operation = clients.lustre.export_data(request=request)
    operation.result(timeout=30, polling=FAST_POLLING)
    bucket = sandbox.state_dir / "gcs" / "my-bucket" / "run-1"
    assert (bucket / "step_10" / "training_info.json").read_text() == '{"current_step": 10}'
    assert (bucket / "step_10" / "policy" / "__0_0.distcp").stat().st_size == 10

    missing = lustre_v1.ExportDataRequest(
        name=SPEC.lustre_path,
        lustre_path=lustre_v1.LustrePath(path="/nothing"),
        gcs_path=lustre_v1.GcsPath(uri="gs://my-bucket/x/"),
    )
    with pytest.raises(exceptions.NotFound):
        clients.lustre.export_data(request=missing).result(timeout=30, polling=FAST_POLLING)
    escape = lustre_v1.ExportDataRequest(
        name=SPEC.lustre_path,
        lustre_path=lustre_v1.LustrePath(path="/../../.."),
        gcs_path=lustre_v1.GcsPath(uri="gs://my-bucket/x/"),
    )
    with pytest.raises(exceptions.BadRequest):
        clients.lustre.export_data(request=escape)


def test_export_blocks_the_delete_until_it_is_done(clients, sandbox):
    create_networks(clients)
    create_peering(clients)
    create_lustre(clients)
    sandbox.set_latency(scale=1.0, seconds={"lustre.instances.exportData": 0.4})
    [item] = [i for i in sandbox.inventory() if i["kind"] == "lustre.instance"]
    (Path(item["data_dir"]) / "f").write_text("1")
    request = lustre_v1.ExportDataRequest(
        name=SPEC.lustre_path, lustre_path=lustre_v1.LustrePath(path="/"), gcs_path=lustre_v1.GcsPath(uri="gs://bkt")
    )
    export = clients.lustre.export_data(request=request)
    with pytest.raises(exceptions.BadRequest):
        clients.lustre.delete_instance(name=SPEC.lustre_path)
    export.result(timeout=10, polling=FAST_POLLING)
    time.sleep(0.01)
    sandbox.set_latency(scale=0.0)
    clients.lustre.delete_instance(name=SPEC.lustre_path).result(timeout=10, polling=FAST_POLLING)


def test_project_number_and_enabled_services(clients, sandbox):
    project = clients.discovery("cloudresourcemanager").projects().get(projectId=PROJECT).execute()
    assert project["projectId"] == PROJECT and project["lifecycleState"] == "ACTIVE"
    assert project["projectNumber"].isdigit() and len(project["projectNumber"]) == 12
    again = clients.discovery("cloudresourcemanager").projects().get(projectId=PROJECT).execute()
    assert again["projectNumber"] == project["projectNumber"]
    usage = clients.discovery("serviceusage").services()
    lustre_api = usage.get(name=f"projects/{PROJECT}/services/lustre.googleapis.com").execute()
    assert lustre_api["state"] == "ENABLED"
    assert usage.get(name=f"projects/{PROJECT}/services/tpu.googleapis.com").execute()["state"] == "DISABLED"
    names = [f"projects/{PROJECT}/services/{s}.googleapis.com" for s in ("compute", "container", "file")]
    states = [s["state"] for s in usage.batchGet(parent=f"projects/{PROJECT}", names=names).execute()["services"]]
    assert states == ["ENABLED", "ENABLED", "DISABLED"]
    with pytest.raises(HttpError) as bad:
        clients.discovery("cloudresourcemanager").projects().get(projectId="X").execute()
    assert bad.value.resp.status == 400
    assert ZONE  # the seeded zone is one of the defaults


def test_both_clients_list_the_operations_of_their_location(clients, sandbox):
    """GKE and Lustre share the operations path; each client lists its own operations, in its own format."""
    create_networks(clients)
    create_peering(clients)
    sandbox.set_latency(scale=1.0, seconds={"lustre.instances.create": 5.0, "container.clusters.create": 5.0})
    clients.lustre.create_instance(
        parent=SPEC.lustre_parent,
        instance_id=SPEC.lustre_name,
        instance=lustre.lustre_create_request(SPEC, OWNER).message,
    )
    # A zonal cluster, so both services have an operation in the same location.
    zonal = gke.cluster_create_request(SPEC, OWNER).message
    zonal.parent = SPEC.lustre_parent
    cluster_op = clients.gke.create_cluster(request=zonal)
    lustre_ops = clients.lustre.list_operations(request=operations_pb2.ListOperationsRequest(name=SPEC.lustre_parent))
    [lustre_op] = lustre_ops.operations
    assert not lustre_op.done
    assert lustre_v1.OperationMetadata.deserialize(lustre_op.metadata.value).target == SPEC.lustre_path
    [gke_op] = clients.gke.list_operations(parent=SPEC.lustre_parent).operations
    assert gke_op.name == cluster_op.name and gke_op.target_link.endswith(f"/clusters/{SPEC.cluster_name}")


# --- errors where Google puts them (issue 17 item 4) -------------------------------------------------------------
def _delete_connection(clients, number: str) -> dict:
    delete = peering.connection_delete_request(SPEC, number)
    return _connections(clients).deleteConnection(name=peering.ANY_CONNECTION, body=delete.body).execute()


def _peerings(clients) -> list[str]:
    return [p.name for p in clients.networks.get(project=PROJECT, network=SPEC.network).peerings]


def test_delete_connection_fails_inside_its_operation_for_a_while_after_lustre_is_gone(clients, sandbox):
    create_networks(clients)
    number = create_peering(clients)
    create_lustre(clients)
    instant = {"lustre.instances.delete": 0.0, "servicenetworking.connections.deleteConnection": 0.0}
    sandbox.set_latency(scale=1.0, seconds={**instant, "servicenetworking.producers.linger": 0.5})
    clients.lustre.delete_instance(name=SPEC.lustre_path).result(timeout=10, polling=FAST_POLLING)
    # The instance is gone, yet Service Networking still counts it: code 9 inside the operation, as on real GCP.
    lingering = _delete_connection(clients, number)
    assert lingering["done"] and lingering["error"]["code"] == 9, lingering
    assert "Producer services (e.g. CloudSQL, Cloud Memstore, etc.) are still using" in lingering["error"]["message"]
    assert _peerings(clients) == [peering.PEERING_NAME]
    time.sleep(0.55)
    gone = _delete_connection(clients, number)
    assert gone["done"] and "error" not in gone, gone
    assert _peerings(clients) == []


def test_remove_peering_is_a_compute_operation_that_takes_the_peering_away(clients, sandbox):
    create_networks(clients)
    create_peering(clients)
    create_lustre(clients)
    sandbox.set_latency(scale=1.0, seconds={"compute.networks.removePeering": 0.4, "compute.globalAddresses.delete": 0})
    removal = clients.networks.remove_peering_unary(
        project=PROJECT,
        network=SPEC.network,
        networks_remove_peering_request_resource=compute_v1.NetworksRemovePeeringRequest(name=peering.PEERING_NAME),
    )
    assert removal.status != compute_v1.Operation.Status.DONE
    assert removal.operation_type == "removePeering"
    # Listed until the operation ends; another peering change meanwhile is refused, in text only (FACTS §19).
    assert _peerings(clients) == [peering.PEERING_NAME]
    with pytest.raises(exceptions.BadRequest) as busy:
        clients.networks.remove_peering_unary(
            project=PROJECT,
            network=SPEC.network,
            networks_remove_peering_request_resource=compute_v1.NetworksRemovePeeringRequest(name=peering.PEERING_NAME),
        )
    assert "There is a peering operation in progress" in busy.value.message
    done = clients.global_operations.wait(project=PROJECT, operation=removal.name)
    assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors
    assert _peerings(clients) == []
    # The range is free now: it goes, as the teardown's next step sends it.
    assert insert_compute_delete(clients)


def insert_compute_delete(clients) -> bool:
    operation = clients.addresses.delete_unary(project=PROJECT, address=SPEC.peering_range)
    return clients.global_operations.wait(project=PROJECT, operation=operation.name).status.name == "DONE"


def _import(clients, path: str, uri: str = "gs://my-bucket/run-1/"):
    request = lustre_v1.ImportDataRequest(
        name=SPEC.lustre_path, gcs_path=lustre_v1.GcsPath(uri=uri), lustre_path=lustre_v1.LustrePath(path=path)
    )
    return clients.lustre.import_data(request=request)


def test_import_needs_an_existing_target_path_and_one_transfer_runs_at_a_time(clients, sandbox):
    create_networks(clients)
    create_peering(clients)
    create_lustre(clients)
    bucket = sandbox.state_dir / "gcs" / "my-bucket" / "run-1" / "ckpt" / "step_3"
    bucket.mkdir(parents=True)
    (bucket / "training_info.json").write_text("{}")
    # LustrePath: "any path other than the default must already exist" (google-cloud-lustre 0.4.3).
    with pytest.raises(exceptions.BadRequest) as missing:
        _import(clients, "/ckpt/step_3")
    assert "does not exist" in missing.value.message
    with pytest.raises(exceptions.BadRequest, match="forward slash"):
        _import(clients, "/", uri="gs://my-bucket/run-1")

    sandbox.set_latency(scale=1.0, seconds={"lustre.instances.importData": 0.4})
    first = _import(clients, "/")
    with pytest.raises(exceptions.Conflict) as second:
        _import(clients, "/")
    assert "unable to queue the operation" in second.value.message
    assert second.value.response.json()["error"]["status"] == "ABORTED"
    first.result(timeout=10, polling=FAST_POLLING)
    [item] = [i for i in sandbox.inventory() if i["kind"] == "lustre.instance"]
    assert (Path(item["data_dir"]) / "ckpt" / "step_3" / "training_info.json").read_text() == "{}"
