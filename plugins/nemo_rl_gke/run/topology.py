"""The run's shape as data: every step of a run, declared once.

A :class:`Step` is one task of the DAG: its task id (which is also the key of the resource or object group it
makes), the operator that runs it, its stage, what it needs, its teardown counterpart, the policies under which
that counterpart deletes it, whether it holds the run group's lease, what it makes and what that costs, and the XCom
keys it pushes for later tasks. The DAG factory builds the DAG (its edges: :func:`upstream`) from this table; the
plan, teardown, the costs, the run report, the alerts, the demo and every XCom lookup read it. No task id, resource
key, teardown order or per-step fact is written anywhere else, so renaming a step here renames it everywhere.

Pure and stdlib-only: it is imported while Airflow parses DAG files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum


class Op(StrEnum):
    """Which operator runs a step (the DAG factory maps each to its class)."""

    VALIDATE_CONF = "validate-conf"
    PLAN = "plan"
    APPLY_GATE = "apply-gate"
    TAKE_LEASE = "take-lease"
    PREFLIGHT_LIVE = "preflight-live"
    ENSURE_GCP = "ensure-gcp"
    APPLY_KUBE = "apply-kube"
    SUBMIT_JOB = "submit-job"
    FOLLOW_JOB = "follow-job"
    VALIDATE_CHECKPOINT = "validate-checkpoint"
    CONVERT_CHECKPOINT = "convert-checkpoint"
    EVALUATE_MODEL = "evaluate-model"
    EXPORT_CHECKPOINT = "export-checkpoint"
    PUBLISH_MODEL = "publish-model"
    DELETE_KUBE = "delete-kube"
    DELETE_GCP = "delete-gcp"
    RELEASE_LEASE = "release-lease"
    RESUME = "resume"
    SCALE_POOL = "scale-pool"
    REPORT = "report"


# ---------------------------------------------------------------------------------------------------------------
# Stages, in run order; each bounds one wait with a conf parameter.
# ---------------------------------------------------------------------------------------------------------------
PREFLIGHT = "preflight"
NETWORK = "network"
STORAGE = "storage"
CLUSTER = "cluster"
KUBE = "kube"
TRAIN = "train"
CHECKPOINT = "checkpoint"
TEARDOWN = "teardown"
REPORT = "report"
STAGES: tuple[str, ...] = (PREFLIGHT, NETWORK, STORAGE, CLUSTER, KUBE, TRAIN, CHECKPOINT, TEARDOWN, REPORT)
# The stages that see the max_steps the resume step set (the job, its checkpoint, the report).
RESUMED_STAGES = frozenset({TRAIN, CHECKPOINT, REPORT})
# Where a run may stop (the conf's stop_after): the provisioning stages after it are skipped, teardown still runs.
# Storage and cluster run side by side, so "cluster" is the first stop that has all the infrastructure.
STOP_POINTS: tuple[str, ...] = (CLUSTER, KUBE, TRAIN, CHECKPOINT)
# The conf parameter that bounds one wait of a step in each stage (the checkpoint steps name their own).
STAGE_TIMEOUT_PARAM: dict[str, str] = {
    NETWORK: "network_timeout_s",
    STORAGE: "storage_timeout_s",
    CLUSTER: "cluster_timeout_s",
    KUBE: "kube_timeout_s",
    TRAIN: "job_timeout_s",
    TEARDOWN: "teardown_timeout_s",
}

# ---------------------------------------------------------------------------------------------------------------
# Teardown policies: which of them delete a step's resources is declared per step below.
# ---------------------------------------------------------------------------------------------------------------
DELETE_ALL = "delete_all"
KEEP_WARM = "keep_cluster_and_storage"
KEEP_ALL = "keep_all"
POLICIES: tuple[str, ...] = (DELETE_ALL, KEEP_WARM, KEEP_ALL)


class Cost(StrEnum):
    """What a step's resource costs while it is up (:mod:`nemo_rl_gke.run.costs` prices each kind), in the order the
    alerts name what is still up: the GPU nodes, the cluster, the storage, what runs on the nodes, the free rest."""

    GPU_NODES = "gpu-nodes"  # the GPU pool's nodes, at the per-GPU-hour price
    CLUSTER = "cluster"  # GKE's management fee and the default pool's nodes
    LUSTRE = "lustre"  # Managed Lustre's capacity at its throughput tier
    ON_NODES = "on-nodes"  # runs on the pools' nodes, which the pools already count
    FREE = "free"  # no charge while idle: networks, subnets, firewall rules, the range, the peering


# ---------------------------------------------------------------------------------------------------------------
# XCom keys
# ---------------------------------------------------------------------------------------------------------------
RETURN = "return_value"
STARTED_AT = "started_at"  # every step records when its try started, for the run report
PENDING = "pending_result"  # a deferred step's result so far (``airflow dags test`` drops deferral kwargs)
ERROR = "error"  # the first line of a step's final failure, recorded for the run's failure alert
FINDINGS = "findings"
PLAN_TEXT = "plan_text"
JOB_STEPS = "steps"
JOB_SUMMARY = "summary"
# train.wait's budget figures (:meth:`nemo_rl_gke.run.budget.RunBudget.xcom`), for the report and the Training view.
JOB_BUDGET = "budget"
# A stalled job's newest save and the stall's message: train.wait fails, and the checkpoint steps still run on it.
JOB_STALLED = "stalled"
# The node-loss recoveries train.wait made: one row each (when, the rule, the steps and GPU-hours lost).
JOB_RECOVERIES = "recoveries"
CHECKPOINT_REPORT = "report"
REPORT_TEXT = "text"

# ---------------------------------------------------------------------------------------------------------------
# Task ids. A grouped step's id is ``group.name``; the group is its Airflow TaskGroup.
# ---------------------------------------------------------------------------------------------------------------
VALIDATE = "validate"
PLAN = "plan"
APPLY_GATE = "apply_gate"
LEASE = "lease"
PREFLIGHT_LIVE = "preflight_live"

NET = "network.net"
GVNIC_NET = "network.gvnic-net"
GVNIC_SUB = "network.gvnic-sub"
GVNIC_FW = "network.gvnic-fw"
RDMA_NET = "network.rdma-net"
RDMA_SUBNET_COUNT = 8
RDMA_SUBS: tuple[str, ...] = tuple(f"network.rdma-sub-{n}" for n in range(RDMA_SUBNET_COUNT))
PEERING_RANGE = "storage.peering-range"
PEERING = "storage.peering"
LUSTRE_FW = "storage.lustre-fw"
LUSTRE = "storage.lustre"
GKE_CLUSTER = "cluster.cluster"
NODE_POOL = "cluster.node-pool"

NCCL_INSTALLER = "kube.nccl-installer"
NETWORK_MAPPING = "kube.network-mapping"
LUSTRE_STORAGE = "kube.lustre-storage"
RAYCLUSTER = "kube.raycluster"

RESUME = "train.resume"
SUBMIT = "train.submit"
WAIT = "train.wait"
CHECK_CHECKPOINT = "checkpoint.validate"
CONVERT = "checkpoint.convert"
EVALUATE = "checkpoint.evaluate"
EXPORT = "checkpoint.export"
PUBLISH = "checkpoint.publish"

DELETE_RAYCLUSTER = "teardown.delete-raycluster"
SCALE_POOL = "teardown.scale-pool"
DELETE_KUBE_OBJECTS = "teardown.delete-kube-objects"
DELETE_LUSTRE = "teardown.delete-lustre"
DELETE_PEERING = "teardown.delete-peering"
DELETE_PEERING_RANGE = "teardown.delete-peering-range"
DELETE_LUSTRE_FW = "teardown.delete-lustre-fw"
DELETE_CLUSTER = "teardown.delete-cluster"
DELETE_GVNIC_FW = "teardown.delete-gvnic-fw"
DELETE_GVNIC_SUB = "teardown.delete-gvnic-sub"
DELETE_RDMA_SUBS: tuple[str, ...] = tuple(f"teardown.delete-rdma-sub-{n}" for n in range(RDMA_SUBNET_COUNT))
DELETE_GVNIC_NET = "teardown.delete-gvnic-net"
DELETE_RDMA_NET = "teardown.delete-rdma-net"
DELETE_NET = "teardown.delete-net"
RELEASE_LEASE = "teardown.release-lease"

RUN_REPORT = "report"

# Every exported checkpoint is an event on this Asset (its extra holds the URI, step, metrics and shards).
# Each DAG publishes its exported checkpoints on an Asset of its own, so a schedule's lineage is its events alone.
CHECKPOINT_ASSET = "{dag_id}_checkpoint"


# A model the publish policy promoted is an event on this one (its extra: the score, the baseline, the Hugging Face
# and the checkpoint URIs): what serving, and a resume=promoted night, read.
PUBLISHED_ASSET = "{dag_id}_published_model"


def checkpoint_asset(dag_id: str) -> str:
    """The name of the Asset a DAG's exported checkpoints are published on."""
    return CHECKPOINT_ASSET.format(dag_id=dag_id)


