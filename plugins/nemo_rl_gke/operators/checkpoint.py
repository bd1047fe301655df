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
from nemo_rl_gke.raysubmit import ray_token_source
from nemo_rl_gke.topology import CHECK_CHECKPOINT, CHECKPOINT_REPORT, JOB_SUMMARY, LUSTRE, RESUME, SUBMIT, WAIT

if TYPE_CHECKING:
    from nemo_rl_gke.spec import RunSpec

# The validator is one file with no package imports, so it can run in any image that has torch and PyYAML.
VALIDATOR = Path(__file__).resolve().parents[1] / "checkpoints.py"


def final_step(context: Context, spec: RunSpec) -> int:
    """The step whose checkpoint the run validates and exports: where the job stopped after converging, or the last
    step (``max_steps``, or the epoch cap below it) for a job that ran to its end."""
    waited = pull(context, WAIT) or {}
    step = waited.get("final_step")
    return int(step) if step is not None else spec.final_step


def expectation(spec: RunSpec, step: int, *, stopped: bool = False) -> dict[str, Any]:
    """What the submitted run must have produced: the checkpoint of ``step``, one shard per training rank, its
    config; ``stopped`` when the job was stopped after that save (it converged)."""
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
        "step": step,
        "stopped": stopped,
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

        from nemo_rl_gke.ray.hooks import RayJobsHook
        from nemo_rl_gke.rayjobs import JobRequest
        from nemo_rl_gke.triggers.rayjob import RayJobTrigger

        spec = self.run_spec(context)
        submitted = pull(context, SUBMIT)
        # /data is the Lustre mount on GKE; the sandbox sets SANDBOX_DATA_DIR to the directory standing in for it.
        rest = spec.checkpoint_dir.removeprefix("/data")
        mount = '"${SANDBOX_DATA_DIR:-/data}"'
        target = f"{mount}{shlex.quote(rest)}"
        converged = (pull(context, WAIT) or {}).get("converged_at") is not None
        expected = expectation(spec, final_step(context, spec), stopped=converged)
        request = JobRequest(
            submission_id=f"{submitted['submission_id']}-validate",
            # --list-steps: every step_N on the instance, which teardown compares with the records before a delete.
            entrypoint=f"python checkpoints.py validate {target} --expect {shlex.quote(json.dumps(expected))} "
            f"--list-steps {mount}",
            env_vars={},
            secrets=(),
            working_dir_files=(str(VALIDATOR),),
            metadata={
                "airflow_dag_id": context["dag"].dag_id,
                "airflow_run_id": context["run_id"],
                "purpose": "validate",
            },
        )
        ray = RayJobsHook.for_run(spec, self.hook, self.deployment)
        submission = ray.submit(request, {})
        self.log.info("Validating %s: %s", spec.checkpoint_dir, request.entrypoint)
        self.defer_until(
            context,
            spec,
            RayJobTrigger,
            what=f"checkpoint validation job {submission.submission_id}",
            address=ray.address.url,
            submission_id=submission.submission_id,
            needs_token=ray.address.needs_token,
            zero_learning_steps=0,
            ca_pem=ray.address.ca_pem,
            **ray_token_source(spec),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Read the report from the job log; fail with every problem it lists."""
        from nemo_rl_gke.checkpoints import find_report
        from nemo_rl_gke.ray.hooks import RayJobsHook

        spec = self.run_spec(context)
        logs = RayJobsHook.for_run(spec, self.hook, self.deployment).logs(event["submission_id"])
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
    """Exports the validated step to ``gs://<bucket>/<dag>/<run>/<dir>/step_N/`` (``<dir>``: checkpoint_dir under
    /data, so a resume can import the run's prefix into Lustre's ``/``) with Lustre's exportData, deferred.

    On success it publishes an event on its outlet Asset with ``{"uri", "step", "metrics", "shards"}`` in the extra,
    and returns ``{"action": "exported", "uri", "step"}``. A failed export fails the task and says where the checkpoint
    still is; teardown then keeps Lustre (unless the conf accepts the loss).
    """

    operator_extra_links = EXPORT_LINKS
    ui_color = "#fff3d6"

    def _request_id(self, context: Context, spec: RunSpec) -> str:
        # Stable per run and step: a retried export reuses the operation it started instead of copying twice.
        step = final_step(context, spec)
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{context['dag'].dag_id}/{context['run_id']}/{step}"))

    def execute(self, context: Context) -> None:
        """Start the export and defer on its operation."""
        from google.cloud import lustre_v1

        from nemo_rl_gke.gcp.operations import LONGRUNNING, OperationRef
        from nemo_rl_gke.triggers.operations import OperationTrigger

        spec = self.run_spec(context)
        step = final_step(context, spec)
        uri = spec.export_uri(context["dag"].dag_id, context["run_id"], step)
        source = spec.checkpoint_lustre_path(step)
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

    def unmark(self, context: Context, spec: RunSpec, step: int, uri: str) -> None:
        """The checkpoint has a copy now: this run's record becomes a receipt naming it (other runs' records stay)."""
        from nemo_rl_gke.gcp.pending import CheckpointRecords
        from nemo_rl_gke.gcp.resources import resources
        from nemo_rl_gke.ownership import PendingCheckpoint

        owner = self.identity(context, spec)
        lustre = resources(spec, owner)[LUSTRE]
        actual = lustre.get(self.hook)
        if actual is None or not lustre.owned(actual):
            return
        where = CheckpointRecords(self.hook, spec, actual).put(
            PendingCheckpoint(owner.run, step, spec.checkpoint_dir, uri=uri)
        )
        self.log.info("%s: run %s's checkpoint is exported; its record %s says where", lustre.label, owner.run, where)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Publish the Asset event, or fail saying where the checkpoint still is."""
        spec = self.run_spec(context)
        step = final_step(context, spec)
        uri = spec.export_uri(context["dag"].dag_id, context["run_id"], step)
        source = spec.checkpoint_lustre_path(step)
        if event.get("status") != "success":
            raise AirflowFailException(
                f"the export of the checkpoint to {uri} failed: {event.get('message')}. The checkpoint is still on "
                f"Lustre instance {spec.lustre_name} at {source} ({spec.checkpoint_dir}/step_{step} in "
                "the pods); teardown keeps that instance. Export it by hand (gcloud lustre instances export-data), or "
                f"let a later run's teardown delete it: release_checkpoint_of_run='{context['dag'].dag_id}/"
                f"{context['run_id']}' in its conf."
            )
        report = pull(context, CHECK_CHECKPOINT, CHECKPOINT_REPORT) or {}
        summary = pull(context, WAIT, JOB_SUMMARY) or {}
        # The checkpoint this run continued from: following parents walks a schedule's lineage night by night.
        parent = (pull(context, RESUME) or {}).get("parent") or {}
        extra = {
            "uri": uri,
            "step": step,
            "metrics": summary,
            "shards": report.get("shards", {}),
            "parent": parent.get("uri"),
            "parent_step": parent.get("step"),
        }
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = extra
        self.log.info("Checkpoint step %s exported to %s", step, uri)
        self.unmark(context, spec, step, uri)
        return {"action": outcomes.EXPORTED, "uri": uri, "step": step}


