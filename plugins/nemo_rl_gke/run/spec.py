"""RunSpec: the one validated, frozen description of a run, and the single source of every name.

Every conf parameter is a field here with its JSON-schema (type, enum, range, title, description, form section),
so the Airflow trigger form, the CLI and the validator share one definition. Every GCP resource name, Kubernetes
object name, label and path is derived here, so that teardown deletes exactly what setup created.

This module is pure: it is imported while the DAG file is parsed, so it must stay cheap (no google/kubernetes/ray).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_gke.run.budget import run_budget
from nemo_rl_gke.run.deployment import load_deployment
from nemo_rl_gke.run.findings import CREDENTIAL_VALUE, REDACTED, ConfError, Finding, looks_like_secret, shown
from nemo_rl_gke.run.paths import recipe_names
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.steps import step_budget
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
    "/reservationBlocks/BLOCK (RESERVATION and BLOCK: lowercase RFC 1035 names; PROJECT: a project ID)"
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


def _param(default: Any, *, section: str, title: str, description: str, **schema: Any) -> Any:
    """Declare a conf parameter: a dataclass field carrying its JSON schema for the form and the validator."""
    full = {"type": _json_type(default), "title": title, "description": description, **schema}
    if isinstance(default, tuple):
        full.setdefault("items", {"type": "string"})
    return field(default=default, metadata={"schema": full, "section": section})


@dataclass(frozen=True)
class RunSpec:
    """A validated run conf. Build it with :meth:`from_conf`; everything else is derived from it."""

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
        description="latest: continue from the newest checkpoint this DAG exported (its lineage): from Lustre when "
        "it was kept warm, else imported from Cloud Storage into the new Lustre before the job starts; the job refuses "
        "a checkpoint_dir whose newest step_N is not that one. none: start from step 0; the job refuses a "
        "checkpoint_dir that already holds a step_N (NeMo RL would resume from it).",
        enum=["none", "latest"],
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
        section=SECTION_TRAINING,
        title="DTensor tensor parallel size",
        description="policy.dtensor_cfg.tensor_parallel_size.",
        minimum=1,
        maximum=TP_MAX,
    )
    vllm_tp: int = _param(
        8,
        section=SECTION_TRAINING,
        title="vLLM tensor parallel size",
        description="policy.generation.vllm_cfg.tensor_parallel_size.",
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
    gpu_hour_price_usd: float = _param(
        0.0,
        section=SECTION_TEARDOWN,
        title="Price per GPU-hour (USD)",
        description="For the run report's cost estimate; 0 uses the package's rough list price for the GPU type.",
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

    # ------------------------------------------------------------------------------------------------------
    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> RunSpec:
        """Build a RunSpec from a trigger conf, or raise :class:`ConfError` listing every type-level problem.

        Only the conf's own shape is checked here (unknown keys, JSON types, enums, ranges); the rules that
        relate fields to each other live in :mod:`nemo_rl_gke.preflight.offline`.
        """
        findings = conf_findings(conf)
        if findings:
            raise ConfError(findings)
        return cls(**_coerce(conf))

    def to_conf(self) -> dict[str, Any]:
        """The full conf, defaults included, as JSON values (the inverse of :meth:`from_conf`)."""
        return {f.name: _to_json(getattr(self, f.name)) for f in dataclasses.fields(self)}

    # --- GPU -------------------------------------------------------------------------------------------------
    @property
    def gpu(self) -> GpuProfile:
        """Machine type, accelerator, GPU count and tuner config implied by ``gpu_type``."""
        return GPU_PROFILES[self.gpu_type]

    @property
    def effective_machine_type(self) -> str:
        """The machine type the pool is created with: the override if given, else the GPU type's."""
        return self.machine_type or self.gpu.machine_type

    @property
    def reservation_project(self) -> str:
        """The project that owns the reservation: the shared reservation's owner, else the run's project."""
        found = RESERVATION.match(self.reservation)
        return (found and found.group("owner")) or self.project

    @property
    def reservation_name(self) -> str:
        """The reservation's own name, without its owner or block."""
        found = RESERVATION.match(self.reservation)
        return found.group("name") if found else self.reservation

    @property
    def reservation_block(self) -> str | None:
        """The reservation block the pool is pinned to, if the conf names one."""
        found = RESERVATION.match(self.reservation)
        return found.group("block") if found else None

    @property
    def gpus_per_node(self) -> int:
        """GPUs on every GPU node (cluster.gpus_per_node)."""
        return self.gpu.gpus_per_node

    # --- Network names ---------------------------------------------------------------------------------------
    @property
    def gvnic_network(self) -> str:
        """Name of the gVNIC VPC."""
        return f"{self.gvnic_prefix}-net"

    @property
    def gvnic_subnet(self) -> str:
        """Name of the gVNIC subnet."""
        return f"{self.gvnic_prefix}-sub"

    @property
    def gvnic_firewall(self) -> str:
        """Name of the gVNIC network's internal firewall rule."""
        return f"{self.gvnic_prefix}-internal"

    @property
    def rdma_network(self) -> str:
        """Name of the RDMA (RoCE) VPC."""
        return f"{self.rdma_prefix}-net"

    @property
    def rdma_subnets(self) -> tuple[str, ...]:
        """Names of the eight RDMA subnets, in NIC order."""
        return tuple(f"{self.rdma_prefix}-sub-{n}" for n in range(RDMA_SUBNET_COUNT))

    @property
    def gvnic_device_network(self) -> str:
        """Name of the GKE Network / GKENetworkParamSet pair mapping the gVNIC subnet (pod interface eth1)."""
        return "gvnic-1"

    @property
    def rdma_device_networks(self) -> tuple[str, ...]:
        """Names of the GKE Network / GKENetworkParamSet pairs for the RDMA subnets, in NIC order (eth2..eth9)."""
        return tuple(f"rdma-{n}" for n in range(RDMA_SUBNET_COUNT))

    @property
    def peering_range(self) -> str:
        """Name of the global address reserved for Service Networking peering."""
        return f"{self.lustre_name}-range"

    @property
    def lustre_firewall(self) -> str:
        """Name of the main network's rule that lets Lustre traffic in from the peering range."""
        return f"{self.lustre_name}-fw"

    @property
    def network_profile(self) -> str:
        """Name of the RoCE network profile the RDMA network needs."""
        return f"{self.zone}-vpc-roce"

    def network_path(self, name: str) -> str:
        """Relative resource path of a VPC network of this project."""
        return f"projects/{self.project}/global/networks/{name}"

    def subnet_path(self, name: str) -> str:
        """Relative resource path of a subnet in the region."""
        return f"projects/{self.project}/regions/{self.region}/subnetworks/{name}"

    def firewall_path(self, name: str) -> str:
        """Relative resource path of a firewall rule of this project."""
        return f"projects/{self.project}/global/firewalls/{name}"

    def global_address_path(self, name: str) -> str:
        """Relative resource path of a global address (such as the peering range) of this project."""
        return f"projects/{self.project}/global/addresses/{name}"

    def consumer_network_path(self, project_number: str) -> str:
        """The main network as Service Networking names it: by project *number*, never the project ID."""
        return f"projects/{project_number}/global/networks/{self.network}"

    @property
    def network_profile_path(self) -> str:
        """Relative resource path of the RoCE network profile."""
        return f"projects/{self.project}/global/networkProfiles/{self.network_profile}"

    @property
    def peering_range_cidr(self) -> str:
        """The reserved range as CIDR, or empty when Google picks the address."""
        return f"{self.peering_range_address}/{self.peering_prefix_length}" if self.peering_range_address else ""

    # --- GKE ---------------------------------------------------------------------------------------------------
    @property
    def cluster_parent(self) -> str:
        """Location path clusters are created under (regional cluster)."""
        return f"projects/{self.project}/locations/{self.region}"

    @property
    def cluster_path(self) -> str:
        """Resource path of the GKE cluster."""
        return f"{self.cluster_parent}/clusters/{self.cluster_name}"

    @property
    def node_pool_path(self) -> str:
        """Resource path of the GPU node pool."""
        return f"{self.cluster_path}/nodePools/{self.node_pool_name}"

    @property
    def workload_pool(self) -> str:
        """Workload Identity pool of the project."""
        return f"{self.project}.svc.id.goog"

    @property
    def system_pool_name(self) -> str:
        """The cluster's CPU node pool (GKE's default pool), where the Ray head is scheduled."""
        return "default-pool"

    # --- Lustre ------------------------------------------------------------------------------------------------
    @property
    def lustre_parent(self) -> str:
        """Location path Lustre instances are created under (zonal)."""
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def lustre_path(self) -> str:
        """Resource path of the Lustre instance."""
        return f"{self.lustre_parent}/instances/{self.lustre_name}"

    @property
    def lustre_volume_handle(self) -> str:
        """CSI volume handle of the Lustre PV: project/zone/instance."""
        return f"{self.project}/{self.zone}/{self.lustre_name}"

    @property
    def lustre_storage_class(self) -> str:
        """storageClassName used by the statically provisioned PV and its PVC."""
        return f"lustre-rwx-{self.lustre_throughput}mbps-per-tib"

    @property
    def lustre_pv(self) -> str:
        """Name of the Lustre PersistentVolume."""
        return f"{self.lustre_name}-pv"

    @property
    def lustre_pvc(self) -> str:
        """Name of the Lustre PersistentVolumeClaim the Ray pods mount at /data."""
        return f"{self.lustre_name}-pvc"

    # --- Ray ---------------------------------------------------------------------------------------------------
    @property
    def head_service(self) -> str:
        """KubeRay's head service, which serves the dashboard on port 8265."""
        return f"{self.raycluster_name}-head-svc"

    @property
    def dashboard_proxy_path(self) -> str:
        """Kubernetes API service-proxy path to the Ray dashboard (FACTS §6)."""
        return f"/api/v1/namespaces/{self.namespace}/services/{self.head_service}:8265/proxy"

    @property
    def worker_group(self) -> str:
        """Name of the GPU worker group in the RayCluster."""
        return "worker-grp-0"

    @property
    def num_nodes(self) -> int:
        """NeMo RL's cluster.num_nodes: one Ray GPU worker per node."""
        return self.worker_replicas

    @property
    def gpu_nodes(self) -> int:
        """The most GPU nodes this run may hold: its pool's ceiling (non-colocated generation nodes are part of
        ``worker_replicas``, and the pool autoscales up to ``gpu_pool_max_nodes``)."""
        return max(self.worker_replicas, self.gpu_pool_max_nodes)

    @property
    def dataset_dir(self) -> str:
        """Where recipes prepare datasets: on Lustre, so every Ray node reads the same files."""
        return "/data/datasets"

    @property
    def export_bucket_name(self) -> str:
        """Bucket the checkpoint is exported to."""
        return self.export_bucket or f"{self.project}-nemo-rl-checkpoints"

    # --- Ownership ---------------------------------------------------------------------------------------------
    @property
    def group_id(self) -> str:
        """The run group: every resource this conf's names describe. Two confs with the same names are one group
        (they would fight over the same resources); the id is the cluster name and a digest of every name."""
        digest = hashlib.sha256("\0".join(self.group_names.values()).encode()).hexdigest()[:8]
        return f"{self.cluster_name}-{digest}"

    @property
    def group_names(self) -> dict[str, str]:
        """The conf values that name the group's resources (recorded with its lease, so the sweeper can find them)."""
        return {name: str(getattr(self, name)) for name in GROUP_NAME_PARAMS}

    @property
    def final_step(self) -> int:
        """The step the run's last checkpoint is saved at: NeMo RL saves at its last step, ``max_steps`` or the
        recipe dataset's epoch cap when that comes first (:class:`~nemo_rl_gke.run.steps.StepBudget`)."""
        budget = step_budget(self, load_recipe(self.recipe))
        return budget.effective if budget is not None and budget.epoch_cap else self.max_steps

    @property
    def budget_hours(self) -> float | None:
        """The hours this run may last under the deployment's settings as loaded now, its conf's lower limits and
        the USD cap converted at the report's prices (None: no limit); :func:`nemo_rl_gke.run.budget.run_budget`."""
        return run_budget(self, load_deployment()).hours

    @property
    def budget_usd(self) -> float | None:
        """The USD this run may spend, likewise (None: no limit)."""
        return run_budget(self, load_deployment()).usd

    def checkpoint_lustre_path(self, step: int) -> str:
        """A step's directory as a path on the Lustre filesystem (the PV mounts its root at /data)."""
        return f"{self.checkpoint_dir.removeprefix('/data').rstrip('/')}/step_{step}"

    def export_prefix(self, dag_id: str, run_id: str) -> str:
        """The run's prefix in the export bucket: gs://<bucket>/<dag>/<run>/."""
        readable = re.sub(r"[^a-zA-Z0-9_.-]+", "-", run_id).strip("-")
        return f"gs://{self.export_bucket_name}/{dag_id}/{readable}/"

    def export_uri(self, dag_id: str, run_id: str, step: int) -> str:
        """Where a validated step is exported: the run's prefix, then the step's path on Lustre
        (gs://<bucket>/<dag>/<run>/<checkpoint_dir under /data>/step_N/). Laid out so, importing the run's prefix
        into Lustre's ``/`` (the one import path that always exists, FACTS §14) puts the step back where it was."""
        return f"{self.export_prefix(dag_id, run_id)}{self.checkpoint_lustre_path(step).lstrip('/')}/"

    def submission_id(self, dag_id: str, run_id: str) -> str:
        """Ray job submission_id for one DAG run: stable across task retries, unique across runs."""
        digest = hashlib.sha256(f"{dag_id}\0{run_id}".encode()).hexdigest()[:12]
        readable = re.sub(r"[^a-zA-Z0-9_-]+", "-", run_id).strip("-")[:40]
        return f"nemo-rl-{readable}-{digest}"


