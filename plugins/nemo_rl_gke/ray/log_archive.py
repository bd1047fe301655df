"""Copy the RayCluster's Ray session logs to Cloud Storage before teardown deletes it: the raylet, GCS, driver and
worker logs of every node, which otherwise go with the pods' emptyDirs (only container stdout outlives them).

Ray's own log API, through the dashboard the run already reaches (the API server's service proxy, with the Google
token, and the Ray token when the RayCluster has token auth; :meth:`RayJobsHook.for_run`), as Ray 2.60's State API
serves it (``ray/dashboard/modules/state/state_head.py``):

* ``GET /api/v0/nodes`` (``list_nodes``): the nodes, head and workers, alive or dead;
* ``GET /api/v0/logs?node_id=...&glob=*`` (``list_logs``, state_head.py:185-234): the files in each node's
  ``/tmp/ray/session_latest/logs`` by category (``{"raylet": [...], "worker_out": [...]}``), directories ending in
  ``/``;
* ``GET /api/v0/logs/file?node_id=...&filename=...&lines=N`` (``get_log``, state_head.py:236-320): the file's last N
  lines, streamed; the node's log agent seeks them from the file's end (``log_agent.py`` ``StreamLog``:
  ``find_start_offset_last_n_lines_from_offset``), so a large file is not read whole.

Ray's Python ``list_logs`` / ``get_log`` (``ray/util/state/api.py``) take neither headers nor a CA bundle, so the same
endpoints are called with ``requests``, verified against the cluster's CA, never unverified.

What is copied, its caps and the index are :mod:`nemo_rl_gke.run.ray_logs`. Every value the run knows to be secret
(the job's tokens, the Ray token, the Google token) is replaced by ``***`` in what is written: the runtime-env agent
and the job manager may log a job's environment. :func:`archive_ray_logs` never raises: teardown must delete the
RayCluster whatever happened here, so every failure is recorded in the index and the summary instead.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import requests

from nemo_rl_gke.gcp.hooks import is_not_found
from nemo_rl_gke.gcp.pending import execute
from nemo_rl_gke.kube.access import DashboardAddress
from nemo_rl_gke.kube.client import ObjectRef
from nemo_rl_gke.ray.hooks import RayJobsHook
from nemo_rl_gke.run.ownership import owner_from_labels
from nemo_rl_gke.run.ray_logs import (
    INDEX_NAME,
    ArchiveIndex,
    CopiedFile,
    LogCaps,
    RayNode,
    TailBuffer,
    copy_order,
    keep_last_lines,
    list_log_names,
    node_rows,
    not_copied,
    short_error,
)

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.kube.client import KubeHook
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec

log = logging.getLogger(__name__)

# One request to the dashboard may take this long (a log file of the caps' size streams in well under it).
REQUEST_TIMEOUT_S = 30.0
CHUNK_BYTES = 64 * 1024
MASK = b"***"
# Shorter values are not masked: replacing every "ab" in a log would say nothing and hide a lot.
MIN_SECRET_CHARS = 6
ALIVE = "ALIVE"
# The index object's metadata key holding the summary.
SUMMARY_METADATA = "summary"


class StateApiError(RuntimeError):
    """The Ray State API refused or failed a request."""


class RayLogsApi:
    """Ray's State API log endpoints on one dashboard.

    :param address: where the dashboard is, and the CA that signs it.
    :param headers: what every request carries (the Google and the Ray token); never logged.
    """

    def __init__(
        self, address: DashboardAddress, headers: Mapping[str, str], timeout_s: float = REQUEST_TIMEOUT_S
    ) -> None:
        self.url = address.url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.headers.update(headers)
        # Given with every request: a session's verify loses to REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE (requests 2.34
        # sessions.py merge_environment_settings:855, which reads them when the request's own verify is None).
        self.verify = address.verify()

    def _json(self, path: str, params: Mapping[str, Any]) -> Any:
        response = self.session.get(self.url + path, params=dict(params), timeout=self.timeout_s, verify=self.verify)
        if response.status_code != 200:
            raise StateApiError(f"GET {path}: HTTP {response.status_code}: {response.text[:200]}")
        body = response.json()
        # Ray's rest_response: {"result": bool, "msg": str, "data": {"result": ...}}
        if not body.get("result", False):
            raise StateApiError(f"GET {path}: {body.get('msg') or 'Ray answered result=false'}")
        return (body.get("data") or {}).get("result")

    def nodes(self) -> list[RayNode]:
        """Every node Ray knows of, head first."""
        found = self._json("/api/v0/nodes", {"limit": 10_000, "detail": "false", "timeout": int(self.timeout_s)})
        rows = found.get("result") if isinstance(found, Mapping) else found
        nodes = [RayNode.from_state(row) for row in rows or [] if isinstance(row, Mapping)]
        return sorted(nodes, key=lambda n: (not n.is_head, n.node_id))

    def list_logs(self, node: RayNode) -> list[str]:
        """The log files of one node (relative to its log directory, directories left out)."""
        listing = self._json("/api/v0/logs", {"node_id": node.node_id, "glob": "*", "timeout": int(self.timeout_s)})
        return list_log_names(listing if isinstance(listing, Mapping) else {})

    def read_tail(self, node: RayNode, name: str, cap: int, lines: int) -> tuple[bytes, bool, int]:
        """The file's tail: (at most ``cap`` bytes of its last ``lines`` lines, whether anything was cut, the bytes
        cut off at least). Ray is asked for one line more, which tells a longer file from one of exactly ``lines``."""
        params = {"node_id": node.node_id, "filename": name, "lines": lines + 1, "timeout": int(self.timeout_s)}
        with self.session.get(
            self.url + "/api/v0/logs/file", params=params, stream=True, timeout=self.timeout_s, verify=self.verify
        ) as response:
            if response.status_code != 200:
                raise StateApiError(f"get_log {name}: HTTP {response.status_code}: {response.text[:200]}")
            buffer = TailBuffer(cap)
            for chunk in response.iter_content(chunk_size=CHUNK_BYTES):
                buffer.add(chunk)
        data, dropped = buffer.tail()
        data, more_lines = keep_last_lines(data, lines)
        return data, bool(dropped) or more_lines, dropped

    def close(self) -> None:
        """Close the HTTP session."""
        self.session.close()


def mask_secrets(data: bytes, secrets: Iterable[str]) -> bytes:
    """``data`` with every secret value (long enough to mean something) replaced by ``***``."""
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True):
        data = data.replace(secret.encode(), MASK)
    return data


class BucketWriter:
    """Writes the archive's objects under one ``gs://bucket/prefix/`` through the GCP hook (its retry policy)."""

    def __init__(self, hook: GcpHook, uri: str) -> None:
        bucket, _, prefix = uri.removeprefix("gs://").partition("/")
        self.hook, self.bucket, self.prefix = hook, bucket, prefix

    def put(self, name: str, data: bytes, content_type: str, metadata: Mapping[str, str] | None = None) -> str:
        """Write ``prefix + name``; returns the object name."""
        from googleapiclient.http import MediaInMemoryUpload

        object_name = self.prefix + name
        body: dict[str, Any] = {"name": object_name, "contentType": content_type}
        if metadata:
            body["metadata"] = dict(metadata)
        request = self.hook.storage.objects().insert(
            bucket=self.bucket, body=body, media_body=MediaInMemoryUpload(data, mimetype=content_type)
        )
        execute(self.hook, request, f"write gs://{self.bucket}/{object_name}")
        return object_name

    def metadata(self, name: str) -> dict[str, str] | None:
        """An object's custom metadata, or None when the object does not exist."""
        request = self.hook.storage.objects().get(bucket=self.bucket, object=self.prefix + name)
        try:
            found = execute(self.hook, request, f"read gs://{self.bucket}/{self.prefix}{name}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return {str(k): str(v) for k, v in (found.get("metadata") or {}).items()}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def copy_logs(
    api: RayLogsApi,
    writer: BucketWriter,
    index: ArchiveIndex,
    secrets: Sequence[str] = (),
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Copy every alive node's logs into ``writer``'s prefix, recording each file in ``index`` (errors included)."""
    deadline = clock() + index.caps.deadline_s
    nodes = api.nodes()
    index.nodes = node_rows(nodes)
    files: list[tuple[RayNode, str]] = []
    for node in nodes:
        if node.state != ALIVE:
            # A dead node's log agent went with it (a lost worker): nothing to ask for.
            index.nodes[nodes.index(node)]["error"] = f"node is {node.state or 'in no state'}: its logs went with it"
            continue
        try:
            files += [(node, name) for name in api.list_logs(node)]
        except Exception as exc:
            index.nodes[nodes.index(node)]["error"] = short_error(f"list_logs failed: {exc}")
    for node, name in copy_order(files):
        row = {"node": node.folder, "node_id": node.node_id, "file": name}
        budget = min(index.caps.per_file_bytes, index.remaining())
        if budget <= 0:
            index.files.append(CopiedFile(**row, skipped="total cap reached"))
            continue
        if clock() > deadline:
            index.files.append(CopiedFile(**row, skipped=f"time budget of {index.caps.deadline_s:g} s spent"))
            continue
        try:
            data, truncated, dropped = api.read_tail(node, name, budget, index.caps.tail_lines)
            data = mask_secrets(data, secrets)
            metadata = {"truncated": str(truncated).lower(), "node_id": node.node_id, "ray_file": name}
            written = writer.put(f"{node.folder}/{name}", data, "text/plain; charset=utf-8", metadata)
        except Exception as exc:
            index.files.append(CopiedFile(**row, error=short_error(exc)))
            continue
        index.files.append(
            CopiedFile(**row, object=written, bytes=len(data), truncated=truncated, dropped_bytes=dropped)
        )


def archive_ray_logs(
    hook: GcpHook,
    address: DashboardAddress,
    headers: Mapping[str, str],
    uri: str,
    *,
    secrets: Sequence[str] = (),
    caps: LogCaps | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Copy the Ray session logs of the dashboard at ``address`` to ``uri`` (``gs://bucket/prefix/``), write the index
    there, and return its summary (:func:`~nemo_rl_gke.run.ray_logs.summarize`). Never raises: a failure is in the
    summary and the index. ``secrets`` are masked in everything written (the headers' tokens are added)."""
    index = ArchiveIndex(uri=uri, caps=caps or LogCaps(), started_at=_now())
    tokens = [v.removeprefix("Bearer ").strip() for v in headers.values()]
    masked = [*secrets, *tokens]
    started = time.monotonic()
    try:
        writer = BucketWriter(hook, uri)
    except Exception as exc:
        return not_copied(uri, f"cannot write to {uri}: {exc}")
    api = None
    try:
        api = RayLogsApi(address, headers)
        copy_logs(api, writer, index, masked, clock)
    except Exception as exc:
        index.error(f"copying the Ray logs through {address.via} failed: {type(exc).__name__}: {exc}")
    finally:
        if api is not None:
            api.close()
    index.finished_at = _now()
    summary = index.summary()
    try:
        document = json.dumps(index.to_dict(), indent=1).encode()
        # The summary rides along as the index's metadata: a retry that finds the RayCluster gone reports it from
        # there (one objects.get, no download).
        writer.put(
            INDEX_NAME, mask_secrets(document, masked), "application/json", {SUMMARY_METADATA: json.dumps(summary)}
        )
    except Exception as exc:
        index.error(f"writing {uri}{INDEX_NAME} failed: {exc}")
        summary = {**index.summary(), "index": ""}
    log.info(
        "Ray logs: %s file(s), %s bytes (%s cut to their tail, %s skipped, %s error(s)) to %s in %.1f s",
        summary["files"],
        summary["bytes"],
        summary["truncated"],
        summary["skipped"],
        summary["errors"],
        uri,
        time.monotonic() - started,
    )
    if summary["error"]:
        log.warning("Ray logs: first error: %s", summary["error"])
    return {**summary, "seconds": round(time.monotonic() - started, 1), "copied": bool(summary["files"])}


def earlier_copy(hook: GcpHook, uri: str) -> dict[str, Any] | None:
    """The summary an earlier try recorded with its index at ``uri`` (a retry finds the RayCluster already gone), or
    None when there is none."""
    try:
        metadata = BucketWriter(hook, uri).metadata(INDEX_NAME)
        found = json.loads((metadata or {}).get(SUMMARY_METADATA) or "null")
    except Exception as exc:
        log.warning("Ray logs: could not read an earlier copy's index at %s: %s", uri, short_error(exc))
        return None
    return {**found, "copied": bool(found.get("files")), "earlier_try": True} if isinstance(found, dict) else None


def archive_before_delete(
    spec: RunSpec,
    gcp: GcpHook,
    kube: KubeHook,
    owner: Owner,
    deployment: Deployment,
    *,
    uri: str,
    secrets: Sequence[str] = (),
    caps: LogCaps | None = None,
) -> dict[str, Any]:
    """Teardown's step before it deletes the run's RayCluster: copy its Ray logs to ``uri``, and return the summary.

    Nothing to copy when the RayCluster is absent (the run failed before it, or an earlier try deleted it: then that
    try's summary, if it wrote one) or not this run group's (teardown keeps it, logs and all). Never raises.
    """
    try:
        ref = ObjectRef("ray.io/v1", "RayCluster", spec.raycluster_name, spec.namespace)
        actual = kube.get(ref)
        if actual is None or (actual.get("metadata") or {}).get("deletionTimestamp"):
            # A retry after its delete: the earlier try's copy stands (a new one would find no dashboard and
            # overwrite it with errors).
            gone = "no" if actual is None else "a terminating"
            return earlier_copy(gcp, uri) or not_copied(uri, f"{gone} {ref} to copy from")
        if not owner.owns(owner_from_labels((actual.get("metadata") or {}).get("labels"))):
            return not_copied(uri, f"{ref} is not this run group's: teardown keeps it, with its logs")
        ray = RayJobsHook.for_run(spec, gcp, deployment)
    except Exception as exc:
        log.warning("Ray logs: not copied: %s", short_error(exc))
        return not_copied(uri, f"{type(exc).__name__}: {exc}")
    return archive_ray_logs(gcp, ray.address, ray.headers, uri, secrets=secrets, caps=caps)
