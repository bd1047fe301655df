"""KubeRay, emulated: every RayCluster applied to a sandbox cluster gets a real local Ray head.

For a new RayCluster the controller makes its pods (Pending), finds the local directory behind the head's ``/data``
volume (PVC -> PV -> the Lustre volume handle -> the sandbox Lustre instance's data directory), and runs
``ray start --head --block`` on 127.0.0.1 with its own ports and temp dir, with ``SANDBOX_DATA_DIR`` set to that
directory so jobs can map ``/data`` onto it. When the dashboard answers, the pods turn Running, the head service
``{name}-head-svc`` appears and the conditions ``HeadPodReady`` and ``RayClusterProvisioned`` turn True.

Deleting the RayCluster stops that Ray by its own process group (never ``ray stop``, which stops every Ray on the
machine), and only then does the object go, as KubeRay's finalizer does. Deleting the GKE cluster stops its Rays too.

A RayCluster with ``spec.authOptions: {mode: token}`` gets what KubeRay 1.5.1+ gives it: a Secret named after it
(``utils.CheckName``) holding a random token under ``auth_token``, and ``RAY_AUTH_MODE=token`` / ``RAY_AUTH_TOKEN``
on its Ray, so Ray itself answers 401/403 to a request without the token (docs.ray.io kuberay user-guides/auth).

Every Ray listens on loopback only: ``--node-ip-address=127.0.0.1`` alone is not enough, since ``ray start`` swaps
a loopback address for the machine's own (``services.resolve_ip_for_localhost``), and the GCS, raylet, client
server and dashboard agent then bind to that. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps it at 127.0.0.1 (the
single-node mode Ray uses on laptops); its one cost, no second node joining, is what the sandbox wants anyway.

Every worker pod is a real local Ray worker node (``ray start --address=<head>``, through :mod:`sandbox.ray_node` so
it stays on loopback) that advertises the pod's ``nvidia.com/gpu`` limit as Ray GPUs, as KubeRay's generated start
command does; no process uses a GPU. A worker pod turns Running when its node has joined; ``readyWorkerReplicas``
counts them, and ``RayClusterProvisioned`` turns True once the head and every worker were ready (KubeRay's
``AllPodRunningAndReadyFirstTime``).

A node can be lost (:meth:`KubeRay.lose_node`, the admin API's ``/sandbox/node-loss``): killed (its processes
SIGKILLed, as a host that dies) or frozen (SIGSTOPped, as a host that hangs: Ray finds it by missed heartbeats). Its
pod goes, KubeRay's replacement pod is Pending until the node pool's replacement node comes after
``replace_after_s`` (GKE auto-repair, or the instance group recreating the VM), and then joins as a new Ray node. A
loss can wait for a checkpoint (``after_save``: as soon as ``step_N`` is on the RayCluster's Lustre volume), so a
test knows which save the job resumes from.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import functools
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import psutil

from sandbox import formats, kube_nodes
from sandbox.capacity import CONSUME_ANNOTATION, QUEUED_TAINT, CapacityModel, Claim
from sandbox.ports import free_ports

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox.kube_cluster import KubeCluster
    from sandbox.store import Store

log = logging.getLogger("sandbox.kuberay")
HOST = "127.0.0.1"
DASHBOARD_PORT = "8265"
READY_TIMEOUT_S = 180.0
# The kubelet's CrashLoopBackOff: the first restart after 10 s, each next one twice as late, at most 5 min.
KUBELET_BACKOFF_S = 10.0
KUBELET_BACKOFF_MAX_S = 300.0
# KubeRay's Secret key for the token (utils.RAY_AUTH_TOKEN_SECRET_KEY).
RAY_TOKEN_KEY = "auth_token"
# The cluster autoscaler's ProvisioningRequest API (queued provisioning).
PROVISIONING_GV = "autoscaling.x-k8s.io/v1"
DEFAULT_STUCK_MESSAGE = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available."
# Ray's ports, one free port each: two heads on one machine would otherwise collide on Ray's defaults.
PORT_FLAGS = (
    "--port",
    "--dashboard-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
)
# A worker node's own fixed-default ports; its GCS, node manager and object manager ports are the head's or random.
WORKER_PORT_FLAGS = PORT_FLAGS[3:]
# What `ray start --block` prints once the node has joined.
WORKER_STARTED = "Ray runtime started."
# killed: a host that dies; frozen: one that hangs; preempted: a Spot VM reclaimed (SIGTERM, then SIGKILL after its
# notice); ended: a flex-start VM at its maxRunDuration (the same, with no notice asked for).
NODE_LOSS_MODES = ("killed", "frozen", "preempted", "ended")
# GKE's notice before a Spot VM goes (Compute Engine preemption: 30 s).
PREEMPTION_NOTICE_S = 30.0
NODE_LOST_MESSAGE = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. The node pool is replacing a lost node."


@dataclass
class WorkerNode:
    """One worker pod's local Ray worker node."""

    pod: str
    process: asyncio.subprocess.Process | None = None
    log_path: str = ""
    temp_dir: str = ""
    ready: bool = False
    # "killed" or "frozen" once the node is lost ("" : it is not).
    lost: str = ""
    # How its Ray container last crashed while starting, and how often the kubelet restarted it.
    crash: str = ""
    restarts: int = 0

    @property
    def pid(self) -> int | None:
        """The PID of its ``ray start --block`` (the leader of its process group)."""
        return self.process.pid if self.process is not None else None


@dataclass
class NodeLoss:
    """One node loss: asked for, done, and replaced (the admin API's record of it)."""

    id: str
    raycluster: str
    namespace: str
    mode: str
    replace_after_s: float
    after_save: int | None
    state: str = "armed"
    worker_pod: str = ""
    replacement_pod: str = ""
    lost_at: float | None = None
    replaced_at: float | None = None
    # preempted: seconds between SIGTERM and SIGKILL; the pod it must hit ("": the first ready worker).
    notice_s: float = 0.0
    pod: str = ""

    def to_json(self) -> dict[str, Any]:
        """The admin API's view of it."""
        return dataclasses.asdict(self)


