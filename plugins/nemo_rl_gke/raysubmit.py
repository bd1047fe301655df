"""Submitting the GRPO job to the RayCluster exactly once, through Ray's Job Submission API.

The ``submission_id`` comes from the DAG run (:meth:`RunSpec.submission_id`), so a retried submit task finds the job it
already started: Ray answers a duplicate id with "already exists" (FACTS §6), and the job is adopted instead of run
twice. Secrets are resolved here, at the last moment, from Airflow connections into the runtime env only; they are
registered with Airflow's secrets masker first, so no log line can show them. Only connections the deployment allows
for each secret are ever read.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nemo_rl_gke
from nemo_rl_gke.deployment import ConnectionNotAllowedError, Deployment
from nemo_rl_gke.paths import RECIPES_DIR
from nemo_rl_gke.rayjobs import JobRequest, allowed_secret_conn_ids

log = logging.getLogger(__name__)
# KubeRay 1.5.1+ with ``authOptions: {mode: token}`` keeps the Ray token in a Secret named after the RayCluster
# (``utils.CheckName(name)``), under this key (``utils.RAY_AUTH_TOKEN_SECRET_KEY``; `kubectl ray get token` reads it).
RAY_TOKEN_KEY = "auth_token"
# Through the API server's service proxy ``Authorization`` carries the Google token and is consumed by the API server;
# Ray's middleware reads this header next ("for proxies and KubeRay", ray._private.authentication).
RAY_TOKEN_HEADER = "X-Ray-Authorization"


class SecretMissingError(RuntimeError):
    """A connection the job needs a secret from does not exist or has no password."""


class RayTlsError(RuntimeError):
    """The Ray Jobs API's TLS certificate does not verify against the CA it must be signed by (not retried)."""


class RayTokenMissingError(RuntimeError):
    """The RayCluster authenticates with a token, but KubeRay's Secret holding it is missing or has no token."""


def kuberay_name(name: str) -> str:
    """KubeRay's ``utils.CheckName``: the last 50 characters, a leading digit or punctuation replaced by ``r``."""
    name = name[-50:]
    return "r" + name[1:] if name and (name[0].isdigit() or not name[0].isalnum()) else name


def ray_token_secret_path(namespace: str, raycluster: str) -> str:
    """The Kubernetes API path of the Secret KubeRay keeps the RayCluster's Ray token in."""
    return f"/api/v1/namespaces/{namespace}/secrets/{kuberay_name(raycluster)}"