def published_asset(dag_id: str) -> str:
    """The name of the Asset a DAG's promoted models are published on."""
    return PUBLISHED_ASSET.format(dag_id=dag_id)


_RECORDS = (RETURN, STARTED_AT, PENDING, ERROR)
_DELETES_EVERYTHING = frozenset({DELETE_ALL})
# The RayCluster holds the GPU nodes: every policy but keep_all lets it go, so a warm cluster scales to zero.
_DELETED_UNLESS_KEPT = frozenset({DELETE_ALL, KEEP_WARM})


@dataclass(frozen=True)
class Step:
    """One task of a run.

    :param task_id: the Airflow task id (``group.name`` in a task group); also the key of what the step makes.
    :param op: the operator that runs it.
    :param stage: the stage it belongs to (the run report groups by it; it picks the wait's timeout).
    :param needs: task ids that must finish first (successfully, for a provisioning step).
    :param teardown: for a step that makes something, the teardown step that deletes it.
    :param deleted_under: the teardown policies under which that teardown step deletes it (or, with ``goes_with``,
        under which it goes with what it belongs to).
    :param goes_with: for a step whose resource has no teardown step of its own, the step whose deletion takes it.
    :param scaled_down_under: the teardown policies under which teardown keeps it but scales it to zero nodes.
    :param holds_lease: whether it renews the run group's lease before it acts (it creates, trains or deletes);
        the steps before the lease is taken, the lease's release and the report do not.
    :param makes: what it makes, for people ("VPC network"), and ``name_attr`` the RunSpec attribute holding its
        name; ``cost`` what that costs while it is up (None: nothing the still-running banner lists).
    :param deletes: for a teardown step, the steps whose resources it deletes, in order.
    :param produces: the XCom keys it pushes for later tasks.
    :param retries: Airflow retries (None: the DAG default).
    :param retry_delay_s: seconds between tries (None: the DAG default).
    :param counts_for_run_state: a teardown step whose failure fails the run (the network deletions: every other
        resource lives in one of those networks, so a leak anywhere makes one of them fail).
    :param timeout_param: the conf parameter bounding one wait of this step (default: its stage's).
    :param doc: what it does, for the task's docs.
    :param outlets: Assets it publishes an event on, ``inlets`` Assets whose events it reads (names, with
        ``{dag_id}`` filled in by the DAG factory).
    """

    task_id: str
    op: Op
    stage: str
    needs: tuple[str, ...] = ()
    teardown: str | None = None
    deleted_under: frozenset[str] = frozenset()
    goes_with: str | None = None
    scaled_down_under: frozenset[str] = frozenset()
    holds_lease: bool = True
    makes: str = ""
    name_attr: str = ""
    cost: Cost | None = None
    deletes: tuple[str, ...] = ()
    produces: tuple[str, ...] = _RECORDS
    retries: int | None = None
    retry_delay_s: float | None = None
    counts_for_run_state: bool = False
    timeout_param: str | None = None
    doc: str = ""
    outlets: tuple[str, ...] = field(default=())
    inlets: tuple[str, ...] = field(default=())

    @property
    def group(self) -> str | None:
        """The task group (the part of the id before the dot), or None for a top-level task."""
        group, dot, _ = self.task_id.partition(".")
        return group if dot else None

    @property
    def name(self) -> str:
        """The task id inside its group."""
        return self.task_id.rpartition(".")[2]

    @property
    def is_teardown(self) -> bool:
        """Whether the step cleans up (it runs after any failure, as an Airflow teardown task)."""
        return self.op in (Op.DELETE_GCP, Op.DELETE_KUBE, Op.SCALE_POOL, Op.RELEASE_LEASE)

    @property
    def wait_timeout_param(self) -> str | None:
        """The conf parameter bounding one wait of this step."""
        return self.timeout_param or STAGE_TIMEOUT_PARAM.get(self.stage)


