"""Validating the run's final checkpoint where it lives, and exporting it to Cloud Storage before teardown.

Validation is a small Ray job on the run's RayCluster: ``checkpoints.py`` (self-contained) travels as the job's
working_dir, so no extra image is needed, and its JSON report comes back in the job log. Export is Managed Lustre's
``exportData`` long-running operation, waited for by the triggerer; success publishes an Airflow Asset event with
the checkpoint's URI, step, final metrics and shard count, for downstream evaluation DAGs.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from nemo_rl_gke import outcomes
from nemo_rl_gke.links import EXPORT_LINKS
from nemo_rl_gke.operators.base import StepOperator, pull
from nemo_rl_gke.operators.rayjob import dashboard
from nemo_rl_gke.topology import CHECK_CHECKPOINT, CHECKPOINT_REPORT, JOB_SUMMARY, LUSTRE, SUBMIT, WAIT

if TYPE_CHECKING:
    from nemo_rl_gke.spec import RunSpec

# The validator is one file with no package imports, so it can run in any image that has torch and PyYAML.
VALIDATOR = Path(__file__).resolve().parents[1] / "checkpoints.py"


def expectation(spec: RunSpec) -> dict[str, Any]:
    """What the submitted run must have produced: the final step, one shard per training rank, its config."""
    from nemo_rl_gke.nemo_rules import layout
    from nemo_rl_gke.recipes import load_recipe

    config = load_recipe(spec.recipe).effective_config(spec)
    keys = (
        "policy.model_name",
        "grpo.max_num_steps",
        "policy.dtensor_cfg.tensor_parallel_size",
        "cluster.num_nodes",
        "cluster.gpus_per_node",
    )
    return {
        "step": spec.final_step,
        "training_ranks": layout(config).train_gpus,
        "config": {k: config[k] for k in keys if k in config},
    }


class ValidateCheckpointOperator(StepOperator):
    """Runs the checkpoint validator as a Ray job on the cluster and fails with its precise reasons.

    Pushes the validator's JSON report to XCom (``report``) and returns ``{"valid", "step", "shards", ...}``.
    """

    ui_color = "#fff3d6"

    def execute(self, context: Context) -> None:
        """Submit the validation job (exactly once per run) and defer until it ends."""
        import json
        import shlex

        from nemo_rl_gke.rayjobs import JobRequest
        from nemo_rl_gke.raysubmit import submit_once
        from nemo_rl_gke.triggers.rayjob import RayJobTrigger

        spec = self.run_spec(context)
        submitted = pull(context, SUBMIT)
        # /data is the Lustre mount on GKE; the sandbox sets SANDBOX_DATA_DIR to the directory standing in for it.
        rest = spec.checkpoint_dir.removeprefix("/data")
        target = f'"${{SANDBOX_DATA_DIR:-/data}}"{shlex.quote(rest)}'
        request = JobRequest(
            submission_id=f"{submitted['submission_id']}-validate",
            entrypoint=f"python checkpoints.py validate {target} --expect {shlex.quote(json.dumps(expectation(spec)))}",
            env_vars={},
            secrets=(),
            working_dir_files=(str(VALIDATOR),),
            metadata={
                "airflow_dag_id": context["dag"].dag_id,
                "airflow_run_id": context["run_id"],
                "purpose": "validate",
            },
        )
        address, headers = dashboard(spec, self.hook, self.deployment)
        submission = submit_once(request, address.url, headers, {}, verify=address.verify())
        self.log.info("Validating %s: %s", spec.checkpoint_dir, request.entrypoint)
        self.defer_until(
            context,
            spec,
            RayJobTrigger,
            what=f"checkpoint validation job {submission.submission_id}",
            address=address.url,
            submission_id=submission.submission_id,
            needs_token=address.needs_token,
            zero_learning_steps=0,
            ca_pem=address.ca_pem,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Read the report from the job log; fail with every problem it lists."""
        from ray.job_submission import JobSubmissionClient

        from nemo_rl_gke.checkpoints import find_report

        spec = self.run_spec(context)
        address, headers = dashboard(spec, self.hook, self.deployment)
        client = JobSubmissionClient(address=address.url, headers=headers, verify=address.verify())
        logs = client.get_job_logs(event["submission_id"])
        report = find_report(logs)
        if report is None:
            tail = "\n".join(event.get("tail") or [])
            raise AirflowFailException(f"the checkpoint validator produced no report ({event.get('message')}):\n{tail}")
        context["ti"].xcom_push(key=CHECKPOINT_REPORT, value=report)
        if not report.get("valid"):
            problems = "\n".join(f"  - [{p['check']}] {p['path']}: {p['reason']}" for p in report.get("problems", []))
            raise AirflowFailException(f"checkpoint {report.get('path')} is not valid:\n{problems}")
        self.log.info(
            "Checkpoint %s is valid: step %s, shards %s, %s tensors, %s bytes",
            report.get("path"),
            report.get("step"),
            report.get("shards"),
            report.get("tensors"),
            report.get("total_bytes"),
        )
        return {k: report.get(k) for k in ("valid", "path", "step", "shards", "tensors", "total_bytes")}


