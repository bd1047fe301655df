"""Kubernetes manifests of a run, rendered from the RunSpec alone (plus the image and, at apply time, the Lustre IP).

The Jinja templates live in include/manifests. This module is imported while Airflow parses the DAG, so jinja2
and yaml are imported only when something is rendered, and the NCCL installer is never fetched at import.

The NCCL installer runs privileged on every GPU node, so a source other than the bundled template is held to the
deployment's rules (:func:`installer_source_problem`): an https URL on its allowlist (and every redirect too), or a
.yaml file inside include/. What such a source holds is never quoted in an error: a wrong path must not turn the
validator into a way to read files on the worker.
"""

from __future__ import annotations

import functools
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run import paths
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.ownership import Owner
from nemo_rl_gke.run.paths import MANIFESTS_DIR
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.topology import LUSTRE_STORAGE, NCCL_INSTALLER, NETWORK_MAPPING, RAYCLUSTER

if TYPE_CHECKING:
    import jinja2

    from nemo_rl_gke.run.spec import RunSpec

LUSTRE_IP_PLACEHOLDER = "<LUSTRE_IP from the instance's mountPoint>"
NCCL_INSTALLER_TEMPLATE = "nccl-rdma-installer.yaml.j2"
NETWORK_MAPPING_TEMPLATE = "network-mapping.yaml.j2"
LUSTRE_STORAGE_TEMPLATE = "lustre-storage.yaml.j2"
RAYCLUSTER_TEMPLATE = "raycluster.yaml.j2"
# The Ray pods' log-shipping sidecar, as the tutorial's chart values give it (head.sidecarContainers and
# additionalWorkerGroups.worker-grp-0.sidecarContainers: fluent/fluent-bit:latest).
FLUENT_BIT_IMAGE = "fluent/fluent-bit:latest"
# The template each object group of the topology renders (the NCCL installer may come from another source).
TEMPLATES = {
    NCCL_INSTALLER: NCCL_INSTALLER_TEMPLATE,
    NETWORK_MAPPING: NETWORK_MAPPING_TEMPLATE,
    LUSTRE_STORAGE: LUSTRE_STORAGE_TEMPLATE,
    RAYCLUSTER: RAYCLUSTER_TEMPLATE,
}
NCCL_FETCH_TIMEOUT_S = 30.0
# A real installer manifest is a few KB; anything near this is not one.
NCCL_SOURCE_MAX_BYTES = 1 << 20
INSTALLER_SUFFIXES = (".yaml", ".yml")


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
    """An NCCL installer source that is not allowed, cannot be read, or does not hold Kubernetes objects."""


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


