"""Ownership and drift, read from REST JSON: the comparisons that decide adopt-or-refuse (no sandbox needed)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.gcp.resources.drift import normalize_ref, same_ref
from nemo_rl_gke.gcp.resources.peering import PEERING_RANGE_FIELD
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.owners import owner_of

SPEC = RunSpec.from_conf({"project": "my-project", "region": "us-east5", "zone": "us-east5-b"})
FOUND = resources(SPEC, owner_of(SPEC))
NET_URL = "projects/my-project/global/networks/nemo-rl-net"


def _as_read(key: str) -> dict[str, Any]:
    """What a GET would answer right after our create: the create body (for GKE, the resource inside it)."""
    body = copy.deepcopy(FOUND[key].request.body or {})
    return body.get(FOUND[key].body_root, body) if FOUND[key].body_root else body


@pytest.mark.parametrize(
    "ref",
    [
        f"https://www.googleapis.com/compute/v1/{NET_URL}",
        f"https://compute.googleapis.com/compute/v1/{NET_URL}",
        f"http://127.0.0.1:8080/compute/v1/{NET_URL}",
        f"/compute/v1/{NET_URL}",
        NET_URL,
    ],
)
def test_compute_urls_normalise_to_the_relative_path(ref: str) -> None:
    assert normalize_ref(ref) == NET_URL
    assert same_ref(f"https://compute.googleapis.com/compute/v1/{NET_URL}", ref)
    assert same_ref("nemo-rl-net", ref)  # GKE's bare names
    assert not same_ref(NET_URL.replace("nemo-rl-net", "other"), ref)


@pytest.mark.parametrize("key", [k for k in FOUND if k != t.PEERING])
def test_what_we_create_is_ours_and_matches_the_conf(key: str) -> None:
    actual = _as_read(key)
    assert FOUND[key].owned(actual)
    assert FOUND[key].drift(actual) == []


@pytest.mark.parametrize("key", [t.NET, t.GVNIC_SUB, t.GVNIC_FW, t.PEERING_RANGE, t.LUSTRE, t.GKE_CLUSTER, t.NODE_POOL])
def test_without_the_marker_it_is_not_ours(key: str) -> None:
    actual = _as_read(key)
    for field in ("description", "labels", "resourceLabels"):
        actual.pop(field, None)
    actual.get("config", {}).pop("resourceLabels", None)
    assert not FOUND[key].owned(actual)


def test_google_spellings_of_the_same_values_are_not_drift() -> None:
    subnet = _as_read(t.GVNIC_SUB)
    subnet["network"] = "https://www.googleapis.com/compute/v1/projects/my-project/global/networks/nemo-rl-gvnic-net"
    assert FOUND[t.GVNIC_SUB].drift(subnet) == []

    firewall = _as_read(t.GVNIC_FW)
    firewall["allowed"] = [
        {"IPProtocol": "ICMP"},
        {"IPProtocol": "UDP", "ports": ["0-65535"]},
        {"IPProtocol": "TCP", "ports": ["0-65535"]},
    ]
    assert FOUND[t.GVNIC_FW].drift(firewall) == []

    lustre = _as_read(t.LUSTRE)
    lustre["capacityGib"] = 18000  # int64 as a number instead of a string
    assert FOUND[t.LUSTRE].drift(lustre) == []

    pool = _as_read(t.NODE_POOL)
    pool["networkConfig"]["additionalNodeNetworkConfigs"] = [
        {
            "network": f"projects/my-project/global/networks/{n['network']}",
            "subnetwork": f"projects/my-project/regions/us-east5/subnetworks/{n['subnetwork']}",
        }
        for n in pool["networkConfig"]["additionalNodeNetworkConfigs"]
    ]
    pool["config"]["accelerators"][0]["acceleratorCount"] = 8
    assert FOUND[t.NODE_POOL].drift(pool) == []

    net = _as_read(t.NET)
    del net["mtu"]  # the API's default MTU, 1460, which the conf asks for
    assert FOUND[t.NET].drift(net) == []


def test_drift_names_each_field_with_expected_and_found() -> None:
    net = _as_read(t.NET)
    net["autoCreateSubnetworks"] = False
    net["mtu"] = 8896
    assert FOUND[t.NET].drift(net) == [
        "autoCreateSubnetworks: expected true, found false",
        "mtu: expected 1460, found 8896",
    ]

    rdma = _as_read(t.RDMA_NET)
    del rdma["networkProfile"]
    assert FOUND[t.RDMA_NET].drift(rdma) == [
        "networkProfile: expected "
        '"https://compute.googleapis.com/compute/v1/projects/my-project/global/networkProfiles/us-east5-b-vpc-roce", '
        "found (unset)"
    ]

    lustre = _as_read(t.LUSTRE)
    lustre["perUnitStorageThroughput"] = "250"
    assert FOUND[t.LUSTRE].drift(lustre) == ["perUnitStorageThroughput: expected 500, found 250"]

    cluster = _as_read(t.GKE_CLUSTER)
    cluster["addonsConfig"]["rayOperatorConfig"] = {}
    cluster["networkConfig"]["enableMultiNetworking"] = False
    cluster["network"] = "default"
    assert FOUND[t.GKE_CLUSTER].drift(cluster) == [
        'network: expected "nemo-rl-net", found "default"',
        "networkConfig.enableMultiNetworking: expected true, found false",
        "addonsConfig.rayOperatorConfig.enabled: expected true, found false",
    ]

    pool = _as_read(t.NODE_POOL)
    pool["config"]["machineType"] = "a3-ultragpu-8g"
    pool["networkConfig"]["additionalNodeNetworkConfigs"] = pool["networkConfig"]["additionalNodeNetworkConfigs"][:1]
    pool["locations"] = ["us-east5-a"]
    lines = FOUND[t.NODE_POOL].drift(pool)
    assert [line.split(":")[0] for line in lines] == [
        "config.machineType",
        "networkConfig.additionalNodeNetworkConfigs",
        "locations",
    ]

    address = _as_read(t.PEERING_RANGE)
    address["prefixLength"] = 24
    address["purpose"] = "GCE_ENDPOINT"
    assert FOUND[t.PEERING_RANGE].drift(address) == [
        'purpose: expected "VPC_PEERING", found "GCE_ENDPOINT"',
        "prefixLength: expected 20, found 24",
    ]


def test_the_peering_is_ours_through_its_range() -> None:
    peering = FOUND[t.PEERING]
    ours_range = _as_read(t.PEERING_RANGE)
    connection = {"reservedPeeringRanges": [SPEC.peering_range], PEERING_RANGE_FIELD: ours_range}
    assert peering.owned(connection)
    assert peering.drift(connection) == []

    theirs_range = {**ours_range, "labels": {}, "description": ""}
    assert not peering.owned({**connection, PEERING_RANGE_FIELD: theirs_range})
    other_group = {**ours_range, "description": ours_range["description"].replace(SPEC.group_id, "other-group")}
    assert not peering.owned({**connection, PEERING_RANGE_FIELD: other_group})


def test_states_decide_ready_failed_and_deleting() -> None:
    cluster, lustre = FOUND[t.GKE_CLUSTER], FOUND[t.LUSTRE]
    assert cluster.ready({"status": "RUNNING"}) and not cluster.ready({"status": "PROVISIONING"})
    assert cluster.failed({"status": "ERROR"}) and cluster.deleting({"status": "STOPPING"})
    assert lustre.ready({"state": "ACTIVE"}) and not lustre.ready({"state": "CREATING"})
    assert lustre.deleting({"state": "DELETING"})
    assert FOUND[t.PEERING_RANGE].ready({"status": "RESERVED"}) and not FOUND[t.PEERING_RANGE].ready(
        {"status": "RESERVING"}
    )
    assert FOUND[t.NET].owned({"description": owner_of(SPEC).description})
