"""GKE (container v1, REST transport) on the sandbox: the production cluster and node pool requests."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time

import pytest
from cryptography import x509
from google.api_core import exceptions
from google.cloud import container_v1
from sandbox.testing import start_sandbox

from nemo_rl_gke.plan import gke
from nemo_rl_gke.run.spec import RunSpec
from tests.owners import owner_of
from tests.sandbox.conftest import OWNER, PROJECT, REGION, SEED, SPEC, Clients
from tests.sandbox.helpers import create_cluster, create_networks, create_node_pool, operation_name, raw

Status = container_v1.Cluster.Status
OpStatus = container_v1.Operation.Status


def test_cluster_and_gpu_pool_of_the_plan_succeed(clients, sandbox):
    create_networks(clients)
    operation = create_cluster(clients)
    assert operation.operation_type == container_v1.Operation.Type.CREATE_CLUSTER
    assert clients.gke.get_operation(name=operation_name(operation.name)).status == OpStatus.DONE
    pool_op = create_node_pool(clients)
    assert clients.gke.get_operation(name=operation_name(pool_op.name)).status == OpStatus.DONE

    cluster = clients.gke.get_cluster(name=SPEC.cluster_path)
    assert cluster.status == Status.RUNNING
    # As GKE: a bare address (here 127.0.0.1 with the port of the cluster's own listener) and the cluster's CA.
    assert cluster.endpoint.startswith("127.0.0.1:")
    assert "BEGIN CERTIFICATE" in base64.b64decode(cluster.master_auth.cluster_ca_certificate).decode()
    assert cluster.resource_labels == OWNER.labels
    assert cluster.network_config.enable_multi_networking
    assert cluster.addons_config.lustre_csi_driver_config.enable_legacy_lustre_port
    assert [p.name for p in cluster.node_pools] == ["default-pool", SPEC.node_pool_name]
    pool = clients.gke.get_node_pool(name=SPEC.node_pool_path)
    assert pool.status == container_v1.NodePool.Status.RUNNING
    assert len(pool.network_config.additional_node_network_configs) == 9
    assert pool.config.reservation_affinity.values == [SPEC.reservation]
    listed = clients.gke.list_clusters(parent=SPEC.cluster_parent)
    assert [c.name for c in listed.clusters] == [SPEC.cluster_name]
    assert len(clients.gke.list_node_pools(parent=SPEC.cluster_path).node_pools) == 2
    # The answers parse strictly into the message types.
    _, body = raw(sandbox.url, "GET", f"/v1/{SPEC.cluster_path}")
    container_v1.Cluster.from_json(json.dumps(body), ignore_unknown_fields=False)
    _, body = raw(sandbox.url, "GET", f"/v1/{operation_name(operation.name)}")
    container_v1.Operation.from_json(json.dumps(body), ignore_unknown_fields=False)


def _ca(cluster: container_v1.Cluster) -> str:
    return base64.b64decode(cluster.master_auth.cluster_ca_certificate).decode()


def _handshake(endpoint: str, ca_pem: str) -> dict:
    """A TLS handshake with a cluster's API server, its certificate checked against ``ca_pem`` for its address; the
    certificate it presented."""
    host, _, port = endpoint.rpartition(":")
    context = ssl.create_default_context(cadata=ca_pem)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw_socket,
        context.wrap_socket(raw_socket, server_hostname=host) as tls,
    ):
        return tls.getpeercert()


def _other_cluster(clients: Clients) -> container_v1.Cluster:
    """A second cluster of the run's project, on the same networks."""
    other = RunSpec.from_conf({**SPEC.to_conf(), "cluster_name": "other-cluster"})
    clients.gke.create_cluster(request=gke.cluster_create_request(other, owner_of(other)).message)
    return clients.gke.get_cluster(name=other.cluster_path)


