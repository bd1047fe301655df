"""The GRPO Ray job a run submits: submission id, entrypoint, runtime env and metadata, with secrets as references.

Secrets never enter this object as values: they are :class:`SecretEnv` references to Airflow connections, so a
job request can be logged, planned and pushed to XCom as it is. The submitting task resolves them at the last
moment, straight into the request it sends to Ray. Which connections may be referenced is the deployment's choice
(:class:`~nemo_rl_gke.deployment.Deployment`): the conf may only pick among them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.deployment import Deployment

if TYPE_CHECKING:
    from nemo_rl_gke.recipes import Recipe
    from nemo_rl_gke.spec import RunSpec

RUN_ID_PLACEHOLDER = "<run_id>"
HF_TOKEN_ENV = "HF_TOKEN"
WANDB_KEY_ENV = "WANDB_API_KEY"


@dataclass(frozen=True)
class SecretEnv:
    """An environment variable whose value is the password of an Airflow connection."""

    name: str
    conn_id: str

    @property
    def redacted(self) -> str:
        """What plans, logs and XCom show instead of the value."""
        return f"<redacted: password of Airflow connection '{self.conn_id}'>"


@dataclass(frozen=True)
class JobRequest:
    """Everything the Ray Jobs API gets for the GRPO job, secrets as references."""

    submission_id: str
    entrypoint: str
    env_vars: dict[str, str]
    secrets: tuple[SecretEnv, ...]
    working_dir_files: tuple[str, ...]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def shell_entrypoint(self) -> str:
        """What Ray runs: the script under bash (Ray's shell is /bin/sh, dash on Ubuntu images: no pipefail)."""
        return f"bash -c {shlex.quote(self.entrypoint)}"

    def runtime_env(self) -> dict[str, Any]:
        """The runtime env with every secret redacted (the submitter substitutes the real values)."""
        env = dict(self.env_vars)
        env.update({s.name: s.redacted for s in self.secrets})
        runtime: dict[str, Any] = {"env_vars": env}
        if self.working_dir_files:
            runtime["working_dir"] = {"files": list(self.working_dir_files)}
        return runtime

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the plan and XCom (redacted)."""
        return {
            "submission_id": self.submission_id,
            "entrypoint": self.entrypoint,
            "runtime_env": self.runtime_env(),
            "metadata": self.metadata,
        }


def job_secrets(spec: RunSpec, deployment: Deployment | None = None) -> tuple[SecretEnv, ...]:
    """The secrets the job needs: the HF token always, the W&B key with W&B logging.

    The connections are the conf's choice among those ``deployment`` allows (None: the defaults), '' meaning the
    deployment's first; any other raises :class:`~nemo_rl_gke.deployment.ConnectionNotAllowedError`.
    """
    deployment = deployment or Deployment()
    secrets = [SecretEnv(HF_TOKEN_ENV, deployment.hf_conn_id(spec.hf_conn_id))]
    if spec.wandb_enabled:
        secrets.append(SecretEnv(WANDB_KEY_ENV, deployment.wandb_conn_id(spec.wandb_conn_id)))
    return tuple(secrets)


def allowed_secret_conn_ids(deployment: Deployment) -> dict[str, tuple[str, ...]]:
    """Which connections each secret env var may be read from in ``deployment``."""
    return {HF_TOKEN_ENV: deployment.hf_conn_ids, WANDB_KEY_ENV: deployment.wandb_conn_ids}


def job_request(
    spec: RunSpec,
    recipe: Recipe,
    dag_id: str,
    run_id: str = RUN_ID_PLACEHOLDER,
    deployment: Deployment | None = None,
) -> JobRequest:
    """The GRPO job of one DAG run; the submission id is stable across retries of the same run."""
    known = run_id != RUN_ID_PLACEHOLDER
    return JobRequest(
        submission_id=spec.submission_id(dag_id, run_id)
        if known
        else "<derived from the DAG run: nemo-rl-<run id>-<hash>>",
        entrypoint=recipe.command(spec),
        env_vars=dict(recipe.env),
        secrets=job_secrets(spec, deployment),
        working_dir_files=recipe.files,
        metadata={
            "airflow_dag_id": dag_id,
            "airflow_run_id": run_id,
            "recipe": recipe.name,
            "nemo_rl_version": recipe.nemo_rl_version,
            "image": recipe.image_for(spec),
        },
    )
