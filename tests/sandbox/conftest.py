"""One sandbox process for the whole sandbox suite, reset before each test, and the real clients pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.cloud import compute_v1, container_v1, lustre_v1
from googleapiclient.discovery import build
from sandbox.testing import SandboxProcess, credentials, sandbox_fixture

from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.plan.api import ApiRequest
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.owners import owner_of

PROJECT, REGION, ZONE, RESERVATION = "my-project", "us-central1", "us-central1-b", "my-res"
SPEC = RunSpec.from_conf({"project": PROJECT, "region": REGION, "zone": ZONE, "reservation": RESERVATION})
OWNER = owner_of(SPEC)


def network_requests(spec: RunSpec) -> list[ApiRequest]:
    """The network stage's creates, in the topology's order (from the registry, as the plan lists them)."""
    return [r.request for r in resources(spec, owner_of(spec)).values() if r.stage == t.NETWORK]


def network_delete_requests(spec: RunSpec) -> list[ApiRequest]:
    """The network stage's deletes, in the topology's teardown order."""
    found = resources(spec, owner_of(spec))
    order = [target for s in t.teardown_steps() for target in s.deletes if target in found]
    return [found[k].delete_request for k in order if found[k].stage == t.NETWORK]


SEED = {
    "reservations": [
        {"project": PROJECT, "zone": ZONE, "name": RESERVATION, "machine_type": SPEC.effective_machine_type, "count": 2}
    ]
}


sandbox_process = sandbox_fixture(scope="session", seed=SEED, name="sandbox_process")


@pytest.fixture
def sandbox(sandbox_process: SandboxProcess) -> Iterator[SandboxProcess]:
    """The shared sandbox, empty, instant, without faults; its latency is put back afterwards."""
    sandbox_process.reset()
    sandbox_process.set_latency(scale=0.0, defaults=True)
    yield sandbox_process
    sandbox_process.set_latency(scale=0.0, defaults=True)
    sandbox_process.clear_faults()


@dataclass
class Clients:
    """The real google-cloud and discovery clients, pointed at the sandbox with its service-account credentials."""

    url: str
    _discovery: dict[str, Any] = field(default_factory=dict)

    @property
    def options(self) -> dict[str, str]:
        return {"api_endpoint": self.url}

    def _kw(self) -> dict[str, Any]:
        return {"credentials": credentials(self.url), "client_options": self.options}

    @property
    def networks(self) -> compute_v1.NetworksClient:
        return compute_v1.NetworksClient(**self._kw())

    @property
    def subnetworks(self) -> compute_v1.SubnetworksClient:
        return compute_v1.SubnetworksClient(**self._kw())

    @property
    def firewalls(self) -> compute_v1.FirewallsClient:
        return compute_v1.FirewallsClient(**self._kw())

    @property
    def addresses(self) -> compute_v1.GlobalAddressesClient:
        return compute_v1.GlobalAddressesClient(**self._kw())

    @property
    def profiles(self) -> compute_v1.NetworkProfilesClient:
        return compute_v1.NetworkProfilesClient(**self._kw())

    @property
    def reservations(self) -> compute_v1.ReservationsClient:
        return compute_v1.ReservationsClient(**self._kw())

    @property
    def global_operations(self) -> compute_v1.GlobalOperationsClient:
        return compute_v1.GlobalOperationsClient(**self._kw())

    @property
    def region_operations(self) -> compute_v1.RegionOperationsClient:
        return compute_v1.RegionOperationsClient(**self._kw())

    @property
    def gke(self) -> container_v1.ClusterManagerClient:
        return container_v1.ClusterManagerClient(transport="rest", **self._kw())

    @property
    def lustre(self) -> lustre_v1.LustreClient:
        return lustre_v1.LustreClient(transport="rest", **self._kw())

    def discovery(self, api: str) -> Any:
        # Building a discovery client parses its document: once per test is enough.
        if api not in self._discovery:
            self._discovery[api] = build(api, "v1", static_discovery=True, **self._kw())
        return self._discovery[api]


@pytest.fixture
def clients(sandbox: SandboxProcess) -> Clients:
    return Clients(sandbox.url)