def test_a_running_cluster_serves_its_api_over_https_under_its_own_ca_and_never_over_http(clients, sandbox):
    create_networks(clients)
    create_cluster(clients)
    cluster = clients.gke.get_cluster(name=SPEC.cluster_path)
    ca = x509.load_pem_x509_certificate(_ca(cluster).encode())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # The server's certificate chains to the reported CA and names the endpoint's IP.
    assert _handshake(cluster.endpoint, _ca(cluster))["subjectAltName"] == (("IP Address", "127.0.0.1"),)
    # Each cluster has a CA of its own: another cluster's CA does not verify this one.
    other = _other_cluster(clients)
    assert other.endpoint != cluster.endpoint and _ca(other) != _ca(cluster)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        _handshake(cluster.endpoint, _ca(other))
    # Plain http to the cluster's listener gets no HTTP answer at all.
    host, _, port = cluster.endpoint.rpartition(":")
    plain = http.client.HTTPConnection(host, int(port), timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain.request("GET", "/api")
        plain.getresponse()
    plain.close()
    # The sandbox's plain-http port no longer serves any cluster's API.
    status, body = raw(sandbox.url, "GET", f"/kube/{cluster.id}/api")
    assert status == 404 and body["error"]["status"] == "NOT_FOUND"
    # A deleted cluster's API server is gone with it.
    clients.gke.delete_cluster(name=SPEC.cluster_path)
    deadline = time.monotonic() + 10
    while True:
        try:
            _handshake(cluster.endpoint, _ca(cluster))
        except ConnectionRefusedError:
            break
        except (ConnectionResetError, ssl.SSLError):
            pass  # the listener is closing: not gone yet
        assert time.monotonic() < deadline, "the deleted cluster's API still answers"
        time.sleep(0.05)


def test_a_restarted_sandbox_serves_each_cluster_again_under_the_same_ca(tmp_path):
    state = tmp_path / "state"
    with start_sandbox(state, seed=SEED) as first:
        clients = Clients(first.url)
        create_networks(clients)
        create_cluster(clients)
        before = clients.gke.get_cluster(name=SPEC.cluster_path)
        assert first.stop() == 0
    with start_sandbox(state) as second:
        after = Clients(second.url).gke.get_cluster(name=SPEC.cluster_path)
        assert _ca(after) == _ca(before)
        # The same port when it is still free (a client that knew the endpoint finds it again).
        assert after.endpoint == before.endpoint
        assert _handshake(after.endpoint, _ca(before))["subjectAltName"] == (("IP Address", "127.0.0.1"),)


def test_repeat_create_is_409_missing_is_404(clients, sandbox):
    create_networks(clients)
    create_cluster(clients)
    with pytest.raises(exceptions.Conflict):
        create_cluster(clients)
    create_node_pool(clients)
    with pytest.raises(exceptions.Conflict):
        create_node_pool(clients)
    with pytest.raises(exceptions.NotFound):
        clients.gke.get_cluster(name=f"{SPEC.cluster_parent}/clusters/none")
    with pytest.raises(exceptions.NotFound):
        clients.gke.delete_node_pool(name=f"{SPEC.cluster_path}/nodePools/none")
    with pytest.raises(exceptions.NotFound):
        clients.gke.get_operation(name=operation_name("operation-0-none"))


def test_misspelt_field_is_400(clients, sandbox):
    create_networks(clients)
    body = gke.cluster_create_request(SPEC, OWNER).body
    body["cluster"]["addonsConfig"]["rayOperatorConfig"] = {"enable": True}
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.cluster_parent}/clusters", body)
    assert status == 400
    assert answer["error"]["status"] == "INVALID_ARGUMENT"
    assert 'Unknown name "enable"' in answer["error"]["message"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(name="Bad_Cluster"), "cluster.name"),
        (lambda c: c.update(network="no-such-net"), "does not exist"),
        (lambda c: c["workloadIdentityConfig"].update(workloadPool="other.svc.id.goog"), "Workload Identity"),
        (lambda c: c["networkConfig"].pop("datapathProvider"), "Dataplane V2"),
        (lambda c: c["nodePools"][0]["autoscaling"].update(totalMaxNodeCount=3), "cannot be specified together"),
    ],
)
def test_cluster_rules(clients, sandbox, change, message):
    create_networks(clients)
    body = gke.cluster_create_request(SPEC, OWNER).body
    change(body["cluster"])
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.cluster_parent}/clusters", body)
    assert status == 400, answer
    assert message in answer["error"]["message"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["config"]["reservationAffinity"].update(values=["other-res"]), "other-res"),
        (lambda p: p["config"].update(machineType="a3-ultragpu-8g"), "comes with"),
        (lambda p: p["networkConfig"]["additionalNodeNetworkConfigs"][0].update(subnetwork="nope"), "nope"),
        (lambda p: p.update(locations=["us-east4-b"]), "not a zone of region"),
    ],
)
def test_node_pool_rules(clients, sandbox, change, message):
    create_networks(clients)
    create_cluster(clients)
    body = gke.node_pool_create_request(SPEC, OWNER).body
    change(body["nodePool"])
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.cluster_path}/nodePools", body)
    assert status == 400, answer
    assert message in answer["error"]["message"]