@dataclass
class RayHead:
    """One RayCluster's local Ray: its process, ports, temp dir and log."""

    cluster_id: str
    namespace: str
    name: str
    head_pod: str
    worker_pods: list[str]
    process: asyncio.subprocess.Process | None = None
    dashboard_port: int = 0
    temp_dir: str = ""
    log_path: str = ""
    data_dir: str = ""
    # The Ray token when the RayCluster asked for token auth ("" : none); never logged or shown in the inventory.
    token: str = field(default="", repr=False)
    ready: bool = False
    # Why the head pod is not ready after it was started ("" : it is, or it has not started yet).
    problem: str = ""
    stopping: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # The Ray GPUs each worker node advertises (the worker template's nvidia.com/gpu limit), and the head's GCS port.
    gpus_per_worker: int = 0
    gcs_port: int = 0
    env: dict[str, str] = field(default_factory=dict, repr=False)
    workers: dict[str, WorkerNode] = field(default_factory=dict)
    losses: list[NodeLoss] = field(default_factory=list)
    # KubeRay's AllPodRunningAndReadyFirstTime: once true, it stays true.
    provisioned: bool = False
    cluster: KubeCluster | None = field(default=None, repr=False)
    # The first worker group's pod template: what a queued pool's autoscaler reads off each worker pod.
    worker_template: dict[str, Any] = field(default_factory=dict, repr=False)
    # Each worker pod's group (groupName): its pod template, and its replacement's after a node loss.
    groups: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def pid(self) -> int | None:
        """The PID of ``ray start --block`` (the leader of the Ray process group)."""
        return self.process.pid if self.process is not None else None

    @property
    def ready_workers(self) -> int:
        """Worker pods whose Ray node has joined and is not lost."""
        return sum(1 for pod in self.worker_pods if (w := self.workers.get(pod)) is not None and w.ready)

    def to_json(self) -> dict[str, Any]:
        """The admin inventory entry."""
        return {
            "cluster_id": self.cluster_id,
            "namespace": self.namespace,
            "raycluster": self.name,
            "pid": self.pid,
            "dashboard": f"http://{HOST}:{self.dashboard_port}" if self.dashboard_port else None,
            "ready": self.ready,
            "workers": [
                {"pod": pod, "pid": w.pid if w else None, "ready": bool(w and w.ready)}
                for pod in self.worker_pods
                for w in [self.workers.get(pod)]
            ],
            "node_losses": [loss.to_json() for loss in self.losses],
            "problem": self.problem,
            "data_dir": self.data_dir,
            "log": self.log_path,
            # Where Ray writes each job's driver log (job-driver-<submission id>.log), for benches that time steps.
            "driver_logs": str(Path(self.temp_dir) / "session_latest" / "logs") if self.temp_dir else None,
        }


