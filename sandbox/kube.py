"""The Kubernetes API of every GKE cluster the sandbox creates: a generic object store for the kinds a run applies.

Each cluster's API is served over HTTPS on a port of its own on 127.0.0.1, from the moment the cluster runs until it
is gone (and again after a sandbox restart, on the same port when it is free), with a certificate signed by the
cluster's own CA (:mod:`sandbox.tls`). The cluster reports ``endpoint`` ``127.0.0.1:PORT`` and the CA as
``masterAuth.clusterCaCertificate``, as real GKE reports a bare IP and its CA; nothing serves it over plain http.
Served:

- discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/{group}/{version}``) for the kinds in :data:`RESOURCES`;
- get, list (``labelSelector`` in the full grammar, ``fieldSelector`` on the field labels each kind supports:
  :mod:`sandbox.kube_selectors`), create (409 when it
  exists), server-side apply (``PATCH`` with ``application/apply-patch+yaml`` and a ``fieldManager``), delete (404
  when it does not exist), for namespaced and cluster-scoped objects, with a per-cluster ``resourceVersion``;
- the service proxy ``/api/v1/namespaces/{ns}/services/{name}:{port}/proxy/...``, forwarded to the local Ray dashboard
  behind a RayCluster's head service (see :mod:`sandbox.kuberay`).

Errors are Kubernetes ``Status`` objects. Faults match kube paths like any other: a status fault answers the call, and
an ``operation: hang`` fault on a RayCluster apply makes that RayCluster never become ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml
from aiohttp import web

from sandbox import formats, kube_volumes
from sandbox.auth import KUBE_UNAUTHORIZED, Verdict
from sandbox.kube_cluster import KubeCluster, server_metadata
from sandbox.kube_selectors import SelectorError, field_selector, label_selector
from sandbox.tls import HOST, ClusterTls, new_cluster_tls

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandbox.calllog import CallLog
    from sandbox.faults import Faults
    from sandbox.kuberay import KubeRay
    from sandbox.store import Resource, Store

log = logging.getLogger("sandbox.kube")
# Which cluster a listener serves: every request on it is for that cluster's API.
CLUSTER_ID = web.AppKey("cluster_id", str)
# The GKE version the cluster runs (its currentMasterVersion), for ``/version``.
CLUSTER_VERSION = web.AppKey("cluster_version", str)
# A deleted cluster's listener waits this long for requests in flight (a proxied job log) before it closes them.
LISTENER_SHUTDOWN_S = 2.0
APPLY_PATCH = "application/apply-patch+yaml"
# (plural, kind, namespaced) per groupVersion: what a GKE cluster with KubeRay and multi-networking serves for a run.
RESOURCES: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "v1": (
        ("namespaces", "Namespace", False),
        ("serviceaccounts", "ServiceAccount", True),
        ("persistentvolumes", "PersistentVolume", False),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("services", "Service", True),
        ("pods", "Pod", True),
        ("events", "Event", True),
        ("configmaps", "ConfigMap", True),
        ("secrets", "Secret", True),
        ("podtemplates", "PodTemplate", True),
    ),
    # GKE's cluster autoscaler CRD for queued provisioning (kubernetes/autoscaler provisioningrequest API).
    "autoscaling.x-k8s.io/v1": (("provisioningrequests", "ProvisioningRequest", True),),
    "apps/v1": (("daemonsets", "DaemonSet", True),),
    "networking.gke.io/v1": (("gkenetworkparamsets", "GKENetworkParamSet", False), ("networks", "Network", False)),
    "ray.io/v1": (("rayclusters", "RayCluster", True), ("rayjobs", "RayJob", True)),
}
# The short names the API server's discovery gives (kubectl resolves `kubectl get ns` through them): the core and apps
# kinds' registries (pkg/registry/*/storage), for the kinds served here.
SHORT_NAMES: dict[str, list[str]] = {
    "namespaces": ["ns"],
    "serviceaccounts": ["sa"],
    "persistentvolumes": ["pv"],
    "persistentvolumeclaims": ["pvc"],
    "services": ["svc"],
    "pods": ["po"],
    "events": ["ev"],
    "configmaps": ["cm"],
    "daemonsets": ["ds"],
}
BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public")
# Fields the server owns: never taken from an applied object, never compared to decide whether apply changed it.
SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "deletionTimestamp")
HOP_HEADERS = frozenset({"host", "authorization", "content-length", "transfer-encoding", "connection"})


class KubeError(Exception):
    """A Kubernetes API error, answered as a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        """The ``Status`` body (an authentication failure's, like the API server's, has no details)."""
        if self.code == 401:
            return dict(KUBE_UNAUTHORIZED)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def not_found(plural: str, name: str, group: str = "") -> KubeError:
    """404 as the API server words it: ``rayclusters.ray.io "x" not found``."""
    resource = f"{plural}.{group}" if group else plural
    return KubeError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "group": group, "kind": plural})


