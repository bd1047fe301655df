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

from sandbox import (
    formats,
    kube_authz,
    kube_nodes,
    kube_openapi,
    kube_podlog,
    kube_protobuf,
    kube_table,
    kube_volumes,
    kube_watch,
)
from sandbox.auth import Verdict
from sandbox.kube_cluster import KubeCluster, server_metadata
from sandbox.kube_errors import KubeError
from sandbox.kube_fields import ApplyConflict, Managed, Shape, manager_for, record_update
from sandbox.kube_fields import apply as server_side_apply
from sandbox.kube_patch import apply_patch, check_content_type
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
        ("nodes", "Node", False),
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
    # kubectl auth can-i (sandbox/kube_authz.py).
    "authorization.k8s.io/v1": (("selfsubjectaccessreviews", "SelfSubjectAccessReview", False),),
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
    "nodes": ["no"],
    "events": ["ev"],
    "configmaps": ["cm"],
    "daemonsets": ["ds"],
}
# Kinds served with other verbs than VERBS: nodes read-only (sandbox/kube_nodes.py), reviews create-only.
RESOURCE_VERBS: dict[str, list[str]] = {"nodes": ["get", "list", "watch"], "selfsubjectaccessreviews": ["create"]}
# Subresources discovery lists (name, kind, namespaced, verbs), as the API server's APIResourceList does.
SUBRESOURCES: dict[str, tuple[tuple[str, str, bool, list[str]], ...]] = {"v1": (("pods/log", "Pod", True, ["get"]),)}
BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public")
# Fields the server owns: never taken from an applied object, never compared to decide whether apply changed it.
SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "deletionTimestamp")
HOP_HEADERS = frozenset({"host", "authorization", "content-length", "transfer-encoding", "connection"})


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
                    "verbs": RESOURCE_VERBS.get(plural, VERBS),
                    **({"shortNames": SHORT_NAMES[plural]} if plural in SHORT_NAMES else {}),
                }
                for plural, kind, ns in RESOURCES[gv]
            ]
            + [
                {"name": name, "singularName": "", "namespaced": ns, "kind": kind, "verbs": verbs}
                for name, kind, ns, verbs in SUBRESOURCES.get(gv, ())
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


VERBS = ["create", "delete", "get", "list", "patch", "watch"]


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


def _user_view(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without status and server-owned metadata: what an apply can change."""
    view = {k: v for k, v in obj.items() if k != "status"}
    view["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k not in SERVER_METADATA}
    return view


def _patch_options(request: web.Request, target: Target) -> tuple[str, bool]:
    """The patch type (415 when this resource does not take it) and ``force``, with PatchOptions validated as
    ValidatePatchOptions does (apimachinery pkg/apis/meta/v1/validation/validation.go:190-207)."""
    patch_type = check_content_type(request.headers.get("Content-Type", ""), target.group_version)
    force = request.query.get("force")
    causes = []
    if patch_type == APPLY_PATCH and not request.query.get("fieldManager"):
        causes.append(("FieldValueRequired", "Required value: is required for apply patch", "fieldManager"))
    if patch_type != APPLY_PATCH and force is not None:
        causes.append(("FieldValueForbidden", "Forbidden: may not be specified for non-apply patch", "force"))
    if causes:
        errors = [f"{where}: {message}" for _, message, where in causes]
        # errors.NewInvalid: one error as it is, several as Go prints an aggregate ("[a, b]").
        listed = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        raise KubeError(
            422,
            "Invalid",
            f'PatchOptions.meta.k8s.io "" is invalid: {listed}',
            {
                "group": "meta.k8s.io",
                "kind": "PatchOptions",
                "causes": [{"reason": r, "message": m, "field": f} for r, m, f in causes],
            },
        )
    if force not in (None, "true", "false", "1", "0", "t", "f", "True", "False", "TRUE", "FALSE", "T", "F"):
        # metav1.PatchOptions is decoded with strconv.ParseBool.
        raise KubeError(400, "BadRequest", f'strconv.ParseBool: parsing "{force}": invalid syntax')
    return patch_type, force in ("true", "1", "t", "True", "TRUE", "T")


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
                if (plural == "namespaces" and name in BUILTIN_NAMESPACES) or plural == kube_nodes.NODES:
                    continue  # the cluster's own: its built-in namespaces, the node pools' nodes
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
        logged = False

        def log_call(status: int, error: str | None) -> None:
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
                error=error,
                auth=str(verdict),
            )

        try:
            if verdict is not Verdict.VALID:
                raise KubeError(401, "Unauthorized", "Unauthorized")
            fault = self.faults.call_fault(request.method, request.path, request.query_string, text)
            if fault is not None:
                fault_id = fault.id
                raise KubeError(fault.status or 500, "InternalError", fault.message or f"Injected fault {fault.id}")
            cluster = self.cluster_for(request.app[CLUSTER_ID])
            kube_nodes.sync(cluster, self.store, self.kuberay.capacity)
            response, logged, fault_id = await self._route(request, cluster, raw, text, lambda: log_call(200, None))
            held = self.faults.delay_fault(request.method, request.path, request.query_string, text)
        except KubeError as exc:
            response = web.json_response(exc.status(), status=exc.code)
        if not logged:
            log_call(response.status, None if response.status < 400 else _message(response))
        if held is not None and held.delay_s:
            # The call has taken effect (and is in the call log); only its answer waits.
            await asyncio.sleep(held.delay_s)
        return response

    async def _route(
        self, request: web.Request, cluster: KubeCluster, raw: bytes, text: str, log_started: Any
    ) -> tuple[web.StreamResponse, bool, str | None]:
        """The answer to an authenticated request: the response, whether the call is logged already (a watch is,
        when its stream starts), and the operation fault that fired (None: none)."""
        target = _resolve_request(request)
        if isinstance(target, web.Response):
            return target, False, None  # /openapi/...: kube-openapi's handlers (sandbox.kube_openapi)
        if isinstance(target, dict):
            return web.json_response(target), False, None
        if target.plural == "services" and target.sub[:1] == ("proxy",):
            return await self._proxy(request, cluster, target, raw), False, None
        if (view := await self._view(request, cluster, target)) is not None:
            return view, False, None  # pods/log, reviews, read-only nodes
        if request.method == "GET" and request.query.get("watch") in ("1", "true") and not target.sub:
            # Logged when the stream starts, as an audit log's ResponseStarted: a watch can last many minutes.
            return await self._watch(request, cluster, target, log_started), True, None
        fault = self.faults.operation_fault(request.method, request.path, request.query_string, text)
        status, body = self._dispatch(request, cluster, target, raw, fault)
        if fault is not None:
            self.faults.operation_started(request.method, request.path, request.query_string, fault, text)
        response = kube_table.respond(request, target.group_version, target.plural, body, status)
        kube_openapi.add_warnings(request, response)
        return response, False, None if fault is None else fault.id

    def _dispatch(
        self, request: web.Request, cluster: KubeCluster, target: Target, raw: bytes, fault: Any
    ) -> tuple[int, dict[str, Any]]:
        method = request.method
        text = raw.decode("utf-8", errors="replace")
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
            body = self._body(raw, request.content_type)
            body = kube_openapi.check_fields(request, target.group_version, target.kind, body)
            manager = manager_for(request.query.get("fieldManager", ""), request.headers.get("User-Agent", ""))
            return 201, self._create(cluster, target, body, dry_run, manager)
        if method == "PATCH" and target.name is not None:
            patch_type, force = _patch_options(request, target)
            if patch_type != APPLY_PATCH:
                manager = manager_for(request.query.get("fieldManager", ""), request.headers.get("User-Agent", ""))
                return 200, self._patch(cluster, target, patch_type, text, manager=manager, dry_run=dry_run)
            body = self._body(raw, APPLY_PATCH)
            body = kube_openapi.check_fields(request, target.group_version, target.kind, body, apply=True)
            manager = request.query["fieldManager"]
            return self._apply(cluster, target, body, manager, fault, dry_run=dry_run, force=force)
        if method == "DELETE" and target.name is not None:
            return 200, self._delete(cluster, target, dry_run)
        raise KubeError(405, "MethodNotAllowed", f"{method} is not served on this path")

    @staticmethod
    def _body(raw: bytes, content_type: str) -> dict[str, Any]:
        """A request's object: YAML for an apply, protobuf from kubectl's typed clients (``kubectl create
        configmap``, ``auth can-i``: :mod:`sandbox.kube_protobuf`), else JSON."""
        try:
            if content_type == kube_protobuf.MEDIA_TYPE:
                return kube_protobuf.decode(raw)
            text = raw.decode("utf-8")
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

    def _create(
        self, cluster: KubeCluster, target: Target, body: dict[str, Any], dry_run: bool, manager: str = ""
    ) -> dict[str, Any]:
        """POST: store a new object, its fields recorded as an Update by ``manager`` (:mod:`sandbox.kube_fields`)."""
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
        managed = record_update(None, _user_view(body), Managed(), manager, Shape(target.group_version, target.kind))
        server_metadata(body["metadata"])
        if managed.owners:
            body["metadata"]["managedFields"] = managed.encode()
        if dry_run:
            return body  # validated and defaulted as if stored, but nothing is stored and no controller sees it
        obj = cluster.put(target.group_version, target.plural, body)
        self._created(cluster, target, obj, None)
        return obj

    def _apply(
        self,
        cluster: KubeCluster,
        target: Target,
        body: dict[str, Any],
        manager: str,
        fault: Any,
        *,
        dry_run: bool,
        force: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        """Server-side apply: create the object, or merge the applied fields into it as structured-merge-diff does
        (:mod:`sandbox.kube_fields`): 409 on a field another manager owns with another value unless ``force``;
        unchanged (object and owners) keeps its version. A dry run answers the same and stores nothing."""
        body = self._check_body(target, copy.deepcopy(body), target.name)
        body.pop("status", None)
        applied_meta = {k: v for k, v in body["metadata"].items() if k not in SERVER_METADATA}
        existing = cluster.get(target.group_version, target.plural, target.namespace, target.name or "")
        if existing is not None and existing["metadata"].get("deletionTimestamp"):
            raise KubeError(409, "Conflict", f'{target.plural} "{target.name}" is being deleted')
        managed = Managed.decode(existing["metadata"].get("managedFields") if existing else None)
        live = _user_view(existing) if existing is not None else None
        try:
            merged = server_side_apply(
                live, {**body, "metadata": applied_meta}, managed, manager, Shape(target.group_version, target.kind),
                force=force,
            )  # fmt: skip
        except ApplyConflict as exc:
            # errors.NewApplyConflict (apimachinery pkg/api/errors/errors.go:247-258): details carry only causes.
            raise KubeError(409, "Conflict", exc.message(), {"causes": exc.causes()}) from exc
        if existing is None:
            obj = merged
            server_metadata(obj["metadata"])
            obj["metadata"]["managedFields"] = managed.encode()
            if dry_run:
                return 201, obj
            obj = cluster.put(target.group_version, target.plural, obj)
            self._created(cluster, target, obj, fault)
            return 201, obj
        return 200, self._updated(cluster, target, existing, merged, managed, dry_run=dry_run)

    def _patch(
        self, cluster: KubeCluster, target: Target, patch_type: str, text: str, *, manager: str, dry_run: bool
    ) -> dict[str, Any]:
        """A JSON, merge or strategic merge patch (:mod:`sandbox.kube_patch`) of an existing object, recorded as an
        Update by ``manager``. Status and the server's metadata stay the server's; a ``metadata.resourceVersion``
        the patch leaves in place is a precondition, as on an update."""
        existing = cluster.get(target.group_version, target.plural, target.namespace, target.name or "")
        if existing is None:
            raise not_found(target.plural, target.name or "", target.group)  # jsonPatcher.createNewObject
        patched = apply_patch(patch_type, existing, text, target.group_version, target.kind)
        patched = self._check_body(target, patched, target.name)
        version = patched["metadata"].get("resourceVersion")
        if version and version != existing["metadata"]["resourceVersion"]:
            resource = f"{target.plural}.{target.group}" if target.group else target.plural
            raise KubeError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource} "{target.name}": the object has been modified; please '
                "apply your changes to the latest version and try again",
                {"name": target.name, "group": target.group, "kind": target.plural},
            )
        new = _user_view(patched)
        managed = Managed.decode(existing["metadata"].get("managedFields"))
        record_update(_user_view(existing), new, managed, manager, Shape(target.group_version, target.kind))
        return self._updated(cluster, target, existing, new, managed, dry_run=dry_run)

    def _updated(
        self,
        cluster: KubeCluster,
        target: Target,
        existing: dict[str, Any],
        new: dict[str, Any],
        managed: Managed,
        *,
        dry_run: bool,
    ) -> dict[str, Any]:
        """Store ``new`` (a user view) over ``existing`` with the server's metadata and status kept, generation
        bumped on a spec change; nothing changed (owners included) keeps the object and its resourceVersion."""
        fields = managed.encode()
        if new == _user_view(existing) and fields == (existing["metadata"].get("managedFields") or []):
            return existing
        obj = {**new, "status": existing.get("status", {})}
        kept = {k: existing["metadata"][k] for k in SERVER_METADATA if k in existing["metadata"]}
        obj["metadata"] = {**new["metadata"], **kept}
        spec_changed = new.get("spec") != existing.get("spec")
        obj["metadata"]["generation"] = existing["metadata"].get("generation", 1) + int(spec_changed)
        obj["metadata"]["managedFields"] = fields
        if not fields:
            del obj["metadata"]["managedFields"]
        if dry_run:
            return obj  # the stored resourceVersion: nothing was written
        return cluster.put(target.group_version, target.plural, obj)

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
                obj["metadata"]["deletionTimestamp"] = formats.kube_time(time.time())
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

    # --- watch ------------------------------------------------------------------------------------------------
    async def _watch(
        self, request: web.Request, cluster: KubeCluster, target: Target, started: Callable[[], None]
    ) -> web.StreamResponse:
        """``?watch=true`` on a list (or, deprecated but served, on one object): a stream of JSON watch events, one
        per line, until ``timeoutSeconds`` (:mod:`sandbox.kube_watch`)."""
        if target.namespace is not None and cluster.get("v1", "namespaces", None, target.namespace) is None:
            raise not_found("namespaces", target.namespace)
        query = request.query
        scope = self._watch_scope(query, target)
        try:
            wanted = kube_watch.WatchRequest.parse(query)
            table = kube_table.wanted_table(request.headers.get("Accept", ""))
        except kube_watch.InvalidWatchError as exc:
            raise KubeError(400, "BadRequest", str(exc)) from exc

        def line(event: dict[str, Any]) -> bytes:
            # `kubectl get -w` asks for Tables: each event's object is then a one-row Table (not a bookmark's).
            if table is not None and event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                converted = kube_table.to_table(target.group_version, target.plural, event["object"], query, table)
                event = {"type": event["type"], "object": converted}
            return json.dumps(event).encode() + b"\n"

        history = cluster.history
        queue = history.subscribe()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            objects = cluster.of(target.group_version, target.plural, target.namespace)
            events = wanted.opening(scope, objects, history, cluster.revision, target.kind)
            # What the opening covers is not sent again from the queue (nothing awaits in between, but say so).
            seen = cluster.revision
            response.enable_chunked_encoding()
            await response.prepare(request)
            started()
            for event in events:
                await response.write(line(event))
            if events and events[-1]["type"] == "ERROR":  # an expired version: the client lists again
                await response.write_eof()
                return response
            deadline = time.monotonic() + wanted.timeout_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    change = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                event = scope.event(change) if change.revision > seen else None
                if event is not None:
                    await response.write(line(event))
            if wanted.bookmarks:
                await response.write(line(kube_watch.bookmark(target.kind, target.group_version, cluster.revision)))
            await response.write_eof()
            return response
        except ConnectionResetError:  # the client went away: nothing more to send
            return response
        finally:
            history.unsubscribe(queue)

    # --- views: the pod log, access reviews, nodes ---------------------------------------------------------------
    async def _view(self, request: web.Request, cluster: KubeCluster, target: Target) -> web.StreamResponse | None:
        """The paths not served by the generic object store: ``pods/{name}/log`` (:mod:`sandbox.kube_podlog`),
        ``selfsubjectaccessreviews`` (:mod:`sandbox.kube_authz`), and a write to a node (the sandbox's nodes are the
        node pools', :mod:`sandbox.kube_nodes`). None: the request goes on to the object store."""
        if target.plural == "pods" and target.sub == ("log",):
            if request.method != "GET":
                raise KubeError(405, "MethodNotAllowed", f"{request.method} is not served on pods/log")
            pod = cluster.get("v1", "pods", target.namespace, target.name or "")
            if pod is None:
                raise not_found("pods", target.name or "")
            return await kube_podlog.pod_log(request, cluster, pod, self.kuberay)
        if target.plural == "selfsubjectaccessreviews":
            if request.method != "POST" or target.name is not None:
                raise KubeError(405, "MethodNotAllowed", f"{request.method} is not served on {target.plural}")
            body = self._body(await request.read(), request.content_type)
            return web.json_response(kube_authz.review(body), status=201)
        if target.plural == "nodes" and request.method not in ("GET", "HEAD"):
            raise KubeError(405, "MethodNotAllowed", "the sandbox's nodes are its node pools': they are read-only")
        return None

    @staticmethod
    def _watch_scope(query: Any, target: Target) -> kube_watch.Scope:
        """What one watch sees: the type and namespace of its path, its selectors (and, on one object's path, that
        object's name)."""
        try:
            labels = label_selector(query.get("labelSelector", ""))
            fields = field_selector(query.get("fieldSelector", ""), target.plural)
        except SelectorError as exc:
            raise KubeError(400, "BadRequest", str(exc)) from exc
        name = target.name

        def matches(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            return (name is None or meta.get("name") == name) and labels(meta.get("labels") or {}) and fields(obj)

        return kube_watch.Scope(target.group_version, target.plural, target.namespace, matches)

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


def _resolve_request(request: web.Request) -> Target | dict[str, Any] | web.Response:
    """What a request's path names: ``/version``, an OpenAPI document (:mod:`sandbox.kube_openapi`'s answer), a
    discovery document, or a resource :class:`Target`."""
    if request.path == "/version" and (info := version_info(request.app[CLUSTER_VERSION])) is not None:
        return info
    if request.path.startswith("/openapi/"):
        answer = kube_openapi.response(request.path, request.query, request.headers.get("Accept", ""), RESOURCES)
        if answer is not None:
            return answer
    return resolve(parse_path(request.path))


def _message(response: web.Response) -> str | None:
    try:
        return str(json.loads(response.body).get("message"))  # type: ignore[arg-type]
    except (ValueError, TypeError, AttributeError):
        return None
