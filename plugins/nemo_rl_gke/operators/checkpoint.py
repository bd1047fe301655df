"""Validating the run's final checkpoint where it lives, and exporting it to Cloud Storage before teardown.

Validation is a small Ray job on the run's RayCluster that runs :mod:`nemo_rl_gke.remote` (shipped in its
working_dir); its JSON report comes back in the job log. Export is Managed Lustre's ``exportData`` long-running
operation, waited for by the triggerer; success publishes an Airflow Asset event with the checkpoint's URI, step,
final metrics and shard count, for downstream evaluation DAGs. Every request these steps send (the validation job,
the export, the resume's import) is built by the plan layer (:mod:`nemo_rl_gke.plan.validation`,
:mod:`nemo_rl_gke.plan.transfers`, :mod:`nemo_rl_gke.plan.resume`), and the plan prints the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import Context

from nemo_rl_gke.airflow_compat import AirflowFailException, AirflowSkipException
from nemo_rl_gke.links import EXPORT_LINKS
from nemo_rl_gke.operators.base import StepOperator, pull
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run.topology import (
    CHECK_CHECKPOINT,
    CHECKPOINT_REPORT,
    CONVERT,
    JOB_STALLED,
    JOB_SUMMARY,
    LUSTRE,
    RESUME,
    SUBMIT,
    WAIT,
)

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec


def final_step(context: Context, spec: RunSpec) -> int:
    """The step whose checkpoint the run validates and exports: where the job stopped after converging, or the last
    step (``max_steps``, or the epoch cap below it) for a job that ran to its end."""
    waited = pull(context, WAIT) or pull(context, WAIT, JOB_STALLED) or {}
    step = waited.get("final_step")
    if step is not None:
        return int(step)
    # lazy: the recipes load when a step is read, not at DAG parsing
    from nemo_rl_gke.run.recipes import load_recipe
    from nemo_rl_gke.run.steps import final_step as planned_final_step

    return planned_final_step(spec, load_recipe(spec.recipe))


class ValidateCheckpointOperator(StepOperator):
    """Runs the checkpoint validator as a Ray job on the cluster and fails with its precise reasons.

    Pushes the validator's JSON report to XCom (``report``) and returns ``{"valid", "step", "shards", ...}``.
    """

    ui_color = "#fff3d6"

    def execute(self, context: Context) -> None:
        """Submit the validation job (exactly once per run) and defer until it ends."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.plan.validation import expectation, validation_job
        from nemo_rl_gke.ray.hooks import RayJobsHook
        from nemo_rl_gke.ray.submit import ray_token_source
        from nemo_rl_gke.triggers.rayjob import RayJobTrigger

        spec = self.run_spec(context)
        submitted = pull(context, SUBMIT)
        waited = pull(context, WAIT)
        stalled = pull(context, WAIT, JOB_STALLED)
        if waited is None and not stalled:
            # This step runs once train.wait is done, whatever its end: only a stall leaves a checkpoint to save.
            raise AirflowSkipException("train.wait did not succeed and left no stalled job's checkpoint to validate")
        # Converged, at its budget, or stalled: the job was stopped (or stopped itself) after that save.
        stopped = bool(stalled) or (waited or {}).get("converged_at") is not None
        stopped = stopped or bool((waited or {}).get("stopped_at_budget"))
        expected = expectation(spec, final_step(context, spec), stopped=stopped)
        request = validation_job(spec, context["dag"].dag_id, context["run_id"], submitted["submission_id"], expected)
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
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.ray.hooks import RayJobsHook
        from nemo_rl_gke.remote.report import find_report

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

    def execute(self, context: Context) -> None:
        """Start the export and defer on its operation."""
        # Here, not at module level: google.cloud (the request's message type) must not load while DAGs are parsed.
        from nemo_rl_gke.gcp.resources import resources

        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.plan.transfers import lustre_export_request
        from nemo_rl_gke.triggers.operations import OperationTrigger

        spec = self.run_spec(context)
        if not pull(context, CHECK_CHECKPOINT):
            # This step runs after the Hugging Face export whatever its end: only a validated checkpoint is exported.
            raise AirflowSkipException("checkpoint.validate did not succeed: no validated checkpoint to export")
        step = final_step(context, spec)
        request = lustre_export_request(spec, context["dag"].dag_id, context["run_id"], step)
        ref = resources(spec, self.identity(context, spec))[LUSTRE].export_data(self.hook, request)
        source, uri = request.message.lustre_path.path, request.message.gcs_path.uri
        what = f"export of Lustre {spec.lustre_name}:{source} to {uri} (operation {ref.path})"
        self.defer_until(context, spec, OperationTrigger, what=what, operation=ref.to_dict())

    def unmark(self, context: Context, spec: RunSpec, step: int, uri: str) -> None:
        """The checkpoint has a copy now: this run's record becomes a receipt naming it (other runs' records stay)."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.gcp.pending import CheckpointRecords
        from nemo_rl_gke.gcp.resources import resources
        from nemo_rl_gke.run.ownership import PendingCheckpoint

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
            "recipe": spec.recipe,
            # The Hugging Face export, when the conversion wrote one (it is under the step, so it was copied too).
            "hf_uri": f"{uri}hf/" if (pull(context, CONVERT) or {}).get("hf_path") else None,
        }
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = extra
        self.log.info("Checkpoint step %s exported to %s", step, uri)
        self.unmark(context, spec, step, uri)
        return {"action": outcomes.EXPORTED, "uri": uri, "step": step}


class ResumeOperator(StepOperator):
    """Continual training (``resume=latest`` or ``promoted``): the checkpoint to continue from, in Lustre before the
    job starts.

    The lineage is this DAG's exported checkpoints (events on its Asset), or with ``promoted`` its published models
    (events on the published-model Asset). Lustre kept warm still holds the newest export; a new Lustre, or a
    promoted resume past nights that were not promoted (``set_aside``, which the job moves out of its way), gets the
    checkpoint imported from Cloud Storage with Lustre's ``importData`` (deferred). ``max_steps`` becomes the resumed
    step plus ``steps_per_run``, refused when the recipe's epoch cap would cut it. Returns ``{"action",
    "resumed_from", "max_steps", "parent", "lineage", "startups", "set_aside"}``; with ``resume=none`` it changes
    nothing, but still reads the setup times earlier exports of the recipe measured (``startups``: the submit reserves
    the job's setup time from them, :func:`nemo_rl_gke.run.deadline.setup_reserve`).
    """

    ui_color = "#fff3d6"

    def execute(self, context: Context) -> dict[str, Any]:
        """Work out where the job resumes; import the checkpoint into a new Lustre, deferred."""
        # Here, not at module level: google.cloud (the request's message type) must not load while DAGs are parsed.
        from nemo_rl_gke.gcp.resources import resources

        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.plan import resume as resume_plan
        from nemo_rl_gke.plan.transfers import LayoutError, import_source, lustre_import_request
        from nemo_rl_gke.triggers.operations import OperationTrigger

        spec = self.run_spec(context)
        events = self.events(context)
        startups = resume_plan.startups_of(events, spec.recipe)
        exported = resume_plan.lineage_of(events)
        if spec.resume == "promoted":
            # The lineage of published models: a night whose model was not promoted is not built on.
            events = self.events(context, inlet=1)
        if not spec.resumes:
            return {"action": outcomes.NOT_NEEDED, "resumed_from": None, "max_steps": spec.max_steps,
                    "parent": None, "lineage": [], "startups": startups, "set_aside": []}  # fmt: skip
        lineage = resume_plan.lineage_of(events)
        point = resume_plan.resume_point(spec, lineage)
        parent, start, max_steps = point.parent, point.start, point.max_steps
        set_aside = resume_plan.set_aside(spec, exported, start)
        if set_aside:
            self.log.info("Not promoted, set aside by the job before it trains: steps %s", set_aside)
        try:
            self.log.info("Step budget: %s", resume_plan.check_resume_budget(spec, start, max_steps))
        except resume_plan.ResumeBudgetError as exc:
            raise AirflowFailException(str(exc)) from exc
        result = {
            "resumed_from": None,
            "max_steps": max_steps,
            "parent": parent,
            "lineage": lineage,
            "startups": startups,
            "set_aside": set_aside,
        }
        if parent is None:
            self.log.info("No checkpoint in this DAG's lineage yet: training from scratch to step %d", max_steps)
            return {**result, "action": outcomes.NOT_NEEDED}
        lustre_action = (pull(context, LUSTRE) or {}).get("action")
        if lustre_action != outcomes.CREATED and not set_aside:
            # Kept warm (exists) or adopted: the lineage's newest checkpoint is still on it, where NeMo RL resumes.
            # (With steps set aside the published one is imported again: keep_top_k may have pruned it.)
            self.log.info("Resuming from step %d on the warm Lustre, training to step %d", start, max_steps)
            return {**result, "action": "warm", "resumed_from": {"step": start, "source": "lustre"}}
        try:
            source = import_source(spec, parent["uri"], start)
        except LayoutError as exc:
            raise AirflowFailException(str(exc)) from exc
        target = spec.checkpoint_lustre_path(start)
        request = lustre_import_request(spec, context["dag"].dag_id, context["run_id"], source, start)
        lustre = resources(spec, self.identity(context, spec))[LUSTRE]
        ref = lustre.import_data(self.hook, request, what=f"import {target}", label=f"import {parent['uri']}")
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

    def events(self, context: Context, inlet: int = 0) -> list[Any]:
        """This DAG's latest export events (``inlet`` 1: its published-model events), oldest first (its lineage,
        and the setup times they measured); none for a step built without the Asset as its inlet."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.plan import resume as resume_plan

        if len(self.inlets) <= inlet:
            return []
        events = context["inlet_events"][self.inlets[inlet]].ascending(False).limit(resume_plan.LINEAGE_SHOWN)
        return list(reversed(list(events)))