@dataclass(frozen=True)
class Target:
    """What a request path names: groupVersion, resource type, namespace, name and subresource path."""

    group_version: str
    plural: str
    kind: str
    namespaced: bool
    namespace: str | None
    name: str | None
    sub: tuple[str, ...] = ()

    @property
    def group(self) -> str:
        """The API group ('' for the core group)."""
        return self.group_version.rpartition("/")[0]


def _kind_table() -> dict[tuple[str, str], tuple[str, bool]]:
    return {(gv, plural): (kind, ns) for gv, items in RESOURCES.items() for plural, kind, ns in items}


KINDS = _kind_table()


def parse_path(path: str) -> list[str]:
    """A request path's non-empty segments."""
    return [p for p in path.split("/") if p != ""]


def resolve(segments: list[str]) -> Target | dict[str, Any]:
    """A resource path as a :class:`Target`, or the discovery document it names."""
    if segments == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if segments == ["apis"]:
        groups = [gv for gv in RESOURCES if "/" in gv]
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": gv.split("/")[0],
                    "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                    "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
                }
                for gv in groups
            ],
        }
    if segments[:1] == ["api"] and len(segments) >= 2:
        gv, rest = segments[1], segments[2:]
    elif segments[:1] == ["apis"] and len(segments) >= 3:
        gv, rest = f"{segments[1]}/{segments[2]}", segments[3:]
    else:
        raise KubeError(404, "NotFound", "the server could not find the requested resource")
    if gv not in RESOURCES:
        raise KubeError(404, "NotFound", f"the server could not find the requested resource (groupVersion {gv})")
    if not rest:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": [
                {
                    "name": plural,
                    "singularName": kind.lower(),
                    "namespaced": ns,
                    "kind": kind,
                    "verbs": VERBS,
                    **({"shortNames": SHORT_NAMES[plural]} if plural in SHORT_NAMES else {}),
                }
                for plural, kind, ns in RESOURCES[gv]
            ],
        }
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), tuple(rest[2:])
    if (gv, plural) not in KINDS:
        raise KubeError(404, "NotFound", f"the server could not find the requested resource ({gv} {plural})")
    kind, namespaced = KINDS[(gv, plural)]
    if namespace is not None and not namespaced:
        raise KubeError(404, "NotFound", f"{plural} is not namespaced")
    return Target(gv, plural, kind, namespaced, namespace, name, sub)


VERBS = ["create", "delete", "get", "list", "patch"]


def version_info(gke_version: str) -> dict[str, Any] | None:
    """``GET /version`` as GKE's API server answers it (``k8s.io/apimachinery/pkg/version.Info``), for the cluster's
    GKE version (``1.32.4-gke.1106006``); None when the cluster reports none."""
    if not gke_version:
        return None
    major, minor = gke_version.split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "gitVersion": f"v{gke_version}",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0 X:boringcrypto",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def _merge(base: Any, applied: Any) -> Any:
    """Apply ``applied`` over ``base``: maps merge key by key, anything else (lists included) is replaced."""
    if isinstance(base, dict) and isinstance(applied, dict):
        out = dict(base)
        for key, value in applied.items():
            out[key] = _merge(base.get(key), value)
        return out
    return copy.deepcopy(applied)