class KubeRay:
    """The RayCluster controller of every sandbox cluster."""

    def __init__(self, store: Store, state_dir: Path) -> None:
        self.store = store
        self.state_dir = state_dir
        self.heads: dict[tuple[str, str, str], RayHead] = {}
        # Every node loss asked for, kept after its RayCluster is gone (the admin API lists them).
        self.losses: list[NodeLoss] = []
        # Whether a worker pod's node comes: the GPU pool's capacity (reservation, flex-start, Spot, on-demand).
        self.capacity = CapacityModel(store)

    # --- called by the API ----------------------------------------------------------------------------------------
    def created(self, cluster: KubeCluster, obj: dict[str, Any], stuck_message: str | None) -> None:
        """A RayCluster was created: make its pods and start reconciling it."""
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        suffix = secrets.token_hex(3)[:5]
        workers, groups = [], {}
        for group in (obj.get("spec") or {}).get("workerGroupSpecs") or []:
            for n in range(int(group.get("replicas") or 0)):
                workers.append(f"{name}-{group.get('groupName', 'workers')}-worker-{suffix}{n}")
                groups[workers[-1]] = str(group.get("groupName", "workers"))
        head = RayHead(cluster.cluster_id, namespace, name, f"{name}-head-{suffix}", workers, groups=groups)
        head.gpus_per_worker = _worker_gpus(obj)
        head.worker_template = next(
            (g.get("template") or {} for g in (obj.get("spec") or {}).get("workerGroupSpecs") or []), {}
        )
        head.cluster = cluster
        self.heads[(cluster.cluster_id, namespace, name)] = head
        if ((obj.get("spec") or {}).get("authOptions") or {}).get("mode") == "token":
            head.token = self._token_secret(cluster, head, meta)
        for pod in [head.head_pod, *workers]:
            self._new_pod(cluster, head, pod, "head" if pod == head.head_pod else "worker", meta.get("labels"))
        self._set_conditions(cluster, head, head_ready=False, reason="HeadPodNotReady")
        task = asyncio.get_running_loop().create_task(self._reconcile(cluster, head, stuck_message))
        head.tasks.append(task)

    def _token_secret(self, cluster: KubeCluster, head: RayHead, meta: dict[str, Any]) -> str:
        """KubeRay's token Secret for a RayCluster with token auth: the existing one's token, or a new one."""
        name = check_name(head.name)
        existing = cluster.get("v1", "secrets", head.namespace, name)
        if existing is not None:
            return base64.b64decode(existing.get("data", {}).get(RAY_TOKEN_KEY, "")).decode()
        token = secrets.token_urlsafe(32)
        body = {
            "metadata": {
                "labels": {"ray.io/cluster": head.name},
                "ownerReferences": [
                    {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": head.name, "uid": meta.get("uid", "")}
                ],
            },
            "type": "Opaque",
            "data": {RAY_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
        }
        cluster.put("v1", "secrets", cluster.new_object("v1", "Secret", name, head.namespace, body))
        return token

    def deleting(self, cluster: KubeCluster, obj: dict[str, Any]) -> None:
        """A RayCluster was deleted: stop its Ray, then remove its pods, service and the object itself."""
        head = self.heads.get((cluster.cluster_id, obj["metadata"]["namespace"], obj["metadata"]["name"]))
        task = asyncio.get_running_loop().create_task(self._finalize(cluster, head, obj))
        if head is not None:
            head.tasks.append(task)

    def drop_cluster(self, cluster_id: str) -> None:
        """The GKE cluster is gone: stop every Ray it had (in the background; the inventory shows them until then)."""
        loop = asyncio.get_running_loop()
        for key, head in list(self.heads.items()):
            if head.cluster_id == cluster_id:
                head.tasks.append(loop.create_task(self._stop_and_forget(key, head)))

    def backend(self, cluster: KubeCluster, service: dict[str, Any], port: str) -> str | None:
        """The local URL behind ``service:port``, when it is a ready head service's dashboard port."""
        for head in self.heads.values():
            if (
                head.cluster_id == cluster.cluster_id
                and service["metadata"]["name"] == f"{head.name}-head-svc"
                and service["metadata"].get("namespace") == head.namespace
                and port in (DASHBOARD_PORT, "dashboard")
                and head.ready
            ):
                return f"http://{HOST}:{head.dashboard_port}"
        return None

    def ray_log(self, cluster: KubeCluster, namespace: str, pod: str) -> tuple[Path | None, Callable[[], bool]]:
        """What the pod's Ray container writes to its stdout: the output of its ``ray start --block`` (the head's for
        the head pod, the worker node's for a worker pod: what KubeRay's generated container command prints), and a
        check that says whether that container still runs (a followed log ends when it stops). (None, ...) when no
        Ray process was started for the pod (yet)."""
        for head in self.heads.values():
            if head.cluster_id != cluster.cluster_id or head.namespace != namespace:
                continue
            if pod == head.head_pod and head.log_path:
                return Path(head.log_path), functools.partial(_runs, head, None)
            worker = head.workers.get(pod)
            if worker is not None and worker.log_path:
                return Path(worker.log_path), functools.partial(_runs, head, worker)
        return None, lambda: False

    def inventory(self) -> list[dict[str, Any]]:
        """Every Ray head the sandbox runs (or is stopping)."""
        return [head.to_json() for head in self.heads.values()]

    async def shutdown(self) -> None:
        """Stop every Ray (the sandbox is stopping)."""
        await asyncio.gather(*(self._stop_and_forget(key, head) for key, head in list(self.heads.items())))

    # --- reconciling ------------------------------------------------------------------------------------------------
    async def _reconcile(self, cluster: KubeCluster, head: RayHead, stuck_message: str | None) -> None:
        try:
            if stuck_message is not None:
                # The injected fault: the head pod can never be scheduled, as on a cluster without capacity.
                self._pending(cluster, head, "Unschedulable", stuck_message or DEFAULT_STUCK_MESSAGE)
                return
            while not head.stopping:
                data_dir, problem = self._data_dir(cluster, head)
                if data_dir is not None:
                    break
                self._pending(cluster, head, "Unschedulable", problem)
                await asyncio.sleep(1.0)
            if head.stopping:
                return
            head.data_dir = str(data_dir)
            await self._start(head)
            # The workers join as soon as the head's GCS listens, while its dashboard is still starting.
            loop = asyncio.get_running_loop()
            for pod in list(head.worker_pods):
                head.tasks.append(loop.create_task(self._run_worker(cluster, head, pod)))
            if await self._wait_dashboard(head):
                self._running(cluster, head)
                head.tasks.append(loop.create_task(self._watch(cluster, head)))
            elif not head.stopping:
                self._crashed(cluster, head, "the Ray dashboard did not answer in time")
        except Exception:
            log.exception("reconciling RayCluster %s failed", head.name)
            self._crashed(cluster, head, "the sandbox's KubeRay emulation failed (see the sandbox log)")

    def _data_dir(self, cluster: KubeCluster, head: RayHead) -> tuple[Path | None, str]:
        """The local directory behind the head pod's PVC volume (its Lustre instance), or why there is none."""
        obj = cluster.get("ray.io/v1", "rayclusters", head.namespace, head.name)
        if obj is None:
            return None, "the RayCluster is gone"
        template = obj.get("spec", {}).get("headGroupSpec", {}).get("template", {}).get("spec", {})
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in template.get("volumes") or []
            if isinstance(v.get("persistentVolumeClaim"), dict)
        ]
        if not claims:
            return Path(tempfile.gettempdir()), ""
        claim = cluster.get("v1", "persistentvolumeclaims", head.namespace, claims[0])
        if claim is None:
            return None, f'persistentvolumeclaim "{claims[0]}" not found'
        volume_name = (claim.get("spec") or {}).get("volumeName")
        volume = cluster.get("v1", "persistentvolumes", None, volume_name or "")
        if volume is None:
            return None, f'0/1 nodes are available: persistentvolume "{volume_name}" not found.'
        handle = ((volume.get("spec") or {}).get("csi") or {}).get("volumeHandle", "")
        project, _, rest = handle.partition("/")
        zone, _, instance = rest.partition("/")
        lustre = self.store.get(f"projects/{project}/locations/{zone}/instances/{instance}")
        if lustre is None or lustre.phase != "ready":
            return None, f"MountVolume.SetUp failed for volume {volume_name!r}: Lustre instance {handle} is not ready"
        return Path(lustre.extra["data_dir"]), ""

    async def _start(self, head: RayHead) -> None:
        ports = free_ports(len(PORT_FLAGS))
        head.gcs_port, head.dashboard_port = ports[0], ports[1]
        # Ray's socket paths must stay under 108 bytes, so the temp dir is short and not under the state dir.
        head.temp_dir = tempfile.mkdtemp(prefix="sbray-")
        head.log_path = str(self.state_dir / "ray" / f"{head.cluster_id}-{head.namespace}-{head.name}.log")
        Path(head.log_path).parent.mkdir(parents=True, exist_ok=True)
        ray = Path(sys.executable).parent / "ray"
        port_args = [f"{flag}={port}" for flag, port in zip(PORT_FLAGS, ports, strict=True)]
        args = [str(ray), "start", "--head", "--block", *port_args]
        args += [
            "--min-worker-port=0",
            "--max-worker-port=0",
            f"--node-ip-address={HOST}",
            f"--dashboard-host={HOST}",
            f"--temp-dir={head.temp_dir}",
            "--num-cpus=2",
            # The head gets no GPU (the manifest's head limit is 0): GPU work can only land on the workers.
            "--num-gpus=0",
            "--object-store-memory=200000000",
            "--include-dashboard=true",
            "--disable-usage-stats",
        ]
        # Jobs run `python` from PATH, as in the NeMo RL image: here, the sandbox's own interpreter (it has torch).
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {
            **os.environ,
            "PATH": path,
            "SANDBOX_DATA_DIR": head.data_dir,
            "RAY_USAGE_STATS_ENABLED": "0",
            # No idle workers started ahead: the jobs here start their own processes (the local trainer is one), so
            # prestarted ones only took CPU from the small machines the sandbox runs on (two per head here).
            "RAY_enable_worker_prestart": "0",
            # Loopback only (see the module docstring): without it ray start binds to the machine's own address.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "TMPDIR": _pod_tmp(head.temp_dir),
        }
        for variable in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(variable, None)
        if head.token:
            # What KubeRay sets on every Ray container of a RayCluster with authOptions {mode: token}.
            env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": head.token})
        head.env = env
        with open(head.log_path, "ab") as out:
            head.process = await asyncio.create_subprocess_exec(
                *args, stdout=out, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
            )
        log.info("RayCluster %s: ray start pid %s, dashboard port %s", head.name, head.pid, head.dashboard_port)

    async def _wait_dashboard(self, head: RayHead) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S
        url = f"http://{HOST}:{head.dashboard_port}/api/version"
        headers = {"Authorization": f"Bearer {head.token}"} if head.token else {}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() < deadline and not head.stopping:
                if head.process is not None and head.process.returncode is not None:
                    return False
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with session.get(url, headers=headers) as response:
                        if response.status == 200:
                            return True
                # Ray's dashboard comes up about 5 s after `ray start`: a short poll adds little to that.
                await asyncio.sleep(0.1)
        return False

    async def _watch(self, cluster: KubeCluster, head: RayHead) -> None:
        """A Ray that exits on its own is a crashed head pod."""
        assert head.process is not None
        code = await head.process.wait()
        if not head.stopping:
            self._crashed(cluster, head, f"ray start exited with code {code}")

    # --- worker nodes -----------------------------------------------------------------------------------------------
    async def _run_worker(self, cluster: KubeCluster, head: RayHead, pod: str) -> None:
        """Start the worker node of ``pod`` once the head's GCS listens, and mark the pod Running when it joined."""
        try:
            if not await _wait_port(head.gcs_port, lambda: head.stopping):
                return
            if not await self._node_for(cluster, head, pod):
                return
            worker = WorkerNode(pod)
            head.workers[pod] = worker
            while not await self._start_worker(head, worker):
                # The Ray container crashed while starting (on a loaded host Ray's own startup can time out): the
                # kubelet restarts it after its back-off (restartPolicy Always), as it would on GKE.
                worker.restarts += 1
                delay = kubelet_backoff_s(worker.restarts)
                self._worker_crashed(cluster, head, worker, delay)
                log.warning("RayCluster %s: worker %s %s; restarting in %.0f s", head.name, pod, worker.crash, delay)
                await asyncio.sleep(delay)
                shutil.rmtree(worker.temp_dir, ignore_errors=True)
                if head.stopping or worker.lost or pod not in head.worker_pods:
                    return
            if head.stopping or worker.lost:
                return
            worker.ready = True
            self._pod_running(cluster, head, pod, worker.restarts)
            self._set_conditions(cluster, head, head_ready=head.ready, reason=_head_reason(head))
            ends_at = self.capacity.ends_at(pod)
            if ends_at is not None:
                head.tasks.append(asyncio.get_running_loop().create_task(self._end_at(head, pod, ends_at)))
        except Exception:
            log.exception("starting worker %s of RayCluster %s failed", pod, head.name)

    async def _start_worker(self, head: RayHead, worker: WorkerNode) -> bool:
        """Start ``worker``'s ``ray start`` and wait until it joined the head (True; also when the RayCluster or the
        node went meanwhile) or exited first (False, ``worker.crash`` says how)."""
        pod = worker.pod
        ports = free_ports(len(WORKER_PORT_FLAGS))
        port_args = [f"{flag}={port}" for flag, port in zip(WORKER_PORT_FLAGS, ports, strict=True)]
        worker.log_path = str(Path(head.log_path).with_suffix(f".{pod}.log"))
        # Its own session dir: two nodes starting at once in the head's would race for the same socket names.
        worker.temp_dir = tempfile.mkdtemp(prefix="sbrw-")
        # As a module: run as a script, its directory would lead sys.path and sandbox/http.py hide the stdlib's.
        args = [sys.executable, "-m", "sandbox.ray_node", "start", "--block"]
        args += [
            f"--address={HOST}:{head.gcs_port}",
            f"--node-ip-address={HOST}",
            "--num-cpus=1",
            f"--num-gpus={head.gpus_per_worker}",
            "--object-store-memory=100000000",
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--disable-usage-stats",
            f"--temp-dir={worker.temp_dir}",
            *port_args,
        ]
        env = _with_sandbox_path({**head.env, "TMPDIR": _pod_tmp(worker.temp_dir)})  # the worker pod's own /tmp
        with open(worker.log_path, "ab") as out:
            worker.process = await asyncio.create_subprocess_exec(
                *args, stdout=out, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
            )
        log.info("RayCluster %s: worker %s ray start pid %s", head.name, pod, worker.pid)
        while not head.stopping and not worker.lost:
            if worker.process.returncode is not None:
                worker.crash = f"ray start exited with code {worker.process.returncode}"
                return False
            if WORKER_STARTED in Path(worker.log_path).read_text(errors="replace"):
                break
            await asyncio.sleep(0.1)
        return True

    async def _node_for(self, cluster: KubeCluster, head: RayHead, pod: str) -> bool:
        """Wait until the GPU pool's capacity gives ``pod`` a node (False: the RayCluster or the pod went first).
        Meanwhile the pod is Pending with the scheduler's and the autoscaler's words for why."""
        said = ""
        while not head.stopping and pod in head.worker_pods:
            claim = _claim(cluster, head)
            answer = self.capacity.request(cluster.cluster_key, pod, time.time(), claim)
            if answer.provisioned is not None and claim.request is not None:
                _provisioning_status(cluster, claim.request, answer.provisioned)
            if answer.granted:
                return True
            if answer.message != said:
                self._pending_pod(cluster, head, pod, answer.reason, answer.message)
                said = answer.message
            await asyncio.sleep(0.25)
        return False

    async def _end_at(self, head: RayHead, pod: str, ends_at: float) -> None:
        """A flex-start node's maxRunDuration: GKE removes the VM then, whatever runs on it."""
        await asyncio.sleep(max(0.0, ends_at - time.time()))
        worker = head.workers.get(pod)
        if head.stopping or worker is None or not worker.ready or head.cluster is None:
            return
        loss = NodeLoss(secrets.token_hex(4), head.name, head.namespace, "ended", 0.0, None, pod=pod)
        head.losses.append(loss)
        self.losses.append(loss)
        await self._lose(head.cluster, head, loss)

    def lose_node(
        self,
        raycluster: str,
        namespace: str | None,
        mode: str,
        replace_after_s: float,
        after_save: int | None,
        *,
        notice_s: float = PREEMPTION_NOTICE_S,
    ) -> NodeLoss:
        """Lose one worker node of ``raycluster`` now, or as soon as the checkpoint ``step_{after_save}`` is saved on
        its Lustre volume (``/data/step_N`` or ``/data/<dir>/step_N``). ``preempted`` (SIGTERM, SIGKILL ``notice_s``
        later) only happens to a Spot node, as Compute Engine preempts only Spot VMs.

        Raises LookupError (no such RayCluster, or no worker) or ValueError (a bad argument)."""
        if mode not in NODE_LOSS_MODES:
            raise ValueError(f"mode must be one of {', '.join(NODE_LOSS_MODES)}, got {mode!r}")
        if replace_after_s < 0 or notice_s < 0:
            raise ValueError(f"replace_after_s and notice_s must be >= 0, got {replace_after_s!r}, {notice_s!r}")
        heads = [
            h
            for h in self.heads.values()
            if h.name == raycluster and namespace in (None, h.namespace) and not h.stopping
        ]
        if not heads:
            raise LookupError(f"no running RayCluster {raycluster!r}")
        head = heads[0]
        if not head.worker_pods:
            raise LookupError(f"RayCluster {raycluster!r} has no worker pods")
        if mode == "preempted":
            kinds = {self.capacity.capacity_of(pod) for pod in head.worker_pods} - {None}
            if kinds and kinds != {"spot"}:
                raise ValueError(f"only Spot VMs are preempted; the workers of {raycluster!r} run on {sorted(kinds)}")
        loss = NodeLoss(
            secrets.token_hex(4), head.name, head.namespace, mode, float(replace_after_s), after_save,
            notice_s=float(notice_s) if mode == "preempted" else 0.0,
        )  # fmt: skip
        head.losses.append(loss)
        self.losses.append(loss)
        assert head.cluster is not None
        head.tasks.append(asyncio.get_running_loop().create_task(self._lose(head.cluster, head, loss)))
        return loss

    def node_losses(self) -> list[dict[str, Any]]:
        """Every node loss asked for, in order."""
        return [loss.to_json() for loss in self.losses]

    async def _lose(self, cluster: KubeCluster, head: RayHead, loss: NodeLoss) -> None:
        try:
            if loss.after_save is not None:
                # The checkpoint directory appears when its save finished (tmp_step_N is renamed to step_N).
                data = Path(head.data_dir)
                names = (f"step_{loss.after_save}", f"*/step_{loss.after_save}")
                while not head.stopping and not any(next(data.glob(name), None) for name in names):
                    await asyncio.sleep(0.02)

            def ready_pods() -> list[str]:
                found = [p for p in head.worker_pods if (w := head.workers.get(p)) is not None and w.ready]
                return [p for p in found if p == loss.pod] if loss.pod else found

            ready = ready_pods()
            while not ready and not head.stopping:
                await asyncio.sleep(0.1)
                ready = ready_pods()
            if head.stopping:
                loss.state = "cancelled"
                return
            pod = ready[0]
            worker = head.workers[pod]
            worker.lost, worker.ready = loss.mode, False
            await _take_down(worker, loss)
            self.capacity.release(pod, requeue=loss.mode == "ended")
            loss.state, loss.worker_pod, loss.lost_at = "lost", pod, time.time()
            log.info("RayCluster %s: worker node of %s %s", head.name, pod, loss.mode)
            # The node is gone with its pod; KubeRay's replacement pod waits for a node.
            replacement = f"{pod.rsplit('-', 1)[0]}-{secrets.token_hex(3)[:5]}"
            loss.replacement_pod = replacement
            head.worker_pods[head.worker_pods.index(pod)] = replacement
            head.groups[replacement] = head.groups.get(pod, "")
            cluster.remove("v1", "pods", head.namespace, pod)
            self._new_pod(cluster, head, replacement, "worker")
            self._pending_pod(cluster, head, replacement, "Unschedulable", NODE_LOST_MESSAGE)
            self._set_conditions(cluster, head, head_ready=head.ready, reason=_head_reason(head))
            await asyncio.sleep(loss.replace_after_s)
            if worker.lost == "frozen":
                _signal_group(worker.process, signal.SIGKILL)  # the hung VM is deleted and recreated
            if worker.process is not None and worker.process.returncode is None:
                await worker.process.wait()
            head.workers.pop(pod, None)
            shutil.rmtree(worker.temp_dir, ignore_errors=True)
            if head.stopping:
                return
            loss.state, loss.replaced_at = "replaced", time.time()
            await self._run_worker(cluster, head, replacement)
        except Exception:
            log.exception("losing a node of RayCluster %s failed", head.name)

    def _worker_crashed(self, cluster: KubeCluster, head: RayHead, worker: WorkerNode, delay_s: float) -> None:
        """The worker pod's Ray container in CrashLoopBackOff until its restart, with the kubelet's event."""
        obj = cluster.get("v1", "pods", head.namespace, worker.pod)
        if obj is not None:
            obj["status"] = _crash_status(worker.crash, obj, worker.restarts)
            cluster.put("v1", "pods", obj)
        ray = _containers(obj)[0][0] if obj is not None else RAY_CONTAINER
        message = f"Back-off {delay_s:.0f}s restarting failed container={ray}"
        self._event(cluster, head, "BackOff", message, pod=worker.pod)
        self._set_conditions(cluster, head, head_ready=head.ready, reason=_head_reason(head))

    # --- status -----------------------------------------------------------------------------------------------------
    def _new_pod(
        self, cluster: KubeCluster, head: RayHead, pod: str, role: str, labels: dict[str, str] | None = None
    ) -> None:
        """A pod of the RayCluster, Pending, made from its group's pod template (its containers, a sidecar too, and
        the rest of its spec), labelled as KubeRay's ``labelPod`` labels it: its own labels, the template's and (the
        sandbox's addition, which the run's ownership checks read) the RayCluster's, never overriding the cluster,
        node-type and group labels (kuberay v1.5.1 ``ray-operator/controllers/ray/common/pod.go:677-701``)."""
        obj = cluster.get("ray.io/v1", "rayclusters", head.namespace, head.name) or {"metadata": {}}
        if labels is None:
            labels = obj["metadata"].get("labels") or {}
        group = "headgroup" if role == "head" else head.groups.get(pod, "")
        template = _pod_template(obj, None if role == "head" else group)
        fixed = {"ray.io/cluster": head.name, "ray.io/node-type": role, "ray.io/group": group}
        overrides = {**((template.get("metadata") or {}).get("labels") or {}), **labels}
        pod_labels = {
            "ray.io/is-ray-node": "yes",
            "ray.io/identifier": f"{head.name}-{role}"[-63:],
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
            **{k: str(v) for k, v in overrides.items() if k not in fixed},
            **fixed,
        }
        spec = copy.deepcopy(template.get("spec") or {})
        if not spec.get("containers"):
            # A template without containers (KubeRay's webhook refuses one): the pod still has its Ray container.
            spec["containers"] = [{"name": RAY_CONTAINER}]
        body = {
            "metadata": {
                "labels": pod_labels,
                "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "ray.io/v1",
                        "kind": "RayCluster",
                        "name": head.name,
                        "uid": obj["metadata"].get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        body["status"] = _pending_status("ContainerCreating", "", body)
        cluster.put("v1", "pods", cluster.new_object("v1", "Pod", pod, head.namespace, body))

    def _pending_pod(self, cluster: KubeCluster, head: RayHead, pod: str, reason: str, message: str) -> None:
        obj = cluster.get("v1", "pods", head.namespace, pod)
        if obj is not None:
            obj["status"] = _pending_status(reason, message, obj)
            cluster.put("v1", "pods", obj)
            self._event(cluster, head, "FailedScheduling" if reason == "Unschedulable" else reason, message, pod)

    def _pod_running(self, cluster: KubeCluster, head: RayHead, pod_name: str, restarts: int = 0) -> None:
        """The pod is on its node (the one :mod:`sandbox.kube_nodes` lists for it) with every container running, the
        Ray container after ``restarts`` restarts by the kubelet."""
        pod = cluster.get("v1", "pods", head.namespace, pod_name)
        if pod is not None:
            node = kube_nodes.pod_node(self.store, self.capacity, cluster.cluster_key, pod_name)
            if node:
                pod.setdefault("spec", {})["nodeName"] = node
            started = formats.kube_time(time.time())
            pod["status"] = {
                "phase": "Running",
                "hostIP": kube_nodes.NODE_IP,
                "podIP": HOST,
                "podIPs": [{"ip": HOST}],
                "startTime": pod["metadata"].get("creationTimestamp", started),
                "conditions": [
                    {"type": kind, "status": "True"}
                    for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
                ],
                "containerStatuses": [
                    {
                        "name": name,
                        "ready": True,
                        "started": True,
                        "restartCount": restarts if index == 0 else 0,
                        "image": image,
                        "state": {"running": {"startedAt": started}},
                    }
                    for index, (name, image) in enumerate(_containers(pod))
                ],
            }
            cluster.put("v1", "pods", pod)

    def _pending(self, cluster: KubeCluster, head: RayHead, reason: str, message: str) -> None:
        pod = cluster.get("v1", "pods", head.namespace, head.head_pod)
        if pod is None:
            return
        status = _pending_status(reason, message, pod)
        if pod.get("status") != status:
            pod["status"] = status
            cluster.put("v1", "pods", pod)
            self._event(cluster, head, "FailedScheduling" if reason == "Unschedulable" else reason, message)

    def _running(self, cluster: KubeCluster, head: RayHead) -> None:
        head.ready = True
        self._pod_running(cluster, head, head.head_pod)
        service = cluster.new_object(
            "v1",
            "Service",
            f"{head.name}-head-svc",
            head.namespace,
            {
                "metadata": {"labels": {"ray.io/cluster": head.name}},
                "spec": {
                    "selector": {"ray.io/cluster": head.name, "ray.io/node-type": "head"},
                    "ports": [
                        {"name": "dashboard", "port": int(DASHBOARD_PORT)},
                        {"name": "gcs-server", "port": 6379},
                        {"name": "client", "port": 10001},
                    ],
                },
            },
        )
        cluster.put("v1", "services", service)
        self._set_conditions(cluster, head, head_ready=True, reason=_head_reason(head))

    def _crashed(self, cluster: KubeCluster, head: RayHead, message: str) -> None:
        head.ready = False
        head.problem = message
        pod = cluster.get("v1", "pods", head.namespace, head.head_pod)
        if pod is not None:
            pod["status"] = _crash_status(message, pod)
            cluster.put("v1", "pods", pod)
            ray = _containers(pod)[0][0]
            self._event(cluster, head, "BackOff", f"Back-off restarting failed container {ray}: {message}")
        self._set_conditions(cluster, head, head_ready=False, reason="HeadPodNotReady")

    def _set_conditions(self, cluster: KubeCluster, head: RayHead, *, head_ready: bool, reason: str) -> None:
        obj = cluster.get("ray.io/v1", "rayclusters", head.namespace, head.name)
        if obj is None:
            return
        now = formats.kube_time(time.time())
        status = "True" if head_ready else "False"
        was_provisioned = head.provisioned
        all_ready = head_ready and head.ready_workers == len(head.worker_pods)
        head.provisioned = was_provisioned or all_ready
        desired = desired_resources(obj)
        obj["status"] = {
            # state is deprecated (kuberay #2188) but kept, as KubeRay still sets it; omitempty drops it until ready.
            **({"state": "ready"} if all_ready else {}),
            "desiredWorkerReplicas": len(head.worker_pods),
            "readyWorkerReplicas": head.ready_workers,
            "availableWorkerReplicas": head.ready_workers,
            # KubeRay's CalculateDesiredResources (raycluster_controller.go:1510-1514): resource.Quantity fields
            # have no omitempty effect, so a zero sum is "0".
            "desiredCPU": desired.get("cpu", "0"),
            "desiredMemory": desired.get("memory", "0"),
            "desiredGPU": desired.get("gpu", "0"),
            "desiredTPU": desired.get("google.com/tpu", "0"),
            "head": {"podName": head.head_pod, **({"podIP": HOST} if head_ready else {}), "serviceIP": HOST},
            "conditions": [
                {"type": "HeadPodReady", "status": status, "reason": reason, "lastTransitionTime": now},
                {
                    "type": "RayClusterProvisioned",
                    "status": "True" if head.provisioned else "False",
                    "reason": "AllPodRunningAndReadyFirstTime" if head.provisioned else "RayClusterPodsProvisioning",
                    "lastTransitionTime": now,
                },
            ],
        }
        if not self.store.config.kuberay_conditions:
            # KubeRay 1.2 without the RayClusterStatusConditions gate reports no conditions (FACTS §19).
            del obj["status"]["conditions"]
        cluster.put("ray.io/v1", "rayclusters", obj)

    def _event(self, cluster: KubeCluster, head: RayHead, reason: str, message: str, pod: str = "") -> None:
        pod = pod or head.head_pod
        name = f"{pod}.{secrets.token_hex(8)}"
        body = {
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": head.namespace},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "count": 1,
            "lastTimestamp": formats.kube_time(time.time()),
        }
        cluster.put("v1", "events", cluster.new_object("v1", "Event", name, head.namespace, body))

    # --- stopping ---------------------------------------------------------------------------------------------------
    async def _finalize(self, cluster: KubeCluster, head: RayHead | None, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if head is not None:
            await self._stop_and_forget((cluster.cluster_id, head.namespace, head.name), head)
            for pod in [head.head_pod, *head.worker_pods]:
                cluster.remove("v1", "pods", head.namespace, pod)
                self.capacity.release(pod)
            cluster.remove("v1", "services", head.namespace, f"{head.name}-head-svc")
        # The token Secret is owned by the RayCluster: Kubernetes' garbage collector removes it with it.
        cluster.remove("v1", "secrets", meta["namespace"], check_name(meta["name"]))
        cluster.remove("ray.io/v1", "rayclusters", meta["namespace"], meta["name"])

    async def _stop_and_forget(self, key: tuple[str, str, str], head: RayHead) -> None:
        head.stopping = True
        head.ready = False
        await _stop(head)
        for pod in head.worker_pods:
            self.capacity.release(pod)
        for task in head.tasks:
            if task is not asyncio.current_task() and not task.done():
                task.cancel()
        self.heads.pop(key, None)


def _runs(head: RayHead, worker: WorkerNode | None) -> bool:
    """Whether the head's (``worker`` None) or the worker node's ``ray start --block`` still runs."""
    node = head if worker is None else worker
    lost = worker is not None and bool(worker.lost)
    return not head.stopping and not lost and node.process is not None and node.process.returncode is None


async def _stop(head: RayHead) -> None:
    """Stop one Ray by its own process group, at once, as a pod whose grace period ran out.

    A SIGTERM first bought nothing: ``ray start --block`` never finished its own stop within a 5 s grace on this
    machine, so every RayCluster delete waited the whole grace and ended in SIGKILL anyway. Nothing reads the head's
    temp dir after the delete, and Lustre's files (the checkpoints) live outside it.
    """
    for process in [head.process, *(w.process for w in head.workers.values())]:
        if process is not None:
            _signal_group(process, signal.SIGKILL)
            if process.returncode is None:
                await process.wait()
    for temp_dir in [head.temp_dir, *(w.temp_dir for w in head.workers.values())]:
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)


async def _take_down(worker: WorkerNode, loss: NodeLoss) -> None:
    """What the loss does to the node's processes: a dead host (SIGKILL), a hung one (SIGSTOP), or a VM shut down
    (SIGTERM, then SIGKILL once its notice is over: a Spot VM's preemption, a flex-start VM's end)."""
    if loss.mode == "frozen":
        _signal_group(worker.process, signal.SIGSTOP)
        return
    if loss.mode != "killed":
        _signal_group(worker.process, signal.SIGTERM)
        if worker.process is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(worker.process.wait()), loss.notice_s)
    _signal_group(worker.process, signal.SIGKILL)
    if worker.process is not None and worker.process.returncode is None:
        await worker.process.wait()  # reaped now: a dead host leaves no zombie that still answers kill(0)


def _signal_group(process: asyncio.subprocess.Process | None, sig: signal.Signals) -> None:
    """Signal every process of a Ray node, as a host that dies (or hangs) takes them all: its process group (the
    raylet and agents) and every descendant, since the raylet puts its workers (the actors) in groups of their own."""
    if process is None:
        return
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.send_signal(sig)


async def _wait_port(port: int, stopping: Callable[[], bool]) -> bool:
    """Wait until 127.0.0.1:``port`` accepts connections (False: gave up, or the head is stopping)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and not stopping():
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(HOST, port)
            writer.close()
            return True
        await asyncio.sleep(0.1)
    return False


def _pod_tmp(temp_dir: str) -> str:
    """A Ray pod's own /tmp (its ``TMPDIR``), inside its node's temp dir: a pod's /tmp goes with the pod. On the
    host's shared one, every RayCluster delete (SIGKILL, see :func:`_stop`) left its dashboard's forkserver socket
    dir (``pymp-*``) behind, and an interrupted save its PyTorch error files (``pytorch-errorfile-*``)."""
    path = Path(temp_dir) / "tmp"
    path.mkdir(exist_ok=True)
    return str(path)


def _with_sandbox_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this package's parent first on PYTHONPATH (for ``python -m sandbox.ray_node``)."""
    root = str(Path(__file__).resolve().parents[1])
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)}