def _loader() -> Any:
    import yaml  # lazy, see _environment

    # libyaml parses the same YAML several times faster; the pure-Python loader is the fallback.
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_documents(text: str, source: str, *, untrusted: bool = False) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``text``; each must be a Kubernetes object.

    ``untrusted`` text (a file or URL named by a conf) may hold no aliases (no alias bombs), and errors say where,
    never what: PyYAML's own messages quote the offending line.
    """
    import yaml  # lazy, see _environment

    try:
        if untrusted and any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=_loader())):
            raise ManifestSourceError(f"{source}: YAML aliases are not accepted in an installer manifest")
        documents = [doc for doc in yaml.load_all(text, Loader=_loader()) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ManifestSourceError(f"{source}: not valid YAML{where}") from None
    for n, doc in enumerate(documents, 1):
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            what = type(doc).__name__ if not isinstance(doc, dict) else "a mapping without apiVersion and kind"
            raise ManifestSourceError(f"{source}: YAML document {n} must be a Kubernetes object, not {what}")
    return documents


def render_manifests(spec: RunSpec, image: str, owner: Owner, lustre_ip: str = LUSTRE_IP_PLACEHOLDER) -> list[Manifest]:
    """Every Kubernetes object of the run, in apply order.

    The order is: the NCCL RDMA installer (only when ``spec.nccl_installer_source`` is ``bundled``; other sources are
    read at apply time by :func:`load_nccl_installer`), the network mapping (GKENetworkParamSet + Network pairs), the
    Lustre PersistentVolume and PersistentVolumeClaim, the ServiceAccount and the RayCluster.

    ``image`` is the NeMo RL image resolved from the recipe. ``lustre_ip`` is the address part of the Lustre
    instance's mountPoint; plan mode leaves the placeholder.
    """
    manifests: list[Manifest] = []
    for group, template in TEMPLATES.items():
        if group == NCCL_INSTALLER and spec.nccl_installer_source != "bundled":
            continue  # read at apply time from its source
        manifests += [Manifest(template, obj) for obj in rendered_group(spec, group, owner, image, lustre_ip)]
    return manifests


def rendered_group(
    spec: RunSpec, group: str, owner: Owner, image: str | None = None, lustre_ip: str = LUSTRE_IP_PLACEHOLDER
) -> list[dict[str, Any]]:
    """The objects of one group of the topology rendered from its template, with what that template needs besides
    the spec and the owner (the one place a group finds its template: the plan and the apply both ask here). The
    NCCL installer renders its bundled template; :func:`load_nccl_installer` reads any other source. ``image``: the
    recipe's NeMo RL image when None."""
    if group not in TEMPLATES:
        raise ValueError(f"unknown Kubernetes object group {group!r}; one of {', '.join(TEMPLATES)}")
    needs: dict[str, Any] = {}
    if group == LUSTRE_STORAGE:
        needs = {"lustre_ip": lustre_ip}
    elif group == RAYCLUSTER:
        needs = raycluster_context(spec, image or load_recipe(spec.recipe).image_for(spec))
    return render_template(TEMPLATES[group], spec=spec, owner=owner, **needs)


def raycluster_context(spec: RunSpec, image: str) -> dict[str, Any]:
    """What the RayCluster template needs besides the spec and the owner: the images and the pinned Ray's facts."""
    return {"image": image, "fluent_bit_image": FLUENT_BIT_IMAGE, "ray": load_recipe(spec.recipe).version}


def installer_source_problem(source: str, deployment: Deployment) -> str:
    """Why ``source`` may not be the NCCL installer's source in ``deployment`` ('' when it may).

    Allowed: ``bundled``; an https URL on the deployment's allowlist; a .yaml file inside include/ (relative to it,
    or absolute), with no ``..`` and no symlink leading out. Pure apart from looking at that file's metadata.
    """
    if source == "bundled":
        return ""
    if "://" in source or source.lower().startswith(("http:", "https:", "file:")):
        return deployment.installer_url_problem(source)
    return _include_path_problem(source)[1]


def _include_path_problem(source: str) -> tuple[Path | None, str]:
    """The resolved file inside include/ that ``source`` names, or the reason it is not one."""
    include = paths.INCLUDE_DIR.resolve()
    if not source or not source.isprintable() or "\\" in source:
        return None, "it is neither 'bundled', an https URL nor a file path"
    pure = PurePosixPath(source)
    if ".." in pure.parts:
        return None, "the path has a '..' component"
    if not source.endswith(INSTALLER_SUFFIXES):
        return None, "an installer file must end in .yaml or .yml"
    path = Path(source) if pure.is_absolute() else include / source
    try:
        resolved = path.resolve()  # follows symlinks: one that leads out of include/ is caught below
    except (OSError, RuntimeError):
        return None, "the path cannot be resolved"
    if not resolved.is_relative_to(include):
        return None, f"the file must be inside include/ ({include}); paths elsewhere on the worker are refused"
    try:
        if not resolved.is_file():
            return None, "no such file inside include/"
        if resolved.stat().st_size > NCCL_SOURCE_MAX_BYTES:
            return None, f"the file is larger than {NCCL_SOURCE_MAX_BYTES} bytes"
    except OSError:
        return None, "the file cannot be read"
    return resolved, ""


