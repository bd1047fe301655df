"""RunSpec: the one validated, frozen description of a run, and the single source of every name.

The conf's parameters are its fields (declared in :mod:`nemo_rl_gke.run.conf_schema`, checked by
:mod:`nemo_rl_gke.run.conf_checks`). Every GCP resource name, Kubernetes object name, label and path is derived here,
so that teardown deletes exactly what setup created.

This module is pure (no google/kubernetes/ray): `validate`, `plan` and the CLI use it without any client installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_gke.run.conf_checks import _coerce, conf_findings
from nemo_rl_gke.run.conf_schema import (
    GPU_PROFILES,
    GROUP_NAME_PARAMS,
    RESERVATION,
    GpuProfile,
    RunConf,
    default_conf,  # noqa: F401 - re-exported: its many callers import it from here
    to_json,
)
from nemo_rl_gke.run.findings import ConfError
from nemo_rl_gke.run.topology import RDMA_SUBNET_COUNT

# The package's own folder in the export bucket holds the Ray logs (beside its checkpoint records and baselines).
RAY_LOGS_PATH = "nemo-rl-gke/ray-logs"


@dataclass(frozen=True)
class RunSpec(RunConf):
    """A validated run conf. Build it with :meth:`from_conf`; everything else is derived from it."""

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
        return {f.name: to_json(getattr(self, f.name)) for f in dataclasses.fields(self)}

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
    def fluentbit_config_name(self) -> str:
        """The fluent-bit sidecars' ConfigMap: the tutorial chart's ``<release>-kuberay-fluentbit-config``, which is
        ``ray-cluster-kuberay-fluentbit-config`` for the default RayCluster name."""
        return f"{self.raycluster_name}-fluentbit-config"

    @property
    def provisioning_request_name(self) -> str:
        """The ProvisioningRequest (and its PodTemplate) of a queued run's workers."""
        return f"{self.raycluster_name}-workers"

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
    def resumes(self) -> bool:
        """Whether the run continues a lineage: its newest export (``latest``) or its newest published model."""
        return self.resume in ("latest", "promoted")

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

    def ray_logs_uri(self, dag_id: str, run_id: str) -> str:
        """Where teardown copies the run's Ray session logs: gs://<export bucket>/nemo-rl-gke/ray-logs/<dag>/<run>/
        (:mod:`nemo_rl_gke.run.ray_logs`). Beside the checkpoint's bucket, not under the run's export prefix, which
        a resume imports whole into Lustre."""
        readable = re.sub(r"[^a-zA-Z0-9_.-]+", "-", run_id).strip("-")
        return f"gs://{self.export_bucket_name}/{RAY_LOGS_PATH}/{dag_id}/{readable}/"

    def submission_id(self, dag_id: str, run_id: str) -> str:
        """Ray job submission_id for one DAG run: stable across task retries, unique across runs."""
        digest = hashlib.sha256(f"{dag_id}\0{run_id}".encode()).hexdigest()[:12]
        readable = re.sub(r"[^a-zA-Z0-9_-]+", "-", run_id).strip("-")[:40]
        return f"nemo-rl-{readable}-{digest}"