def _ensure(
    task_id: str,
    stage: str,
    needs: tuple[str, ...],
    teardown: str | None,
    doc: str,
    *,
    makes: str,
    name: str = "",
    cost: Cost = Cost.FREE,
) -> Step:
    return Step(task_id, Op.ENSURE_GCP, stage, needs, teardown=teardown, deleted_under=_DELETES_EVERYTHING, doc=doc,
                makes=makes, name_attr=name, cost=cost)  # fmt: skip


def _delete(task_id: str, deletes: str, needs: tuple[str, ...], **kwargs: object) -> Step:
    # A failed deletion is retried soon: the usual cause (a dependent still going away) clears quickly.
    return Step(task_id, Op.DELETE_GCP, TEARDOWN, needs, deletes=(deletes,), retries=3, retry_delay_s=5, **kwargs)  # type: ignore[arg-type]


_STEPS: tuple[Step, ...] = (
    # --- preflight: nothing exists yet ---------------------------------------------------------------------
    Step(VALIDATE, Op.VALIDATE_CONF, PREFLIGHT, produces=(*_RECORDS, FINDINGS), retries=0, holds_lease=False,
         doc="Offline preflight of the conf: every finding at once; nothing else runs if one is found."),
    Step(PLAN, Op.PLAN, PREFLIGHT, (VALIDATE,), produces=(*_RECORDS, PLAN_TEXT), holds_lease=False,
         doc="Every GCP request, Kubernetes manifest and the Ray job, in order (secrets redacted)."),
    Step(APPLY_GATE, Op.APPLY_GATE, PREFLIGHT, (PLAN,), retries=0, holds_lease=False,
         doc="Ends a plan-mode run here: it skips itself and everything after it."),
    # Before anything is created the run takes its group's lease (cloud-side, seen by every Airflow); another
    # holder fails it (or skips, or waits: the conf's lease_held). A retry would meet the same holder.
    Step(LEASE, Op.TAKE_LEASE, PREFLIGHT, (APPLY_GATE,), retries=0, timeout_param="lease_wait_s", holds_lease=False,
         doc="Takes the run group's lease, so no other run creates or deletes the group's resources meanwhile."),
    Step(PREFLIGHT_LIVE, Op.PREFLIGHT_LIVE, PREFLIGHT, (LEASE,), produces=(*_RECORDS, FINDINGS), retries=1,
         holds_lease=False,
         doc="Live checks before anything is created: reservation, RoCE profile, APIs, quota, secrets."),
    # --- network -----------------------------------------------------------------------------------------------
    _ensure(NET, NETWORK, (PREFLIGHT_LIVE,), DELETE_NET, "The main VPC (auto subnets): cluster and Lustre.",
            makes="VPC network", name="network"),
    _ensure(GVNIC_NET, NETWORK, (PREFLIGHT_LIVE,), DELETE_GVNIC_NET, "The gVNIC VPC of the GPU nodes' second NIC.",
            makes="VPC network", name="gvnic_network"),
    _ensure(GVNIC_SUB, NETWORK, (GVNIC_NET,), DELETE_GVNIC_SUB, "The gVNIC subnet.", makes="subnet",
            name="gvnic_subnet"),
    _ensure(GVNIC_FW, NETWORK, (GVNIC_NET,), DELETE_GVNIC_FW, "The gVNIC network's internal allow rule.",
            makes="firewall rule", name="gvnic_firewall"),
    _ensure(RDMA_NET, NETWORK, (PREFLIGHT_LIVE,), DELETE_RDMA_NET, "The RDMA VPC on the zone's RoCE profile.",
            makes="VPC network (RDMA)", name="rdma_network"),
    *(
        _ensure(sub, NETWORK, (RDMA_NET,), delete, f"RDMA subnet {n} (GPU NIC {n}).", makes="subnet (RDMA)")
        for n, (sub, delete) in enumerate(zip(RDMA_SUBS, DELETE_RDMA_SUBS, strict=True))
    ),
    # --- storage: side by side with the cluster once NET exists ----------------------------------------------
    _ensure(PEERING_RANGE, STORAGE, (NET,), DELETE_PEERING_RANGE, "The private-services range reserved on NET.",
            makes="peering range", name="peering_range"),
    _ensure(PEERING, STORAGE, (PEERING_RANGE,), DELETE_PEERING, "NET's Service Networking peering over the range.",
            makes="Service Networking peering", name="network"),
    # Lustre's clients reach it over tcp 988/6988 from the peering range (Google's GKE Managed Lustre guide).
    _ensure(LUSTRE_FW, STORAGE, (PEERING_RANGE,), DELETE_LUSTRE_FW, "NET's rule letting Lustre traffic in.",
            makes="firewall rule", name="lustre_firewall"),
    _ensure(LUSTRE, STORAGE, (PEERING, LUSTRE_FW), DELETE_LUSTRE,
            "The Managed Lustre instance the pods mount at /data.", makes="Managed Lustre instance", name="lustre_name",
            cost=Cost.LUSTRE),
    # --- cluster: the GPU pool also needs the gVNIC and RDMA subnets ----------------------------------------
    _ensure(GKE_CLUSTER, CLUSTER, (NET,), DELETE_CLUSTER, "The regional GKE cluster with its default pool.",
            makes="GKE cluster", name="cluster_name", cost=Cost.CLUSTER),
    # The pool goes with its cluster: it has no teardown step of its own. A warm cluster keeps it at 0 nodes.
    Step(NODE_POOL, Op.ENSURE_GCP, CLUSTER, (GKE_CLUSTER, GVNIC_SUB, *RDMA_SUBS), goes_with=GKE_CLUSTER,
         deleted_under=_DELETES_EVERYTHING, scaled_down_under=frozenset({KEEP_WARM}), makes="GPU node pool",
         name_attr="node_pool_name", cost=Cost.GPU_NODES,
         doc="The GPU node pool on the reservation, with the gVNIC and RDMA NICs."),
    # --- kube: the pool's nodes run the installer and use the mapped networks; the PV needs Lustre's IP ------
    Step(NCCL_INSTALLER, Op.APPLY_KUBE, KUBE, (NODE_POOL,), teardown=DELETE_KUBE_OBJECTS,
         deleted_under=_DELETES_EVERYTHING, doc="The NCCL RDMA installer DaemonSet."),
    Step(NETWORK_MAPPING, Op.APPLY_KUBE, KUBE, (NODE_POOL,), teardown=DELETE_KUBE_OBJECTS,
         deleted_under=_DELETES_EVERYTHING, doc="GKENetworkParamSet and Network objects for the gVNIC and RDMA NICs."),
    Step(LUSTRE_STORAGE, Op.APPLY_KUBE, KUBE, (GKE_CLUSTER, LUSTRE), teardown=DELETE_KUBE_OBJECTS,
         deleted_under=_DELETES_EVERYTHING, doc="The Lustre PersistentVolume and its claim."),
    Step(RAYCLUSTER, Op.APPLY_KUBE, KUBE, (NCCL_INSTALLER, NETWORK_MAPPING, LUSTRE_STORAGE, NODE_POOL),
         teardown=DELETE_RAYCLUSTER, deleted_under=_DELETED_UNLESS_KEPT, makes="RayCluster",
         name_attr="raycluster_name", cost=Cost.ON_NODES,
         doc="The KubeRay RayCluster and its service account, waited on until ready."),
    # --- train -----------------------------------------------------------------------------------------------
    # Continual training (resume=latest): the lineage's newest checkpoint, imported from Cloud Storage into a new
    # Lustre before the job starts; it sets this run's max_steps to the resumed step plus the step budget.
    Step(RESUME, Op.RESUME, TRAIN, (LUSTRE,), retries=1, timeout_param="storage_timeout_s",
         inlets=(CHECKPOINT_ASSET, PUBLISHED_ASSET),
         doc="Finds the checkpoint to continue from (resume=latest or promoted) and imports it into Lustre if needed."),
    # The submission id comes from the DAG run, so a retried submit adopts the job instead of starting another.
    # A retry adopts the job its try submitted (its id is the run's), and until one follows it nothing watches it.
    Step(SUBMIT, Op.SUBMIT_JOB, TRAIN, (RAYCLUSTER, RESUME), retry_delay_s=10,
         doc="Submits the GRPO job once (Ray Jobs API)."),
    # A failed or stopped job, the guard and the timeout fail without retry; a lost trigger is retried.
    Step(WAIT, Op.FOLLOW_JOB, TRAIN, (SUBMIT,), retries=1,
         produces=(*_RECORDS, JOB_STEPS, JOB_SUMMARY, JOB_BUDGET, JOB_STALLED, JOB_RECOVERIES),
         doc="Follows the job, deferred: its log into the task log, its step metrics into XCom."),
    # --- checkpoint: a retry would re-read the same files to the same answer ---------------------------------
    Step(CHECK_CHECKPOINT, Op.VALIDATE_CHECKPOINT, CHECKPOINT, (WAIT,), produces=(*_RECORDS, CHECKPOINT_REPORT),
         retries=0, timeout_param="kube_timeout_s", doc="Validates the final checkpoint where it lives (a Ray job)."),
    # The Hugging Face export runs on the head (no GPU); the evaluation on the GPU workers, the base model's once.
    Step(CONVERT, Op.CONVERT_CHECKPOINT, CHECKPOINT, (CHECK_CHECKPOINT,), retries=1, timeout_param="kube_timeout_s",
         doc="Converts the validated checkpoint to a Hugging Face model in step_N/hf (a Ray job, no GPU)."),
    Step(EVALUATE, Op.EVALUATE_MODEL, CHECKPOINT, (CONVERT,), retries=0, timeout_param="kube_timeout_s",
         doc="Scores the Hugging Face model (and the base model once) with NeMo RL's run_eval.py (a Ray job)."),
    # After the export whatever the conversion did: every run exports what it learned (the step itself skips
    # unless the checkpoint validated).
    Step(EXPORT, Op.EXPORT_CHECKPOINT, CHECKPOINT, (CONVERT,), retries=1, timeout_param="storage_timeout_s",
         outlets=(CHECKPOINT_ASSET,), doc="Exports the checkpoint to Cloud Storage and publishes the Asset event."),
    Step(PUBLISH, Op.PUBLISH_MODEL, CHECKPOINT, (EXPORT, EVALUATE), retries=1, inlets=(PUBLISHED_ASSET,),
         outlets=(PUBLISHED_ASSET,),
         doc="Publishes the model as the lineage's published one when the publish policy promotes it."),
    # --- teardown (FACTS §4 order, parallel where the APIs allow) -------------------------------------------
    # The RayCluster first (it holds the GPU nodes), then the other objects, then the infrastructure.
    Step(DELETE_RAYCLUSTER, Op.DELETE_KUBE, TEARDOWN, deletes=(RAYCLUSTER,), retries=3, retry_delay_s=5,
         doc="Copies the Ray session logs to the export bucket, deletes the RayCluster and waits until KubeRay "
             "removed it."),
    # A warm cluster (keep_cluster_and_storage) keeps no GPU node between runs: its pool goes to 0 nodes.
    Step(SCALE_POOL, Op.SCALE_POOL, TEARDOWN, (DELETE_RAYCLUSTER,), retries=3, retry_delay_s=5,
         doc="Scales the GPU pool of a cluster kept warm to 0 nodes (nothing to do when the cluster goes)."),
    Step(DELETE_KUBE_OBJECTS, Op.DELETE_KUBE, TEARDOWN, (DELETE_RAYCLUSTER,),
         deletes=(LUSTRE_STORAGE, NETWORK_MAPPING, NCCL_INSTALLER), retries=3, retry_delay_s=5,
         doc="Deletes the other Kubernetes objects."),
    # Lustre -> peering -> range; the cluster (and its pool) before the subnets it uses; every network last.
    _delete(DELETE_LUSTRE, LUSTRE, (DELETE_KUBE_OBJECTS,),
            doc="Deletes Lustre, unless its checkpoint was not exported."),
    _delete(DELETE_PEERING, PEERING, (DELETE_LUSTRE,), doc="Deletes the peering."),
    _delete(DELETE_PEERING_RANGE, PEERING_RANGE, (DELETE_PEERING,), doc="Releases the peering range."),
    _delete(DELETE_LUSTRE_FW, LUSTRE_FW, (DELETE_LUSTRE,), doc="Deletes the Lustre firewall rule."),
    _delete(DELETE_CLUSTER, GKE_CLUSTER, (DELETE_KUBE_OBJECTS,), doc="Deletes the cluster and its node pools."),
    _delete(DELETE_GVNIC_FW, GVNIC_FW, (), doc="Deletes the gVNIC firewall rule."),
    _delete(DELETE_GVNIC_SUB, GVNIC_SUB, (DELETE_CLUSTER,), doc="Deletes the gVNIC subnet."),
    *(
        _delete(delete, sub, (DELETE_CLUSTER,), doc=f"Deletes RDMA subnet {n}.")
        for n, (sub, delete) in enumerate(zip(RDMA_SUBS, DELETE_RDMA_SUBS, strict=True))
    ),
    _delete(DELETE_GVNIC_NET, GVNIC_NET, (DELETE_GVNIC_SUB, DELETE_GVNIC_FW), counts_for_run_state=True,
            doc="Deletes the gVNIC network."),
    _delete(DELETE_RDMA_NET, RDMA_NET, DELETE_RDMA_SUBS, counts_for_run_state=True, doc="Deletes the RDMA network."),
    _delete(DELETE_NET, NET, (DELETE_PEERING_RANGE, DELETE_LUSTRE_FW, DELETE_CLUSTER), counts_for_run_state=True,
            doc="Deletes the main network, last."),
    # After every other teardown step; it runs whenever the lease was taken, so no failure keeps the group held.
    Step(RELEASE_LEASE, Op.RELEASE_LEASE, TEARDOWN, (DELETE_RAYCLUSTER, SCALE_POOL, DELETE_KUBE_OBJECTS, DELETE_LUSTRE,
         DELETE_PEERING, DELETE_PEERING_RANGE, DELETE_LUSTRE_FW, DELETE_CLUSTER, DELETE_GVNIC_FW, DELETE_GVNIC_SUB,
         *DELETE_RDMA_SUBS, DELETE_GVNIC_NET, DELETE_RDMA_NET, DELETE_NET), retries=3, retry_delay_s=5,
         holds_lease=False, doc="Frees the run group's lease (recording whether its resources were kept warm)."),
    # --- the last task: whenever the conf was valid, after teardown; it never decides the run's state -------
    Step(RUN_REPORT, Op.REPORT, REPORT, produces=(*_RECORDS, REPORT_TEXT), retries=0, holds_lease=False,
         doc="Stage times, critical path, GPU node-hours and cost, training, checkpoint and teardown."),
)  # fmt: skip

