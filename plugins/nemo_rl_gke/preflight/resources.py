"""Offline preflight rules for cloud and Kubernetes resources: names, locations, GPUs, Lustre, CIDRs, sizes.

Name rules follow the API rules of FACTS §4; a wrong name found here costs nothing, found by the API it costs the
resources created before it. Every name is matched whole (``fullmatch``): ``$`` would also match before a trailing
newline, and ``name\n`` would pass here and fail at the API after the first resources exist.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nemo_rl_gke.plan.manifests import installer_source_problem
from nemo_rl_gke.preflight.registry import Violation, rule
from nemo_rl_gke.run import capacity
from nemo_rl_gke.run.conf_schema import FLEX_START_MIN_GKE, GPU_PROFILES, QUEUED, version_parts
from nemo_rl_gke.run.findings import shown

if TYPE_CHECKING:
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.recipes import Recipe
    from nemo_rl_gke.run.spec import RunSpec

RESOURCE = "resource"

# Use these with fullmatch only.
RFC1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
GKE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
ZONE_SUFFIX = "-[a-z]"
LUSTRE_FS = re.compile(r"[A-Za-z0-9]{1,8}")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
CHECKPOINT_COMPONENT = re.compile(r"[A-Za-z0-9_.-]+")
# Subnet ranges of an auto-mode VPC: the main network is auto mode, so nothing else may overlap them.
AUTO_MODE_RANGE = ipaddress.ip_network("10.128.0.0/9")


@dataclass(frozen=True)
class LustreTier:
    """Capacity bounds of one Managed Lustre throughput tier (GiB)."""

    minimum: int
    maximum: int
    step: int
    threshold: int
    large_step: int

    def valid(self, gib: int) -> bool:
        """Whether ``gib`` is an allowed capacity of this tier."""
        if not self.minimum <= gib <= self.maximum:
            return False
        return gib % (self.step if gib <= self.threshold else self.large_step) == 0

    def neighbours(self, gib: int) -> list[int]:
        """The nearest allowed capacities around ``gib``."""
        below = max((c for c in self._around(gib) if c <= gib), default=None)
        above = min((c for c in self._around(gib) if c >= gib), default=None)
        return sorted({c for c in (below, above) if c is not None})

    def _around(self, gib: int) -> Iterator[int]:
        for step in (self.step, self.large_step):
            for c in (gib // step * step, (gib // step + 1) * step):
                if self.valid(c):
                    yield c
        yield self.minimum
        yield self.maximum


LUSTRE_TIERS: dict[int, LustreTier] = {
    1000: LustreTier(9_000, 10_008_000, 9_000, 1_530_000, 72_000),
    500: LustreTier(18_000, 20_016_000, 18_000, 3_060_000, 144_000),
    250: LustreTier(36_000, 40_032_000, 36_000, 6_120_000, 288_000),
    125: LustreTier(72_000, 12_240_000, 72_000, 12_240_000, 72_000),
}


@rule(
    "name.project",
    RESOURCE,
    "Project ID format",
    example={"project": "My_Project"},
    counter_example={"project": "my-project-123"},
)
def project_id(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """A project ID is 6-30 characters: lowercase letters, digits and hyphens, starting with a letter."""
    if not PROJECT_ID.fullmatch(spec.project):
        yield Violation(
            ("project",),
            spec.project,
            "a project ID is 6-30 characters of lowercase letters, digits and hyphens, starting with a letter "
            "and not ending with a hyphen",
            "use the project ID (not its display name or number), e.g. `gcloud config get project`",
        )


@rule(
    "location.zone-in-region",
    RESOURCE,
    "Zone lies in the region",
    example={"region": "us-central1", "zone": "europe-west4-b"},
    counter_example={"region": "europe-west4", "zone": "europe-west4-b"},
)
def zone_in_region(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """The GPU zone must be a zone of the control-plane region, since the subnets live in that region."""
    if not REGION.fullmatch(spec.region):
        yield Violation(("region",), spec.region, "a region looks like us-central1", "use a Compute Engine region name")
    elif not re.fullmatch(re.escape(spec.region) + ZONE_SUFFIX, spec.zone):
        suggestion = spec.zone.rsplit("-", 1)[0] if "-" in spec.zone else "the zone's region"
        yield Violation(
            ("zone", "region"),
            spec.zone,
            f"the zone must be a zone of region {spec.region} ({spec.region}-a, -b, ...): the GPU pool's subnets "
            "are regional",
            f"pick a zone in {spec.region} with the GPUs reserved, or set region to {suggestion}",
        )


@rule(
    "name.compute",
    RESOURCE,
    "Compute Engine names (RFC 1035, 1-63 characters)",
    example={"rdma_prefix": "RDMA_net"},
    counter_example={"rdma_prefix": "rdma"},
)
def compute_names(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Networks, subnets, the firewall rule, the address and the reservation are RFC 1035 names."""
    derived = {
        "network": [spec.network],
        "gvnic_prefix": [spec.gvnic_network, spec.gvnic_subnet, spec.gvnic_firewall],
        "rdma_prefix": [spec.rdma_network, *spec.rdma_subnets],
        "lustre_name": [spec.peering_range, spec.lustre_firewall],
        "reservation": [spec.reservation_name, *filter(None, [spec.reservation_block])],
    }
    for param, names in derived.items():
        bad = [n for n in names if not RFC1035.fullmatch(n)]
        if bad:
            yield Violation(
                (param,),
                getattr(spec, param),
                f"derived name {bad[0]!r} is not a valid Compute Engine name (RFC 1035: 1-63 characters, lowercase "
                "letters, digits and hyphens, starting with a letter, not ending with a hyphen)",
                "use lowercase letters, digits and hyphens; keep prefixes short enough for the longest derived "
                f"name ({max(names, key=len)!r})",
            )


