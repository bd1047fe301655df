"""What the sandbox's world offers beyond what clients create: RoCE zones, enabled APIs, reservations, latencies.

It comes from defaults, then the ``--seed`` file, then the admin API, and is persisted with the state. The seed file
is JSON (every key optional)::

    {"roce_zones": ["us-central1-b"],
     "enabled_services": ["compute.googleapis.com", ...],
     "reservations": [{"project": "p", "zone": "us-central1-b", "name": "res", "machine_type": "a4-highgpu-8g",
                       "count": 2, "in_use_count": 0}],
     "latency_seconds": {"container.clusters.create": 420},
     "quotas": {"N2_CPUS": 600},
     "gpu_family_quotas": {"NVIDIA_B200": 64},
     "preemptible_gpu_family_quotas": {"NVIDIA_B200": 0},
     "buckets": [{"project": "p", "name": "p-ckpt", "lustre_agent_role": "roles/storage.objectUser"}],
     "iam_denied": {"p": ["compute.projects.setCommonInstanceMetadata"]},
     "kuberay_conditions": false,
     "capacity": {"flex_start_delay_s": 2.0, "spot_stockout": false, "on_demand_stockout": false},
     "gke_default_version": "1.33.5-gke.1201000",
     "rate_quotas": {"compute.read": 1500, "compute.default": 1500, "container.requests": 5000}}

``quotas`` are the regional quota limits every region reports (``regions.get``), merged into the defaults.
``gpu_family_quotas`` are the ``compute.googleapis.com/gpus_per_gpu_family`` limits per ``gpu_family`` in every
region (Service Usage v1beta1 ``consumerQuotaMetrics``): regions.get does not list B200 or H200 quotas, as on Google.
``preemptible_gpu_family_quotas`` are ``compute.googleapis.com/preemptible_gpus_per_gpu_family``'s, the quota Spot
and flex-start VMs count against (a family left out has none listed).
``buckets`` are the Cloud Storage buckets that exist (each with the default legacy bindings, plus a binding of the
project's Lustre service agent when ``lustre_agent_role`` is given). Every project is granted every permission of
``include/iam/nemo-rl-gke-role.yaml`` except those ``iam_denied`` lists for it. ``kuberay_conditions: false``
makes the KubeRay stand-in behave like KubeRay 1.2 without its feature gate: no ``status.conditions``.
``capacity`` sets the GPU capacity model (:mod:`sandbox.capacity`): how long flex-start's queue takes (null: no nodes
at all) and whether Spot or on-demand VMs are stocked out. ``gke_default_version`` is the version GKE gives a
cluster that asks for none (``getServerConfig``'s ``defaultClusterVersion``), one of the versions it offers.
``rate_quotas`` sets the per-project request limits of the rate quota groups (:mod:`sandbox.quotas`; a group left out
keeps Google's default), per interval.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from sandbox import formats

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
# Regional quota limits regions.get reports, in every region (usage is always 0). Like Google's, they list no B200
# or H200 metric: compute v1's Quota.metric enum has none, those quotas live in gpus_per_gpu_family (below).
DEFAULT_QUOTAS: dict[str, float] = {
    "CPUS": 2400.0,
    "N2_CPUS": 600.0,
    "NETWORKS": 50.0,
    "SUBNETWORKS": 275.0,
    "FIREWALLS": 500.0,
}
# compute.googleapis.com/gpus_per_gpu_family limits in every region, by gpu_family (the Cloud Quotas dimension).
DEFAULT_GPU_FAMILY_QUOTAS: dict[str, float] = {"NVIDIA_B200": 64.0, "NVIDIA_H200": 64.0}
SEED_KEYS = {
    "roce_zones",
    "enabled_services",
    "reservations",
    "latency_seconds",
    "quotas",
    "gpu_family_quotas",
    "preemptible_gpu_family_quotas",
    "buckets",
    "iam_denied",
    "kuberay_conditions",
    "capacity",
    "gke_default_version",
    "rate_quotas",
}
# The capacity model's settings (sandbox/capacity.py): flex-start's queue delay (None: never) and the stock-outs.
DEFAULT_CAPACITY: dict[str, Any] = {"flex_start_delay_s": 2.0, "spot_stockout": False, "on_demand_stockout": False}
RESERVATION_KEYS = {
    "project",
    "zone",
    "name",
    "machine_type",
    "count",
    "in_use_count",
    "accelerator_type",
    "accelerator_count",
    "blocks",
}
BUCKET_KEYS = {"project", "name", "location", "lustre_agent_role"}
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
# The permissions every project grants by default: the project's own custom-role file (what a user applies).
ROLE_FILE = Path(__file__).resolve().parents[1] / "include" / "iam" / "nemo-rl-gke-role.yaml"


@cache
def default_permissions() -> frozenset[str]:
    """Every permission of the custom-role file: what a project grants unless ``iam_denied`` takes some away."""
    return frozenset(yaml.safe_load(ROLE_FILE.read_text())["includedPermissions"])


class SeedError(ValueError):
    """A seed file or an admin request describes the world wrongly."""


def _capacity_settings(record: Any) -> dict[str, Any]:
    """Validate a seed's ``capacity`` record: ``flex_start_delay_s`` (seconds >= 0, or null: never) and the
    ``spot_stockout`` / ``on_demand_stockout`` switches."""
    if not isinstance(record, dict) or set(record) - set(DEFAULT_CAPACITY):
        raise SeedError(f"capacity: give an object with keys among {sorted(DEFAULT_CAPACITY)}, got {record!r}")
    delay = record.get("flex_start_delay_s", 0.0)
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0):
        raise SeedError(f"capacity: flex_start_delay_s must be seconds >= 0 or null (never), got {delay!r}")
    for key in ("spot_stockout", "on_demand_stockout"):
        if key in record and not isinstance(record[key], bool):
            raise SeedError(f"capacity: {key} must be true or false, got {record[key]!r}")
    return dict(record)


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
    blocks: list[str] = field(default_factory=list)

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
            blocks=[str(b) for b in record.get("blocks", [])],
        )


@dataclass
class Bucket:
    """A Cloud Storage bucket that exists, with its IAM policy bindings (``role -> members``)."""

    project: str
    name: str
    location: str = "US"
    bindings: dict[str, list[str]] = field(default_factory=dict)
    created: float = 0.0

    @classmethod
    def from_seed(cls, record: dict[str, Any], at: float) -> Bucket:
        """Validate one seed record; the bindings are a new bucket's defaults plus the Lustre agent's, if asked."""
        unknown = set(record) - BUCKET_KEYS
        if unknown:
            raise SeedError(f"bucket: unknown keys {sorted(unknown)}; known: {sorted(BUCKET_KEYS)}")
        if not {"project", "name"} <= set(record):
            raise SeedError("bucket: project and name are required")
        name, project = str(record["name"]), str(record["project"])
        if not BUCKET_NAME.match(name):
            raise SeedError(f"bucket: {name!r} is not a bucket name")
        number = formats.project_number(project)
        # What GCS gives every new bucket (uniform access): the project's owners and editors own it, viewers read.
        bindings = {
            "roles/storage.legacyBucketOwner": [f"projectEditor:{project}", f"projectOwner:{project}"],
            "roles/storage.legacyBucketReader": [f"projectViewer:{project}"],
        }
        if record.get("lustre_agent_role"):
            member = f"serviceAccount:service-{number}@gcp-sa-lustre.iam.gserviceaccount.com"
            bindings.setdefault(str(record["lustre_agent_role"]), []).append(member)
        return cls(project, name, str(record.get("location", "US")).upper(), bindings, at)


@dataclass
class Config:
    """The seeded world: RoCE zones, enabled services, reservations, latency overrides, quotas, projects seen."""

    roce_zones: list[str] = field(default_factory=lambda: list(DEFAULT_ROCE_ZONES))
    enabled_services: list[str] = field(default_factory=lambda: list(DEFAULT_ENABLED_SERVICES))
    reservations: dict[str, Reservation] = field(default_factory=dict)
    latency_seconds: dict[str, float] = field(default_factory=dict)
    quotas: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    gpu_family_quotas: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_GPU_FAMILY_QUOTAS))
    preemptible_gpu_family_quotas: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_GPU_FAMILY_QUOTAS))
    buckets: dict[str, Bucket] = field(default_factory=dict)
    iam_denied: dict[str, list[str]] = field(default_factory=dict)
    kuberay_conditions: bool = True
    capacity: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_CAPACITY))
    gke_default_version: str = ""
    # Requests per interval of each rate quota group the seed changed (sandbox/quotas.py; the rest: Google's).
    rate_quotas: dict[str, int] = field(default_factory=dict)
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
        self._apply_numbers(seed)
        for record in seed.get("buckets", []):
            bucket = Bucket.from_seed(record, at)
            self.buckets[bucket.name] = bucket
        for project, denied in seed.get("iam_denied", {}).items():
            self.iam_denied[str(project)] = sorted({str(p) for p in denied})
        if "kuberay_conditions" in seed:
            self.kuberay_conditions = bool(seed["kuberay_conditions"])
        self._apply_gke_settings(seed)

    def _apply_numbers(self, seed: dict[str, Any]) -> None:
        """The latencies and the quotas a seed upserts (the preemptible GPU quotas it replaces)."""
        for kind, seconds in seed.get("latency_seconds", {}).items():
            self.latency_seconds[str(kind)] = float(seconds)
        for metric, limit in seed.get("quotas", {}).items():
            self.quotas[str(metric)] = float(limit)
        for family, limit in seed.get("gpu_family_quotas", {}).items():
            self.gpu_family_quotas[str(family)] = float(limit)
        if "preemptible_gpu_family_quotas" in seed:
            self.preemptible_gpu_family_quotas = {
                str(family): float(limit) for family, limit in seed["preemptible_gpu_family_quotas"].items()
            }

    def _apply_gke_settings(self, seed: dict[str, Any]) -> None:
        """The GPU capacity model's settings and GKE's default version."""
        if "capacity" in seed:
            self.capacity = {**self.capacity, **_capacity_settings(seed["capacity"])}
        for name, limit in seed.get("rate_quotas", {}).items():
            from sandbox.quotas import QUOTAS_BY_NAME  # lazy: quotas imports the API error types

            if name not in QUOTAS_BY_NAME or isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise SeedError(
                    f"rate_quotas: {name!r}: {limit!r}; give requests >= 1 for one of {sorted(QUOTAS_BY_NAME)}"
                )
            self.rate_quotas[name] = limit
        if "gke_default_version" in seed:
            from sandbox.apis.container import VALID_VERSIONS  # lazy: the API modules import this one

            version = seed["gke_default_version"]
            if version not in VALID_VERSIONS:
                raise SeedError(f"gke_default_version must be one of {list(VALID_VERSIONS)}, got {version!r}")
            self.gke_default_version = version

    def granted(self, project: str) -> frozenset[str]:
        """The permissions the caller holds on ``project``."""
        return default_permissions() - set(self.iam_denied.get(project, []))

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
        record["buckets"] = [dataclasses.asdict(b) for b in self.buckets.values()]
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Config:
        """The inverse of :meth:`to_json`."""
        record = dict(record)
        reservations = [Reservation(**r) for r in record.pop("reservations", [])]
        buckets = [Bucket(**b) for b in record.pop("buckets", [])]
        config = cls(**record)
        config.reservations = {r.key: r for r in reservations}
        config.buckets = {b.name: b for b in buckets}
        return config