def test_cluster_delete_is_refused_while_a_node_pool_operation_runs(clients, sandbox):
    create_networks(clients)
    create_cluster(clients)
    sandbox.set_latency(scale=1.0, seconds={"container.nodePools.create": 0.5})
    pool_op = create_node_pool(clients)
    assert pool_op.status in (OpStatus.PENDING, OpStatus.RUNNING)
    assert clients.gke.get_cluster(name=SPEC.cluster_path).status == Status.RECONCILING
    assert clients.gke.get_node_pool(name=SPEC.node_pool_path).status == container_v1.NodePool.Status.PROVISIONING
    with pytest.raises(exceptions.BadRequest) as refused:
        clients.gke.delete_cluster(name=SPEC.cluster_path)
    assert "incompatible operation" in refused.value.message
    assert pool_op.name in refused.value.message
    time.sleep(0.55)
    assert clients.gke.get_operation(name=operation_name(pool_op.name)).status == OpStatus.DONE
    sandbox.set_latency(scale=0.0)
    delete = clients.gke.delete_cluster(name=SPEC.cluster_path)
    assert delete.operation_type == container_v1.Operation.Type.DELETE_CLUSTER
    # Deleting the cluster deleted its node pools.
    assert not [i for i in sandbox.inventory() if i["kind"].startswith("container.")]


def test_node_pool_waits_for_a_running_cluster(clients, sandbox):
    create_networks(clients)
    sandbox.set_latency(scale=1.0, seconds={"container.clusters.create": 0.4})
    operation = create_cluster(clients)
    assert clients.gke.get_cluster(name=SPEC.cluster_path).status == Status.PROVISIONING
    with pytest.raises(exceptions.BadRequest):
        create_node_pool(clients)
    time.sleep(0.45)
    done = clients.gke.get_operation(name=operation_name(operation.name))
    assert (done.status, done.end_time != "") == (OpStatus.DONE, True)
    assert create_node_pool(clients).status in (OpStatus.PENDING, OpStatus.RUNNING, OpStatus.DONE)


def test_node_pool_delete_leaves_the_cluster(clients, sandbox):
    create_networks(clients)
    create_cluster(clients)
    create_node_pool(clients)
    operation = clients.gke.delete_node_pool(name=SPEC.node_pool_path)
    assert operation.operation_type == container_v1.Operation.Type.DELETE_NODE_POOL
    assert [p.name for p in clients.gke.get_cluster(name=SPEC.cluster_path).node_pools] == ["default-pool"]
    assert clients.gke.get_cluster(name=SPEC.cluster_path).status == Status.RUNNING
    assert REGION in operation.self_link and PROJECT not in operation.self_link  # links name the project by number


def test_a_pool_resized_to_zero_reports_no_nodes_and_a_negative_size_is_refused(clients, sandbox):
    create_networks(clients)
    create_cluster(clients)
    create_node_pool(clients)
    before = clients.gke.get_cluster(name=SPEC.cluster_path).current_node_count
    request = container_v1.SetNodePoolSizeRequest(name=SPEC.node_pool_path, node_count=0)
    operation = clients.gke.set_node_pool_size(request=request)
    assert operation.operation_type == container_v1.Operation.Type.SET_NODE_POOL_SIZE
    assert clients.gke.get_operation(name=operation_name(operation.name)).status == OpStatus.DONE
    # The default pool's nodes stay; the GPU pool's are gone.
    assert clients.gke.get_cluster(name=SPEC.cluster_path).current_node_count == before
    clients.gke.set_node_pool_size(request=container_v1.SetNodePoolSizeRequest(name=SPEC.node_pool_path, node_count=2))
    assert clients.gke.get_cluster(name=SPEC.cluster_path).current_node_count == 2 + before
    status, body = raw(sandbox.url, "POST", f"/v1/{SPEC.node_pool_path}:setSize", {"nodeCount": -1})
    assert status == 400 and "nodeCount must not be negative" in json.dumps(body)


