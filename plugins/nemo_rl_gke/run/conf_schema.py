"""The conf's parameters, declared once: each one's default, JSON schema (type, enum, range, title, description)
and form section, so the Airflow trigger form, the CLI and the validator share one definition; the bounds, patterns
and GPU profiles those schemas use.

This module is pure: it is imported while the DAG file is parsed, so it must stay cheap (no google/kubernetes/ray).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any

from nemo_rl_gke.run.paths import recipe_names
from nemo_rl_gke.run.topology import CHECKPOINT, POLICIES, RDMA_SUBNET_COUNT, STOP_POINTS

SECTION_RUN = "Run"
SECTION_LOCATION = "Project and location"
SECTION_GPU = "GPU nodes"
SECTION_NETWORK = "Networking"
SECTION_CLUSTER = "GKE cluster"
SECTION_STORAGE = "Managed Lustre storage"
SECTION_KUBE = "Kubernetes and Ray"
SECTION_TRAINING = "Training (NeMo RL GRPO)"
SECTION_LOGGING = "Logging and secrets"
SECTION_TEARDOWN = "Checkpoint export and teardown"
SECTION_MODEL = "Evaluation and publishing"
SECTION_WAITING = "Waiting and timeouts"

# Bounds of the conf's values. Every string and number has one, so nothing unbounded reaches a rule, a template or
# an API; the name rules (resource_rules) then check each name's exact grammar.
NAME_MAX = 63
CIDR_MAX = len("255.255.255.255/32")
BATCH_MAX = 65_536
# The conf parameters whose values name a run group's resources: equal values, one group.
GROUP_NAME_PARAMS = (
    "project",
    "region",
    "zone",
    "network",
    "gvnic_prefix",
    "rdma_prefix",
    "lustre_name",
    "cluster_name",
    "node_pool_name",
    "namespace",
    "ksa_name",
    "raycluster_name",
)
TP_MAX = 512  # 64 nodes of 8 GPUs
POLL_MIN_S = 0.05  # faster polling only spins the triggerer's event loop
HOUR = 3600
DAY = 24 * HOUR
# Compute Engine machine types: family-shape(-size...), e.g. a4-highgpu-8g, n2-highmem-80, n2-custom-8-16384.
MACHINE_TYPE = r"[a-z][a-z0-9]*(-[a-z0-9]+)+"
CONN_ID_PATTERN = r"^[A-Za-z0-9_.-]*$"
# Where the GPU nodes come from (plan/gke.py builds each one's node pool as GKE requires it).
RESERVATION_CAPACITY = "reservation"
FLEX_START = "flex_start"
SPOT = "spot"
ON_DEMAND = "on_demand"
# Flex-start with queued provisioning: the nodes come all together, through a ProvisioningRequest.
QUEUED = "queued"
CAPACITIES = (RESERVATION_CAPACITY, FLEX_START, QUEUED, SPOT, ON_DEMAND)
# The Dynamic Workload Scheduler's options: flex-start VMs, with their end, quota, price and GKE version.
FLEX_KINDS = (FLEX_START, QUEUED)
# Flex-start VMs run at most seven days (GKE docs: flex-start, maxRunDuration).
FLEX_START_MAX_HOURS = 7 * 24
# What eval_benchmark may name: off, gsm8k (a local_math_dataset file the job writes) and the named eval datasets
# of nemo_rl/data/datasets/eval_datasets/__init__.py (v0.5.0 and v0.7.0; aime2026 only at v0.7.0). Which of them the
# recipe's release offers is a preflight rule (eval.benchmark-in-release).
EVAL_OFF = "off"
EVAL_BENCHMARKS = (
    EVAL_OFF, "gsm8k", "math", "math500", "aime2024", "aime2025", "aime2026", "gpqa", "gpqa_diamond", "mmlu",
    "mmlu_pro",
)  # fmt: skip
PUBLISH_POLICIES = ("always", "if_better", "never")
# A capacity ladder's rung: an option, and optionally how long (s) its nodes may take to come before the next rung.
LADDER_RUNG_PATTERN = rf"^({'|'.join(CAPACITIES)})(:[1-9][0-9]{{0,5}})?$"
LADDER_MAX = len(CAPACITIES)
# GKE versions: 1.32.2-gke.1652000 (GKE's form); an empty one is GKE's default for new clusters.
GKE_VERSION_PATTERN = r"^([0-9]+\.[0-9]+(\.[0-9]+(-gke\.[0-9]+)?)?)?$"
# The first GKE version with flex-start node pools for GPUs (GKE docs: flex-start, requirements).
FLEX_START_MIN_GKE = "1.32.2-gke.1652000"


def version_parts(text: str) -> tuple[int, ...]:
    """A GKE version's numbers in order (1.32.2-gke.1652000 -> (1, 32, 2, 1652000)), for comparing versions."""
    return tuple(int(part) for part in re.findall(r"[0-9]+", text))