class _AllowlistRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to another URL the deployment allows: never to http, never off the allowlist."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        """Refuse (raise) unless ``newurl`` is on the allowlist; then redirect as urllib would."""
        problem = self.deployment.installer_url_problem(newurl)
        if problem:
            raise ManifestSourceError(
                f"nccl_installer_source: the server redirected (HTTP {code}) to a URL that is not allowed: {problem}"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_installer(
    url: str,
    deployment: Deployment,
    *,
    timeout: float = NCCL_FETCH_TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> str:
    """Download the installer manifest at ``url`` (https, on the allowlist, certificate verified).

    Every redirect must stay on the allowlist; the body is read up to :data:`NCCL_SOURCE_MAX_BYTES`. Errors name the
    HTTP status or the network error, never the body. ``context`` is for tests (a private CA); the default verifies
    against the system's CAs.
    """
    problem = deployment.installer_url_problem(url)
    if problem:
        raise ManifestSourceError(f"nccl_installer_source is not allowed: {problem}")
    https = urllib.request.HTTPSHandler(context=context or ssl.create_default_context())
    opener = urllib.request.build_opener(_AllowlistRedirects(deployment), https)
    try:
        with opener.open(url, timeout=timeout) as response:
            body = response.read(NCCL_SOURCE_MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ManifestSourceError(f"nccl_installer_source: the server answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ManifestSourceError(f"nccl_installer_source could not be fetched: {type(reason).__name__}") from None
    if len(body) > NCCL_SOURCE_MAX_BYTES:
        raise ManifestSourceError(f"nccl_installer_source: the download is larger than {NCCL_SOURCE_MAX_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestSourceError("nccl_installer_source: the download is not UTF-8 text") from None


def load_nccl_installer(
    spec: RunSpec,
    owner: Owner,
    deployment: Deployment | None = None,
    *,
    timeout: float = NCCL_FETCH_TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> list[dict[str, Any]]:
    """The NCCL RDMA installer objects named by ``spec.nccl_installer_source``, judged by ``deployment``.

    ``bundled`` renders include/manifests/nccl-rdma-installer.yaml.j2; an https URL on the deployment's allowlist is
    downloaded (see :func:`fetch_installer`); a .yaml file inside include/ is read. The source is checked again
    here, as validate did, since the deployment or the file may have changed since. Call it at apply time only,
    never while a DAG is parsed. Objects from a file or URL get the run's ownership labels added, since this package
    applies them and its teardown deletes them. Anything not allowed raises :class:`ManifestSourceError`.
    """
    deployment = deployment or Deployment()
    source = spec.nccl_installer_source
    if source == "bundled":
        return rendered_group(spec, NCCL_INSTALLER, owner)
    problem = installer_source_problem(source, deployment)
    if problem:
        raise ManifestSourceError(f"nccl_installer_source is not allowed: {problem}")
    label = "nccl_installer_source"
    if source.startswith("https://"):
        text = fetch_installer(source, deployment, timeout=timeout, context=context)
    else:
        path, problem = _include_path_problem(source)
        if path is None:
            raise ManifestSourceError(f"nccl_installer_source is not allowed: {problem}")
        try:
            data = path.read_bytes()[: NCCL_SOURCE_MAX_BYTES + 1]
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            raise ManifestSourceError(f"{label}: cannot read the file as UTF-8 text") from None
    objects = _parse_documents(text, label, untrusted=True)
    if not objects:
        raise ManifestSourceError(f"{label}: no Kubernetes object in it")
    return [_with_labels(obj, owner.labels) for obj in objects]


def _with_labels(obj: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    metadata = dict(obj.get("metadata") or {})
    # The owner's labels win over whatever the file says; the file's other labels are kept.
    metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    return {**obj, "metadata": metadata}
