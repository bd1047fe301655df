"""The GRPO Ray job a run submits: submission id, entrypoint, runtime env and metadata, with secrets as references.

Secrets never enter this object as values: they are :class:`SecretEnv` references to Airflow connections, so a
job request can be logged, planned and pushed to XCom as it is. The submitting task resolves them at the last
moment, straight into the request it sends to Ray. Which connections may be referenced is the deployment's choice
(:class:`~nemo_rl_gke.run.deployment.Deployment`): the conf may only pick among them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.deployment import Deployment

if TYPE_CHECKING:
    from nemo_rl_gke.run.recipes import Recipe
    from nemo_rl_gke.run.spec import RunSpec

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
    deployment's first; any other raises :class:`~nemo_rl_gke.run.deployment.ConnectionNotAllowedError`.
    """
    deployment = deployment or Deployment()
    secrets = [SecretEnv(HF_TOKEN_ENV, deployment.hf_conn_id(spec.hf_conn_id))]
    if spec.wandb_enabled:
        secrets.append(SecretEnv(WANDB_KEY_ENV, deployment.wandb_conn_id(spec.wandb_conn_id)))
    return tuple(secrets)


def allowed_secret_conn_ids(deployment: Deployment) -> dict[str, tuple[str, ...]]:
    """Which connections each secret env var may be read from in ``deployment``."""
    return {HF_TOKEN_ENV: deployment.hf_conn_ids, WANDB_KEY_ENV: deployment.wandb_conn_ids}


# The exit status of a job the lineage guard stopped before it trained.
LINEAGE_EXIT = 3


def lineage_guard(spec: RunSpec, resumed_step: int | str | None, set_aside: Sequence[int] = ()) -> str:
    """Shell lines that stop the job before it trains unless ``checkpoint_dir`` holds exactly what this run means
    to start from. NeMo RL resumes from the highest ``step_N`` it finds there, whoever wrote it: with ``resume=none``
    (or ``latest`` with no lineage yet) it must hold none, so the run starts from step 0; with ``latest`` its highest
    must be the lineage's ``resumed_step``, so the run continues its own lineage and nobody else's. The directory is
    read where the job runs (``/data`` is the Lustre mount; the sandbox's Ray sets ``SANDBOX_DATA_DIR``).

    ``set_aside`` (``resume=promoted``) are the lineage's own exported steps past the published one: moved first into
    ``checkpoint_dir/not_promoted/`` (kept, never deleted; each is also in Cloud Storage), so NeMo RL resumes from the
    published step and not from a night that was not promoted."""
    rest = shlex.quote(spec.checkpoint_dir.removeprefix("/data"))
    aside = [int(step) for step in set_aside]  # ints only: they reach the shell
    expected = "none" if resumed_step is None else str(resumed_step)
    if resumed_step is None:
        why = (
            f"resume={spec.resume} starts from step 0, but checkpoint_dir {spec.checkpoint_dir} already holds "
            "step_$newest, which NeMo RL would resume from. Fix: a checkpoint_dir of its own for this run"
            + (", or resume=latest to continue that lineage." if spec.resume == "none" else ".")
        )
    else:
        why = (
            f"resume={spec.resume} continues this DAG's lineage from step {resumed_step}, but the newest checkpoint in "
            f"checkpoint_dir {spec.checkpoint_dir} is step_$newest, which this lineage did not export (another DAG's, "
            "or a failed run's). Fix: a checkpoint_dir of its own for this DAG, or resume=none with an empty one."
        )
    # The message names the step found: $newest is left outside the single quotes, so the shell expands it.
    message = shlex.quote("nemo-rl-gke: not started: " + why).replace("$newest", "'$newest'")
    moves = []
    if aside:
        # A stamp per move: a step set aside on an earlier night keeps its copy.
        moves = [
            f"for step in {' '.join(str(step) for step in aside)}; do",
            '  if [ -d "$ckpt_dir/step_$step" ]; then',
            '    mkdir -p "$ckpt_dir/not_promoted"',
            '    mv -T "$ckpt_dir/step_$step" "$ckpt_dir/not_promoted/step_$step.$(date -u +%Y%m%dT%H%M%SZ)"',
            '    echo "nemo-rl-gke: set aside step_$step (not promoted) in $ckpt_dir/not_promoted/"',
            "  fi",
            "done",
        ]
    return "\n".join(
        [
            f'ckpt_dir="${{SANDBOX_DATA_DIR:-/data}}"{rest}',
            *moves,
            "newest=$(find \"$ckpt_dir\" -mindepth 1 -maxdepth 1 -type d -name 'step_*' -printf '%f\\n' "
            "2>/dev/null | sed -n 's/^step_\\([0-9][0-9]*\\)$/\\1/p' | sort -n | tail -n 1 || true)",
            f'if [ "${{newest:-none}}" != {shlex.quote(expected)} ]; then',
            f"  echo {message} >&2",
            f"  exit {LINEAGE_EXIT}",
            "fi",
        ]
    )


def job_request(
    spec: RunSpec,
    recipe: Recipe,
    dag_id: str,
    run_id: str = RUN_ID_PLACEHOLDER,
    deployment: Deployment | None = None,
    *,
    resumed_step: int | str | None = None,
    must_save_by: str | None = None,
    set_aside: Sequence[int] = (),
) -> JobRequest:
    """The GRPO job of one DAG run; the submission id is stable across retries of the same run. ``resumed_step`` is
    the lineage's step the resume step chose (None: the run starts from step 0), which the job checks first, after
    setting aside ``set_aside`` (:func:`lineage_guard`).
    ``must_save_by`` ("DD:HH:MM:SS", from the budget left at submit) becomes NeMo RL's
    ``checkpointing.checkpoint_must_save_by``, the last override (a key no conf override may touch)."""
    known = run_id != RUN_ID_PLACEHOLDER
    command = recipe.command(spec)
    if must_save_by is not None:
        if not re.fullmatch(r"\d{2}:\d{2}:\d{2}:\d{2}", must_save_by):
            raise ValueError(f"must_save_by must be DD:HH:MM:SS, got {must_save_by!r}")
        command += f" checkpointing.checkpoint_must_save_by={must_save_by}"
    return JobRequest(
        submission_id=spec.submission_id(dag_id, run_id)
        if known
        else "<derived from the DAG run: nemo-rl-<run id>-<hash>>",
        entrypoint=lineage_guard(spec, resumed_step, set_aside) + "\n" + command,
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
