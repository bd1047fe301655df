"""The sandbox process: 127.0.0.1 only, restarts with its state, routes and errors like Google, admin API, load."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from google.cloud import compute_v1
from sandbox.testing import REPO_ROOT, SandboxError, request_json, start_sandbox

from nemo_rl_gke.plan import networks
from tests.sandbox.conftest import OWNER, PROJECT, SEED, SPEC, Clients
from tests.sandbox.helpers import insert_compute, raw

LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
LISTEN = "0A"


def _listeners(port: int) -> list[str]:
    """The local addresses of every socket listening on ``port`` (IPv4 and IPv6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                address, hex_port = fields[1].split(":")
                if int(hex_port, 16) == port and fields[3] == LISTEN:
                    found.append(address)
    return found


def test_it_listens_on_127_0_0_1_only(sandbox):
    assert _listeners(sandbox.port) == [LOOPBACK_HEX]
    health = request_json(f"{sandbox.url}/sandbox/health")
    assert health["status"] == "ok" and health["url"] == sandbox.url and health["pid"] == sandbox.pid


def test_the_command_line_has_no_host_option():
    result = subprocess.run(
        [sys.executable, "-m", "sandbox", "serve", "--port", "0", "--state", "/tmp/x", "--host", "0.0.0.0"],
        cwd=REPO_ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "unrecognized arguments: --host" in result.stderr


def test_a_restarted_sandbox_keeps_its_resources_and_operations(tmp_path):
    state = tmp_path / "state"
    with start_sandbox(state, latency_scale=1.0, seed=SEED) as first:
        first.set_latency(seconds={"compute.networks.insert": 0.0, "compute.subnetworks.insert": 1.5})
        clients = Clients(first.url)
        insert_compute(clients, networks.gvnic_network_request(SPEC, OWNER))
        pending = insert_compute(clients, networks.gvnic_subnet_request(SPEC, OWNER))
        assert pending.status != compute_v1.Operation.Status.DONE
        before = first.inventory()
        assert first.stop() == 0  # SIGTERM: a clean exit
    assert json.loads((state / "state.json").read_text())["version"] == 1
    with start_sandbox(state, latency_scale=1.0) as second:
        clients = Clients(second.url)
        assert [(i["path"], i["description"]) for i in second.inventory()] == [
            (i["path"], i["description"]) for i in before
        ]
        assert clients.networks.get(project=PROJECT, network=SPEC.gvnic_network).name == SPEC.gvnic_network
        # The operation kept its schedule across the restart and finishes by the wall clock.
        operation = clients.region_operations.wait(project=PROJECT, region=SPEC.region, operation=pending.name)
        assert operation.status == compute_v1.Operation.Status.DONE
        assert [i["state"] for i in second.inventory()] == ["READY", "READY"]
        # The seeded reservation survived too; the call log is the new process's own.
        assert clients.reservations.get(project=PROJECT, zone=SPEC.zone, reservation=SPEC.reservation).name
        assert [c["method"] for c in second.calls()] == ["GET", "POST", "GET"]


def test_unknown_paths_and_methods_answer_googles_404(sandbox):
    for method, path in [("GET", "/v2/whatever"), ("PUT", f"/compute/v1/projects/{PROJECT}/global/networks")]:
        status, answer = raw(sandbox.url, method, path)
        assert status == 404
        assert set(answer["error"]) >= {"code", "message", "status", "errors"}
        assert answer["error"]["errors"][0]["reason"] == "notFound"
    status, answer = raw(sandbox.url, "POST", f"/compute/v1/projects/{PROJECT}/global/networks", "{not json")
    assert status == 400 and answer["error"]["message"].startswith("Invalid JSON payload received.")


def test_inventory_shows_owner_markers_and_resources_without_them(clients, sandbox):
    insert_compute(clients, networks.main_network_request(SPEC, OWNER))
    foreign = {"name": "someone-elses", "autoCreateSubnetworks": False}
    assert raw(sandbox.url, "POST", f"/compute/v1/projects/{PROJECT}/global/networks", foreign)[0] == 200
    items = {i["name"]: i for i in sandbox.inventory()}
    assert items[SPEC.network]["description"] == OWNER.description
    assert items["someone-elses"]["description"] == "" and items["someone-elses"]["labels"] == {}
    assert {i["kind"] for i in items.values()} == {"compute.network"}
    assert items[SPEC.network]["path"] == f"projects/{PROJECT}/global/networks/{SPEC.network}"
    seeded = request_json(f"{sandbox.url}/sandbox/inventory")["seeded"]
    assert seeded["reservations"][0]["name"] == SPEC.reservation
    assert "lustre.googleapis.com" in seeded["enabled_services"]


def test_admin_seed_services_and_latency(clients, sandbox):
    usage = clients.discovery("serviceusage").services()
    name = f"projects/{PROJECT}/services/lustre.googleapis.com"
    request_json(f"{sandbox.url}/sandbox/services", "POST", {"service": "lustre.googleapis.com", "enabled": False})
    assert usage.get(name=name).execute()["state"] == "DISABLED"
    request_json(f"{sandbox.url}/sandbox/services", "POST", {"service": "lustre.googleapis.com", "enabled": True})
    assert usage.get(name=name).execute()["state"] == "ENABLED"
    sandbox.seed({"roce_zones": ["us-central1-b", "asia-southeast1-b"]})
    assert {p.name for p in clients.profiles.list(project=PROJECT)} == {
        "us-central1-b-vpc-roce",
        "asia-southeast1-b-vpc-roce",
    }
    sandbox.seed({"roce_zones": ["us-central1-b", "europe-west1-b", "us-east4-b"]})
    model = sandbox.set_latency(scale=0.5)
    assert model["scaled_seconds"]["container.clusters.create"] == 210.0
    assert model["seconds"]["lustre.instances.create"] == 600.0
    with pytest.raises(SandboxError):
        sandbox.seed({"roce_zone": ["x"]})
    with pytest.raises(SandboxError):
        sandbox.seed_reservation(PROJECT, "not-a-zone", "r", machine_type="a4-highgpu-8g", count=1)


def test_concurrent_requests_are_served_while_a_wait_is_pending(clients, sandbox):
    # The slow operation's latency is far longer than 24 creates take even on a loaded machine: the order of events
    # proves the wait blocked nothing, with no clock in the assertions.
    sandbox.set_latency(scale=1.0, seconds={"compute.networks.insert": 8.0, "compute.firewalls.insert": 0.0})
    slow = insert_compute(clients, networks.gvnic_network_request(SPEC, OWNER))
    events: list[str] = []

    def wait() -> None:
        Clients(sandbox.url).global_operations.wait(project=PROJECT, operation=slow.name)
        events.append("wait returned")

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)

    def create(index: int) -> int:
        body = {"name": f"net-{index}", "autoCreateSubnetworks": False}
        return raw(sandbox.url, "POST", f"/compute/v1/projects/{PROJECT}/global/networks", body)[0]

    sandbox.set_latency(scale=0.0)
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(create, range(24))) == [200] * 24
    events.append("creates answered")
    waiter.join(60)
    assert events == ["creates answered", "wait returned"]  # answered while the wait was still blocked
    assert len(sandbox.inventory()) == 25


def test_start_sandbox_reports_a_server_that_cannot_start(tmp_path):
    (tmp_path / "seed.json").write_text('{"nonsense": 1}')
    with pytest.raises(SandboxError, match="nonsense"):
        start_sandbox(tmp_path / "state", seed=tmp_path / "seed.json")