STEPS: dict[str, Step] = {step.task_id: step for step in _STEPS}


def step(task_id: str) -> Step:
    """The step of a task id; a clear error for an unknown one (a rename missed somewhere)."""
    try:
        return STEPS[task_id]
    except KeyError:
        raise KeyError(f"no step {task_id!r} in the run's topology") from None


def steps_by(op: Op) -> tuple[Step, ...]:
    """Every step one operator runs, in declaration order."""
    return tuple(s for s in _STEPS if s.op is op)


def provisioning() -> tuple[Step, ...]:
    """The steps between the live preflight and teardown: everything that makes, trains or exports."""
    return tuple(s for s in _STEPS if s.stage not in (PREFLIGHT, TEARDOWN, REPORT))


def teardown_steps() -> tuple[Step, ...]:
    """The teardown steps in an order that works (each after the steps it needs)."""
    return tuple(s for s in _STEPS if s.is_teardown)


def gcp_resources() -> tuple[Step, ...]:
    """The steps that ensure a Google Cloud resource, in creation order (each after what it needs)."""
    return steps_by(Op.ENSURE_GCP)


def kube_groups() -> tuple[Step, ...]:
    """The steps that apply a group of Kubernetes objects, in apply order."""
    return steps_by(Op.APPLY_KUBE)