def _claim(cluster: KubeCluster, head: RayHead) -> Claim:
    """The ProvisioningRequest a worker pod consumes (its template's annotation), and whether it tolerates the
    queued nodes' taint."""
    meta = head.worker_template.get("metadata") or {}
    name = str((meta.get("annotations") or {}).get(CONSUME_ANNOTATION) or "")
    tolerations = (head.worker_template.get("spec") or {}).get("tolerations") or []
    tolerates = any(
        (t.get("key") in (QUEUED_TAINT, None, "") and t.get("operator") == "Exists")
        or (t.get("key") == QUEUED_TAINT and t.get("value") == "true")
        for t in tolerations
        if isinstance(t, dict) and t.get("effect") in (None, "", "NoSchedule")
    )
    request = cluster.get(PROVISIONING_GV, "provisioningrequests", head.namespace, name) if name else None
    return Claim(name, request, tolerates)


def _provisioning_status(cluster: KubeCluster, request: dict[str, Any], provisioned: bool) -> None:
    """The cluster autoscaler's conditions on a queued request: Accepted at once, Provisioned once it has capacity."""
    wanted = {"Accepted": "True", "Provisioned": "True" if provisioned else "False"}
    conditions = (request.get("status") or {}).get("conditions") or []
    if {c.get("type"): c.get("status") for c in conditions} == wanted:
        return
    at = formats.kube_time(time.time())
    reasons = {"Accepted": "Accepted", "Provisioned": "Provisioned" if provisioned else "NotProvisioned"}
    request["status"] = {
        "conditions": [
            {"type": kind, "status": status, "reason": reasons[kind], "lastTransitionTime": at, "message": ""}
            for kind, status in wanted.items()
        ]
    }
    cluster.put(PROVISIONING_GV, "provisioningrequests", request)


