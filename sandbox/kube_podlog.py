"""The ``pods/{name}/log`` subresource: what ``kubectl logs`` reads, served from the pod's local Ray process.

The API server checks the pod and the container (``pkg/registry/core/pod/strategy.go`` ``LogLocation`` and
``validateContainer``: no container named in a pod of several is 400 "a container name must be specified for pod P,
choose one of: [a b]", an unknown one 400 "container C is not valid for pod P"; a pod on no node yet answers an empty
log) and validates ``PodLogOptions`` (``pkg/apis/core/validation`` ``ValidatePodLogOptions``: ``tailLines`` >= 0,
``limitBytes`` >= 1, else 422); the kubelet then serves the container's stdout, or 400 "container C in pod P is
waiting to start: REASON" for a container that never ran.

Here the Ray container's stdout is its ``ray start --block`` output (:meth:`sandbox.kuberay.KubeRay.ray_log`); any
other container of the template (a sidecar) runs no process in the sandbox, so its log is empty. ``follow`` streams
the file until the Ray process stops. ``timestamps``, ``sinceSeconds``, ``sinceTime`` and ``previous`` need what the
sandbox does not keep (a time per line, a previous container), so they are refused with 400 rather than ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sandbox.kube_errors import KubeError
from sandbox.kuberay import container_names

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from sandbox.kube_cluster import KubeCluster
    from sandbox.kuberay import KubeRay

# How often a followed log looks for new output.
FOLLOW_POLL_S = 0.2
UNMODELLED = ("timestamps", "sinceSeconds", "sinceTime", "previous")


def _count(query: Any, key: str, minimum: int, pod: str) -> int | None:
    """An integer option of PodLogOptions (None: not given); 400 when not an integer, 422 below ``minimum``."""
    text = query.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError as exc:
        raise KubeError(400, "BadRequest", f'strconv.ParseInt: parsing "{text}": invalid syntax') from exc
    if value < minimum:
        rule = "must be greater than or equal to 0" if minimum == 0 else "must be greater than 0"
        raise KubeError(422, "Invalid", f'PodLogOptions "{pod}" is invalid: {key}: Invalid value: {value}: {rule}')
    return value


def container_for(pod: dict[str, Any], asked: str) -> str:
    """``validateContainer``: the container asked for, or the only one; 400 as the API server words it."""
    name = pod["metadata"]["name"]
    names = container_names(pod)
    if not asked:
        if len(names) == 1:
            return names[0]
        raise KubeError(
            400, "BadRequest", f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
        )
    if asked not in names:
        raise KubeError(400, "BadRequest", f"container {asked} is not valid for pod {name}")
    return asked


def _waiting(pod: dict[str, Any], container: str) -> str | None:
    """The kubelet's refusal for a container that has not run yet (None: it has, or is running)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if status.get("name") == container and waiting and waiting.get("reason") != "CrashLoopBackOff":
            name = pod["metadata"]["name"]
            return f'container "{container}" in pod "{name}" is waiting to start: {waiting.get("reason", "")}'
    return None


def tail(text: bytes, lines: int | None, limit: int | None) -> bytes:
    """The last ``lines`` lines of ``text`` (all when None), then at most ``limit`` bytes of that."""
    if lines is not None:
        parts = text.splitlines(keepends=True)
        text = b"".join(parts[len(parts) - lines :] if lines else [])
    return text[:limit] if limit is not None else text


async def pod_log(
    request: web.Request, cluster: KubeCluster, pod: dict[str, Any], kuberay: KubeRay
) -> web.StreamResponse:
    """Answer ``GET .../pods/{name}/log`` for ``pod`` (raises :class:`KubeError` as the API server refuses one)."""
    query = request.query
    name = pod["metadata"]["name"]
    for option in UNMODELLED:
        if option in query and query[option] not in ("", "false"):
            raise KubeError(400, "BadRequest", f"the sandbox does not model the log option {option}")
    lines = _count(query, "tailLines", 0, name)
    limit = _count(query, "limitBytes", 1, name)
    follow = query.get("follow", "false") in ("true", "1")
    container = container_for(pod, query.get("container", ""))
    if not (pod.get("spec") or {}).get("nodeName") and (pod.get("status") or {}).get("phase") == "Pending":
        refusal = _waiting(pod, container)
        if refusal is not None:
            raise KubeError(400, "BadRequest", refusal)
        return web.Response(body=b"", content_type="text/plain")
    path, runs = kuberay.ray_log(cluster, pod["metadata"].get("namespace", ""), name)
    if container != container_names(pod)[0] or path is None:
        # A sidecar (or a pod whose Ray was never started): no process writes to it here.
        return web.Response(body=b"", content_type="text/plain")
    text = path.read_bytes() if path.exists() else b""
    body = tail(text, lines, limit)
    if not follow:
        return web.Response(body=body, content_type="text/plain")
    return await _follow(request, path, len(text), body, limit=limit, runs=runs)


async def _follow(
    request: web.Request, path: Path, offset: int, first: bytes, *, limit: int | None, runs: Callable[[], bool]
) -> web.StreamResponse:
    """Stream ``first``, then what is appended to ``path`` from ``offset``, until the process stops (or ``limit``)."""
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    sent = len(first)
    with contextlib.suppress(ConnectionResetError):
        await response.write(first)
        while limit is None or sent < limit:
            alive = runs()
            size = path.stat().st_size if path.exists() else offset
            if size > offset:
                with path.open("rb") as source:
                    source.seek(offset)
                    chunk = source.read(size - offset)
                offset = size
                chunk = chunk if limit is None else chunk[: limit - sent]
                sent += len(chunk)
                await response.write(chunk)
            elif not alive:
                break
            await asyncio.sleep(FOLLOW_POLL_S)
        await response.write_eof()
    return response