def teardown_of(task_id: str) -> Step | None:
    """The teardown step that deletes what ``task_id`` makes (None: it goes with something else, or is kept)."""
    counterpart = step(task_id).teardown
    return None if counterpart is None else step(counterpart)


def requires(task_id: str) -> frozenset[str]:
    """The GCP resources ``task_id`` needs, directly or through others: what it cannot outlive."""
    found: set[str] = set()
    todo = list(step(task_id).needs)
    while todo:
        need = step(todo.pop())
        if need.op is Op.ENSURE_GCP and need.task_id not in found:
            found.add(need.task_id)
            todo.extend(need.needs)
    return frozenset(found)


def deleted_by(task_id: str) -> Step | None:
    """The teardown step whose deletion takes what ``task_id`` makes: its own, or that of what it goes with (the node
    pool goes with its cluster); None when nothing deletes it."""
    this = step(task_id)
    return teardown_of(this.goes_with or task_id)


def deletes_under(task_id: str, policy: str) -> bool:
    """Whether the teardown policy deletes what ``task_id`` makes."""
    return policy in step(task_id).deleted_under


def scales_down_under(task_id: str, policy: str) -> bool:
    """Whether the teardown policy keeps what ``task_id`` makes but scales it to zero nodes."""
    return policy in step(task_id).scaled_down_under


