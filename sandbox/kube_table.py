"""Server-side printing: the ``meta.k8s.io`` ``Table`` the API server answers when a client asks for one.

``kubectl get`` sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=Table;v=v1beta1;
g=meta.k8s.io, application/json`` and prints the rows it gets back; it only hides the columns of priority 1 unless
``-o wide``. So the columns come from the server, and here from the same places as on GKE:

- the built-in kinds served here (pods, nodes, namespaces, serviceaccounts, persistentvolumes,
  persistentvolumeclaims, services, events, configmaps, secrets, podtemplates, daemonsets): kube-apiserver's printers
  (``pkg/printers/internalversion/printers.go`` v1.32: ``AddHandlers``' ``*ColumnDefinitions`` and ``printPod``,
  ``printNode``, ``printNamespace``, ``printServiceAccount``, ``printPersistentVolume``,
  ``printPersistentVolumeClaim``, ``printService``, ``printEvent``, ``printConfigMap``, ``printSecret``,
  ``printPodTemplate``, ``printDaemonSet``), always generated wide, as the server's ``TableConvertor`` does. Those
  printers read objects the API server has defaulted (``pkg/apis/core/v1/defaults.go``); this sandbox stores what was
  sent, so a row function reads the few defaults its printer shows (a Service's ``ClusterIP`` type and ``TCP`` ports,
  a Secret's ``Opaque`` type, ...) where the object lacks them;
- the custom resources: the CRD's ``additionalPrinterColumns`` (apiextensions-apiserver's ``tableconvertor``): a
  ``Name`` column, then each printer column. RayCluster's and RayJob's are KubeRay v1.5.1's ``+kubebuilder:printcolumn``
  markers (``ray-operator/apis/ray/v1/raycluster_types.go:367-376``, ``rayjob_types.go:333-338``); a CRD with none
  gets apiextensions' default ``Age`` column;
- any other built-in kind: the default table convertor (``apiserver/pkg/registry/rest/table.go``): ``Name`` and
  ``Created At``.

``includeObject`` (``Object``, ``Metadata`` the default, ``None``) decides what each row carries, as
``endpoints/handlers/response.go`` ``asTable`` does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sandbox.kube_errors import KubeError

if TYPE_CHECKING:
    from collections.abc import Callable

TABLE_GROUP = "meta.k8s.io"
TABLE_VERSIONS = ("v1", "v1beta1")
# metav1.ObjectMeta's swagger docs: the descriptions of the Name and age columns of every table.
NAME_DOC = (
    "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a "
    "client to request the generation of an appropriate name automatically. Name is primarily intended for creation "
    "idempotence and configuration definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
CREATED_DOC = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
    "guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is "
    "represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)


def _column(name: str, kind: str, description: str, priority: int = 0, fmt: str = "") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": fmt, "description": description, "priority": priority}


NAME_COLUMN = _column("Name", "string", NAME_DOC, fmt="name")
# printers.go AddHandlers: podColumnDefinitions (v1.32).
POD_COLUMNS = [
    NAME_COLUMN,
    _column("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
    _column("Status", "string", "The aggregate status of the containers in this pod."),
    _column(
        "Restarts",
        "string",
        "The number of times the containers in this pod have been restarted and when the last container in this pod "
        "has restarted.",
    ),
    _column("Age", "string", CREATED_DOC),
    _column("IP", "string", "podIP address allocated to the pod. Routable at least within the cluster.", 1),
    _column("Node", "string", "NodeName indicates in which node this pod is scheduled.", 1),
    _column("Nominated Node", "string", "nominatedNodeName is set only when this pod preempts other pods.", 1),
    _column("Readiness Gates", "string", "If specified, all readiness gates will be evaluated for pod readiness.", 1),
]
# printers.go AddHandlers: nodeColumnDefinitions (v1.32).
NODE_COLUMNS = [
    NAME_COLUMN,
    _column("Status", "string", "The status of the node"),
    _column("Roles", "string", "The roles of the node"),
    _column("Age", "string", CREATED_DOC),
    _column("Version", "string", "Kubelet Version reported by the node."),
    _column("Internal-IP", "string", "List of addresses reachable to the node.", 1),
    _column("External-IP", "string", "List of addresses reachable to the node.", 1),
    _column("OS-Image", "string", "OS Image reported by the node from /etc/os-release.", 1),
    _column("Kernel-Version", "string", "Kernel Version reported by the node from 'uname -r'.", 1),
    _column("Container-Runtime", "string", "ContainerRuntime Version reported by the node.", 1),
]
# The other built-in kinds' columns, printers.go AddHandlers (v1.32); descriptions are the SwaggerDoc() texts the real
# definitions take (first sentences, as for the pod columns). Column order is the cell order of the print* function.
AGE_COLUMN = _column("Age", "string", CREATED_DOC)
CONTAINERS_DOC = "Names of each container in the template."
IMAGES_DOC = "Images referenced by each container in the template."
NAMESPACE_COLUMNS = [NAME_COLUMN, _column("Status", "string", "The status of the namespace"), AGE_COLUMN]
SERVICE_ACCOUNT_COLUMNS = [
    NAME_COLUMN,
    _column(
        "Secrets",
        "string",
        "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are "
        "allowed to use.",
    ),
    AGE_COLUMN,
]
PERSISTENT_VOLUME_COLUMNS = [
    NAME_COLUMN,
    _column("Capacity", "string", "capacity is the description of the persistent volume's resources and capacity."),
    _column("Access Modes", "string", "accessModes contains all ways the volume can be mounted."),
    _column(
        "Reclaim Policy",
        "string",
        "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim.",
    ),
    _column("Status", "string", "phase indicates if a volume is available, bound to a claim, or released by a claim."),
    _column(
        "Claim",
        "string",
        "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim.",
    ),
    _column("StorageClass", "string", "StorageClass of the pv"),
    # Priority 0 since it was added (1.29): kubectl shows it without -o wide, as <unset> when the spec names none.
    _column("VolumeAttributesClass", "string", "VolumeAttributesClass of the pv"),
    _column(
        "Reason",
        "string",
        "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy "
        "display in the CLI.",
    ),
    AGE_COLUMN,
    _column(
        "VolumeMode",
        "string",
        "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block "
        "state.",
        1,
    ),
]
PERSISTENT_VOLUME_CLAIM_COLUMNS = [
    NAME_COLUMN,
    _column("Status", "string", "phase represents the current phase of PersistentVolumeClaim."),
    _column("Volume", "string", "volumeName is the binding reference to the PersistentVolume backing this claim."),
    _column("Capacity", "string", "capacity represents the actual resources of the underlying volume."),
    _column("Access Modes", "string", "accessModes contains the actual access modes the volume backing the PVC has."),
    _column("StorageClass", "string", "StorageClass of the pvc"),
    _column("VolumeAttributesClass", "string", "VolumeAttributesClass of the pvc"),
    AGE_COLUMN,
    _column("VolumeMode", "string", "volumeMode defines what type of volume is required by the claim.", 1),
]
SERVICE_COLUMNS = [
    NAME_COLUMN,
    _column("Type", "string", "type determines how the Service is exposed. Defaults to ClusterIP."),
    _column("Cluster-IP", "string", "clusterIP is the IP address of the service and is usually assigned randomly."),
    _column(
        "External-IP",
        "string",
        "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this "
        "service.",
    ),
    _column("Port(s)", "string", "The list of ports that are exposed by this service."),
    AGE_COLUMN,
    _column(
        "Selector",
        "string",
        "Route service traffic to pods with label keys and values matching this selector.",
        1,
    ),
]
# printers.go's eventColumnDefinitions: the default columns first, the wide ones after (Name last, at priority 1).
EVENT_COLUMNS = [
    _column("Last Seen", "string", "The time at which the most recent occurrence of this event was recorded."),
    _column("Type", "string", "Type of this event (Normal, Warning), new types could be added in the future"),
    _column(
        "Reason",
        "string",
        "This should be a short, machine understandable string that gives the reason for the transition into the "
        "object's current status.",
    ),
    _column("Object", "string", "The object that this event is about."),
    _column(
        "Subobject",
        "string",
        "If referring to a piece of an object instead of an entire object, this string should contain a valid "
        "JSON/Go field access statement, such as desiredState.manifest.containers[2].",
        1,
    ),
    _column(
        "Source", "string", "The component reporting this event. Should be a short machine understandable string.", 1
    ),
    _column("Message", "string", "A human-readable description of the status of this operation."),
    _column("First Seen", "string", "The time at which the event was first recorded.", 1),
    _column("Count", "string", "The number of times this event has occurred.", 1),
    _column("Name", "string", NAME_DOC, 1, "name"),
]
CONFIG_MAP_COLUMNS = [
    NAME_COLUMN,
    _column("Data", "string", "Data contains the configuration data."),
    AGE_COLUMN,
]
SECRET_COLUMNS = [
    NAME_COLUMN,
    _column("Type", "string", "Used to facilitate programmatic handling of secret data."),
    _column("Data", "string", "Data contains the secret data."),
    AGE_COLUMN,
]
# podTemplateColumnDefinitions has no Age column.
POD_TEMPLATE_COLUMNS = [
    NAME_COLUMN,
    _column("Containers", "string", CONTAINERS_DOC),
    _column("Images", "string", IMAGES_DOC),
    _column("Pod Labels", "string", "The labels for the pod template."),
]
DAEMON_SET_COLUMNS = [
    NAME_COLUMN,
    _column(
        "Desired",
        "integer",
        "The total number of nodes that should be running the daemon pod (including nodes correctly running the "
        "daemon pod).",
    ),
    _column(
        "Current",
        "integer",
        "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
    ),
    _column(
        "Ready",
        "integer",
        "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon "
        "pod running with a Ready Condition.",
    ),
    _column("Up-to-date", "integer", "The total number of nodes that are running updated daemon pod"),
    _column(
        "Available",
        "integer",
        "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running "
        "and available (ready for at least spec.minReadySeconds)",
    ),
    _column(
        "Node Selector",
        "string",
        "NodeSelector is a selector which must be true for the pod to fit on a node.",
    ),
    AGE_COLUMN,
    _column("Containers", "string", CONTAINERS_DOC, 1),
    _column("Images", "string", IMAGES_DOC, 1),
    _column("Selector", "string", "A label query over pods that are managed by the daemon set.", 1),
]
# apiserver/pkg/registry/rest/table.go: the default convertor's columns.
DEFAULT_COLUMNS = [NAME_COLUMN, _column("Created At", "date", CREATED_DOC)]
# The CRDs' additionalPrinterColumns: (name, type, JSONPath, priority). KubeRay v1.5.1's markers (see the module
# docstring); a CRD that declares none gets apiextensions' default, one "Age" column on .metadata.creationTimestamp.
PRINTER_COLUMNS: dict[tuple[str, str], list[tuple[str, str, str, int]]] = {
    ("ray.io/v1", "rayclusters"): [
        ("desired workers", "integer", ".status.desiredWorkerReplicas", 0),
        ("available workers", "integer", ".status.availableWorkerReplicas", 0),
        ("cpus", "string", ".status.desiredCPU", 0),
        ("memory", "string", ".status.desiredMemory", 0),
        ("gpus", "string", ".status.desiredGPU", 0),
        ("tpus", "string", ".status.desiredTPU", 1),
        ("status", "string", ".status.state", 0),
        ("age", "date", ".metadata.creationTimestamp", 0),
        ("head pod IP", "string", ".status.head.podIP", 1),
        ("head service IP", "string", ".status.head.serviceIP", 1),
    ],
    ("ray.io/v1", "rayjobs"): [
        ("job status", "string", ".status.jobStatus", 0),
        ("deployment status", "string", ".status.jobDeploymentStatus", 0),
        ("ray cluster name", "string", ".status.rayClusterName", 0),
        ("start time", "string", ".status.startTime", 0),
        ("end time", "string", ".status.endTime", 0),
        ("age", "date", ".metadata.creationTimestamp", 0),
    ],
}
CRD_DEFAULT_COLUMNS = [("Age", "date", ".metadata.creationTimestamp", 0)]
INCLUDE_OBJECT = ("Object", "Metadata", "None")


def wanted_table(accept: str) -> str | None:
    """The Table version (``v1`` / ``v1beta1``) the ``Accept`` header asks for first, or None when the first media
    type it accepts is plain JSON (or there is no header). Entries are tried in order, as the API server's content
    negotiation does; an ``as=`` it does not serve here (``PartialObjectMetadata``) is skipped."""
    if not accept.strip():
        return None
    for entry in accept.split(","):
        media, *raw = (part.strip() for part in entry.split(";"))
        params = dict(p.split("=", 1) for p in raw if "=" in p)
        if media.lower() not in ("application/json", "application/*", "*/*"):
            continue
        if "as" not in params:
            return None
        if params["as"] == "Table" and params.get("g") == TABLE_GROUP and params.get("v") in TABLE_VERSIONS:
            return params["v"]
    raise KubeError(
        406,
        "NotAcceptable",
        f"only the following media types are accepted: application/json, application/json;as=Table;v=v1;"
        f"g={TABLE_GROUP} (asked: {accept})",
    )


def human_duration(seconds: float) -> str:
    """``k8s.io/apimachinery/pkg/util/duration.HumanDuration``: kubectl's ages (``42s``, ``3m7s``, ``5h``, ``2d3h``)."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return f"{minutes}m{whole % 60}s" if whole % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def since(timestamp: str | None, now: float | None = None) -> str:
    """printers.go ``translateTimestampSince``: ``<unknown>`` for no timestamp, else its age."""
    if not timestamp:
        return "<unknown>"
    try:
        at = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "<invalid>"
    return human_duration((time.time() if now is None else now) - at)