# How many of the lineage's latest checkpoints the resume step reads (the report shows them).
LINEAGE_SHOWN = 30


class ResumeOperator(StepOperator):
    """Continual training (``resume=latest``): the checkpoint to continue from, in Lustre before the job starts.

    The lineage is this DAG's exported checkpoints (events on its Asset). Lustre kept warm still holds the newest
    one; a new Lustre gets it imported from Cloud Storage with Lustre's ``importData`` (deferred). ``max_steps``
    becomes the resumed step plus ``steps_per_run``, refused when the recipe's epoch cap would cut it. Returns
    ``{"action", "resumed_from", "max_steps", "parent", "lineage"}``; with ``resume=none`` it changes nothing.
    """

    ui_color = "#fff3d6"

    def execute(self, context: Context) -> dict[str, Any]:
        """Work out where the job resumes; import the checkpoint into a new Lustre, deferred."""
        from nemo_rl_gke.gcp.operations import LONGRUNNING, OperationRef
        from nemo_rl_gke.triggers.operations import OperationTrigger

        spec = self.run_spec(context)
        if spec.resume != "latest":
            return {"action": outcomes.NOT_NEEDED, "resumed_from": None, "max_steps": spec.max_steps,
                    "parent": None, "lineage": []}  # fmt: skip
        lineage = self.lineage(context)
        parent = lineage[-1] if lineage else None
        start = int(parent["step"]) if parent else 0
        max_steps = start + spec.steps_per_run if spec.steps_per_run else spec.max_steps
        self.check_budget(spec, start, max_steps)
        result = {"resumed_from": None, "max_steps": max_steps, "parent": parent, "lineage": lineage}
        if parent is None:
            self.log.info("No checkpoint in this DAG's lineage yet: training from scratch to step %d", max_steps)
            return {**result, "action": outcomes.NOT_NEEDED}
        lustre_action = (pull(context, LUSTRE) or {}).get("action")
        if lustre_action != outcomes.CREATED:
            # Kept warm (exists) or adopted: the lineage's newest checkpoint is still on it, where NeMo RL resumes.
            self.log.info("Resuming from step %d on the warm Lustre, training to step %d", start, max_steps)
            return {**result, "action": "warm", "resumed_from": {"step": start, "source": "lustre"}}
        source = self.import_source(spec, parent["uri"], start)
        target = spec.checkpoint_lustre_path(start)
        request = self.import_request(context, spec, source, start)
        # A transfer already running on the instance refuses this one (ABORTED): the hook retries it, bounded.
        operation = self.hook.call(self.hook.lustre_client.import_data, request=request, what=f"import {target}")
        ref = OperationRef("lustre", f"/v1/{operation.operation.name}", LONGRUNNING, f"import {parent['uri']}")
        what = f"import of {source} into Lustre {spec.lustre_name}:/ for {target} (operation {ref.path})"
        pending = {**result, "action": outcomes.IMPORTED, "resumed_from": {"step": start, "source": parent["uri"]}}
        self.defer_until(context, spec, OperationTrigger, what=what, pending=pending, operation=ref.to_dict())

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The import finished: resume from it; or fail saying what to do."""
        result = self.pending(context)
        if event.get("status") != "success":
            raise AirflowFailException(
                f"importing checkpoint {result['parent']['uri']} into Lustre failed: {event.get('message')}. The job "
                "was not started. Check that the object still exists and the Lustre service agent can read the "
                "bucket, then clear this task; or trigger with resume=none to start over."
            )
        self.log.info("Imported step %s; training to step %d", result["resumed_from"]["step"], result["max_steps"])
        return dict(result)

    def lineage(self, context: Context) -> list[dict[str, Any]]:
        """This DAG's latest exported checkpoints, oldest first: run, step, URI, parent and the night's rewards."""
        events = context["inlet_events"][self.inlets[0]].ascending(False).limit(LINEAGE_SHOWN)
        found = []
        for event in reversed(list(events)):
            extra = event.extra or {}
            if not isinstance(extra.get("uri"), str) or not isinstance(extra.get("step"), int):
                continue  # an event some other producer wrote: not one of ours
            metrics = extra.get("metrics") or {}
            found.append(
                {
                    "run": f"{event.source_dag_id}/{event.source_run_id}",
                    "step": extra["step"],
                    "uri": extra["uri"],
                    "parent": extra.get("parent"),
                    "first_reward": metrics.get("first_reward"),
                    "last_reward": metrics.get("last_reward"),
                }
            )
        return found

    def check_budget(self, spec: RunSpec, start: int, max_steps: int) -> None:
        """Refuse a run that would train nothing, or that the recipe dataset's epoch cap would cut."""
        import dataclasses

        from nemo_rl_gke.nemo_rules import step_budget
        from nemo_rl_gke.recipes import load_recipe

        if max_steps <= start:
            raise AirflowFailException(
                f"max_steps={max_steps} is not past the resumed step {start}: NeMo RL would exit at once. Fix: set "
                "steps_per_run (the steps to train past the resumed step) or a larger max_steps."
            )
        budget = step_budget(dataclasses.replace(spec, max_steps=max_steps), load_recipe(spec.recipe))
        if budget is None:
            self.log.info("Step budget: step %d + %d = max_steps %d", start, max_steps - start, max_steps)
            return
        if budget.capped:
            raise AirflowFailException(
                f"resumed step {start} + steps_per_run {spec.steps_per_run} = {max_steps}, but the recipe's epoch cap "
                f"ends the job first: {budget.explain()}. Nothing was started."
            )
        self.log.info("Step budget: step %d + %d = %s", start, max_steps - start, budget.explain())

    def import_source(self, spec: RunSpec, uri: str, step: int) -> str:
        """The prefix to import into Lustre's ``/`` so the step lands at its checkpoint path.

        An import's Lustre path other than ``/`` must already exist (FACTS §14), and on a new instance only ``/``
        does. The export lays the step out under the exporting run's prefix at its Lustre path
        (:meth:`RunSpec.export_uri`), so that prefix, imported into ``/``, puts it back in place.
        """
        layout = spec.checkpoint_lustre_path(step).lstrip("/") + "/"
        if not uri.endswith("/" + layout):
            raise AirflowFailException(
                f"the lineage's checkpoint {uri} is not laid out as {layout} under its run's prefix, so importing it "
                f"into a new Lustre cannot put it at {spec.checkpoint_dir}/step_{step}: it was exported with another "
                "checkpoint_dir (or by an older version of this package). Fix: trigger with the checkpoint_dir it "
                f"was exported from, or copy it to <run prefix>/{layout} (gcloud storage cp -r), or resume=none."
            )
        return uri.removesuffix(layout)

    def import_request(self, context: Context, spec: RunSpec, source: str, step: int) -> Any:
        """Lustre's importData request of ``source`` into ``/``; its id is stable per run and step, so a retry reuses
        the operation."""
        from google.cloud import lustre_v1

        request_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{context['dag'].dag_id}/{context['run_id']}/import/{step}"))
        return lustre_v1.ImportDataRequest(
            name=spec.lustre_path,
            gcs_path=lustre_v1.GcsPath(uri=source),
            lustre_path=lustre_v1.LustrePath(path="/"),
            request_id=request_id,
        )