def upstream(task_id: str) -> tuple[str, ...]:
    """Every task id ``task_id`` depends on directly in the built DAG, derived edges included.

    Teardown steps with no teardown needs start once every provisioning step has finished; the report comes after
    every teardown step. Teardown steps also hang off their setup task (Airflow's setup/teardown edge).
    """
    this = step(task_id)
    if this.op is Op.REPORT:
        return (*(s.task_id for s in teardown_steps()), VALIDATE)
    if this.is_teardown:
        roots = () if this.needs else tuple(s.task_id for s in provisioning())
        return (*this.needs, *roots, setup_of(task_id))
    return this.needs


def edges() -> set[tuple[str, str]]:
    """Every (upstream, downstream) pair of the DAG the factory builds."""
    return {(up, s.task_id) for s in _STEPS for up in upstream(s.task_id)}


def setup_of(task_id: str) -> str | None:
    """The setup task a teardown task belongs to: deletions need the live preflight, the lease's release the lease,
    the report a valid conf."""
    this = step(task_id)
    if this.op is Op.REPORT:
        return VALIDATE
    if this.op is Op.RELEASE_LEASE:
        return LEASE
    return PREFLIGHT_LIVE if this.is_teardown else None


def after(stop_stage: str) -> Iterator[Step]:
    """The provisioning steps of the stages after ``stop_stage``: what a run that stops there skips."""
    cut = STAGES.index(stop_stage)
    return (s for s in provisioning() if STAGES.index(s.stage) > cut)