@rule(
    "name.gke",
    RESOURCE,
    "GKE cluster and node pool names (1-40 characters)",
    example={"cluster_name": "nemo-rl-cluster-for-the-gemma3-27b-grpo-run"},
    counter_example={"cluster_name": "nemo-rl-gemma"},
)
def gke_names(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Cluster and node pool names match [a-z]([-a-z0-9]{0,38}[a-z0-9])?."""
    for param in ("cluster_name", "node_pool_name"):
        value = getattr(spec, param)
        if not GKE_NAME.fullmatch(value):
            yield Violation(
                (param,),
                value,
                "GKE cluster and node pool names are 1-40 characters of lowercase letters, digits and hyphens, "
                "starting with a letter and not ending with a hyphen",
                f"shorten or rename it ({len(value)} characters now)",
            )


@rule(
    "name.lustre-instance",
    RESOURCE,
    "Lustre instance name",
    example={"lustre_name": "9lustre"},
    counter_example={"lustre_name": "lustre9"},
)
def lustre_instance_name(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """A Managed Lustre instance ID is 1-63 lowercase characters starting with a letter."""
    if not RFC1035.fullmatch(spec.lustre_name):
        yield Violation(
            ("lustre_name",),
            spec.lustre_name,
            "a Managed Lustre instance ID is 1-63 characters of lowercase letters, digits and hyphens, starting "
            "with a letter",
            "rename it, e.g. nemo-rl-lustre",
        )


@rule(
    "lustre.filesystem",
    RESOURCE,
    "Lustre filesystem name (letters and digits, at most 8)",
    example={"lustre_filesystem": "lustre-fs"},
    counter_example={"lustre_filesystem": "lustrefs"},
)
def lustre_filesystem(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """The filesystem name is at most 8 letters and digits."""
    if not LUSTRE_FS.fullmatch(spec.lustre_filesystem):
        yield Violation(
            ("lustre_filesystem",),
            spec.lustre_filesystem,
            "a Lustre filesystem name is 1-8 letters and digits, nothing else",
            "use e.g. lustrefs",
        )


@rule(
    "lustre.capacity",
    RESOURCE,
    "Lustre capacity fits the throughput tier (min, max, step)",
    example={"lustre_throughput": 500, "lustre_capacity_gib": 9000},
    counter_example={"lustre_throughput": 1000, "lustre_capacity_gib": 9000},
)
def lustre_capacity(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Each tier has its own minimum, maximum and step; the tier cannot change later and capacity only grows."""
    tier = LUSTRE_TIERS[spec.lustre_throughput]
    if not tier.valid(spec.lustre_capacity_gib):
        steps = f"a multiple of {tier.step:,}"
        if tier.large_step != tier.step:
            steps += f" up to {tier.threshold:,}, then of {tier.large_step:,}"
        options = " or ".join(f"{c}" for c in tier.neighbours(spec.lustre_capacity_gib))
        yield Violation(
            ("lustre_capacity_gib", "lustre_throughput"),
            spec.lustre_capacity_gib,
            f"at {spec.lustre_throughput} MB/s/TiB the capacity must be {tier.minimum:,}-{tier.maximum:,} GiB and "
            f"{steps}",
            f"use {options} GiB, or another throughput tier",
        )


@rule(
    "gpu.machine-type",
    RESOURCE,
    "GPU type matches the machine type",
    example={"gpu_type": "h200", "machine_type": "a4-highgpu-8g"},
    counter_example={"gpu_type": "h200", "machine_type": "a3-ultragpu-8g"},
)
def gpu_machine_pair(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """B200 comes only on a4-highgpu-8g and H200 only on a3-ultragpu-8g."""
    if spec.machine_type and spec.machine_type != spec.gpu.machine_type:
        owner = next((p.gpu_type for p in GPU_PROFILES.values() if p.machine_type == spec.machine_type), None)
        hint = f" ({spec.machine_type} carries {owner})" if owner else ""
        yield Violation(
            ("machine_type", "gpu_type"),
            spec.machine_type,
            f"gpu_type {spec.gpu_type} ({spec.gpu.accelerator_type} x{spec.gpu.gpus_per_node}) runs only on "
            f"{spec.gpu.machine_type}{hint}",
            f"clear machine_type to derive it, or set it to {spec.gpu.machine_type}",
        )


def _networks(spec: RunSpec) -> Iterator[tuple[str, str, str]]:
    """(parameter, label, cidr) of every range this run places."""
    yield "gvnic_subnet_cidr", spec.gvnic_subnet, spec.gvnic_subnet_cidr
    for name, cidr in zip(spec.rdma_subnets, spec.rdma_subnet_cidrs, strict=False):
        yield "rdma_subnet_cidrs", name, cidr
    if spec.peering_range_address:
        yield "peering_range_address", spec.peering_range, spec.peering_range_cidr


@functools.lru_cache(maxsize=256)
def _parse(cidr: str) -> ipaddress.IPv4Network | None:
    # Cached: three rules parse the same ten ranges of every conf.
    try:
        net = ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        return None
    return net if isinstance(net, ipaddress.IPv4Network) else None


@rule(
    "network.cidr-valid",
    RESOURCE,
    "Subnet and peering ranges are private IPv4 CIDRs",
    example={"gvnic_subnet_cidr": "192.168.0.1/24"},
    counter_example={"gvnic_subnet_cidr": "192.168.0.0/24"},
)
def cidr_valid(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Each range parses as an IPv4 network with no host bits, in private address space."""
    for param, label, cidr in [
        *_networks(spec),
        ("firewall_source_range", spec.gvnic_firewall, spec.firewall_source_range),
    ]:
        net = _parse(cidr)
        if net is None:
            yield Violation(
                (param,),
                cidr,
                f"range of {label} is not an IPv4 network address in CIDR form (host bits must be zero)",
                "write it like 192.168.0.0/24 (or 10.64.0.0 for the peering address)",
            )
        elif not net.is_private:
            yield Violation((param,), cidr, f"range of {label} is not private address space", "use an RFC 1918 range")


@rule(
    "network.cidr-overlap",
    RESOURCE,
    "Subnet and peering ranges do not overlap",
    example={"gvnic_subnet_cidr": "192.168.1.0/24"},
    counter_example={"gvnic_subnet_cidr": "192.168.100.0/24"},
)
def cidr_overlap(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """GPU nodes route to every range at once, and the auto-mode main network owns 10.128.0.0/9."""
    placed: list[tuple[str, str, ipaddress.IPv4Network]] = [("network", f"{spec.network} (auto mode)", AUTO_MODE_RANGE)]
    for param, label, cidr in _networks(spec):
        net = _parse(cidr)
        if net is None:
            continue  # reported by network.cidr-valid
        for other_param, other_label, other in placed:
            if net.overlaps(other):
                yield Violation(
                    (param, other_param),
                    cidr,
                    f"{label} ({net}) overlaps {other_label} ({other}); the GPU nodes have an interface in each "
                    "network and route to all of them",
                    "give every subnet and the peering range its own range outside 10.128.0.0/9",
                )
        placed.append((param, label, net))


@rule(
    "network.firewall-covers-subnet",
    RESOURCE,
    "The gVNIC firewall admits the gVNIC subnet",
    example={"firewall_source_range": "10.0.0.0/16"},
    counter_example={"firewall_source_range": "192.168.0.0/16"},
)
def firewall_covers(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Without it, traffic between GPU nodes on the gVNIC network is dropped."""
    fw, sub = _parse(spec.firewall_source_range), _parse(spec.gvnic_subnet_cidr)
    if fw is not None and sub is not None and not sub.subnet_of(fw):
        yield Violation(
            ("firewall_source_range", "gvnic_subnet_cidr"),
            spec.firewall_source_range,
            f"the gVNIC firewall's source range does not contain the gVNIC subnet {sub}, so the GPU nodes cannot "
            "talk over it",
            f"use a range containing {sub}, e.g. {sub.supernet(new_prefix=16) if sub.prefixlen >= 16 else sub}",
        )


@rule(
    "gpu.replicas-vs-pool",
    RESOURCE,
    "Worker replicas fit in the GPU pool",
    example={"worker_replicas": 4, "gpu_pool_max_nodes": 2},
    counter_example={"worker_replicas": 4, "gpu_pool_max_nodes": 4},
)
def replicas_vs_pool(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Each Ray GPU worker takes a whole 8-GPU node; more workers than nodes stay Pending forever."""
    if spec.worker_replicas > spec.gpu_pool_max_nodes:
        yield Violation(
            ("worker_replicas", "gpu_pool_max_nodes"),
            spec.worker_replicas,
            f"{spec.worker_replicas} GPU workers need {spec.worker_replicas} nodes but the pool stops at "
            f"{spec.gpu_pool_max_nodes}; the extra workers would stay Pending",
            f"lower worker_replicas or raise gpu_pool_max_nodes to {spec.worker_replicas} (and the reservation)",
        )


@rule(
    "gpu.flex-start-hours",
    RESOURCE,
    "Flex-start hours only with flex-start capacity",
    example={"capacity": "spot", "flex_start_max_hours": 24},
    counter_example={"capacity": "spot", "capacity_ladder": ["spot", "flex_start"], "flex_start_max_hours": 24},
)
def flex_start_hours(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """maxRunDuration is a flex-start field (a queued pool's ProvisioningRequest's maxRunDurationSeconds): GKE refuses
    it on any other node pool, so a run without a flex-start or queued rung has nothing to set it on."""
    if spec.flex_start_max_hours and not capacity.may_use_flex_start(spec):
        yield Violation(
            ("flex_start_max_hours", "capacity", "capacity_ladder"),
            spec.flex_start_max_hours,
            f"flex_start_max_hours={spec.flex_start_max_hours:g} limits flex-start nodes, but the run's capacity is "
            f"{', '.join(capacity.options(spec))}",
            "set flex_start_max_hours to 0, or use flex_start or queued (as capacity or a rung of capacity_ladder)",
        )


@rule(
    "gpu.capacity-ladder",
    RESOURCE,
    "The capacity ladder starts at the capacity and tries each option once",
    example={"capacity": "reservation", "capacity_ladder": ["flex_start", "spot"]},
    counter_example={"capacity": "reservation", "capacity_ladder": ["reservation:900", "flex_start", "spot"]},
)
def capacity_ladder(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """The first rung's pool is the one the plan prints and cluster.node-pool creates; a second try of one option
    would meet the same stock-out."""
    if not spec.capacity_ladder:
        return
    found = capacity.options(spec)
    if found[0] != spec.capacity:
        yield Violation(
            ("capacity_ladder", "capacity"),
            list(spec.capacity_ladder),
            f"the ladder starts at {found[0]}, but capacity is {spec.capacity}: the first rung is the pool the "
            "run creates first",
            f"set capacity to {found[0]}, or start capacity_ladder with {spec.capacity}",
        )
    twice = sorted({option for option in found if found.count(option) > 1})
    if twice:
        yield Violation(
            ("capacity_ladder",),
            list(spec.capacity_ladder),
            f"{', '.join(twice)} is on the ladder more than once: a second try would meet the same shortage",
            "list each option once",
        )


@rule(
    "gpu.flex-start-gke-version",
    RESOURCE,
    "Flex-start GPU nodes need GKE 1.32.2-gke.1652000 or later",
    example={"capacity": "flex_start", "gke_version": "1.31.6-gke.1020000"},
    counter_example={"capacity": "flex_start", "gke_version": "1.33.5-gke.1201000"},
)
def flex_start_gke_version(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """GKE refuses a flex-start GPU pool on an older cluster, after the networks, Lustre and the cluster were paid
    for. A version GKE resolves (1.32) passes when some patch of it is new enough; empty (GKE's default, newer than
    that in every release channel today) passes, and the sandbox, like GKE, refuses the pool on an older cluster."""
    if not capacity.may_use_flex_start(spec) or not spec.gke_version:
        return
    given, needed = version_parts(spec.gke_version), version_parts(FLEX_START_MIN_GKE)
    if given < needed[: len(given)]:
        yield Violation(
            ("gke_version", "capacity", "capacity_ladder"),
            spec.gke_version,
            f"GKE {spec.gke_version} has no flex-start node pools for GPUs (they need {FLEX_START_MIN_GKE})",
            f"set gke_version to {FLEX_START_MIN_GKE} or later (or empty for GKE's default), or drop flex_start",
        )


@rule(
    "gpu.queued-alone",
    RESOURCE,
    "Queued provisioning is a run's only capacity, not a rung of a ladder",
    example={"capacity": "queued", "capacity_ladder": ["queued:3600", "spot"]},
    counter_example={"capacity": "queued"},
)
def queued_alone(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """A queued pool's workers carry the ProvisioningRequest's annotations from the RayCluster's first apply, and no
    other rung's pool would serve them; a ladder that reaches queued from another rung would need the RayCluster's
    workers replaced, which the ladder does not do."""
    if QUEUED in capacity.options(spec) and len(capacity.options(spec)) > 1:
        yield Violation(
            ("capacity_ladder", "capacity"),
            list(spec.capacity_ladder),
            "queued is on a ladder with other options: its workers wait on their ProvisioningRequest, which no other "
            "rung's pool serves",
            "use capacity=queued with an empty capacity_ladder, or take queued off the ladder (flex_start is the "
            "same capacity without the request)",
        )


@rule(
    "cluster.default-pool-bounds",
    RESOURCE,
    "Default pool min <= initial <= max",
    example={"system_min_nodes": 3, "system_initial_nodes": 1},
    counter_example={"system_min_nodes": 1, "system_initial_nodes": 1},
)
def default_pool_bounds(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """The API refuses autoscaling bounds that do not contain the initial size."""
    if not spec.system_min_nodes <= spec.system_initial_nodes <= spec.system_max_nodes:
        yield Violation(
            ("system_initial_nodes", "system_min_nodes", "system_max_nodes"),
            spec.system_initial_nodes,
            f"the default pool needs min ({spec.system_min_nodes}) <= initial ({spec.system_initial_nodes}) <= "
            f"max ({spec.system_max_nodes}) nodes per zone",
            "adjust the three so they are ordered",
        )


@rule(
    "name.kubernetes",
    RESOURCE,
    "Kubernetes object names",
    example={"raycluster_name": "Ray_Cluster"},
    counter_example={"raycluster_name": "ray-cluster"},
)
def kubernetes_names(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Namespace and service names are DNS-1123 labels; the head service adds 9 characters to the RayCluster."""
    checks = [
        ("namespace", (spec.namespace,), DNS1123_LABEL, "a DNS-1123 label (1-63 lowercase letters, digits, hyphens)"),
        ("ksa_name", (spec.ksa_name,), DNS1123_SUBDOMAIN, "a DNS-1123 subdomain"),
        (
            # The RayCluster's own name too: "a-" makes a valid "a--head-svc" but is no object name.
            "raycluster_name",
            (spec.raycluster_name, spec.head_service),
            RFC1035,
            "usable as service name {value}-head-svc: an RFC 1035 label of at most 63 characters",
        ),
        ("lustre_name", (spec.lustre_pv,), DNS1123_SUBDOMAIN, "usable as PersistentVolume name {value}-pv"),
    ]
    for param, names, pattern, what in checks:
        if not all(pattern.fullmatch(name) for name in names):
            value = getattr(spec, param)
            yield Violation(
                (param,),
                value,
                "the name must be " + what.format(value=value),
                "use lowercase letters, digits and hyphens, starting with a letter",
            )


@rule(
    "storage.checkpoint-on-lustre",
    RESOURCE,
    "Checkpoint directory lies on the Lustre mount",
    example={"checkpoint_dir": "/tmp/ckpt"},
    counter_example={"checkpoint_dir": "/data/ckpt"},
)
def checkpoint_on_lustre(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Anything outside /data dies with the pod, and the export reads from Lustre."""
    parts = spec.checkpoint_dir.split("/")
    plain = all(CHECKPOINT_COMPONENT.fullmatch(p) and p not in (".", "..") for p in parts[2:])
    if not spec.checkpoint_dir.startswith("/data/") or len(parts) < 3 or not plain:
        yield Violation(
            ("checkpoint_dir",),
            spec.checkpoint_dir,
            "the checkpoint directory must be a normalised path below /data, where the Lustre PVC is mounted, of "
            "components made of letters, digits, '_', '.' and '-' (no '.' or '..'); elsewhere it is lost with the "
            "pod and cannot be exported, and other characters reach Hydra, the shell and the Lustre export path",
            "use e.g. /data/nemo_rl_gemma3_27b",
        )


@rule(
    "export.bucket-name",
    RESOURCE,
    "Export bucket name",
    example={"export_bucket": "gs://My Bucket"},
    counter_example={"export_bucket": "my-checkpoints"},
)
def bucket_name(spec: RunSpec, _: Recipe) -> Iterator[Violation]:
    """Bucket names are 3-63 lowercase characters; a gs:// prefix is a common slip."""
    name = spec.export_bucket_name
    if not BUCKET.fullmatch(name) or name.startswith("goog") or "google" in name:
        yield Violation(
            ("export_bucket",),
            spec.export_bucket,
            f"{shown(name)} is not a Cloud Storage bucket name (3-63 lowercase letters, digits, '-', '_', '.'; "
            "no gs:// prefix; no 'goog' prefix or 'google')",
            "give the bare bucket name, e.g. my-project-nemo-rl-checkpoints",
        )


@rule(
    "kube.nccl-installer-source",
    RESOURCE,
    "NCCL RDMA installer source: bundled, an allowed https URL, or a file inside include/",
    example={"nccl_installer_source": "http://example.com/installer.yaml"},
    counter_example={"nccl_installer_source": "bundled"},
    uses_deployment=True,
)
def nccl_source(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """The installer runs privileged on every GPU node: only the pinned copy, the deployment's URLs, or include/."""
    problem = installer_source_problem(spec.nccl_installer_source, deployment)
    if problem:
        yield Violation(
            ("nccl_installer_source",),
            spec.nccl_installer_source,
            f"the installer DaemonSet runs privileged on every GPU node, so its source must be 'bundled', an https "
            f"URL on the deployment's allowlist, or a .yaml file inside include/: {problem}",
            "use 'bundled' (the pinned template), an https URL on the deployment's allowlist ([nemo_rl_gke] "
            "nccl_installer_allowlist; by default the tutorial's raw.githubusercontent.com URL of "
            "nccl-rdma-installer.yaml), or a .yaml path relative to include/",
        )


@rule(
    "secrets.connections",
    RESOURCE,
    "Secrets come only from connections the deployment allows",
    example={"hf_conn_id": "google_cloud_default"},
    counter_example={"hf_conn_id": "huggingface_default"},
    uses_deployment=True,
)
def secret_connections(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """The conf may pick among the deployment's connections for the HF token and the W&B key, and nothing else:
    any other connection's password would leave in the job's environment."""
    checks = [("hf_conn_id", spec.hf_conn_id, deployment.hf_conn_ids, "Hugging Face token")]
    if spec.wandb_enabled:
        checks.append(("wandb_conn_id", spec.wandb_conn_id, deployment.wandb_conn_ids, "W&B API key"))
    for param, value, allowed, what in checks:
        if value and value not in allowed:
            yield Violation(
                (param,),
                value,
                f"the {what} may be read only from a connection this deployment allows for it "
                f"({', '.join(allowed)}); no other connection is read",
                f"leave {param} empty for {allowed[0]}, or use one of {', '.join(allowed)}; an Airflow admin sets "
                f"the list ([nemo_rl_gke] {param}s)",
            )
