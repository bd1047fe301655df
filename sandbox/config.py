"""What the sandbox's world offers beyond what clients create: RoCE zones, enabled APIs, reservations, latencies.

It comes from defaults, then the ``--seed`` file, then the admin API, and is persisted with the state. The seed file
is JSON (every key optional)::

    {"roce_zones": ["us-central1-b"],
     "enabled_services": ["compute.googleapis.com", ...],
     "reservations": [{"project": "p", "zone": "us-central1-b", "name": "res", "machine_type": "a4-highgpu-8g",
                       "count": 2, "in_use_count": 0}],
     "latency_seconds": {"container.clusters.create": 420},
     "quotas": {"NVIDIA_B200_GPUS": 64}}

``quotas`` are the regional quota limits every region reports (``regions.get``), merged into the defaults.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ROCE_ZONES: tuple[str, ...] = ("us-central1-b", "europe-west1-b", "us-east4-b")
DEFAULT_ENABLED_SERVICES: tuple[str, ...] = (
    "compute.googleapis.com",
    "container.googleapis.com",
    "lustre.googleapis.com",
    "servicenetworking.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "storage.googleapis.com",
)
# The GPU machine types of the tutorial and the accelerators they come with (FACTS §4 "GPU pairs").
GPU_MACHINES: dict[str, tuple[str, int]] = {
    "a4-highgpu-8g": ("nvidia-b200", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
}
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
# Regional quota limits regions.get reports, in every region (usage is always 0).
DEFAULT_QUOTAS: dict[str, float] = {
    "CPUS": 2400.0,
    "NVIDIA_B200_GPUS": 64.0,
    "NVIDIA_H200_141GB_GPUS": 64.0,
    "NETWORKS": 50.0,
    "SUBNETWORKS": 275.0,
    "FIREWALLS": 500.0,
}
SEED_KEYS = {"roce_zones", "enabled_services", "reservations", "latency_seconds", "quotas"}
RESERVATION_KEYS = {
    "project",
    "zone",
    "name",
    "machine_type",
    "count",
    "in_use_count",
    "accelerator_type",
    "accelerator_count",
}


class SeedError(ValueError):
    """A seed file or an admin request describes the world wrongly."""


@dataclass
class Reservation:
    """A specific reservation of GPU machines in a zone, as preflight and node pools look it up."""

    project: str
    zone: str
    name: str
    machine_type: str
    count: int
    in_use_count: int = 0
    accelerator_type: str = ""
    accelerator_count: int = 0
    created: float = 0.0

    @property
    def key(self) -> str:
        """Its compute path: ``projects/P/zones/Z/reservations/R``."""
        return f"projects/{self.project}/zones/{self.zone}/reservations/{self.name}"

    @classmethod
    def from_seed(cls, record: dict[str, Any], at: float) -> Reservation:
        """Validate one seed / admin record; accelerators default to the machine type's own."""
        unknown = set(record) - RESERVATION_KEYS
        if unknown:
            raise SeedError(f"reservation: unknown keys {sorted(unknown)}; known: {sorted(RESERVATION_KEYS)}")
        missing = {"project", "zone", "name", "machine_type", "count"} - set(record)
        if missing:
            raise SeedError(f"reservation: missing keys {sorted(missing)}")
        if not ZONE.match(str(record["zone"])):
            raise SeedError(f"reservation: zone {record['zone']!r} is not a zone name")
        count, in_use = int(record["count"]), int(record.get("in_use_count", 0))
        if count < 0 or not 0 <= in_use <= count:
            raise SeedError(f"reservation: need 0 <= in_use_count ({in_use}) <= count ({count})")
        accelerator, accelerators = GPU_MACHINES.get(str(record["machine_type"]), ("", 0))
        return cls(
            project=str(record["project"]),
            zone=str(record["zone"]),
            name=str(record["name"]),
            machine_type=str(record["machine_type"]),
            count=count,
            in_use_count=in_use,
            accelerator_type=str(record.get("accelerator_type", accelerator)),
            accelerator_count=int(record.get("accelerator_count", accelerators)),
            created=at,
        )


@dataclass
class Config:
    """The seeded world: RoCE zones, enabled services, reservations, latency overrides, quotas, projects seen."""

    roce_zones: list[str] = field(default_factory=lambda: list(DEFAULT_ROCE_ZONES))
    enabled_services: list[str] = field(default_factory=lambda: list(DEFAULT_ENABLED_SERVICES))
    reservations: dict[str, Reservation] = field(default_factory=dict)
    latency_seconds: dict[str, float] = field(default_factory=dict)
    quotas: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    # Service Networking names networks by project number; these are the project IDs it can map back to.
    known_projects: list[str] = field(default_factory=list)

    def apply_seed(self, seed: dict[str, Any], at: float) -> None:
        """Merge a seed document (replaces zone and service lists, upserts reservations and latencies)."""
        unknown = set(seed) - SEED_KEYS
        if unknown:
            raise SeedError(f"seed: unknown keys {sorted(unknown)}; known: {sorted(SEED_KEYS)}")
        if "roce_zones" in seed:
            zones = [str(z) for z in seed["roce_zones"]]
            bad = [z for z in zones if not ZONE.match(z)]
            if bad:
                raise SeedError(f"seed: roce_zones {bad} are not zone names")
            self.roce_zones = zones
        if "enabled_services" in seed:
            self.enabled_services = [str(s) for s in seed["enabled_services"]]
        for record in seed.get("reservations", []):
            self.add_reservation(Reservation.from_seed(record, at))
        for kind, seconds in seed.get("latency_seconds", {}).items():
            self.latency_seconds[str(kind)] = float(seconds)
        for metric, limit in seed.get("quotas", {}).items():
            self.quotas[str(metric)] = float(limit)

    def add_reservation(self, reservation: Reservation) -> None:
        """Add or replace a reservation."""
        self.reservations[reservation.key] = reservation

    def remember_project(self, project: str) -> None:
        """Record a project ID, so its project number can be mapped back to it."""
        if project not in self.known_projects:
            self.known_projects.append(project)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe record for the state file."""
        record = dataclasses.asdict(self)
        record["reservations"] = [dataclasses.asdict(r) for r in self.reservations.values()]
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Config:
        """The inverse of :meth:`to_json`."""
        record = dict(record)
        reservations = [Reservation(**r) for r in record.pop("reservations", [])]
        config = cls(**record)
        config.reservations = {r.key: r for r in reservations}
        return config
