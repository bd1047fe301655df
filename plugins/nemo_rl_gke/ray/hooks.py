"""The Ray Jobs API for tasks (sync): submit a job exactly once, read its status and its log from an offset, stop it.

The hook's connection is the run's Ray dashboard (:class:`~nemo_rl_gke.kube.access.DashboardAddress`) and the
headers a request to it needs: the Google bearer token through the API server's service proxy, and Ray's own token
(``X-Ray-Authorization``, read from KubeRay's Secret and masked first) when the RayCluster has token auth. TLS is
verified against the cluster's CA, or the system's CAs for the deployment's ``ray_dashboard_url``; never switched off.

The ``submission_id`` comes from the DAG run (:meth:`RunSpec.submission_id`), so a retried submit task finds the job it
already started: Ray answers a duplicate id with "already exists" (FACTS §6), and the job is adopted instead of run
twice. :class:`~nemo_rl_gke.ray.async_hooks.RayJobsAsyncHook` is the triggers' counterpart.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests
from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from nemo_rl_gke.kube.access import DashboardAddress
from nemo_rl_gke.kube.client import KubeHook, ObjectRef
from nemo_rl_gke.plan.ray_job import JobRequest
from nemo_rl_gke.ray.errors import RayTlsError, tls_error
from nemo_rl_gke.ray.submit import (
    hide_secret_bodies,
    kuberay_name,
    ray_token_headers,
    ray_token_of,
    ray_token_secret_path,
    ray_token_source,
)
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.paths import PLUGINS_DIR, RECIPES_DIR

# Re-exported: the errors live in ray.errors, which the async side imports without the sync clients.
__all__ = ["RayJobsHook", "RayTlsError", "Submission", "tls_error"]

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.run.spec import RunSpec


@dataclass(frozen=True)
class Submission:
    """What the submit task did: ``submitted`` a new job or ``adopted`` the one this run already started."""

    submission_id: str
    action: str
    status: str
    # Epoch seconds Ray started an adopted job (None for a new one: it starts now).
    started_at: float | None = None

    def to_dict(self) -> dict[str, str]:
        """JSON form for XCom (no secrets: only the id, the action and the status)."""
        return {"submission_id": self.submission_id, "action": self.action, "status": self.status}


class RayJobsHook(BaseHook):
    """The Ray Jobs API of one dashboard, through Ray's ``JobSubmissionClient``.

    :param address: where the Jobs API is, and the CA that signs it.
    :param headers: what every request carries (the Google and the Ray token); never logged.
    """

    def __init__(self, address: DashboardAddress, headers: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.address = address
        self.headers = dict(headers or {})

    @classmethod
    def for_run(cls, spec: RunSpec, gcp: GcpHook, deployment: Deployment) -> RayJobsHook:
        """The hook for the run's RayCluster (or the deployment's dashboard): the Google token through the API
        server, and the Ray token (masked first) when the RayCluster has token auth."""
        kube = KubeHook(spec, gcp)
        address = kube.dashboard(deployment)
        headers = kube.dashboard_headers(address)
        if ray_token_source(spec):
            hide_secret_bodies()
            secret = kube.get(ObjectRef("v1", "Secret", kuberay_name(spec.raycluster_name), spec.namespace))
            token = ray_token_of(secret, ray_token_secret_path(spec.namespace, spec.raycluster_name))
            mask_secret(token)
            headers.update(ray_token_headers(token))
        return cls(address, headers)

    @cached_property
    def client(self) -> JobSubmissionClient:
        """Ray's client for the address, its SDK's log records routed as :func:`route_ray_logs` says.

        The client checks the connection when it is made, and Ray words a certificate that does not verify as
        "Failed to connect": :class:`RayTlsError` says what it is.
        """
        # Ray is imported by the tasks that talk to it only: the triggerer imports this module and never loads Ray.
        from ray.job_submission import JobSubmissionClient

        route_ray_logs()
        verify = self.address.verify()
        try:
            return JobSubmissionClient(address=self.address.url, headers=dict(self.headers), verify=verify)
        except ConnectionError as exc:
            cause = exc.__cause__ or exc.__context__
            if not isinstance(cause, requests.exceptions.SSLError):
                raise
            against = f"the CA in {verify}" if isinstance(verify, str) else "the system's CAs"
            raise tls_error(self.address.url, against, cause) from cause

    def status(self, submission_id: str) -> str | None:
        """The job's status (``RUNNING``, ``SUCCEEDED``, ...), or None when Ray has no job with this id."""
        # Ray's get_job_status is get_job_info's status: one request either way.
        info = self.job_info(submission_id)
        return None if info is None else str(info.get("status"))

    def submit(self, request: JobRequest, secrets: Mapping[str, str]) -> Submission:
        """Submit the job, or adopt it when its submission id already exists on the cluster.

        ``secrets`` (resolved by :func:`~nemo_rl_gke.ray.submit.resolve_secrets`) join the runtime env's variables;
        the request itself carries references only.
        """
        existing = self.job_info(request.submission_id)
        if existing is not None:
            self.log.info(
                "Ray job %s already exists (%s): adopting it, not submitting again",
                request.submission_id,
                existing.get("status"),
            )
            return self._adopted(request.submission_id, existing)
        runtime_env: dict[str, Any] = {"env_vars": {**request.env_vars, **secrets}}
        with tempfile.TemporaryDirectory(prefix="nemo-rl-job-") as staging:
            if request.working_dir_files:
                runtime_env["working_dir"] = str(stage_working_dir(request, Path(staging) / "working_dir"))
            try:
                self.client.submit_job(
                    entrypoint=request.shell_entrypoint,
                    submission_id=request.submission_id,
                    runtime_env=runtime_env,
                    metadata=dict(request.metadata),
                )
            except RuntimeError as exc:
                # A submit that reached Ray but whose answer was lost: the retry lands here, and the job is ours.
                if "already exists" not in str(exc):
                    raise
                self.log.info("Ray job %s already exists: adopting it", request.submission_id)
                return self._adopted(request.submission_id, self.job_info(request.submission_id) or {})
        self.log.info("Submitted Ray job %s", request.submission_id)
        return Submission(request.submission_id, "submitted", "PENDING")

    @staticmethod
    def _adopted(submission_id: str, info: Mapping[str, Any]) -> Submission:
        """An adopted job, with when Ray started it: its timeout counts from there, not from the adoption."""
        started = info.get("start_time")
        return Submission(
            submission_id, "adopted", str(info.get("status") or "PENDING"), float(started) / 1000 if started else None
        )

    def job_info(self, submission_id: str) -> dict[str, Any] | None:
        """Ray's record of the job (status, message, error_type, start_time and end_time in ms, ...); None: no such
        job."""
        try:
            details = self.client.get_job_info(submission_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc) or "Not Found" in str(exc):
                return None
            raise
        data = details.dict() if hasattr(details, "dict") else dict(vars(details))
        # JobStatus is a str Enum: its value is the bare name ('RUNNING'), its str() is not.
        return {k: (v.value if hasattr(v, "value") else v) for k, v in data.items() if not k.startswith("_")}

    def logs(self, submission_id: str, offset: int = 0) -> str:
        """The job's driver log from character ``offset`` on (``GET /api/jobs/{id}/logs`` answers the whole log)."""
        return str(self.client.get_job_logs(submission_id))[offset:]

    def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job; True when it was running. Raises RuntimeError when Ray has no such job."""
        return bool(self.client.stop_job(submission_id))


def stage_working_dir(request: JobRequest, into: Path) -> Path:
    """Copy the files the job needs (recipe-relative, ``nemo_rl_gke/``-relative, or absolute) into one flat directory:
    the job's working_dir. A directory (a package such as ``nemo_rl_gke/remote``) is copied whole, by its name."""
    into.mkdir(parents=True, exist_ok=True)
    for name in request.working_dir_files:
        if Path(name).is_absolute():
            source = Path(name)
        elif name.startswith("nemo_rl_gke/"):
            source = PLUGINS_DIR / name
        else:
            source = RECIPES_DIR / name
        if source.is_dir():
            shutil.copytree(source, into / source.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, into / source.name)
    return into


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