def _worker_gpus(obj: dict[str, Any]) -> int:
    """The ``nvidia.com/gpu`` limit of the first worker group's first container (0: none)."""
    for group in (obj.get("spec") or {}).get("workerGroupSpecs") or []:
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
        for container in containers[:1]:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0)
            with contextlib.suppress(TypeError, ValueError):
                return max(int(limit), 0)
    return 0


def _head_reason(head: RayHead) -> str:
    return "HeadPodRunningAndReady" if head.ready else "HeadPodNotReady"


def kubelet_backoff_s(restarts: int) -> float:
    """The kubelet's delay before a crashed container's ``restarts``-th restart: 10 s, doubled each time, at most
    5 min (Kubernetes' "Container restarts": CrashLoopBackOff)."""
    return min(KUBELET_BACKOFF_S * 2 ** max(restarts - 1, 0), KUBELET_BACKOFF_MAX_S)


def _crash_status(message: str, pod: dict[str, Any], restarts: int = 1) -> dict[str, Any]:
    """A pod whose Ray container keeps failing (CrashLoopBackOff); its other containers still run."""
    (ray, ray_image), *others = _containers(pod)
    status = copy.deepcopy(pod.get("status") or {})
    return {
        "phase": "Running",
        **{k: status[k] for k in ("hostIP", "podIP", "podIPs", "startTime") if k in status},
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
        "containerStatuses": [
            {
                "name": ray,
                "ready": False,
                "started": False,
                "restartCount": restarts,
                "image": ray_image,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": message}},
            },
            *(
                {"name": name, "ready": True, "started": True, "restartCount": 0, "image": image,
                 "state": {"running": {}}}
                for name, image in others
            ),
        ],
    }  # fmt: skip