def pod_row(pod: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printPod`` (v1.32), wide: NAME READY STATUS RESTARTS AGE IP NODE NOMINATED-NODE READINESS-GATES."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    meta = pod.get("metadata") or {}
    sidecars = {c.get("name") for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"}
    total = len(spec.get("containers") or []) + len(sidecars)
    phase = status.get("phase") or ""
    reason = status.get("reason") or phase
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    if (conditions.get("PodScheduled") or {}).get("reason") == "SchedulingGated":
        reason = "SchedulingGated"
    init = _init_containers(status, sidecars, len(spec.get("initContainers") or []))
    ready, restarts, last_restart = init.ready, init.restarts, init.last_restart
    reason = init.reason or reason
    if not init.reason or (conditions.get("Initialized") or {}).get("status") == "True":
        main = _containers(status, reason, (conditions.get("Ready") or {}).get("status") == "True")
        reason = main.reason
        ready += main.ready
        restarts = init.sidecar_restarts + main.restarts
        last_restart = max(init.sidecar_last, main.last_restart)
    if meta.get("deletionTimestamp") and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"
    restarts_cell = str(restarts)
    if restarts and last_restart:
        restarts_cell = f"{restarts} ({since(last_restart, now)} ago)"
    ips = status.get("podIPs") or []
    gates = spec.get("readinessGates") or []
    gates_cell = "<none>"
    if gates:
        true = sum(1 for g in gates if (conditions.get(g.get("conditionType")) or {}).get("status") == "True")
        gates_cell = f"{true}/{len(gates)}"
    return [
        meta.get("name", ""),
        f"{ready}/{total}",
        reason,
        restarts_cell,
        since(meta.get("creationTimestamp"), now),
        (ips[0].get("ip") if ips else "") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gates_cell,
    ]


@dataclass
class _Tally:
    """What printPod adds up over a pod's containers: ready ones, restarts, the last restart, and the reason."""

    reason: str = ""
    ready: int = 0
    restarts: int = 0
    last_restart: str = ""
    sidecar_restarts: int = 0
    sidecar_last: str = ""


def _init_containers(status: dict[str, Any], sidecars: set[Any], count: int) -> _Tally:
    """printPod's loop over the init containers: its reason is set ("Init:...") while the pod is initializing."""
    tally = _Tally()
    for index, container in enumerate(status.get("initContainerStatuses") or []):
        tally.restarts += int(container.get("restartCount") or 0)
        tally.last_restart = max(tally.last_restart, _finished(container))
        sidecar = container.get("name") in sidecars
        if sidecar:
            tally.sidecar_restarts += int(container.get("restartCount") or 0)
            tally.sidecar_last = max(tally.sidecar_last, _finished(container))
        state = container.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated is not None and int(terminated.get("exitCode") or 0) == 0:
            continue
        if sidecar and container.get("started"):
            tally.ready += int(bool(container.get("ready")))
            continue
        if terminated is not None:
            if terminated.get("reason"):
                tally.reason = "Init:" + terminated["reason"]
            elif terminated.get("signal"):
                tally.reason = f"Init:Signal:{terminated['signal']}"
            else:
                tally.reason = f"Init:ExitCode:{terminated.get('exitCode', 0)}"
        elif waiting is not None and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            tally.reason = "Init:" + waiting["reason"]
        else:
            tally.reason = f"Init:{index}/{count}"
        break
    return tally


def _containers(status: dict[str, Any], reason: str, pod_ready: bool) -> _Tally:
    """printPod's loop over the containers, last to first: the last waiting or terminated one's reason wins."""
    tally = _Tally(reason=reason)
    running = False
    for container in reversed(status.get("containerStatuses") or []):
        tally.restarts += int(container.get("restartCount") or 0)
        tally.last_restart = max(tally.last_restart, _finished(container))
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting is not None and waiting.get("reason"):
            tally.reason = waiting["reason"]
        elif terminated is not None and terminated.get("reason"):
            tally.reason = terminated["reason"]
        elif terminated is not None:
            signal = terminated.get("signal")
            tally.reason = f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}"
        elif container.get("ready") and state.get("running") is not None:
            running = True
            tally.ready += 1
    if tally.reason == "Completed" and running:
        tally.reason = "Running" if pod_ready else "NotReady"
    return tally


def _finished(container: dict[str, Any]) -> str:
    """When the container's last run ended (RFC 3339, compares in time order), or ''."""
    return str((((container.get("lastState") or {}).get("terminated")) or {}).get("finishedAt") or "")


def node_row(node: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printNode`` (v1.32), wide: NAME STATUS ROLES AGE VERSION INTERNAL-IP EXTERNAL-IP OS-IMAGE
    KERNEL-VERSION CONTAINER-RUNTIME."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    states = [("Ready" if ready[-1].get("status") == "True" else "NotReady")] if ready else ["Unknown"]
    if (node.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    roles = set()
    for key, value in (meta.get("labels") or {}).items():
        if key.startswith("node-role.kubernetes.io/") and key != "node-role.kubernetes.io/":
            roles.add(key.removeprefix("node-role.kubernetes.io/"))
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    info = status.get("nodeInfo") or {}
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        return next((a.get("address", "") for a in addresses if a.get("type") == kind), "<none>")

    return [
        meta.get("name", ""),
        ",".join(states),
        ",".join(sorted(roles)) or "<none>",
        since(meta.get("creationTimestamp"), now),
        info.get("kubeletVersion", ""),
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def format_labels(labels: dict[str, Any] | None) -> str:
    """``labels.FormatLabels``: ``k=v`` pairs sorted by key, comma-joined; ``<none>`` for none."""
    return ",".join(f"{key}={labels[key]}" for key in sorted(labels or {})) or "<none>"


def format_label_selector(selector: dict[str, Any] | None) -> str:
    """``metav1.FormatLabelSelector``: the selector as ``LabelSelectorAsSelector(...).String()`` writes it (its
    requirements sorted by key; ``in``/``notin`` values sorted); ``<none>`` for a missing or empty selector and
    ``<error>`` for an operator it refuses."""
    if not selector:
        return "<none>"
    requirements: list[tuple[str, str]] = [
        (key, f"{key}={value}") for key, value in (selector.get("matchLabels") or {}).items()
    ]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key", ""), expression.get("operator", "")
        values = ",".join(sorted(str(v) for v in expression.get("values") or []))
        if operator in ("In", "NotIn"):
            requirements.append((key, f"{key} {operator.lower()} ({values})"))
        elif operator == "Exists":
            requirements.append((key, key))
        elif operator == "DoesNotExist":
            requirements.append((key, f"!{key}"))
        else:
            return "<error>"
    # internalSelector.Add sorts by key only; Python's sort is stable where Go's is not (ties keep their order).
    return ",".join(text for _, text in sorted(requirements, key=lambda pair: pair[0])) or "<none>"


def _quantity(text: Any) -> str:
    """``resource.Quantity.String()``: the canonical form (``18000Gi``, ``1Ti``); a missing quantity is Go's zero
    value, ``0``."""
    # Imported here, not at the top: kuberay holds the sandbox's one Quantity parser, and its imports (psutil, the
    # Ray process plumbing) are no business of a module that only formats tables.
    from sandbox.kuberay import format_quantity, parse_quantity

    if text is None or text == "":
        return "0"
    try:
        return format_quantity(*parse_quantity(text))
    except ValueError:
        return str(text)


# helper.GetAccessModesAsString: the modes present, always in this order, deduplicated.
ACCESS_MODES = (
    ("ReadWriteOnce", "RWO"),
    ("ReadOnlyMany", "ROX"),
    ("ReadWriteMany", "RWX"),
    ("ReadWriteOncePod", "RWOP"),
)
# core/v1 annotation the storage-class helpers read before spec.storageClassName.
BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"


def access_modes(modes: list[str] | None) -> str:
    """``helper.GetAccessModesAsString``: ``RWO,ROX,RWX,RWOP`` for the modes present, in that order."""
    present = set(modes or [])
    return ",".join(short for mode, short in ACCESS_MODES if mode in present)


def _storage_class(obj: dict[str, Any]) -> str:
    """``helper.GetPersistentVolumeClass`` / ``GetPersistentVolumeClaimClass``: the beta annotation, else the spec's
    ``storageClassName``, else empty."""
    annotations = _meta(obj).get("annotations") or {}
    if BETA_STORAGE_CLASS in annotations:
        return str(annotations[BETA_STORAGE_CLASS])
    return str((obj.get("spec") or {}).get("storageClassName") or "")


def _container_cells(spec: dict[str, Any]) -> tuple[str, str]:
    """``layoutContainerCells``: the containers' names and images, each comma-joined."""
    containers = spec.get("containers") or []
    return ",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers)


def namespace_row(namespace: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printNamespace`` (v1.32): NAME STATUS AGE."""
    meta = _meta(namespace)
    # SetDefaults_NamespaceStatus: a namespace is Active from its creation (the sandbox stores what was sent).
    phase = (namespace.get("status") or {}).get("phase") or "Active"
    return [meta.get("name", ""), phase, since(meta.get("creationTimestamp"), now)]


def service_account_row(account: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printServiceAccount`` (v1.32): NAME SECRETS AGE (the number of ``secrets`` it lists)."""
    meta = _meta(account)
    return [meta.get("name", ""), len(account.get("secrets") or []), since(meta.get("creationTimestamp"), now)]


def persistent_volume_row(volume: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printPersistentVolume`` (v1.32), wide: NAME CAPACITY ACCESS-MODES RECLAIM-POLICY STATUS CLAIM
    STORAGECLASS VOLUMEATTRIBUTESCLASS REASON AGE VOLUMEMODE."""
    meta, spec, status = _meta(volume), volume.get("spec") or {}, volume.get("status") or {}
    ref = spec.get("claimRef")
    claim = f"{ref.get('namespace') or ''}/{ref.get('name') or ''}" if ref else ""
    # SetDefaults_PersistentVolume: phase Pending, reclaim policy Retain, volume mode Filesystem.
    phase = "Terminating" if meta.get("deletionTimestamp") else status.get("phase") or "Pending"
    return [
        meta.get("name", ""),
        _quantity((spec.get("capacity") or {}).get("storage")),
        access_modes(spec.get("accessModes")),
        spec.get("persistentVolumeReclaimPolicy") or "Retain",
        phase,
        claim,
        _storage_class(volume),
        spec.get("volumeAttributesClassName") or "<unset>",
        status.get("reason") or "",
        since(meta.get("creationTimestamp"), now),
        spec.get("volumeMode") or "Filesystem",
    ]


def persistent_volume_claim_row(claim: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printPersistentVolumeClaim`` (v1.32), wide: NAME STATUS VOLUME CAPACITY ACCESS-MODES STORAGECLASS
    VOLUMEATTRIBUTESCLASS AGE VOLUMEMODE. Capacity and access modes come from the status, once the claim names its
    volume."""
    meta, spec, status = _meta(claim), claim.get("spec") or {}, claim.get("status") or {}
    # SetDefaults_PersistentVolumeClaim: phase Pending; SetDefaults_PersistentVolumeClaimSpec: volume mode Filesystem.
    phase = "Terminating" if meta.get("deletionTimestamp") else status.get("phase") or "Pending"
    volume = spec.get("volumeName") or ""
    capacity = _quantity((status.get("capacity") or {}).get("storage")) if volume else ""
    modes = access_modes(status.get("accessModes")) if volume else ""
    return [
        meta.get("name", ""),
        phase,
        volume,
        capacity,
        modes,
        _storage_class(claim),
        spec.get("volumeAttributesClassName") or "<unset>",
        since(meta.get("creationTimestamp"), now),
        spec.get("volumeMode") or "Filesystem",
    ]


def _external_ip(spec: dict[str, Any], status: dict[str, Any], kind: str) -> str:
    """printers.go ``getServiceExternalIP``, wide (the server prints wide, so no 16-character clipping)."""
    external = [str(ip) for ip in spec.get("externalIPs") or []]
    if kind in ("ClusterIP", "NodePort"):
        return ",".join(external) or "<none>"
    if kind == "LoadBalancer":
        ingress = (status.get("loadBalancer") or {}).get("ingress") or []
        # loadBalancerStatusStringer: a sorted set of each ingress point's IP, else its hostname.
        balanced = sorted({i.get("ip") or i.get("hostname") for i in ingress if i.get("ip") or i.get("hostname")})
        if external:
            return ",".join([*balanced, *external])
        return ",".join(balanced) or "<pending>"
    if kind == "ExternalName":
        return str(spec.get("externalName") or "")
    return "<unknown>"


def service_row(service: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printService`` (v1.32), wide: NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE SELECTOR."""
    meta, spec = _meta(service), service.get("spec") or {}
    # SetDefaults_Service: type ClusterIP and each port's protocol TCP; the registry fills clusterIPs from clusterIP.
    kind = spec.get("type") or "ClusterIP"
    cluster_ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    ports = []
    for port in spec.get("ports") or []:
        protocol = port.get("protocol") or "TCP"
        node_port = int(port.get("nodePort") or 0)
        ports.append(
            f"{port.get('port')}:{node_port}/{protocol}" if node_port > 0 else f"{port.get('port')}/{protocol}"
        )
    return [
        meta.get("name", ""),
        kind,
        cluster_ips[0] if cluster_ips else "<none>",
        _external_ip(spec, service.get("status") or {}, kind),
        ",".join(ports) or "<none>",
        since(meta.get("creationTimestamp"), now),
        format_labels(spec.get("selector")),
    ]


def event_row(event: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printEvent`` (v1.32), wide: LAST-SEEN TYPE REASON OBJECT SUBOBJECT SOURCE MESSAGE FIRST-SEEN COUNT
    NAME. An event of the events.k8s.io shape (``eventTime``, ``series``) reads its times and count from those."""
    meta = _meta(event)
    first = since(event["firstTimestamp"], now) if event.get("firstTimestamp") else since(event.get("eventTime"), now)
    last = since(event["lastTimestamp"], now) if event.get("lastTimestamp") else first
    count = int(event.get("count") or 0)
    series = event.get("series")
    if series is not None:
        last, count = since(series.get("lastObservedTime"), now), int(series.get("count") or 0)
    elif count == 0:
        count = 1  # a singleton event of the new API has no count
    involved = event.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    # formatEventSource: source.component (else reportingComponent), then ", host" (else reportingInstance) if any.
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    return [
        last,
        event.get("type") or "",
        event.get("reason") or "",
        target,
        involved.get("fieldPath") or "",
        f"{component}, {host}" if host else component,
        str(event.get("message") or "").strip(),
        first,
        count,
        meta.get("name", ""),
    ]


def config_map_row(config: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printConfigMap`` (v1.32): NAME DATA AGE (keys of ``data`` and ``binaryData``)."""
    meta = _meta(config)
    keys = len(config.get("data") or {}) + len(config.get("binaryData") or {})
    return [meta.get("name", ""), keys, since(meta.get("creationTimestamp"), now)]


def secret_row(secret: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printSecret`` (v1.32): NAME TYPE DATA AGE."""
    meta = _meta(secret)
    # The API server merges stringData into data on write (v1 -> internal conversion) and defaults the type to Opaque
    # (SetDefaults_Secret); the sandbox stores the object as sent, so count the keys of both.
    keys = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
    return [meta.get("name", ""), secret.get("type") or "Opaque", len(keys), since(meta.get("creationTimestamp"), now)]


def pod_template_row(template: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printPodTemplate`` (v1.32): NAME CONTAINERS IMAGES POD-LABELS (no age)."""
    body = template.get("template") or {}
    names, images = _container_cells(body.get("spec") or {})
    return [_meta(template).get("name", ""), names, images, format_labels((body.get("metadata") or {}).get("labels"))]


def daemon_set_row(daemon_set: dict[str, Any], now: float | None = None) -> list[Any]:
    """printers.go ``printDaemonSet`` (v1.32), wide: NAME DESIRED CURRENT READY UP-TO-DATE AVAILABLE NODE-SELECTOR AGE
    CONTAINERS IMAGES SELECTOR. The counts are the status the DaemonSet controller writes (0 until it has)."""
    meta, spec, status = _meta(daemon_set), daemon_set.get("spec") or {}, daemon_set.get("status") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    names, images = _container_cells(pod_spec)
    counts = ("desiredNumberScheduled", "currentNumberScheduled", "numberReady", "updatedNumberScheduled")
    return [
        meta.get("name", ""),
        *(int(status.get(field) or 0) for field in counts),
        int(status.get("numberAvailable") or 0),
        format_labels(pod_spec.get("nodeSelector")),
        since(meta.get("creationTimestamp"), now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


# The built-in kinds with a printer of their own: (columns, row function) by (group/version, plural).
PRINTERS: dict[tuple[str, str], tuple[list[dict[str, Any]], Callable[[dict[str, Any], float | None], list[Any]]]] = {
    ("v1", "pods"): (POD_COLUMNS, pod_row),
    ("v1", "nodes"): (NODE_COLUMNS, node_row),
    ("v1", "namespaces"): (NAMESPACE_COLUMNS, namespace_row),
    ("v1", "serviceaccounts"): (SERVICE_ACCOUNT_COLUMNS, service_account_row),
    ("v1", "persistentvolumes"): (PERSISTENT_VOLUME_COLUMNS, persistent_volume_row),
    ("v1", "persistentvolumeclaims"): (PERSISTENT_VOLUME_CLAIM_COLUMNS, persistent_volume_claim_row),
    ("v1", "services"): (SERVICE_COLUMNS, service_row),
    ("v1", "events"): (EVENT_COLUMNS, event_row),
    ("v1", "configmaps"): (CONFIG_MAP_COLUMNS, config_map_row),
    ("v1", "secrets"): (SECRET_COLUMNS, secret_row),
    ("v1", "podtemplates"): (POD_TEMPLATE_COLUMNS, pod_template_row),
    ("apps/v1", "daemonsets"): (DAEMON_SET_COLUMNS, daemon_set_row),
}


def _json_path(obj: Any, path: str) -> tuple[bool, Any]:
    """A simple JSONPath (``.a.b.c``, what printer columns use) on ``obj``: (found, value)."""
    for key in path.strip(".").split("."):
        if not isinstance(obj, dict) or key not in obj:
            return False, None
        obj = obj[key]
    return True, obj


def _crd_cell(kind: str, found: bool, value: Any, now: float | None) -> Any:
    """apiextensions tableconvertor ``cellForJSONValue`` (and its string branch: the JSONPath printed as text)."""
    if not found or value is None:
        return None
    if kind == "string":
        return value if isinstance(value, str) else json.dumps(value)
    if kind == "integer":
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if kind == "number":
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if kind == "date":
        return since(value, now) if isinstance(value, str) else None
    return None


def columns_for(group_version: str, plural: str) -> list[dict[str, Any]]:
    """The Table's column definitions for a resource type."""
    if (group_version, plural) in PRINTERS:
        return PRINTERS[(group_version, plural)][0]
    if is_custom(group_version):
        columns = PRINTER_COLUMNS.get((group_version, plural), CRD_DEFAULT_COLUMNS)
        return [NAME_COLUMN] + [_column(name, kind, "", priority) for name, kind, _, priority in columns]
    return DEFAULT_COLUMNS


def is_custom(group_version: str) -> bool:
    """Whether the group is served from a CRD (a dotted group that is not a Kubernetes one), not a built-in."""
    group = group_version.rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


def row_cells(group_version: str, plural: str, obj: dict[str, Any], now: float | None = None) -> list[Any]:
    """One object's cells, in :func:`columns_for`'s order."""
    if (group_version, plural) in PRINTERS:
        return PRINTERS[(group_version, plural)][1](obj, now)
    name = (obj.get("metadata") or {}).get("name", "")
    if is_custom(group_version):
        columns = PRINTER_COLUMNS.get((group_version, plural), CRD_DEFAULT_COLUMNS)
        return [name] + [_crd_cell(kind, *_json_path(obj, path), now) for _, kind, path, _ in columns]
    # The default convertor's cell is the creation time itself, m.GetCreationTimestamp().Time.UTC().Format(RFC3339).
    return [name, _rfc3339((obj.get("metadata") or {}).get("creationTimestamp"))]


def _rfc3339(timestamp: str | None) -> str:
    """A timestamp in Go's ``time.RFC3339`` layout in UTC (whole seconds, ``Z``); the zero time for none."""
    if not timestamp:
        return "0001-01-01T00:00:00Z"
    try:
        at = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return timestamp
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _row_object(obj: dict[str, Any], include: str, table_version: str) -> dict[str, Any] | None:
    if include == "Object":
        return obj
    if include == "None":
        return None
    partial = {"kind": "PartialObjectMetadata", "apiVersion": f"{TABLE_GROUP}/{table_version}"}
    return {**partial, "metadata": obj["metadata"]}


def to_table(
    group_version: str, plural: str, body: dict[str, Any], query: Any, table_version: str = "v1"
) -> dict[str, Any]:
    """The Table for a GET's answer (a list or one object); ``query`` gives ``includeObject`` (TableOptions; its
    ``noHeaders`` is ``json:"-"``, not a query parameter). Raises :class:`KubeError` for an includeObject value the
    server refuses."""
    include = query.get("includeObject", "") or "Metadata"
    if include not in INCLUDE_OBJECT:
        raise KubeError(400, "BadRequest", f'unrecognized includeObject value: "{include}"')
    items = body.get("items") if "items" in body else [body]
    now = time.time()
    table: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": f"{TABLE_GROUP}/{table_version}",
        "metadata": {"resourceVersion": (body.get("metadata") or {}).get("resourceVersion", "")},
        "rows": [
            {"cells": row_cells(group_version, plural, obj, now), "object": _row_object(obj, include, table_version)}
            for obj in items or []
        ],
        "columnDefinitions": columns_for(group_version, plural),
    }
    return table


def respond(request: web.Request, group_version: str, plural: str, body: dict[str, Any], status: int) -> web.Response:
    """The JSON answer of a successful GET, as a Table when the client's ``Accept`` asks for one."""
    try:
        version = wanted_table(request.headers.get("Accept", "")) if request.method == "GET" else None
        if version is None or status >= 300 or body.get("kind") == "Status":
            return web.json_response(body, status=status)
        return web.json_response(to_table(group_version, plural, body, request.query, version), status=status)
    except KubeError as exc:
        return web.json_response(exc.status(), status=exc.code)