# A reservation as GKE's reservationAffinity takes it (FACTS §19): NAME (the run's project), a shared reservation
# projects/OWNER/reservations/NAME, and either followed by /reservationBlocks/BLOCK. Names are RFC 1035; the owner is
# a project ID. A strict grammar: the value reaches a GKE request body and a gcloud command in a finding.
_RFC1035 = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
RESERVATION_PATTERN = (
    rf"^(?:projects/(?P<owner>[a-z][-a-z0-9]{{4,28}}[a-z0-9])/reservations/)?(?P<name>{_RFC1035})"
    rf"(?:/reservationBlocks/(?P<block>{_RFC1035}))?$"
)
RESERVATION = re.compile(RESERVATION_PATTERN)
RESERVATION_MAX = 200
# Python's named groups are not JSON Schema: the form gets the same grammar without the names.
RESERVATION_JSON_PATTERN = RESERVATION_PATTERN.replace("?P<owner>", "").replace("?P<name>", "").replace("?P<block>", "")
# Patterns too long to read in a finding, said in words instead.
PATTERN_WORDS: dict[str, str] = {
    RESERVATION_JSON_PATTERN: "RESERVATION, projects/PROJECT/reservations/RESERVATION, or either + "
    "/reservationBlocks/BLOCK (RESERVATION and BLOCK: lowercase RFC 1035 names; PROJECT: a project ID)",
    LADDER_RUNG_PATTERN: f"OPTION or OPTION:SECONDS (OPTION: {', '.join(CAPACITIES)}; SECONDS: 1-999999)",
    GKE_VERSION_PATTERN: "a GKE version such as 1.33 or 1.33.5-gke.1201000, or empty for GKE's default",
}


@dataclass(frozen=True)
class GpuProfile:
    """What a GPU type implies: the machine type, the accelerator, its count and the NCCL tuner config."""

    gpu_type: str
    machine_type: str
    accelerator_type: str
    gpus_per_node: int
    nccl_tuner_config: str


GPU_PROFILES: dict[str, GpuProfile] = {
    "b200": GpuProfile("b200", "a4-highgpu-8g", "nvidia-b200", 8, "/usr/local/gib/configs/tuner_config_a4.txtpb"),
    "h200": GpuProfile(
        "h200", "a3-ultragpu-8g", "nvidia-h200-141gb", 8, "/usr/local/gib/configs/tuner_config_a3u.txtpb"
    ),
}


def _json_type(default: Any) -> str:
    if isinstance(default, bool):
        return "boolean"
    if isinstance(default, int):
        return "integer"
    if isinstance(default, float):
        return "number"
    if isinstance(default, tuple):
        return "array"
    return "string"


def _param(
    default: Any, *, section: str, title: str, description: str, recipe_default: bool = False, **schema: Any
) -> Any:
    """Declare a conf parameter: a dataclass field carrying its JSON schema for the form and the validator.

    ``recipe_default``: left empty, the parameter takes the recipe's value (its ``conf_defaults``), else ``default``;
    the form starts it empty."""
    full = {"type": _json_type(default), "title": title, "description": description, **schema}
    if isinstance(default, tuple):
        full.setdefault("items", {"type": "string"})
    return field(default=default, metadata={"schema": full, "section": section, "recipe_default": recipe_default})


def recipe_defaulted() -> tuple[str, ...]:
    """The parameters that take the recipe's value when left empty."""
    return tuple(f.name for f in fields(RunConf) if f.metadata.get("recipe_default"))


