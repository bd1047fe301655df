"""Kubernetes manifests of a run, rendered from the RunSpec alone (plus the image and, at apply time, the Lustre IP).

The Jinja templates live in include/manifests. This module is imported while Airflow parses the DAG, so jinja2
and yaml are imported only when something is rendered, and the NCCL installer is never fetched at import.
"""

from __future__ import annotations

import functools
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from nemo_rl_gke.paths import MANIFESTS_DIR
from nemo_rl_gke.spec import OWNER_LABEL_KEY
from nemo_rl_gke.topology import LUSTRE_STORAGE, NCCL_INSTALLER, NETWORK_MAPPING, RAYCLUSTER

if TYPE_CHECKING:
    import jinja2

    from nemo_rl_gke.spec import RunSpec

LUSTRE_IP_PLACEHOLDER = "<LUSTRE_IP from the instance's mountPoint>"
NCCL_INSTALLER_TEMPLATE = "nccl-rdma-installer.yaml.j2"
NETWORK_MAPPING_TEMPLATE = "network-mapping.yaml.j2"
LUSTRE_STORAGE_TEMPLATE = "lustre-storage.yaml.j2"
RAYCLUSTER_TEMPLATE = "raycluster.yaml.j2"
# The template each object group of the topology renders (the NCCL installer may come from another source).
TEMPLATES = {
    NCCL_INSTALLER: NCCL_INSTALLER_TEMPLATE,
    NETWORK_MAPPING: NETWORK_MAPPING_TEMPLATE,
    LUSTRE_STORAGE: LUSTRE_STORAGE_TEMPLATE,
    RAYCLUSTER: RAYCLUSTER_TEMPLATE,
}
NCCL_FETCH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object and the template (or source) it came from."""

    template: str
    obj: dict[str, Any]

    @property
    def api_version(self) -> str:
        """The object's apiVersion, e.g. ``ray.io/v1``."""
        return str(self.obj["apiVersion"])

    @property
    def kind(self) -> str:
        """The object's kind, e.g. ``RayCluster``."""
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        """metadata.name."""
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str | None:
        """metadata.namespace, or None for a cluster-scoped object."""
        namespace = self.obj["metadata"].get("namespace")
        return None if namespace is None else str(namespace)


class ManifestSourceError(ValueError):
    """An NCCL installer source that is not 'bundled', an absolute path, file:/// or https://, or not a manifest."""


@functools.cache
def _environment(directory: Path) -> jinja2.Environment:
    import jinja2  # lazy: rendering happens in tasks and the CLI, never while the DAG file is parsed

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.policies["json.dumps_kwargs"] = {"sort_keys": True, "default": _json_default}
    return environment


def _json_default(value: object) -> object:
    # `x | tojson` hands an undefined x straight to json.dumps, which would fail with a bare TypeError;
    # stringifying a StrictUndefined raises the UndefinedError that names the missing variable instead.
    str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable; templates take str, int, bool, list, dict")


def render_template(name: str, **context: Any) -> list[dict[str, Any]]:
    """Render one template of include/manifests and parse it into its (non-empty) YAML documents."""
    text = _environment(MANIFESTS_DIR).get_template(name).render(**context)
    return _parse_documents(text, name)


def _parse_documents(text: str, source: str) -> list[dict[str, Any]]:
    import yaml  # lazy, see _environment

    documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    for doc in documents:
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            raise ManifestSourceError(f"{source}: every YAML document must be a Kubernetes object, got {doc!r:.80}")
    return documents


def render_manifests(spec: RunSpec, image: str, lustre_ip: str = LUSTRE_IP_PLACEHOLDER) -> list[Manifest]:
    """Every Kubernetes object of the run, in apply order.

    The order is: the NCCL RDMA installer (only when ``spec.nccl_installer_source`` is ``bundled``; other sources are
    read at apply time by :func:`load_nccl_installer`), the network mapping (GKENetworkParamSet + Network pairs), the
    Lustre PersistentVolume and PersistentVolumeClaim, the ServiceAccount and the RayCluster.

    ``image`` is the NeMo RL image resolved from the recipe. ``lustre_ip`` is the address part of the Lustre
    instance's mountPoint; plan mode leaves the placeholder.
    """
    manifests: list[Manifest] = []
    if spec.nccl_installer_source == "bundled":
        manifests += [
            Manifest(NCCL_INSTALLER_TEMPLATE, obj) for obj in render_template(NCCL_INSTALLER_TEMPLATE, spec=spec)
        ]
    manifests += [
        Manifest(NETWORK_MAPPING_TEMPLATE, obj) for obj in render_template(NETWORK_MAPPING_TEMPLATE, spec=spec)
    ]
    manifests += [
        Manifest(LUSTRE_STORAGE_TEMPLATE, obj)
        for obj in render_template(LUSTRE_STORAGE_TEMPLATE, spec=spec, lustre_ip=lustre_ip)
    ]
    manifests += [
        Manifest(RAYCLUSTER_TEMPLATE, obj) for obj in render_template(RAYCLUSTER_TEMPLATE, spec=spec, image=image)
    ]
    return manifests


def load_nccl_installer(spec: RunSpec, timeout: float = NCCL_FETCH_TIMEOUT_S) -> list[dict[str, Any]]:
    """The NCCL RDMA installer objects named by ``spec.nccl_installer_source``.

    ``bundled`` renders include/manifests/nccl-rdma-installer.yaml.j2; an absolute path or a ``file:///`` URL is read
    from disk; an ``https://`` URL is downloaded (with ``timeout`` seconds). Call it at apply time only, never while a
    DAG is parsed. Objects from a file or URL get the run's ownership labels added, since this package applies them
    and its teardown deletes them. Anything else raises :class:`ManifestSourceError` (a ValueError).
    """
    source = spec.nccl_installer_source
    if source == "bundled":
        return render_template(NCCL_INSTALLER_TEMPLATE, spec=spec)
    if source.startswith("https://"):
        # The scheme is checked above, so urlopen cannot be steered to file:// or ftp:// here.
        with urllib.request.urlopen(source, timeout=timeout) as response:
            text = response.read().decode("utf-8")
    elif source.startswith("file:///") or source.startswith("/"):
        path = Path(unquote(urlparse(source).path)) if source.startswith("file:") else Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ManifestSourceError(f"nccl_installer_source={source!r}: cannot read {path}: {exc}") from exc
    else:
        raise ManifestSourceError(
            f"nccl_installer_source={source!r}: use 'bundled', an https:// URL, an absolute path or a file:/// URL"
        )
    objects = _parse_documents(text, source)
    if not objects:
        raise ManifestSourceError(f"nccl_installer_source={source!r}: no Kubernetes object in it")
    return [_with_labels(obj, spec.labels) for obj in objects]


def _with_labels(obj: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    metadata = dict(obj.get("metadata") or {})
    own = {key: value for key, value in labels.items() if key != OWNER_LABEL_KEY}
    # The ownership marker wins over whatever the file says; the file's other labels are kept.
    metadata["labels"] = {**own, **(metadata.get("labels") or {}), OWNER_LABEL_KEY: labels[OWNER_LABEL_KEY]}
    return {**obj, "metadata": metadata}
