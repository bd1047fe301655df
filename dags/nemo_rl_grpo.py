"""NeMo RL GRPO fine-tunes on GKE.

Wiring only: the tasks' logic lives in plugins/nemo_rl_gke, and nothing heavy is imported while this file is parsed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, TaskGroup, chain, cross_downstream

from nemo_rl_gke.dag_params import build_params
from nemo_rl_gke.docs import DAG_DOC_MD
from nemo_rl_gke.operators.checkpoint import ExportCheckpointOperator, ValidateCheckpointOperator
from nemo_rl_gke.operators.gcp import DeleteGcpResourceOperator, EnsureGcpResourceOperator, PreflightLiveOperator
from nemo_rl_gke.operators.kube import ApplyKubeObjectsOperator, DeleteKubeObjectsOperator
from nemo_rl_gke.operators.preflight import VALIDATE_TASK_ID, ApplyGateOperator, PlanOperator, ValidateConfOperator
from nemo_rl_gke.operators.rayjob import RayJobSensor, SubmitRayJobOperator
from nemo_rl_gke.operators.report import RunReportOperator
from nemo_rl_gke.spec import RDMA_SUBNET_COUNT

# Task ids are the resource keys of nemo_rl_gke.gcp.resources (not imported here: it pulls in the Google clients).
RDMA_SUBNETS = [f"rdma-sub-{n}" for n in range(RDMA_SUBNET_COUNT)]
NETWORKS = ("net", "gvnic-net", "rdma-net")
# Every exported checkpoint is an event on this Asset; its extra holds the gs:// URI, step, metrics and shards,
# so an evaluation DAG can be scheduled on it.
CHECKPOINT_ASSET = Asset(name="nemo_rl_grpo_gke_checkpoint")

with DAG(
    dag_id="nemo_rl_grpo_gke",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # Every run uses the same resource names, so two at once would fight over them.
    max_active_runs=1,
    tags=["nemo-rl", "grpo", "gke", "gpu"],
    doc_md=DAG_DOC_MD,
    default_args={"owner": "ml-platform", "retries": 2, "retry_delay": timedelta(seconds=30)},
) as dag:
    # A bad conf fails the same way every time: no retries.
    validate = ValidateConfOperator(task_id=VALIDATE_TASK_ID, retries=0)
    plan = PlanOperator(task_id="plan")
    apply_gate = ApplyGateOperator(task_id="apply_gate", retries=0)
    preflight_live = PreflightLiveOperator(task_id="preflight_live", retries=1)
    chain(validate, plan, apply_gate, preflight_live)

    with TaskGroup("network"):
        net = EnsureGcpResourceOperator(task_id="net", resource_key="net")
        gvnic_net = EnsureGcpResourceOperator(task_id="gvnic-net", resource_key="gvnic-net")
        gvnic_sub = EnsureGcpResourceOperator(task_id="gvnic-sub", resource_key="gvnic-sub")
        gvnic_fw = EnsureGcpResourceOperator(task_id="gvnic-fw", resource_key="gvnic-fw")
        rdma_net = EnsureGcpResourceOperator(task_id="rdma-net", resource_key="rdma-net")
        rdma_subs = [EnsureGcpResourceOperator(task_id=key, resource_key=key) for key in RDMA_SUBNETS]
        gvnic_net >> [gvnic_sub, gvnic_fw]
        rdma_net >> rdma_subs
    with TaskGroup("storage"):
        peering_range = EnsureGcpResourceOperator(task_id="peering-range", resource_key="peering-range")
        peering = EnsureGcpResourceOperator(task_id="peering", resource_key="peering")
        lustre = EnsureGcpResourceOperator(task_id="lustre", resource_key="lustre")
        chain(peering_range, peering, lustre)
    with TaskGroup("cluster"):
        cluster = EnsureGcpResourceOperator(task_id="cluster", resource_key="cluster")
        node_pool = EnsureGcpResourceOperator(task_id="node-pool", resource_key="node-pool")
        cluster >> node_pool
    with TaskGroup("kube"):
        nccl_installer = ApplyKubeObjectsOperator(task_id="nccl-installer", group="nccl-installer")
        network_mapping = ApplyKubeObjectsOperator(task_id="network-mapping", group="network-mapping")
        lustre_storage = ApplyKubeObjectsOperator(task_id="lustre-storage", group="lustre-storage")
        raycluster = ApplyKubeObjectsOperator(task_id="raycluster", group="raycluster")
        [nccl_installer, network_mapping, lustre_storage] >> raycluster
    with TaskGroup("train"):
        # The submission id comes from the DAG run, so a retried submit adopts the job instead of starting another.
        submit = SubmitRayJobOperator(task_id="submit")
        # A failed or stopped job, the guard and the timeout fail without retry; a lost trigger is retried.
        wait = RayJobSensor(task_id="wait", retries=1)
        raycluster >> submit >> wait
    with TaskGroup("checkpoint"):
        # Both fail without retry: a retry would re-read the same files or re-run the same copy to the same answer.
        validate_checkpoint = ValidateCheckpointOperator(task_id="validate", retries=0)
        export = ExportCheckpointOperator(task_id="export", retries=1, outlets=[CHECKPOINT_ASSET])
        wait >> validate_checkpoint >> export
    preflight_live >> [net, gvnic_net, rdma_net]
    # Storage and cluster run side by side once NET exists; the GPU pool needs the gVNIC and RDMA subnets too.
    net >> [peering_range, cluster]
    [gvnic_sub, *rdma_subs] >> node_pool
    # The GPU pool's nodes run the installer and use the mapped networks; the PV needs Lustre's IP.
    node_pool >> [nccl_installer, network_mapping]
    [cluster, lustre] >> lustre_storage
    node_pool >> raycluster
    # Teardown starts once every provisioning task has finished, whatever its state.
    provisioned = [
        net,
        gvnic_net,
        gvnic_sub,
        gvnic_fw,
        rdma_net,
        *rdma_subs,
        peering_range,
        peering,
        lustre,
        cluster,
        node_pool,
        nccl_installer,
        network_mapping,
        lustre_storage,
        raycluster,
        submit,
        wait,
        validate_checkpoint,
        export,
    ]

    with TaskGroup("teardown"):
        # The RayCluster first (it holds the GPU nodes), then the other objects, then the infrastructure.
        delete_raycluster = DeleteKubeObjectsOperator(
            task_id="delete-raycluster", groups=["raycluster"], retries=3, retry_delay=timedelta(seconds=5)
        )
        delete_kube_objects = DeleteKubeObjectsOperator(
            task_id="delete-kube-objects",
            groups=["lustre-storage", "network-mapping", "nccl-installer"],
            retries=3,
            retry_delay=timedelta(seconds=5),
        )
        delete_raycluster >> delete_kube_objects
        delete = {
            # A failed deletion is retried soon: the usual cause (a dependent still going away) clears quickly.
            key: DeleteGcpResourceOperator(
                task_id=f"delete-{key}",
                resource_key=key,
                retries=3,
                retry_delay=timedelta(seconds=5),
                retry_exponential_backoff=True,
            )
            for key in [
                "lustre",
                "peering",
                "peering-range",
                "cluster",
                "gvnic-fw",
                "gvnic-sub",
                *RDMA_SUBNETS,
                "gvnic-net",
                "rdma-net",
                "net",
            ]
        }
        # FACTS §4 order, parallel where the APIs allow: Lustre -> peering -> range; the cluster (and its pool)
        # before the subnets it uses; every network last.
        chain(delete["lustre"], delete["peering"], delete["peering-range"])
        delete["cluster"] >> [delete["gvnic-sub"], *(delete[k] for k in RDMA_SUBNETS)]
        [delete["gvnic-sub"], delete["gvnic-fw"]] >> delete["gvnic-net"]
        [delete[k] for k in RDMA_SUBNETS] >> delete["rdma-net"]
        [delete["peering-range"], delete["cluster"]] >> delete["net"]
        delete_kube_objects >> [delete["lustre"], delete["cluster"]]
        for task in (delete_raycluster, delete_kube_objects):
            task.as_teardown(setups=preflight_live, on_failure_fail_dagrun=False)
        for key, task in delete.items():
            # Teardown runs after any failure once preflight_live succeeded. Only the network deletions decide the
            # run's state (Airflow otherwise counts a teardown leaf instead of the failed work before it): every
            # other resource lives in one of these networks, so a leak anywhere makes one of them fail.
            task.as_teardown(setups=preflight_live, on_failure_fail_dagrun=key in NETWORKS)
    cross_downstream(provisioned, [delete_raycluster, delete["gvnic-fw"]])

    # The last task: it runs whenever the conf was valid, after teardown, and never decides the run's state.
    report = RunReportOperator(task_id="report", retries=0)
    [delete_raycluster, delete_kube_objects, *delete.values()] >> report
    report.as_teardown(setups=validate, on_failure_fail_dagrun=False)

# Set after the tasks: Airflow deep-copies the DAG's params into every task created while they are set, and merges
# them back at run time anyway (process_params), so this keeps 60 copies of 61 Params out of every parse.
dag.params = build_params()