def ray_token_of(secret: Mapping[str, Any] | None, path: str) -> str:
    """The Ray token in KubeRay's Secret (``data.auth_token``, base64); raises :class:`RayTokenMissingError`."""
    import base64
    import binascii

    encoded = ((secret or {}).get("data") or {}).get(RAY_TOKEN_KEY) if isinstance(secret, Mapping) else None
    try:
        token = base64.b64decode(str(encoded or ""), validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        token = ""
    if not token:
        raise RayTokenMissingError(
            f"the RayCluster authenticates with a Ray token, but {path} "
            f"{'does not exist' if secret is None else f'has no {RAY_TOKEN_KEY}'}. KubeRay 1.5.1 or later creates it "
            "for a RayCluster with authOptions {mode: token}: upgrade KubeRay, or check its operator log"
        )
    return token


def ray_token_headers(token: str | None) -> dict[str, str]:
    """The header that carries the Ray token to Ray (none without a token)."""
    return {RAY_TOKEN_HEADER: f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class Submission:
    """What the submit task did: ``submitted`` a new job or ``adopted`` the one this run already started."""

    submission_id: str
    action: str
    status: str

    def to_dict(self) -> dict[str, str]:
        """JSON form for XCom (no secrets: only the id, the action and the status)."""
        return {"submission_id": self.submission_id, "action": self.action, "status": self.status}


def resolve_secrets(
    request: JobRequest, password_of: Callable[[str], str | None], deployment: Deployment | None = None
) -> dict[str, str]:
    """The secret env vars of ``request``, read through ``password_of(conn_id)``; raises when one is missing.

    Every connection is checked against ``deployment`` (None: the defaults) before anything is read, so a request
    naming any other connection raises :class:`ConnectionNotAllowedError` and reads nothing.
    """
    allowed = allowed_secret_conn_ids(deployment or Deployment())
    for secret in request.secrets:
        if secret.conn_id not in allowed.get(secret.name, ()):
            raise ConnectionNotAllowedError(
                f"the job's {secret.name} may be read only from {', '.join(allowed.get(secret.name, ())) or 'no'} "
                "connection(s) of this deployment; nothing was read"
            )
    values = {}
    for secret in request.secrets:
        value = password_of(secret.conn_id)
        if not value:
            raise SecretMissingError(
                f"the job needs {secret.name} from the password of Airflow connection '{secret.conn_id}', which is "
                "missing or empty. Fix: create the connection (UI, CLI, AIRFLOW_CONN_* or the secrets backend) with "
                "the token as its password"
            )
        values[secret.name] = value
    return values


def stage_working_dir(request: JobRequest, into: Path) -> Path:
    """Copy the files the job needs (recipe-relative, ``nemo_rl_gke/``-relative, or absolute) into one flat directory:
    the job's working_dir. A directory (a package such as ``nemo_rl_gke/remote``) is copied whole, by its name."""
    into.mkdir(parents=True, exist_ok=True)
    for name in request.working_dir_files:
        if Path(name).is_absolute():
            source = Path(name)
        elif name.startswith("nemo_rl_gke/"):
            source = Path(nemo_rl_gke.__file__).resolve().parent.parent / name
        else:
            source = RECIPES_DIR / name
        if source.is_dir():
            shutil.copytree(source, into / source.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, into / source.name)
    return into


def submit_once(
    request: JobRequest,
    address: str,
    headers: Mapping[str, str],
    secrets: Mapping[str, str],
    verify: bool | str = True,
) -> Submission:
    """Submit the job, or adopt it when this submission id already exists on the cluster.

    ``verify`` is the TLS check of an https ``address``: True (the system's CAs) or a CA bundle path, e.g.
    :meth:`~nemo_rl_gke.kube.access.DashboardAddress.verify` for the cluster's own CA. It is never switched off.
    """
    client = ray_client(address, headers, verify)
    existing = _status(client, request.submission_id)
    if existing is not None:
        log.info("Ray job %s already exists (%s): adopting it, not submitting again", request.submission_id, existing)
        return Submission(request.submission_id, "adopted", existing)
    runtime_env: dict[str, Any] = {"env_vars": {**request.env_vars, **secrets}}
    with tempfile.TemporaryDirectory(prefix="nemo-rl-job-") as staging:
        if request.working_dir_files:
            runtime_env["working_dir"] = str(stage_working_dir(request, Path(staging) / "working_dir"))
        try:
            client.submit_job(
                entrypoint=request.shell_entrypoint,
                submission_id=request.submission_id,
                runtime_env=runtime_env,
                metadata=dict(request.metadata),
            )
        except RuntimeError as exc:
            # A submit that reached Ray but whose answer was lost: the retry lands here, and the job is ours.
            if "already exists" not in str(exc):
                raise
            status = _status(client, request.submission_id) or "PENDING"
            log.info("Ray job %s already exists: adopting it", request.submission_id)
            return Submission(request.submission_id, "adopted", status)
    log.info("Submitted Ray job %s", request.submission_id)
    return Submission(request.submission_id, "submitted", "PENDING")


def job_log(address: str, headers: Mapping[str, str], submission_id: str, verify: bool | str = True) -> str:
    """The job's whole driver log, as Ray keeps it (``GET /api/jobs/{id}/logs``); TLS verified as in
    :func:`submit_once`."""
    return str(ray_client(address, headers, verify).get_job_logs(submission_id))


def ray_client(address: str, headers: Mapping[str, str], verify: bool | str = True) -> Any:
    """A Ray Jobs client for ``address``, its SDK's log records routed as :func:`route_ray_logs` says.

    ``verify`` is a CA bundle path or True (the system's CAs); never False. The client checks the connection when it
    is made, and Ray words a certificate that does not verify as "Failed to connect": :class:`RayTlsError` says what
    it is.
    """
    import requests
    from ray.job_submission import JobSubmissionClient

    route_ray_logs()
    try:
        return JobSubmissionClient(address=address, headers=dict(headers), verify=verify or True)
    except ConnectionError as exc:
        cause = exc.__cause__ or exc.__context__
        if not isinstance(cause, requests.exceptions.SSLError):
            raise
        against = f"the CA in {verify}" if isinstance(verify, str) and verify else "the system's CAs"
        raise RayTlsError(
            f"the Ray Jobs API at {address} has a TLS certificate that does not verify against {against}: {cause}. "
            "Fix: for the run's own head service the CA is the GKE cluster's (masterAuth.clusterCaCertificate), read "
            "again from the cluster; for the deployment's ray_dashboard_url, a certificate the system trusts"
        ) from cause


def route_ray_logs() -> None:
    """Send the Ray SDK's log records through Python logging at their own level.

    Importing Ray gives its ``ray`` logger a handler of its own on stderr, which the Airflow task runner records as
    errors (red in the UI, whatever the level): the handler goes, and the records reach the task log as what they
    are (``INFO Uploading package ...``).
    """
    ray_logger = logging.getLogger("ray")
    for handler in list(ray_logger.handlers):
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stderr, sys.stdout):
            ray_logger.removeHandler(handler)
    ray_logger.propagate = True


def _status(client: Any, submission_id: str) -> str | None:
    try:
        status = client.get_job_status(submission_id)
    except RuntimeError as exc:
        if "does not exist" in str(exc) or "404" in str(exc) or "Not Found" in str(exc):
            return None
        raise
    # JobStatus is a str Enum: its value is the bare name ('RUNNING'), its str() is not.
    return str(getattr(status, "value", status))