# ---------------------------------------------------------------------------------------------------------------
# Conf shape: unknown keys and JSON-schema checks, shared with the Airflow Params.
# ---------------------------------------------------------------------------------------------------------------
def spec_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The conf parameters, in form order."""
    return dataclasses.fields(RunSpec)


def param_schema(name: str) -> dict[str, Any]:
    """The JSON schema of one conf parameter (type, enum, range, title, description)."""
    return dict(_FIELDS[name].metadata["schema"])


def default_conf() -> dict[str, Any]:
    """Every parameter at its default, as JSON values."""
    return RunSpec().to_conf()


_FIELDS = {f.name: f for f in dataclasses.fields(RunSpec)}
PARAM_NAMES = frozenset(_FIELDS)
# Former parameters that the deployment now decides: a conf that sets one is refused, not silently ignored.
DEPLOYMENT_SETTINGS = {
    "ray_dashboard_url": "where the Ray job, with the HF and W&B tokens in its environment, is submitted",
}
# Words that mark a conf key as carrying a credential: the value of such an unknown key is never echoed. Known
# parameters are exempt (hf_conn_id names a connection, it holds no secret), hence the lookahead.
_SECRET_WORDS = (
    "token|secret|passw|pwd|pass|api.?key|key|auth|credential|cred|cookie|session|bearer|private|signature|cert|jwt"
    "|ssh|hf|wandb"
)
SECRET_KEY = re.compile(
    r"^(?!(?-i:" + "|".join(map(re.escape, _FIELDS)) + r")\Z).*?(?:" + _SECRET_WORDS + ")", re.IGNORECASE | re.DOTALL
)
# An unknown key's value is shown only when it is a short scalar: anything longer may be a pasted file or token.
UNKNOWN_VALUE_MAX = 40


def is_secret_key(key: object) -> bool:
    """Whether ``key`` is an unknown conf key that looks like it carries a credential (its value is never shown)."""
    return isinstance(key, str) and bool(SECRET_KEY.search(key))


def conf_findings(conf: Any) -> list[Finding]:
    """Every unknown key and every value that breaks its parameter's schema, in conf order.

    Total: any JSON-like input (any types, nesting, huge integers, NaN, very long strings, non-string keys) gives
    findings, never an exception. Stricter than JSON Schema where that matters later: an integer is an ``int`` (not
    2.0, not true), a number is finite, a string is printable and matches its pattern whole.
    """
    if not isinstance(conf, Mapping):
        return [
            Finding(
                "conf.not-an-object",
                ("conf",),
                f"<{type(conf).__name__}>",
                "the run conf must be a JSON object of parameter names to values",
                'pass e.g. {"mode": "plan"}; `python -m nemo_rl_gke params` lists the parameters',
            )
        ]
    findings: list[Finding] = []
    for key, value in conf.items():
        if isinstance(key, str) and key in _FIELDS:
            finding = _field_finding(key, value)
        else:
            finding = _unknown_key_finding(key, value)
        if finding is not None:
            findings.append(finding)
    return findings


def _unknown_key_finding(key: object, value: Any) -> Finding | None:
    if not isinstance(key, str):
        return Finding(
            "conf.key-type",
            (f"<{type(key).__name__} key>",),
            "<not shown>",
            "conf keys are parameter names (strings)",
            "remove it; valid parameters are listed by `python -m nemo_rl_gke params`",
        )
    param = "<redacted key>" if looks_like_secret(key) else key
    if key in DEPLOYMENT_SETTINGS:
        if value in (None, ""):
            return None  # the old "not set" value asks for nothing
        return Finding(
            "conf.deployment-setting",
            (param,),
            "<not shown>",
            f"{key} is no longer a run parameter: {DEPLOYMENT_SETTINGS[key]} is decided by the deployment, never by "
            "the conf",
            f"remove it; an Airflow admin sets [nemo_rl_gke] {key} (AIRFLOW__NEMO_RL_GKE__{key.upper()}) if needed",
        )
    if is_secret_key(key):
        # Never echo it: findings go to the task log and XCom.
        return Finding(
            "conf.secret-in-conf",
            (param,),
            REDACTED,
            "secrets are not accepted in the conf: a run's conf is stored with the run and shown in the UI",
            "remove it and put the token in the password of an Airflow connection (or the secrets backend) that the "
            "deployment allows for it ([nemo_rl_gke] hf_conn_ids / wandb_conn_ids)",
        )
    close = difflib.get_close_matches(key, _FIELDS, n=1) if len(key) <= NAME_MAX else []
    hint = f"did you mean '{close[0]}'? " if close else ""
    return Finding(
        "conf.unknown-key",
        (param,),
        _unknown_value(value),
        "unknown parameter (Airflow accepts unknown conf keys silently, this DAG does not)",
        f"{hint}remove it; valid parameters are listed by `python -m nemo_rl_gke params`",
    )


def _unknown_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and len(value) <= UNKNOWN_VALUE_MAX and not looks_like_secret(value):
        return value
    return f"<not shown: {type(value).__name__}>"


def _field_finding(key: str, value: Any) -> Finding | None:
    schema = _FIELDS[key].metadata["schema"]
    problem = _value_problem(schema, value)
    if problem is not None:
        keyword, message = problem
        if keyword == "secret":
            return Finding(
                "conf.secret-in-conf",
                (key,),
                REDACTED,
                message,
                "remove it; tokens belong in the password of an Airflow connection the deployment allows",
            )
        # An array item's fix is the item's own schema.
        item = message.startswith("item ")
        fix = f"each item: {schema_fix(schema.get('items', {}))}" if item else schema_fix(schema)
        return Finding(f"conf.{keyword}", (key,), value, message, fix)
    return None


def _types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type", "string")
    return list(kind) if isinstance(kind, (list, tuple)) else [kind]


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return type(value) is int  # JSON Schema would take 2.0 and Python's True; the templates would not
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return isinstance(value, int) or math.isfinite(value)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, (list, tuple))
    return False


def _type_message(kinds: list[str], value: Any) -> str:
    expected = " or ".join(repr(k) for k in kinds)
    if "integer" in kinds and isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return f"{shown(value)} is a decimal number, not of type {expected} (write it without a decimal point)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{shown(value)} is not a finite number, not of type {expected}"
    return f"{shown(value)} is not of type {expected}"


def _value_problem(schema: Mapping[str, Any], value: Any) -> tuple[str, str] | None:
    """The first way ``value`` breaks ``schema``, as (JSON-schema keyword, message), or None."""
    kinds = _types(schema)
    if not any(_type_ok(kind, value) for kind in kinds):
        return "type", _type_message(kinds, value)
    if value is None:
        return None
    if "enum" in schema and value not in schema["enum"]:
        return "enum", f"{shown(value)} is not one of {shown(list(schema['enum']))}"
    if isinstance(value, str):
        return _string_problem(schema, value)
    if isinstance(value, (list, tuple)):
        return _array_problem(schema, value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number_problem(schema, value)
    return None


def _number_problem(schema: Mapping[str, Any], value: float) -> tuple[str, str] | None:
    if "minimum" in schema and value < schema["minimum"]:
        return "minimum", f"{shown(value)} is less than the minimum of {schema['minimum']}"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return (
            "exclusiveMinimum",
            f"{shown(value)} is less than or equal to the minimum of {schema['exclusiveMinimum']}",
        )
    if "maximum" in schema and value > schema["maximum"]:
        return "maximum", f"{shown(value)} is greater than the maximum of {schema['maximum']}"
    return None


def _string_problem(schema: Mapping[str, Any], value: str) -> tuple[str, str] | None:
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return "maxLength", f"{shown(value)} is longer than {schema['maxLength']} characters ({len(value)})"
    if not value.isprintable():
        # Newlines, tabs, NULs, lone surrogates, zero-width marks: a name check that allows them lets them through.
        return "printable", f"{shown(value)} contains a control, separator or unpaired surrogate character"
    if CREDENTIAL_VALUE.search(value):
        return "secret", "this looks like a token or key; secrets are never accepted in the conf"
    if "minLength" in schema and len(value) < schema["minLength"]:
        return "minLength", f"{shown(value)} is shorter than {schema['minLength']} characters"
    if "pattern" in schema and not _pattern(schema["pattern"]).fullmatch(value):
        return "pattern", f"{shown(value)} does not match {PATTERN_WORDS.get(schema['pattern'], schema['pattern'])}"
    return None


def _array_problem(schema: Mapping[str, Any], value: list[Any] | tuple[Any, ...]) -> tuple[str, str] | None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return "maxItems", f"the list has {len(value)} items, more than {schema['maxItems']}"
    if "minItems" in schema and len(value) < schema["minItems"]:
        return "minItems", f"{shown(value)} has fewer than {schema['minItems']} items"
    for n, item in enumerate(value):
        problem = _value_problem(schema.get("items", {"type": "string"}), item)
        if problem is not None:
            keyword, message = problem
            return keyword, f"item {n}: {message}"
    return None


@functools.cache
def _pattern(pattern: str) -> re.Pattern[str]:
    # fullmatch, not match: `$` also matches before a trailing newline, so "name\n" would pass a `^...$` check.
    return re.compile(pattern)


def schema_fix(schema: Mapping[str, Any]) -> str:
    """How to write a value that fits ``schema``, for a finding's fix."""
    if "enum" in schema:
        return "use one of " + ", ".join(str(v) for v in schema["enum"])
    kinds = [k for k in _types(schema) if k != "null"] if "type" in schema else ["string"]
    parts = [f"give a JSON {' or '.join(kinds)}"]
    if "integer" in kinds:
        parts.append("written without a decimal point")
    if "array" in kinds:
        parts.append(f"of {schema.get('minItems', 0)}-{schema.get('maxItems', 'any')} strings")
    for key, text in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("minLength", "length >="),
        ("maxLength", "length <="),
    ):
        if key in schema:
            parts.append(f"{text} {schema[key]}")
    if "string" in kinds:
        parts.append("printable characters only")
    if schema.get("pattern") in PATTERN_WORDS:
        parts.append(f"in one of the forms {PATTERN_WORDS[schema['pattern']]}")
    elif "pattern" in schema:
        parts.append(f"matching {schema['pattern']} as a whole")
    return ", ".join(parts)


def _coerce(conf: Mapping[str, Any]) -> dict[str, Any]:
    """JSON values to field types: arrays become tuples (hashable, frozen), integers in number fields floats, and a
    null (an optional field left empty in the form) the field's default."""
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if value is None:
            continue
        kinds = _types(_FIELDS[key].metadata["schema"])
        out[key] = tuple(value) if "array" in kinds else float(value) if "number" in kinds else value
    return out


def _to_json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