def _user_view(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without status and server-owned metadata: what an apply can change."""
    view = {k: v for k, v in obj.items() if k != "status"}
    view["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k not in SERVER_METADATA}
    return view


@dataclass
class Listener:
    """One cluster's API server: an HTTPS site on a socket bound (and listening) before the site starts, so the
    port is known, and connections queue, from the moment the cluster runs."""

    sock: socket.socket
    runner: web.AppRunner
    started: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.sock.getsockname()[1])

    async def start(self, context: Any) -> None:
        """Serve HTTPS on the socket."""
        try:
            await self.runner.setup()
            await web.SockSite(self.runner, self.sock, ssl_context=context).start()
        except Exception:
            log.exception("the Kubernetes API on port %s did not start", self.port)
            raise

    async def stop(self) -> None:
        """Stop serving and close the socket."""
        if self.started is not None:
            with contextlib.suppress(Exception):
                await self.started
        await self.runner.cleanup()
        self.sock.close()


def _bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1: ``port`` when it is free (a restart keeps the endpoint), else any port."""
    for wanted in dict.fromkeys((port, 0)):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((HOST, wanted))
        except OSError:
            sock.close()
            continue
        sock.listen(128)
        sock.setblocking(False)
        return sock
    raise OSError(f"no free port on {HOST}")


class KubeApi:
    """Every cluster's Kubernetes API (one HTTPS listener each), the service proxy, and the hook to the KubeRay
    emulation."""

    def __init__(
        self, store: Store, faults: Faults, calls: CallLog, kuberay: KubeRay, verify: Callable[[str | None], Verdict]
    ) -> None:
        self.store = store
        # The bearer check of the sandbox's Google credentials (the API server takes Google tokens, as GKE's).
        self.verify = verify
        self.faults = faults
        self.calls = calls
        self.kuberay = kuberay
        self.clusters: dict[str, KubeCluster] = {}
        # By GKE cluster key: the HTTPS listener of each cluster that runs.
        self.listeners: dict[str, Listener] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    # --- clusters -----------------------------------------------------------------------------------------------
    def cluster_for(self, cluster_id: str) -> KubeCluster:
        """The API of a running GKE cluster (by its numeric id); 404 once the cluster is gone or not yet running."""
        for resource in self.store.of_kind("container.cluster"):
            if resource.body.get("id") == cluster_id and resource.phase in ("ready", "deleting"):
                if cluster_id not in self.clusters:
                    self.clusters[cluster_id] = self._new_cluster(cluster_id, resource.key)
                return self.clusters[cluster_id]
        raise KubeError(404, "NotFound", f"no running cluster with id {cluster_id}")

    def _new_cluster(self, cluster_id: str, key: str) -> KubeCluster:
        cluster = KubeCluster(cluster_id, key)
        for name in BUILTIN_NAMESPACES:
            obj = cluster.new_object("v1", "Namespace", name, None, {"status": {"phase": "Active"}})
            cluster.put("v1", "namespaces", obj)
        return cluster

    @staticmethod
    def tls(resource: Resource) -> ClusterTls:
        """The cluster's CA and server certificate, made once and kept in its state."""
        if "tls" not in resource.extra:
            resource.extra["tls"] = new_cluster_tls(resource.name).to_json()
        return ClusterTls.from_json(resource.extra["tls"])

    def serve(self, resource: Resource) -> None:
        """Start the HTTPS listener of a GKE cluster that runs (idempotent). Needs the running event loop."""
        if resource.key in self.listeners:
            return
        sock = _bind(int(resource.extra.get("kube_port", 0)))
        application = web.Application(client_max_size=16 * 1024 * 1024)
        application[CLUSTER_ID] = str(resource.body["id"])
        application[CLUSTER_VERSION] = str(resource.body.get("currentMasterVersion") or "")
        application.router.add_route("*", "/{tail:.*}", self._on_listener)
        runner = web.AppRunner(application, access_log=None, handle_signals=False, shutdown_timeout=LISTENER_SHUTDOWN_S)
        listener = Listener(sock, runner)
        listener.started = asyncio.get_running_loop().create_task(listener.start(self.tls(resource).server_context()))
        self.listeners[resource.key] = listener
        if resource.extra.get("kube_port") != listener.port:
            resource.extra["kube_port"] = listener.port
            self.store.dirty = True
        log.info("cluster %s: Kubernetes API on https://%s:%s", resource.key, HOST, listener.port)

    def serve_running(self) -> None:
        """Start the listener of every cluster that runs (a restarted sandbox serves its clusters again)."""
        for resource in self.store.of_kind("container.cluster"):
            if resource.phase in ("ready", "deleting"):
                self.serve(resource)

    def endpoint(self, resource: Resource) -> str:
        """What the GKE cluster reports as its endpoint: ``127.0.0.1:PORT`` while it is served, else empty."""
        listener = self.listeners.get(resource.key)
        return f"{HOST}:{listener.port}" if listener is not None else ""

    def drop_cluster(self, cluster_key: str) -> None:
        """The GKE cluster is gone: so are its objects and its listener, and its RayClusters' Ray processes are
        stopped."""
        for cluster_id, cluster in list(self.clusters.items()):
            if cluster.cluster_key == cluster_key:
                self.kuberay.drop_cluster(cluster_id)
                del self.clusters[cluster_id]
        listener = self.listeners.pop(cluster_key, None)
        if listener is not None:
            task = asyncio.get_running_loop().create_task(listener.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def inventory(self) -> list[dict[str, Any]]:
        """Every object a client made (built-in namespaces left out), for the admin inventory."""
        items = []
        for cluster in self.clusters.values():
            for (gv, plural, ns, name), obj in sorted(cluster.objects.items()):
                if plural == "namespaces" and name in BUILTIN_NAMESPACES:
                    continue
                items.append(
                    {
                        "cluster": cluster.cluster_key,
                        "apiVersion": gv,
                        "kind": obj.get("kind"),
                        "namespace": ns or None,
                        "name": name,
                        "resourceVersion": obj["metadata"].get("resourceVersion"),
                        "labels": obj["metadata"].get("labels", {}),
                    }
                )
        return items

    # --- HTTP ---------------------------------------------------------------------------------------------------
    async def _on_listener(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, self.verify(request.headers.get("Authorization")))

    async def handle(self, request: web.Request, verdict: Verdict) -> web.StreamResponse:
        """Answer one request on a cluster's listener (the cluster is the listener's); ``verdict`` is the bearer
        token's (the API server authenticates first: without a valid Google token every path, the service proxy
        included, is 401 Unauthorized)."""
        started = time.perf_counter()
        self.store.settle(formats.now())
        self.store.save_if_dirty()
        raw = await request.read()
        text = raw.decode("utf-8", errors="replace")
        fault_id = None
        held = None
        status = 200
        try:
            if verdict is not Verdict.VALID:
                raise KubeError(401, "Unauthorized", "Unauthorized")
            fault = self.faults.call_fault(request.method, request.path, request.query_string, text)
            if fault is not None:
                fault_id = fault.id
                raise KubeError(fault.status or 500, "InternalError", fault.message or f"Injected fault {fault.id}")
            cluster = self.cluster_for(request.app[CLUSTER_ID])
            target = version_info(request.app[CLUSTER_VERSION]) if request.path == "/version" else None
            target = target or resolve(parse_path(request.path))
            if isinstance(target, dict):
                response = web.json_response(target)
            elif target.plural == "services" and target.sub[:1] == ("proxy",):
                response = await self._proxy(request, cluster, target, raw)
            else:
                fault = self.faults.operation_fault(request.method, request.path, request.query_string, text)
                status, body = self._dispatch(request, cluster, target, text, fault)
                if fault is not None:
                    self.faults.operation_started(request.method, request.path, request.query_string, fault, text)
                    fault_id = fault.id
                response = web.json_response(body, status=status)
            held = self.faults.delay_fault(request.method, request.path, request.query_string, text)
        except KubeError as exc:
            response = web.json_response(exc.status(), status=exc.code)
        status = response.status
        self.calls.append(
            time=formats.now(),
            method=request.method,
            path=request.path,
            query=request.query_string,
            service="kubernetes",
            status=status,
            duration_ms=round(1000 * (time.perf_counter() - started), 3),
            operations=[],
            fault=fault_id or (held.id if held else None),
            error=None if status < 400 else _message(response),
            auth=str(verdict),
        )
        if held is not None and held.delay_s:
            # The call has taken effect (and is in the call log); only its answer waits.
            await asyncio.sleep(held.delay_s)
        return response

    def _dispatch(
        self, request: web.Request, cluster: KubeCluster, target: Target, text: str, fault: Any
    ) -> tuple[int, dict[str, Any]]:
        method = request.method
        dry = request.query.getall("dryRun", [])
        if any(value != "All" for value in dry):
            bad = next(value for value in dry if value != "All")
            raise KubeError(400, "BadRequest", f'dryRun: Unsupported value: "{bad}": supported values: "All"')
        dry_run = bool(dry)
        if dry_run and method == "GET":
            raise KubeError(400, "BadRequest", "dryRun is not supported on a read")
        if target.sub:
            raise KubeError(404, "NotFound", f"subresource {'/'.join(target.sub)} is not served")
        if target.namespace is not None and cluster.get("v1", "namespaces", None, target.namespace) is None:
            raise not_found("namespaces", target.namespace)
        if method == "GET" and target.name is None:
            return 200, self._list(cluster, target, request)
        if method == "GET":
            obj = cluster.get(target.group_version, target.plural, target.namespace, target.name or "")
            if obj is None:
                raise not_found(target.plural, target.name or "", target.group)
            return 200, obj
        if method == "POST" and target.name is None:
            return 201, self._create(cluster, target, self._body(text, "application/json"), dry_run)
        if method == "PATCH" and target.name is not None:
            if request.content_type != APPLY_PATCH:
                raise KubeError(415, "UnsupportedMediaType", f"the sandbox serves only {APPLY_PATCH} patches")
            if not request.query.get("fieldManager"):
                raise KubeError(400, "BadRequest", "PATCH with apply-patch needs the fieldManager query parameter")
            body = self._body(text, APPLY_PATCH)
            return self._apply(cluster, target, body, request.query["fieldManager"], fault, dry_run=dry_run)
        if method == "DELETE" and target.name is not None:
            return 200, self._delete(cluster, target, dry_run)
        raise KubeError(405, "MethodNotAllowed", f"{method} is not served on this path")

    @staticmethod
    def _body(text: str, content_type: str) -> dict[str, Any]:
        try:
            body = yaml.safe_load(text) if content_type == APPLY_PATCH else json.loads(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise KubeError(400, "BadRequest", f"the body is not a valid object: {exc}") from exc
        if not isinstance(body, dict):
            raise KubeError(400, "BadRequest", "the body must be an object")
        return body

    def _check_body(self, target: Target, body: dict[str, Any], name: str | None) -> dict[str, Any]:
        if body.get("apiVersion") != target.group_version or body.get("kind") != target.kind:
            raise KubeError(
                400,
                "BadRequest",
                f"the body is {body.get('apiVersion')}/{body.get('kind')}, the path is {target.group_version}"
                f"/{target.kind}",
            )
        meta = body.get("metadata") or {}
        if not meta.get("name"):
            raise KubeError(422, "Invalid", f'{target.kind} is invalid: metadata.name: Required value"')
        if name is not None and meta["name"] != name:
            raise KubeError(400, "BadRequest", f"the name in the body ({meta['name']}) does not match the URL ({name})")
        body_ns = meta.get("namespace")
        if target.namespaced:
            if body_ns is not None and body_ns != target.namespace:
                raise KubeError(400, "BadRequest", f"the namespace of the object ({body_ns}) does not match the URL's")
            meta["namespace"] = target.namespace
        elif body_ns:
            raise KubeError(400, "BadRequest", f"{target.kind} is cluster-scoped; metadata.namespace must be unset")
        return body

    def _create(self, cluster: KubeCluster, target: Target, body: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        body = self._check_body(target, copy.deepcopy(body), None)
        name = body["metadata"]["name"]
        if cluster.get(target.group_version, target.plural, target.namespace, name) is not None:
            raise KubeError(
                409,
                "AlreadyExists",
                f'{target.plural} "{name}" already exists',
                {"name": name, "group": target.group, "kind": target.plural},
            )
        body.pop("status", None)
        body["metadata"] = {k: v for k, v in body["metadata"].items() if k not in SERVER_METADATA}
        server_metadata(body["metadata"])
        if dry_run:
            return body  # validated and defaulted as if stored, but nothing is stored and no controller sees it
        obj = cluster.put(target.group_version, target.plural, body)
        self._created(cluster, target, obj, None)
        return obj

    def _apply(
        self, cluster: KubeCluster, target: Target, body: dict[str, Any], manager: str, fault: Any, *, dry_run: bool
    ) -> tuple[int, dict[str, Any]]:
        """Server-side apply: create the object, or merge the applied fields into it; unchanged keeps its version.
        A dry run answers the same and stores nothing."""
        body = self._check_body(target, copy.deepcopy(body), target.name)
        body.pop("status", None)
        applied_meta = {k: v for k, v in body["metadata"].items() if k not in SERVER_METADATA}
        existing = cluster.get(target.group_version, target.plural, target.namespace, target.name or "")
        managed = [{"manager": manager, "operation": "Apply", "apiVersion": target.group_version}]
        if existing is None:
            obj = {**body, "metadata": applied_meta}
            server_metadata(obj["metadata"])
            obj["metadata"]["managedFields"] = managed
            if dry_run:
                return 201, obj
            obj = cluster.put(target.group_version, target.plural, obj)
            self._created(cluster, target, obj, fault)
            return 201, obj
        if existing["metadata"].get("deletionTimestamp"):
            raise KubeError(409, "Conflict", f'{target.plural} "{target.name}" is being deleted')
        merged = _merge(_user_view(existing), {**body, "metadata": applied_meta})
        if merged == _user_view(existing):
            return 200, existing
        obj = {**merged, "status": existing.get("status", {})}
        obj["metadata"] = {**merged["metadata"], **{k: existing["metadata"][k] for k in SERVER_METADATA[:3]}}
        spec_changed = merged.get("spec") != existing.get("spec")
        obj["metadata"]["generation"] = existing["metadata"].get("generation", 1) + int(spec_changed)
        obj["metadata"]["managedFields"] = managed
        if dry_run:
            return 200, {
                **obj,
                "metadata": {**obj["metadata"], "resourceVersion": existing["metadata"]["resourceVersion"]},
            }
        return 200, cluster.put(target.group_version, target.plural, obj)

    def _created(self, cluster: KubeCluster, target: Target, obj: dict[str, Any], fault: Any) -> None:
        """What controllers do with a new object: bind a PVC and its PV (:mod:`sandbox.kube_volumes`), start KubeRay
        on a RayCluster."""
        if target.plural == "persistentvolumeclaims":
            kube_volumes.claim_created(cluster, obj)
        elif target.plural == "persistentvolumes":
            kube_volumes.volume_created(cluster, obj)
        elif target.plural == "rayclusters":
            hang = fault is not None and getattr(fault, "operation", None) == "hang"
            self.kuberay.created(cluster, obj, stuck_message=(fault.message or "") if hang else None)

    def _delete(self, cluster: KubeCluster, target: Target, dry_run: bool) -> dict[str, Any]:
        name = target.name or ""
        obj = cluster.get(target.group_version, target.plural, target.namespace, name)
        if obj is None:
            raise not_found(target.plural, name, target.group)
        if dry_run:
            return obj
        if target.plural == "rayclusters":
            # KubeRay's finalizer keeps the object until its pods are gone: here, until its Ray has stopped.
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = formats.rfc3339(time.time())
                cluster.put(target.group_version, target.plural, obj)
                self.kuberay.deleting(cluster, obj)
            return obj
        cluster.remove(target.group_version, target.plural, target.namespace, name)
        if target.plural == "persistentvolumeclaims":
            kube_volumes.claim_deleted(cluster, obj)
        elif target.plural == "persistentvolumes":
            kube_volumes.volume_deleted(cluster, obj)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "group": target.group, "kind": target.plural, "uid": obj["metadata"]["uid"]},
        }

    def _list(self, cluster: KubeCluster, target: Target, request: web.Request) -> dict[str, Any]:
        try:
            labels = label_selector(request.query.get("labelSelector", ""))
            fields = field_selector(request.query.get("fieldSelector", ""), target.plural)
        except SelectorError as exc:
            raise KubeError(400, "BadRequest", str(exc)) from exc
        items = [
            obj
            for obj in cluster.of(target.group_version, target.plural, target.namespace)
            if labels(obj["metadata"].get("labels") or {}) and fields(obj)
        ]
        return {
            "kind": f"{target.kind}List",
            "apiVersion": target.group_version,
            "metadata": {"resourceVersion": str(cluster.revision)},
            "items": items,
        }

    # --- service proxy -----------------------------------------------------------------------------------------
    async def _proxy(
        self, request: web.Request, cluster: KubeCluster, target: Target, raw: bytes
    ) -> web.StreamResponse:
        """Forward ``services/{name}:{port}/proxy/...`` to the local process behind that service."""
        service_name, _, port = (target.name or "").partition(":")
        service = cluster.get("v1", "services", target.namespace, service_name)
        if service is None:
            raise not_found("services", service_name)
        backend = self.kuberay.backend(cluster, service, port) or ""
        if not backend:
            raise KubeError(503, "ServiceUnavailable", f'no endpoints available for service "{service_name}"')
        url = backend + "/" + "/".join(target.sub[1:])
        if request.path.endswith("/") and not url.endswith("/"):
            url += "/"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._proxy_websocket(request, url, headers)
        try:
            async with self._session.request(
                request.method, url, params=request.query, data=raw or None, headers=headers
            ) as upstream:
                body = await upstream.read()
                content_type = upstream.headers.get("Content-Type", "application/octet-stream")
                return web.Response(status=upstream.status, body=body, headers={"Content-Type": content_type})
        except aiohttp.ClientError as exc:
            raise KubeError(503, "ServiceUnavailable", f"error trying to reach service: {exc}") from exc

    async def _proxy_websocket(self, request: web.Request, url: str, headers: dict[str, str]) -> web.StreamResponse:
        """An upgrade through the service proxy, as kube-apiserver's UpgradeAwareHandler does it: the backend's
        refusal is passed back as it is; once both sides are upgraded, frames go through untouched both ways."""
        assert self._session is not None
        upstream_headers = {k: v for k, v in headers.items() if not k.lower().startswith("sec-websocket")}
        upstream_headers.pop("Upgrade", None)
        try:
            upstream = await self._session.ws_connect(
                url, params=request.query, headers=upstream_headers, timeout=aiohttp.ClientWSTimeout(ws_close=10)
            )
        except aiohttp.WSServerHandshakeError as exc:
            return web.Response(status=exc.status, text=exc.message or "")
        except aiohttp.ClientError as exc:
            raise KubeError(503, "ServiceUnavailable", f"error trying to reach service: {exc}") from exc
        downstream = web.WebSocketResponse(autoping=True)
        await downstream.prepare(request)

        async def pipe(source: Any, sink: Any) -> None:
            async for message in source:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await sink.send_str(message.data)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await sink.send_bytes(message.data)
                else:
                    break

        down = asyncio.ensure_future(pipe(upstream, downstream))
        up = asyncio.ensure_future(pipe(downstream, upstream))
        try:
            await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (down, up):
                task.cancel()
            await upstream.close()
            await downstream.close()
        return downstream

    async def close(self) -> None:
        """Stop every listener and close the proxy's HTTP session."""
        listeners, self.listeners = list(self.listeners.values()), {}
        await asyncio.gather(*(listener.stop() for listener in listeners), *self._stopping)
        if self._session is not None and not self._session.closed:
            await self._session.close()


def _message(response: web.Response) -> str | None:
    try:
        return str(json.loads(response.body).get("message"))  # type: ignore[arg-type]
    except (ValueError, TypeError, AttributeError):
        return None