@dataclass(frozen=True)
class RunConf:
    """The conf's parameters as fields, in form order; :class:`nemo_rl_gke.run.spec.RunSpec` adds the derived names."""

    # --- Run -----------------------------------------------------------------------------------------------
    mode: str = _param(
        "plan",
        section=SECTION_RUN,
        title="Mode",
        description="plan: validate and print every request, manifest and the job, creating nothing. "
        "apply: create the infrastructure, train, export and tear down.",
        enum=["plan", "apply"],
    )
    recipe: str = _param(
        "gemma3-27b-gsm8k-v0.5.0",
        section=SECTION_RUN,
        title="Recipe",
        description="NeMo RL recipe from include/recipes: pins the NeMo RL version, image, entrypoint and base config.",
        enum=recipe_names(),
    )
    stop_after: str = _param(
        CHECKPOINT,
        section=SECTION_RUN,
        title="Stop after stage",
        description="In apply mode, the last stage to run: cluster (the infrastructure only), kube (and the "
        "RayCluster), train (and the GRPO job) or checkpoint (everything: validate and export too). Later stages are "
        "skipped; teardown runs as always.",
        enum=list(STOP_POINTS),
    )
    lease_held: str = _param(
        "fail",
        section=SECTION_RUN,
        title="When another run holds the group",
        description="What a run does when another run (of any Airflow) holds its run group's lease, i.e. works on "
        "resources of the same names: fail at once naming the holder, wait (without a worker slot) up to "
        "lease_wait_s for it to finish, or skip the run.",
        enum=["fail", "wait", "skip"],
    )
    lease_wait_s: int = _param(
        3600,
        section=SECTION_RUN,
        title="Longest wait for the group (s)",
        description="With lease_held=wait: how long to wait for the other run to release the group.",
        minimum=1,
        maximum=12 * HOUR,
    )
    # --- Project and location ------------------------------------------------------------------------------
    project: str = _param(
        "nemo-rl-demo",
        section=SECTION_LOCATION,
        title="GCP project ID",
        description="Project that gets every resource (6-30 characters: lowercase letters, digits, hyphens).",
        minLength=1,
        maxLength=NAME_MAX,
    )
    region: str = _param(
        "us-central1",
        section=SECTION_LOCATION,
        title="Region",
        description="Region of the GKE control plane and the subnets (CONTROL_PLANE_REGION in the tutorial).",
        minLength=1,
        maxLength=NAME_MAX,
    )
    zone: str = _param(
        "us-central1-b",
        section=SECTION_LOCATION,
        title="Zone",
        description="Zone of the GPU nodes, the reservation and Lustre (NODE_ZONE). Must lie in the region and "
        "offer the {zone}-vpc-roce network profile.",
        minLength=1,
        maxLength=NAME_MAX,
    )
    # --- GPU nodes -----------------------------------------------------------------------------------------
    gpu_type: str = _param(
        "b200",
        section=SECTION_GPU,
        title="GPU type",
        description="b200 (a4-highgpu-8g, nvidia-b200 x8) or h200 (a3-ultragpu-8g, nvidia-h200-141gb x8).",
        enum=sorted(GPU_PROFILES),
        values_display={"b200": "NVIDIA B200 (a4-highgpu-8g)", "h200": "NVIDIA H200 141GB (a3-ultragpu-8g)"},
    )
    machine_type: str = _param(
        "",
        type=["null", "string"],
        section=SECTION_GPU,
        title="GPU machine type (override)",
        description="Leave empty to derive it from the GPU type. If set, it must be the GPU type's machine type.",
        maxLength=NAME_MAX,
        pattern=f"^({MACHINE_TYPE})?$",
    )
    reservation: str = _param(
        "nemo-rl-reservation",
        section=SECTION_GPU,
        title="Reservation",
        description="The Compute Engine reservation in the zone that holds the GPU machines: NAME (in the run's "
        "project), a shared reservation projects/OWNER/reservations/NAME, or either followed by "
        "/reservationBlocks/BLOCK to use one reservation block.",
        minLength=1,
        maxLength=RESERVATION_MAX,
        pattern=RESERVATION_JSON_PATTERN,
    )
    capacity: str = _param(
        RESERVATION_CAPACITY,
        section=SECTION_GPU,
        title="GPU capacity",
        description="Where the GPU nodes come from. reservation: the named reservation only (the tutorial's way). "
        "flex_start: Dynamic Workload Scheduler flex-start VMs, no reservation: nodes when capacity frees up, "
        "discounted, gone after flex_start_max_hours. queued: flex-start with queued provisioning: all the workers' "
        "nodes at once through a ProvisioningRequest, or none. spot: Spot VMs, the cheapest, reclaimed with 30 s "
        "notice (a lost node, recovered from the last save). on_demand: list price, no reservation, no discount.",
        enum=list(CAPACITIES),
    )
    capacity_ladder: tuple[str, ...] = _param(
        (),
        type=["null", "array"],
        section=SECTION_GPU,
        title="GPU capacity ladder",
        description="Options to fall back through, in order, as OPTION or OPTION:SECONDS, e.g. reservation:900, "
        "flex_start:3600, spot. The first rung must be the capacity above. A rung whose nodes do not come within its "
        "seconds (default kube_timeout_s), or that reports a stock-out, has its node pool replaced by the next "
        "rung's; the networks, Lustre and the cluster stay. Empty: capacity alone.",
        maxItems=LADDER_MAX,
        items={"type": "string", "maxLength": 20, "pattern": LADDER_RUNG_PATTERN},
    )
    flex_start_max_hours: float = _param(
        0.0,
        section=SECTION_GPU,
        title="Flex-start max run hours",
        description="With flex_start or queued capacity: GKE removes the nodes this many hours after they start "
        "(nodeConfig.maxRunDuration; 0: GKE's default, 7 days). The job is told to save and exit before then.",
        minimum=0,
        maximum=FLEX_START_MAX_HOURS,
    )
    gke_version: str = _param(
        "",
        type=["null", "string"],
        section=SECTION_GPU,
        title="GKE version",
        description="The cluster's GKE version (initialClusterVersion), e.g. 1.33.5-gke.1201000; empty: GKE's "
        f"default. Flex-start GPU nodes need {FLEX_START_MIN_GKE} or later.",
        maxLength=40,
        pattern=GKE_VERSION_PATTERN,
    )
    node_pool_name: str = _param(
        "gpu-pool",
        section=SECTION_GPU,
        title="GPU node pool name",
        description="Name of the GPU node pool.",
        maxLength=NAME_MAX,
    )
    worker_replicas: int = _param(
        2,
        section=SECTION_GPU,
        title="GPU worker replicas",
        description="Ray GPU worker pods, one per GPU node; this is also NeMo RL's cluster.num_nodes.",
        minimum=1,
        maximum=64,
    )
    gpu_pool_max_nodes: int = _param(
        2,
        section=SECTION_GPU,
        title="GPU pool max nodes",
        description="Autoscaling limit of the GPU pool (total, across zones); must be at least the worker replicas.",
        minimum=1,
        maximum=64,
    )
    # --- Networking ----------------------------------------------------------------------------------------
    network: str = _param(
        "nemo-rl-net",
        section=SECTION_NETWORK,
        title="Main VPC network",
        description="Auto-mode VPC of the cluster and of Lustre (NETWORK in the tutorial).",
        maxLength=NAME_MAX,
    )
    gvnic_prefix: str = _param(
        "nemo-rl-gvnic",
        section=SECTION_NETWORK,
        title="gVNIC network prefix",
        description="Prefix of the gVNIC network: {prefix}-net, {prefix}-sub and firewall {prefix}-internal.",
        maxLength=NAME_MAX,
    )
    rdma_prefix: str = _param(
        "nemo-rl-rdma",
        section=SECTION_NETWORK,
        title="RDMA network prefix",
        description="Prefix of the RDMA network: {prefix}-net and subnets {prefix}-sub-0..7.",
        maxLength=NAME_MAX,
    )
    gvnic_subnet_cidr: str = _param(
        "192.168.0.0/24",
        section=SECTION_NETWORK,
        title="gVNIC subnet range",
        description="IPv4 range of the gVNIC subnet.",
        maxLength=CIDR_MAX,
    )
    rdma_subnet_cidrs: tuple[str, ...] = _param(
        tuple(f"192.168.{n + 1}.0/24" for n in range(RDMA_SUBNET_COUNT)),
        section=SECTION_NETWORK,
        title="RDMA subnet ranges",
        description="Eight IPv4 ranges, one per RDMA subnet (one per GPU NIC).",
        minItems=RDMA_SUBNET_COUNT,
        maxItems=RDMA_SUBNET_COUNT,
        items={"type": "string", "maxLength": CIDR_MAX},
    )
    firewall_source_range: str = _param(
        "192.168.0.0/16",
        section=SECTION_NETWORK,
        title="gVNIC firewall source range",
        description="Source range allowed (tcp, udp, icmp) by the gVNIC network's internal firewall rule.",
        maxLength=CIDR_MAX,
    )
    net_mtu: int = _param(
        1460,
        section=SECTION_NETWORK,
        title="Main network MTU",
        description="MTU of the main network. 1460 is what the tutorial's gcloud command gets; "
        "8896 gives Lustre clients more throughput.",
        minimum=1300,
        maximum=8896,
    )
    peering_range_address: str = _param(
        "",
        type=["null", "string"],
        section=SECTION_NETWORK,
        title="Peering range start address",
        description="First address of the private-services range for Lustre; empty lets Google pick a free /N.",
        maxLength=15,
    )
    peering_prefix_length: int = _param(
        20,
        section=SECTION_NETWORK,
        title="Peering range prefix length",
        description="Size of the private-services range reserved for Managed Lustre (the tutorial uses /20).",
        minimum=8,
        maximum=24,
    )
    # --- GKE cluster ---------------------------------------------------------------------------------------
    cluster_name: str = _param(
        "nemo-rl-cluster",
        section=SECTION_CLUSTER,
        title="Cluster name",
        description="GKE Standard cluster, regional, in the region.",
        maxLength=NAME_MAX,
    )
    system_machine_type: str = _param(
        "n2-highmem-80",
        section=SECTION_CLUSTER,
        title="Default pool machine type",
        description="Machine type of the default pool, which runs the Ray head (a Compute Engine machine type "
        "such as n2-highmem-80).",
        maxLength=NAME_MAX,
        pattern=f"^{MACHINE_TYPE}$",
    )
    system_min_nodes: int = _param(
        1,
        section=SECTION_CLUSTER,
        title="Default pool min nodes per zone",
        description="Autoscaling minimum of the default pool, per zone of the regional cluster.",
        minimum=0,
        maximum=100,
    )
    system_max_nodes: int = _param(
        5,
        section=SECTION_CLUSTER,
        title="Default pool max nodes per zone",
        description="Autoscaling maximum of the default pool, per zone of the regional cluster.",
        minimum=1,
        maximum=100,
    )
    system_initial_nodes: int = _param(
        1,
        section=SECTION_CLUSTER,
        title="Default pool initial nodes per zone",
        description="Nodes per zone the default pool starts with.",
        minimum=0,
        maximum=100,
    )
    # --- Managed Lustre ------------------------------------------------------------------------------------
    lustre_name: str = _param(
        "nemo-rl-lustre",
        section=SECTION_STORAGE,
        title="Lustre instance name",
        description="Managed Lustre instance in the zone; the peering range is {name}-range, the firewall rule "
        "{name}-fw.",
        maxLength=NAME_MAX,
    )
    lustre_capacity_gib: int = _param(
        18000,
        section=SECTION_STORAGE,
        title="Lustre capacity (GiB)",
        description="Capacity; its minimum, maximum and step depend on the throughput tier.",
        minimum=9000,
        maximum=40_032_000,
    )
    lustre_throughput: int = _param(
        500,
        section=SECTION_STORAGE,
        title="Lustre throughput tier (MB/s per TiB)",
        description="Per-unit storage throughput; it cannot be changed after creation.",
        enum=[125, 250, 500, 1000],
    )
    lustre_filesystem: str = _param(
        "lustrefs",
        section=SECTION_STORAGE,
        title="Lustre filesystem name",
        description="Filesystem name: letters and digits only, at most 8.",
        maxLength=NAME_MAX,
    )
    # --- Kubernetes and Ray --------------------------------------------------------------------------------
    namespace: str = _param(
        "default",
        section=SECTION_KUBE,
        title="Kubernetes namespace",
        description="Namespace of the Lustre PVC, the service account and the RayCluster.",
        maxLength=NAME_MAX,
    )
    ksa_name: str = _param(
        "generic-ksa",
        section=SECTION_KUBE,
        title="Kubernetes service account",
        description="Service account the Ray pods run as (KSA_NAME in the tutorial).",
        maxLength=253,
    )
    raycluster_name: str = _param(
        "ray-cluster-kuberay",
        section=SECTION_KUBE,
        title="RayCluster name",
        description="Name of the RayCluster; its head service is {name}-head-svc.",
        maxLength=NAME_MAX,
    )
    nccl_installer_source: str = _param(
        "bundled",
        section=SECTION_KUBE,
        title="NCCL RDMA installer source",
        description="'bundled' renders include/manifests/nccl-rdma-installer.yaml.j2 (pinned image). Otherwise an "
        "https:// URL on the deployment's allowlist ([nemo_rl_gke] nccl_installer_allowlist; the tutorial's URL by "
        "default), or a .yaml file inside include/ (a relative path, e.g. manifests/my-installer.yaml), read at "
        "apply time. The installer runs privileged on every GPU node.",
        maxLength=2048,
    )
    # --- Training ------------------------------------------------------------------------------------------
    image_tag: str = _param(
        "",
        type=["null", "string"],
        section=SECTION_TRAINING,
        title="NeMo RL image tag (override)",
        description="Leave empty to use the recipe's pinned image. Otherwise the recipe's release or a variant of "
        "it (e.g. v0.5.0.<suffix>); another release is refused, since the checks are for the recipe's version. "
        "A Docker tag: letters, digits, '_', '.' and '-', at most 128, not starting with '.' or '-'.",
        maxLength=128,
        pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$",
    )
    max_steps: int = _param(
        10,
        section=SECTION_TRAINING,
        title="Max steps",
        description="grpo.max_num_steps. With resume=latest and a steps_per_run budget it is set at run time to the "
        "resumed step plus the budget.",
        minimum=1,
        maximum=1_000_000,
    )
    resume: str = _param(
        "none",
        section=SECTION_TRAINING,
        title="Resume",
        description="latest: continue from the newest checkpoint this DAG exported (its lineage); promoted: from "
        "the newest one it published (see publish), so a night whose model was not better is not built on: from "
        "Lustre when it was kept warm, else imported from Cloud Storage into the new Lustre before the job starts; "
        "the job refuses a checkpoint_dir whose newest step_N is not that one. none: start from step 0; the job "
        "refuses a checkpoint_dir that already holds a step_N (NeMo RL would resume from it).",
        enum=["none", "latest", "promoted"],
    )
    steps_per_run: int = _param(
        0,
        section=SECTION_TRAINING,
        title="Steps per run",
        description="With resume=latest: train this many steps past the resumed step (max_steps becomes resumed "
        "step + budget). 0: max_steps as given.",
        minimum=0,
        maximum=1_000_000,
    )
    num_prompts_per_step: int = _param(
        16,
        section=SECTION_TRAINING,
        title="Prompts per step",
        description="grpo.num_prompts_per_step.",
        minimum=1,
        maximum=BATCH_MAX,
    )
    num_generations_per_prompt: int = _param(
        32,
        section=SECTION_TRAINING,
        title="Generations per prompt",
        description="grpo.num_generations_per_prompt: the GRPO group size.",
        minimum=1,
        maximum=1024,
    )
    colocated: bool = _param(
        False,
        section=SECTION_TRAINING,
        title="Colocated generation",
        description="Run vLLM generation on the training GPUs (true) or on dedicated nodes (false, the tutorial).",
    )
    generation_nodes: int = _param(
        1,
        section=SECTION_TRAINING,
        title="Generation nodes",
        description="Nodes given to vLLM when generation is not colocated "
        "(policy.generation.colocated.resources.num_nodes).",
        minimum=0,
        maximum=64,
    )
    generation_gpus_per_node: int = _param(
        8,
        section=SECTION_TRAINING,
        title="Generation GPUs per node",
        description="GPUs per generation node when not colocated "
        "(policy.generation.colocated.resources.gpus_per_node).",
        minimum=1,
        maximum=max(p.gpus_per_node for p in GPU_PROFILES.values()),
    )
    dtensor_tp: int = _param(
        8,
        type=["null", "integer"],
        recipe_default=True,
        section=SECTION_TRAINING,
        title="DTensor tensor parallel size",
        description="policy.dtensor_cfg.tensor_parallel_size; empty: the recipe's (8 for the tutorial's Gemma 3 27B, "
        "2 for Qwen2.5 7B, whose 28 heads 8 does not divide).",
        minimum=1,
        maximum=TP_MAX,
    )
    vllm_tp: int = _param(
        8,
        type=["null", "integer"],
        recipe_default=True,
        section=SECTION_TRAINING,
        title="vLLM tensor parallel size",
        description="policy.generation.vllm_cfg.tensor_parallel_size; empty: the recipe's (8 for Gemma 3 27B, 2 "
        "for Qwen2.5 7B).",
        minimum=1,
        maximum=TP_MAX,
    )
    vllm_gpu_memory_utilization: float = _param(
        0.9,
        section=SECTION_TRAINING,
        title="vLLM GPU memory utilisation",
        description="policy.generation.vllm_cfg.gpu_memory_utilization.",
        exclusiveMinimum=0,
        maximum=1,
    )
    extra_overrides: tuple[str, ...] = _param(
        (),
        type=["null", "array"],
        section=SECTION_TRAINING,
        title="Extra NeMo RL overrides",
        description="More Hydra overrides for the recipe's config, e.g. policy.optimizer.kwargs.lr=1e-6. "
        "key=v sets an existing key, +key=v adds a new one; both are checked against the pinned version. At most "
        "64, each at most 1024 characters.",
        maxItems=64,
        items={"type": "string", "maxLength": 1024},
    )
    zero_learning_guard: bool = _param(
        True,
        section=SECTION_TRAINING,
        title="Stop runs that cannot learn",
        description="Stop the job and fail the run when every reward in the batch is equal (all 0 or all 1) or the "
        "loss is exactly 0 for zero_learning_steps steps in a row: GRPO's advantages are then zero, so is the "
        "gradient, and the GPUs learn nothing.",
    )
    zero_learning_steps: int = _param(
        3,
        section=SECTION_TRAINING,
        title="Zero-learning steps (K)",
        description="How many consecutive steps without a learning signal stop the run (with the guard on).",
        minimum=1,
        maximum=1000,
    )
    checkpoint_dir: str = _param(
        "/data/nemo_rl_gemma3_27b_3_17",
        section=SECTION_TRAINING,
        title="Checkpoint directory",
        description="checkpointing.checkpoint_dir; must be under /data, the Lustre mount, with path components of "
        "letters, digits, '_', '.' and '-'. NeMo RL resumes from the highest step_N there, so the job checks it "
        "holds exactly what resume asks for (none: no step_N).",
        maxLength=1024,
    )
    # --- Logging and secrets -------------------------------------------------------------------------------
    wandb_enabled: bool = _param(
        True, section=SECTION_LOGGING, title="Weights & Biases logging", description="logger.wandb_enabled."
    )
    wandb_project: str = _param(
        "",
        type=["null", "string"],
        section=SECTION_LOGGING,
        title="W&B project",
        description="logger.wandb.project; empty keeps the recipe's project.",
        maxLength=128,
    )
    wandb_run_name: str = _param(
        "nemo_rl_gemma3_27b_3_17",
        section=SECTION_LOGGING,
        title="W&B run name",
        description="logger.wandb.name.",
        maxLength=128,
    )
    hf_conn_id: str = _param(
        "huggingface_default",
        section=SECTION_LOGGING,
        title="Hugging Face token connection",
        description="Airflow connection whose password is the HF token: one of the ids the deployment allows "
        "([nemo_rl_gke] hf_conn_ids); empty means the deployment's first. Never put the token itself in the conf.",
        maxLength=250,
        pattern=CONN_ID_PATTERN,
    )
    wandb_conn_id: str = _param(
        "wandb_default",
        section=SECTION_LOGGING,
        title="W&B API key connection",
        description="Airflow connection whose password is the W&B API key, needed only with W&B logging: one of "
        "the ids the deployment allows ([nemo_rl_gke] wandb_conn_ids); empty means the deployment's first.",
        maxLength=250,
        pattern=CONN_ID_PATTERN,
    )
    # --- Waiting -------------------------------------------------------------------------------------------
    # The defaults fit the tutorial's A4 run: a GPU pool that starts at 0 nodes (gcp/gke.py: initialNodeCount 0,
    # autoscaling) and a NeMo RL image of 20+ GB. 15 s polls are ~240 calls per hour per wait: far below the APIs'
    # per-minute quotas, and a minute-scale wait is seen within a poll.
    poll_interval_s: float = _param(
        15.0,
        section=SECTION_WAITING,
        title="Poll interval (s)",
        description="How often the triggerer polls a long-running operation; no worker slot is held meanwhile.",
        minimum=POLL_MIN_S,
        maximum=600,
    )
    network_timeout_s: int = _param(
        1800,
        section=SECTION_WAITING,
        title="Network stage timeout (s)",
        description="Longest wait for one network, subnet, firewall or address operation.",
        minimum=1,
        maximum=6 * HOUR,
    )
    storage_timeout_s: int = _param(
        7200,
        section=SECTION_WAITING,
        title="Storage stage timeout (s)",
        description="Longest wait for the peering or the Managed Lustre operation (Lustre creation takes tens of "
        "minutes).",
        minimum=1,
        maximum=12 * HOUR,
    )
    # GKE cluster creation takes ~5-10 min, a node-pool create ~2-5 min (its 0 GPU nodes come later, in the kube
    # stage); an upgrade or reconcile in between can add as much again: 60 min leaves room for both.
    cluster_timeout_s: int = _param(
        3600,
        section=SECTION_WAITING,
        title="Cluster stage timeout (s)",
        description="Longest wait for the GKE cluster or the GPU node pool operation.",
        minimum=1,
        maximum=6 * HOUR,
    )
    # RayClusterProvisioned waits for the GPU workers, so it covers the A4 pool's scale-up from 0 (cluster
    # autoscaler + provisioning of 8-GPU a4-highgpu-8g nodes: ~10-20 min, longer when capacity is tight), the pull
    # of the 20+ GB nemo-rl image on each new node (~10-20 min), and the head's setup script (apt, uv: a few min).
    # 30 min (the old default) was spent by the first two alone on a slow day; 60 min covers them with margin.
    kube_timeout_s: int = _param(
        3600,
        section=SECTION_WAITING,
        title="RayCluster readiness timeout (s)",
        description="Longest wait for the RayCluster's HeadPodReady and RayClusterProvisioned conditions: the GPU "
        "pool scales up from 0 nodes (an A4 node takes 10-20 min) and each new node pulls the 20+ GB NeMo RL image "
        "(10-20 min).",
        minimum=1,
        maximum=6 * HOUR,
    )
    job_timeout_s: int = _param(
        86400,
        section=SECTION_WAITING,
        title="Training job timeout (s)",
        description="Longest run of the GRPO Ray job; past it the job is stopped and the run fails.",
        minimum=1,
        maximum=14 * DAY,
    )
    max_run_hours: float | None = _param(
        None,
        type=["null", "number"],
        section=SECTION_WAITING,
        title="Run budget (hours)",
        description="The longest this run may last, from its start (provisioning included); empty: the "
        "deployment's [nemo_rl_gke] max_run_hours. It may only lower that. Training saves and stops before it.",
        exclusiveMinimum=0,
        maximum=14 * 24,
    )
    max_run_usd: float | None = _param(
        None,
        type=["null", "number"],
        section=SECTION_WAITING,
        title="Run budget (USD)",
        description="The most this run may spend at the run report's prices (GPU price per hour x GPU nodes, from "
        "its start); empty: the deployment's [nemo_rl_gke] max_run_usd. It may only lower that.",
        exclusiveMinimum=0,
        maximum=10_000_000,
    )
    stall_after_s: int | None = _param(
        None,
        type=["null", "integer"],
        section=SECTION_WAITING,
        title="Stall after (s)",
        description="A job that prints no new step for this long after its first step is stalled: it is stopped, "
        "its newest checkpoint validated and exported, and the run fails. Empty: 10x the mean step time so far, at "
        "least 15 min. Before the first step the start-up allowance applies: 60 min, or this if longer.",
        minimum=1,
        maximum=14 * DAY,
    )
    max_recoveries: int = _param(
        2,
        section=SECTION_WAITING,
        title="Recoveries from a lost node",
        description="How many times the job is resubmitted from its newest checkpoint after it failed because a "
        "node was lost (a recovery rule says which failures those are; a bug is never retried). Each waits for the "
        "RayCluster's replacement worker first. When they run out, the run fails and its newest checkpoint is "
        "validated and exported. At most the deployment's [nemo_rl_gke] max_recoveries.",
        minimum=0,
        maximum=20,
    )
    teardown_timeout_s: int = _param(
        3600,
        section=SECTION_WAITING,
        title="Teardown timeout (s)",
        description="Longest wait for one deletion.",
        minimum=1,
        maximum=6 * HOUR,
    )
    # --- Checkpoint export and teardown --------------------------------------------------------------------
    export_bucket: str = _param(
        "",
        type=["null", "string"],
        section=SECTION_TEARDOWN,
        title="Checkpoint export bucket",
        description="Cloud Storage bucket the validated checkpoint is exported to before Lustre is deleted; "
        "empty means {project}-nemo-rl-checkpoints.",
        maxLength=222,
    )
    teardown_policy: str = _param(
        "delete_all",
        section=SECTION_TEARDOWN,
        title="Teardown policy",
        description="delete_all: delete everything this DAG created. keep_cluster_and_storage: delete the RayCluster "
        "only, keeping a warm cluster (GPU nodes scale to 0) and Lustre. keep_all: delete nothing.",
        enum=list(POLICIES),
    )
    accept_checkpoint_loss: bool = _param(
        False,
        section=SECTION_TEARDOWN,
        title="Accept checkpoint loss",
        description="Allow teardown to delete Lustre even when this run's checkpoint export did not succeed. It "
        "releases only this run's own checkpoint: one another run left pending needs release_checkpoint_of_run.",
    )
    release_checkpoint_of_run: str = _param(
        "",
        type=["null", "string"],
        section=SECTION_TEARDOWN,
        title="Release the pending checkpoint of run",
        description="dag_id/run_id of the run whose unexported checkpoint keeps Lustre (the teardown message, the run "
        "report and the Training view name it). Naming it releases that run's checkpoint for good; Lustre goes once "
        "no other run's checkpoint is pending on it.",
        maxLength=500,
        pattern=r"^([A-Za-z0-9_.:+-]{1,250}/[A-Za-z0-9_.:+-]{1,250})?$",
    )
    # --- Evaluation and publishing ----------------------------------------------------------------------------
    eval_benchmark: str = _param(
        "gsm8k",
        section=SECTION_MODEL,
        title="Evaluation benchmark",
        description="After the Hugging Face export, the pinned NeMo RL release's examples/run_eval.py scores the "
        "model on this (the release's eval datasets; gsm8k is GSM8K's test split through its local_math_dataset), and "
        "the base model once for the same settings. off: no evaluation (then publish cannot be if_better).",
        enum=list(EVAL_BENCHMARKS),
    )
    eval_num_tests_per_prompt: int = _param(
        1,
        section=SECTION_MODEL,
        title="Evaluation samples per problem",
        description="eval.num_tests_per_prompt: answers sampled per problem; the score is pass@1 over them. More "
        "than 1 needs a temperature above 0 (nemo_rl/evals/eval.py asserts it).",
        minimum=1,
        maximum=64,
    )
    eval_max_tokens: int = _param(
        2048,
        section=SECTION_MODEL,
        title="Evaluation token limit",
        description="generation.vllm_cfg.max_model_len of the evaluation: prompt and answer together (eval.yaml's "
        "default 2048).",
        minimum=64,
        maximum=131072,
    )
    eval_temperature: float = _param(
        0.0,
        section=SECTION_MODEL,
        title="Evaluation temperature",
        description="generation.temperature of the evaluation; 0 is greedy (eval.yaml's default).",
        minimum=0,
        maximum=2,
    )
    publish: str = _param(
        "if_better",
        section=SECTION_MODEL,
        title="Publish the model",
        description="always: every run's model gets the published-model Asset event; if_better: only one whose score "
        "is at least the last published model's plus publish_margin (the first one always); never. Every run's "
        "checkpoint is exported either way. The deployment may allow only some ([nemo_rl_gke] allowed_publish).",
        enum=["if_better", "always", "never"],
    )
    publish_margin: float = _param(
        0.0,
        section=SECTION_MODEL,
        title="Publish margin",
        description="How much better than the last published model's score (0-1, absolute) a model must score to be "
        "published with if_better.",
        minimum=0,
        maximum=1,
    )
    gpu_hour_price_usd: float = _param(
        0.0,
        section=SECTION_TEARDOWN,
        title="Price per GPU-hour (USD)",
        description="A price per GPU-hour for every cost figure of the run (report, view, USD budget). It may only "
        "raise the package's estimate for the GPU type and the serving capacity, never lower it (the conf is "
        "untrusted and the USD budget counts with it); 0 uses the estimate.",
        minimum=0,
        maximum=1000,
    )
    adopt_existing: bool = _param(
        False,
        section=SECTION_TEARDOWN,
        title="Adopt pre-existing resources",
        description="Use resources of the same name that this DAG did not create (never deleted by teardown). "
        "Off: such a resource fails the run.",
    )


def spec_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The conf parameters, in form order."""
    return dataclasses.fields(RunConf)


def param_schema(name: str) -> dict[str, Any]:
    """The JSON schema of one conf parameter (type, enum, range, title, description)."""
    return dict(FIELDS[name].metadata["schema"])


def to_json(value: Any) -> Any:
    """A field's value as JSON: a tuple (an array field) becomes a list."""
    return list(value) if isinstance(value, tuple) else value


def default_conf() -> dict[str, Any]:
    """Every parameter at its default, as JSON values (``RunSpec().to_conf()``, without building a RunSpec)."""
    defaults = RunConf()
    return {f.name: to_json(getattr(defaults, f.name)) for f in dataclasses.fields(defaults)}


FIELDS = {f.name: f for f in dataclasses.fields(RunConf)}
PARAM_NAMES = frozenset(FIELDS)
