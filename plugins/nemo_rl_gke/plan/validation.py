"""The checkpoint validation job: a small Ray job on the run's RayCluster that runs :mod:`nemo_rl_gke.remote`.

The ``remote/`` folder (self-contained: stdlib, PyYAML, torch) travels as ``remote/`` in the job's working_dir, so no
extra image is needed; its JSON report comes back in the job log. The job carries no secret and no env var.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.plan.ray_job import JobRequest
from nemo_rl_gke.run.checkpoint_layout import layout_of
from nemo_rl_gke.run.gpu_layout import layout
from nemo_rl_gke.run.recipes import load_recipe

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

# Package-relative, as the working_dir files of a job name it (raysubmit.stage_working_dir resolves it).
REMOTE_PACKAGE = "nemo_rl_gke/remote"
# The config keys the validator compares with the checkpoint's config.yaml.
EXPECTED_CONFIG_KEYS = (
    "policy.model_name",
    "grpo.max_num_steps",
    "policy.dtensor_cfg.tensor_parallel_size",
    "cluster.num_nodes",
    "cluster.gpus_per_node",
    # Which save path wrote it (run/checkpoint_layout.py): the layout the validator expects.
    "policy.dtensor_cfg._v2",
    "checkpointing.model_save_format",
    "checkpointing.save_consolidated",
)


def expectation(spec: RunSpec, step: int, *, stopped: bool = False) -> dict[str, Any]:
    """What the submitted run must have produced: the checkpoint of ``step``, one shard per training rank, its
    config; ``stopped`` when the job was stopped after that save (it converged)."""
    recipe = load_recipe(spec.recipe)
    config = recipe.effective_config(spec)
    return {
        "step": step,
        "stopped": stopped,
        "training_ranks": layout(config).train_gpus,
        "config": {k: config[k] for k in EXPECTED_CONFIG_KEYS if k in config},
        "layout": layout_of(recipe.nemo_rl_version, config).to_dict(),
    }


def validation_job(
    spec: RunSpec, dag_id: str, run_id: str, training_submission_id: str, expected: dict[str, Any]
) -> JobRequest:
    """The validation job of one DAG run, after the training job ``training_submission_id``: exactly once per run
    (its id is the training job's plus ``-validate``)."""
    # /data is the Lustre mount on GKE; the sandbox sets SANDBOX_DATA_DIR to the directory standing in for it.
    rest = spec.checkpoint_dir.removeprefix("/data")
    mount = '"${SANDBOX_DATA_DIR:-/data}"'
    target = f"{mount}{shlex.quote(rest)}"
    return JobRequest(
        submission_id=f"{training_submission_id}-validate",
        # --list-steps: every step_N on the instance, which teardown compares with the records before a delete.
        entrypoint=f"python -m remote validate {target} --expect {shlex.quote(json.dumps(expected))} "
        f"--list-steps {mount}",
        env_vars={},
        secrets=(),
        working_dir_files=(REMOTE_PACKAGE,),
        metadata={"airflow_dag_id": dag_id, "airflow_run_id": run_id, "purpose": "validate"},
    )


def planned_validation_job(
    spec: RunSpec, dag_id: str, run_id: str, training_submission_id: str, step: int | str
) -> JobRequest:
    """The validation job as the plan shows it: the checkpoint of ``step``, not stopped early (a run that converges
    stops at an earlier save, and the job then expects that one)."""
    return validation_job(
        spec,
        dag_id,
        run_id,
        training_submission_id,
        expectation(spec, step),  # type: ignore[arg-type]
    )