RAY_CONTAINER = "ray"


def _pod_template(raycluster: dict[str, Any], group: str | None) -> dict[str, Any]:
    """The head group's pod template (``group`` None), or that worker group's."""
    spec = raycluster.get("spec") or {}
    if group is None:
        return (spec.get("headGroupSpec") or {}).get("template") or {}
    for worker_group in spec.get("workerGroupSpecs") or []:
        if str(worker_group.get("groupName", "workers")) == group:
            return worker_group.get("template") or {}
    return {}


def _containers(pod: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, image) of each container of a pod, Ray's first (KubeRay's ``RayContainerIndex`` 0)."""
    found = [(str(c.get("name", "")), str(c.get("image", ""))) for c in (pod.get("spec") or {}).get("containers") or []]
    return found or [(RAY_CONTAINER, "")]


def container_names(pod: dict[str, Any]) -> list[str]:
    """The names of a pod's containers, in spec order (Ray's first)."""
    return [name for name, _ in _containers(pod)]


QUANTITY = re.compile(r"^([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(text: Any) -> tuple[Decimal, str]:
    """A ``resource.Quantity`` string as (value, format: ``binary`` / ``decimal`` / ``exponent``); ValueError if it is
    not one."""
    found = QUANTITY.match(str(text).strip())
    if found is None:
        raise ValueError(f"quantities must match the regular expression of resource.Quantity: {text!r}")
    number, suffix = Decimal(found.group(1)), found.group(2) or ""
    if suffix in BINARY:
        return number * (2 ** BINARY[suffix]), "binary"
    if suffix in DECIMAL:
        return number * Decimal(10) ** DECIMAL[suffix], "decimal"
    return number * Decimal(10) ** int(suffix[1:]), "exponent"


def format_quantity(value: Decimal, kind: str) -> str:
    """apimachinery ``Quantity.String`` (canonical form): a binary value below 1024 or with a fraction is written in
    decimal SI; otherwise the largest suffix that leaves an integer (``16``, ``1500m``, ``96Gi``)."""
    # Quantities keep at most nanounits: anything finer rounds up, as Quantity.RoundUp(Nano) does.
    value = (value * 10**9).to_integral_value(rounding=ROUND_CEILING) / Decimal(10**9)
    if value == 0:
        return "0"
    if kind == "binary" and abs(value) >= 1024 and value == value.to_integral_value():
        for suffix, power in sorted(BINARY.items(), key=lambda item: -item[1]):
            if value % (2**power) == 0:
                return f"{int(value / 2**power)}{suffix}"
        return str(int(value))
    for suffix, power in sorted(DECIMAL.items(), key=lambda item: -item[1]):
        scaled = value / Decimal(10) ** power
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{suffix if kind != 'exponent' or power == 0 else f'e{power}'}"
    return str(value)


def desired_resources(raycluster: dict[str, Any]) -> dict[str, str]:
    """KubeRay's ``CalculateDesiredResources`` (``utils/util.go:477-549``): per pod, each container's requests, a
    limit standing in for a missing request; the head once and every worker replica (times ``numOfHosts``), groups
    with ``suspend`` left out; GPUs are every resource whose name ends in ``gpu`` (``IsGPUResourceKey``). Returns
    canonical quantity strings by resource name, with ``gpu`` for the GPU sum."""
    spec = raycluster.get("spec") or {}
    pods: list[tuple[dict[str, Any], int]] = [(((spec.get("headGroupSpec") or {}).get("template") or {}), 1)]
    for group in spec.get("workerGroupSpecs") or []:
        if not group.get("suspend"):
            replicas = int(group.get("replicas") or 0) * int(group.get("numOfHosts") or 1)
            pods.append((group.get("template") or {}, replicas))
    totals: dict[str, tuple[Decimal, str]] = {}
    for template, count in pods:
        for container in (template.get("spec") or {}).get("containers") or []:
            resources = container.get("resources") or {}
            wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            for name, text in wanted.items():
                try:
                    value, kind = parse_quantity(text)
                except (ValueError, ArithmeticError):
                    continue  # the API server's validation refuses such a pod; nothing to add up
                total, first_kind = totals.get(name, (Decimal(0), kind))
                totals[name] = (total + value * count, first_kind)
    out = {name: format_quantity(value, kind) for name, (value, kind) in totals.items()}
    gpus = [(v, k) for name, (v, k) in totals.items() if name.endswith("gpu") and v != 0]
    if gpus:
        out["gpu"] = format_quantity(sum((v for v, _ in gpus), Decimal(0)), gpus[0][1])
    return out


def check_name(name: str) -> str:
    """KubeRay's ``utils.CheckName``: the last 50 characters, a leading digit or punctuation replaced by ``r``."""
    name = name[-50:]
    return "r" + name[1:] if name and (name[0].isdigit() or not name[0].isalnum()) else name


def _pending_status(reason: str, message: str, pod: dict[str, Any]) -> dict[str, Any]:
    """A Pending pod: unschedulable (no container has a status yet), or on its node with every container waiting."""
    if reason == "Unschedulable":
        return {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": reason, "message": message}],
        }
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {"name": name, "ready": False, "started": False, "restartCount": 0, "image": image,
             "state": {"waiting": dict(waiting)}}
            for name, image in _containers(pod)
        ],
    }  # fmt: skip