def test_node_pool_create_and_delete_are_refused_while_the_cluster_create_runs(clients, sandbox):
    # Real GKE: 400 FAILED_PRECONDITION, reason failedPrecondition, "Cluster is running incompatible operation ...".
    create_networks(clients)
    sandbox.set_latency(scale=1.0, seconds={"container.clusters.create": 0.5})
    cluster_op = create_cluster(clients)
    body = gke.node_pool_create_request(SPEC, OWNER).body
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.cluster_path}/nodePools", body)
    assert status == 400, answer
    error = answer["error"]
    assert error["status"] == "FAILED_PRECONDITION"
    assert [e["reason"] for e in error["errors"]] == ["failedPrecondition"]
    assert error["message"] == f"Cluster is running incompatible operation {cluster_op.name}."
    status, answer = raw(sandbox.url, "DELETE", f"/v1/{SPEC.cluster_path}/nodePools/default-pool")
    assert status == 400 and "incompatible operation" in answer["error"]["message"], answer
    time.sleep(0.55)
    sandbox.set_latency(scale=0.0)
    assert create_node_pool(clients).status == OpStatus.DONE


def test_a_pool_on_a_used_up_reservation_reports_a_stockout_condition(clients, sandbox):
    # GKE puts what keeps a pool's nodes from coming in its conditions: code GCE_STOCKOUT.
    create_networks(clients)
    create_cluster(clients)
    create_node_pool(clients)
    assert not clients.gke.get_node_pool(name=SPEC.node_pool_path).conditions
    sandbox.seed_reservation(PROJECT, SPEC.zone, SPEC.reservation, SPEC.effective_machine_type, 2, in_use_count=2)
    try:
        pool = clients.gke.get_node_pool(name=SPEC.node_pool_path)
        [condition] = pool.conditions
        assert condition.code == container_v1.StatusCondition.Code.GCE_STOCKOUT
        assert f"reservations/{SPEC.reservation}' does not have available resources" in condition.message
        assert pool.status == container_v1.NodePool.Status.RUNNING
    finally:
        # The seeded world outlives the per-test reset: give the next tests their free reservation back.
        sandbox.seed_reservation(PROJECT, SPEC.zone, SPEC.reservation, SPEC.effective_machine_type, 2)


@pytest.mark.parametrize(
    "value",
    [
        "projects/shared-owner/zones/us-central1-b/reservations/my-res",  # a compute URL, not GKE's form
        "projects/shared-owner/reservations/",
        "my-res/reservationBlocks/",
        "my-res/blocks/b1",
        "../my-res",
    ],
)
def test_node_pool_refuses_a_reservation_value_not_in_gkes_forms(clients, sandbox, value):
    create_networks(clients)
    create_cluster(clients)
    body = gke.node_pool_create_request(SPEC, OWNER).body
    body["nodePool"]["config"]["reservationAffinity"]["values"] = [value]
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.cluster_path}/nodePools", body)
    assert status == 400, answer
    assert "is not RESERVATION, projects/PROJECT/reservations/RESERVATION" in answer["error"]["message"]