def check() -> None:
    """Raise ValueError when the table is inconsistent: unknown ids, needs out of order, a missing counterpart."""
    seen: set[str] = set()
    for s in _STEPS:
        if s.stage not in STAGES:
            raise ValueError(f"{s.task_id}: unknown stage {s.stage!r}")
        for need in s.needs:
            if need not in seen:
                raise ValueError(f"{s.task_id} needs {need}, which is not declared before it")
        for target in s.deletes:
            if step(target).teardown != s.task_id:
                raise ValueError(f"{s.task_id} deletes {target}, whose teardown is {step(target).teardown}")
        if s.teardown is not None and s.task_id not in step(s.teardown).deletes:
            raise ValueError(f"{s.task_id}'s teardown {s.teardown} does not list it")
        if (s.deleted_under | s.scaled_down_under) - set(POLICIES):
            unknown = sorted((s.deleted_under | s.scaled_down_under) - set(POLICIES))
            raise ValueError(f"{s.task_id}: unknown policies {unknown}")
        if s.deleted_under & s.scaled_down_under:
            both = sorted(s.deleted_under & s.scaled_down_under)
            raise ValueError(f"{s.task_id}: both deleted and scaled down under {both}")
        if s.goes_with is not None and (
            s.teardown is not None or s.goes_with not in seen or s.deleted_under != step(s.goes_with).deleted_under
        ):
            raise ValueError(f"{s.task_id} goes with {s.goes_with}: so no teardown of its own, and its policies")
        seen.add(s.task_id)


check()