class ExportCheckpointOperator(StepOperator):
    """Exports the validated step to ``gs://<bucket>/<dag>/<run>/step_N/`` with Lustre's exportData, deferred.

    On success it publishes an event on its outlet Asset with ``{"uri", "step", "metrics", "shards"}`` in the extra,
    and returns ``{"action": "exported", "uri", "step"}``. A failed export fails the task and says where the checkpoint
    still is; teardown then keeps Lustre (unless the conf accepts the loss).
    """

    operator_extra_links = EXPORT_LINKS
    ui_color = "#fff3d6"

    def _request_id(self, context: Context, spec: RunSpec) -> str:
        # Stable per run and step: a retried export reuses the operation it started instead of copying twice.
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{context['dag'].dag_id}/{context['run_id']}/{spec.final_step}"))

    def execute(self, context: Context) -> None:
        """Start the export and defer on its operation."""
        from google.cloud import lustre_v1

        from nemo_rl_gke.gcp.operations import LONGRUNNING, OperationRef
        from nemo_rl_gke.triggers.operations import OperationTrigger

        spec = self.run_spec(context)
        uri = spec.export_uri(context["dag"].dag_id, context["run_id"], spec.final_step)
        source = spec.checkpoint_lustre_path(spec.final_step)
        request = lustre_v1.ExportDataRequest(
            name=spec.lustre_path,
            lustre_path=lustre_v1.LustrePath(path=source),
            gcs_path=lustre_v1.GcsPath(uri=uri),
            request_id=self._request_id(context, spec),
        )
        operation = self.hook.call(self.hook.lustre_client.export_data, request=request, what=f"export {source}")
        ref = OperationRef("lustre", f"/v1/{operation.operation.name}", LONGRUNNING, f"export {source} -> {uri}")
        what = f"export of Lustre {spec.lustre_name}:{source} to {uri} (operation {ref.path})"
        self.defer_until(context, spec, OperationTrigger, what=what, operation=ref.to_dict())

    def unmark(self, context: Context, spec: RunSpec) -> None:
        """The checkpoint has a copy now: take this run's pending mark off Lustre (another run's mark stays)."""
        from nemo_rl_gke.gcp.resources import resources

        owner = self.identity(context, spec)
        lustre = resources(spec, owner)[LUSTRE]
        actual = lustre.get(self.hook)
        pending = lustre.pending_checkpoint(actual) if actual is not None else None  # type: ignore[attr-defined]
        if pending is not None and pending.belongs_to(owner.run):
            lustre.mark(self.hook, None)  # type: ignore[attr-defined]
            self.log.info("%s: the checkpoint mark of run %s is off", lustre.label, pending.run)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Publish the Asset event, or fail saying where the checkpoint still is."""
        spec = self.run_spec(context)
        uri = spec.export_uri(context["dag"].dag_id, context["run_id"], spec.final_step)
        source = spec.checkpoint_lustre_path(spec.final_step)
        if event.get("status") != "success":
            raise AirflowFailException(
                f"the export of the checkpoint to {uri} failed: {event.get('message')}. The checkpoint is still on "
                f"Lustre instance {spec.lustre_name} at {source} ({spec.checkpoint_dir}/step_{spec.final_step} in "
                "the pods); teardown keeps that instance. Export it by hand (gcloud lustre instances export-data) or "
                "re-run with accept_checkpoint_loss=true to let teardown delete it."
            )
        report = pull(context, CHECK_CHECKPOINT, CHECKPOINT_REPORT) or {}
        summary = pull(context, WAIT, JOB_SUMMARY) or {}
        extra = {"uri": uri, "step": spec.final_step, "metrics": summary, "shards": report.get("shards", {})}
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = extra
        self.log.info("Checkpoint step %s exported to %s", spec.final_step, uri)
        self.unmark(context, spec)
        return {"action": outcomes.EXPORTED, "uri": uri, "step": spec.final_step}