def test_node_pool_consumes_a_shared_reservations_block_of_another_project(clients, sandbox):
    # The reservation lives in another project and is named in GKE's shared form with one of its blocks.
    owner, value = "shared-owner", "projects/shared-owner/reservations/shared/reservationBlocks/block-1"
    sandbox.seed_reservation(owner, SPEC.zone, "shared", machine_type=SPEC.effective_machine_type, count=2)
    create_networks(clients)
    create_cluster(clients)
    body = gke.node_pool_create_request(SPEC, OWNER).body
    body["nodePool"]["config"]["reservationAffinity"]["values"] = [value]
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.cluster_path}/nodePools", body)
    assert status == 400 and 'reservation block "block-1" of "shared" was not found' in answer["error"]["message"]
    sandbox.seed(
        {
            "reservations": [
                {
                    "project": owner,
                    "zone": SPEC.zone,
                    "name": "shared",
                    "machine_type": SPEC.effective_machine_type,
                    "count": 2,
                    "blocks": ["block-1"],
                }
            ]
        }
    )
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.cluster_path}/nodePools", body)
    assert status == 200, answer
    assert clients.gke.get_node_pool(name=SPEC.node_pool_path).config.reservation_affinity.values == [value]


@pytest.mark.parametrize("capacity", ["flex_start", "spot", "on_demand"])
def test_each_capacitys_pool_of_the_plan_is_accepted_and_kept_as_sent(clients, sandbox, capacity):
    create_networks(clients)
    create_cluster(clients)
    spec = _capacity_spec(capacity, flex_start_max_hours=20 if capacity == "flex_start" else 0)
    body = gke.node_pool_create_request(spec, OWNER).body
    status, answer = raw(sandbox.url, "POST", f"/v1/{spec.cluster_path}/nodePools", body)
    assert status == 200, answer
    pool = clients.gke.get_node_pool(name=spec.node_pool_path)
    affinity = container_v1.ReservationAffinity.Type
    assert pool.config.reservation_affinity.consume_reservation_type == affinity.NO_RESERVATION
    assert (pool.config.spot, pool.config.flex_start) == (capacity == "spot", capacity == "flex_start")
    if capacity == "flex_start":
        assert pool.config.max_run_duration.total_seconds() == 20 * 3600
        assert not pool.management.auto_repair
        assert pool.autoscaling.location_policy == container_v1.NodePoolAutoscaling.LocationPolicy.ANY


def _capacity_spec(capacity: str, **conf: object) -> RunSpec:
    return RunSpec.from_conf({**SPEC.to_conf(), "capacity": capacity, **conf})


def _flex_body() -> dict:
    return gke.node_pool_create_request(_capacity_spec("flex_start"), OWNER).body


def _queued_body() -> dict:
    return gke.node_pool_create_request(_capacity_spec("queued"), OWNER).body


@pytest.mark.parametrize(
    ("body", "change", "message"),
    [
        (_flex_body, lambda p: p["management"].update(autoRepair=True), "do not support auto-repair"),
        (_flex_body, lambda p: p["autoscaling"].update(enabled=False), "need autoscaling enabled"),
        (_flex_body, lambda p: p["config"].update(spot=True), "flexStart and spot cannot both be set"),
        (
            _flex_body,
            lambda p: p["config"].update(reservationAffinity={"consumeReservationType": "ANY_RESERVATION"}),
            "need NO_RESERVATION",
        ),
        (_flex_body, lambda p: p["config"].update(maxRunDuration="700000s"), "at most 7 days"),
        # A queued pool's own rules, named as queued provisioning.
        (_queued_body, lambda p: p["management"].update(autoRepair=True), "queued provisioning node pools do not"),
        (_queued_body, lambda p: p["autoscaling"].update(enabled=False), "queued provisioning node pools need"),
        # On a pool that is not flex-start, maxRunDuration is refused; Spot VMs take no specific reservation.
        (
            lambda: gke.node_pool_create_request(SPEC, OWNER).body,
            lambda p: p["config"].update(maxRunDuration="60s"),
            "must be set with flexStart",
        ),
        (
            lambda: gke.node_pool_create_request(SPEC, OWNER).body,
            lambda p: p["config"].update(spot=True),
            "cannot consume a specific reservation",
        ),
    ],
)
def test_capacity_rules_gke_states(clients, sandbox, body, change, message):
    create_networks(clients)
    create_cluster(clients)
    request = body()
    change(request["nodePool"])
    status, answer = raw(sandbox.url, "POST", f"/v1/{SPEC.cluster_path}/nodePools", request)
    assert status == 400, answer
    assert message in answer["error"]["message"]
