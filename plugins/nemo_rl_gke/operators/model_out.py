"""The model that comes out of a run: its Hugging Face export, its evaluation, and whether it is published.

Thin glue: the jobs come from :mod:`nemo_rl_gke.plan.model_out`, the result block's parser from
:mod:`nemo_rl_gke.observe.eval_result`, the remembered base-model scores from :mod:`nemo_rl_gke.gcp.baselines`, the
decision from :mod:`nemo_rl_gke.decide.publish`. Each job is a Ray job on the run's RayCluster, waited for by the
triggerer (:class:`~nemo_rl_gke.triggers.rayjob.RayJobTrigger`), exactly once per run (its id is the training job's
plus a suffix, so a retry adopts it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import Context

from nemo_rl_gke.airflow_compat import AirflowFailException, AirflowSkipException
from nemo_rl_gke.operators.base import StepOperator, pull
from nemo_rl_gke.operators.checkpoint import final_step
from nemo_rl_gke.operators.rayjob import job_secret_values
from nemo_rl_gke.run.conf_schema import EVAL_OFF
from nemo_rl_gke.run.times import iso_now
from nemo_rl_gke.run.topology import CHECK_CHECKPOINT, CONVERT, EVALUATE, EXPORT, SUBMIT

if TYPE_CHECKING:
    from nemo_rl_gke.plan.ray_job import JobRequest
    from nemo_rl_gke.run.spec import RunSpec

# What the job log ends with when a step's job did its work (plan/model_out.py's conversion job prints it).
HF_DONE = "nemo-rl-gke: Hugging Face model at "


class _RayJobStep(StepOperator):
    """A step whose work is one Ray job on the run's cluster at a time: submit it (or adopt it), defer until it ends."""

    ui_color = "#fff3d6"

    def run_job(
        self, context: Context, spec: RunSpec, request: JobRequest, what: str, pending: dict[str, Any]
    ) -> NoReturn:
        """Submit ``request`` with its secrets and hand the wait to the triggerer; ``job_done`` resumes."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.ray.hooks import RayJobsHook
        from nemo_rl_gke.ray.submit import ray_token_source
        from nemo_rl_gke.triggers.rayjob import RayJobTrigger

        ray = RayJobsHook.for_run(spec, self.hook, self.deployment)
        submission = ray.submit(request, job_secret_values(self, request))
        self.log.info("%s: Ray job %s (%s)\n%s", what, submission.submission_id, submission.action, request.entrypoint)
        self.defer_until(
            context,
            spec,
            RayJobTrigger,
            what=f"{what}: Ray job {submission.submission_id}",
            pending={**pending, "submission_id": submission.submission_id},
            method_name="job_done",
            address=ray.address.url,
            submission_id=submission.submission_id,
            needs_token=ray.address.needs_token,
            zero_learning_steps=0,
            secret_conn_ids=[secret.conn_id for secret in request.secrets],
            ca_pem=ray.address.ca_pem,
            **ray_token_source(spec),
        )

    def job_log(self, spec: RunSpec, event: dict[str, Any]) -> str:
        """The whole log of the job that ended; fails with Ray's account and its last lines unless it succeeded."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.ray.hooks import RayJobsHook

        if event.get("status") != "success":
            tail = "\n".join(event.get("tail") or [])
            raise AirflowFailException(f"{event.get('message')}\nLast lines of the job's log:\n{tail}")
        return RayJobsHook.for_run(spec, self.hook, self.deployment).logs(str(event["submission_id"]))


class ConvertCheckpointOperator(_RayJobStep):
    """Converts the validated checkpoint into ``step_N/hf`` with the release's tools (no GPU). Returns ``{"step",
    "hf_path", "files"}``."""

    def execute(self, context: Context) -> None:
        """Submit the conversion job and defer."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.plan.model_out import conversion_job

        spec = self.run_spec(context)
        step = final_step(context, spec)
        submitted = pull(context, SUBMIT)
        request = conversion_job(
            spec, context["dag"].dag_id, context["run_id"], submitted["submission_id"], step=step,
            deployment=self.deployment,
        )  # fmt: skip
        self.run_job(context, spec, request, f"Hugging Face export of step {step}", {"step": step})

    def job_done(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Read what the export wrote from the job's log."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.plan.model_out import hf_path

        spec = self.run_spec(context)
        pending = self.pending(context)
        log = self.job_log(spec, event)
        lines = log.splitlines()
        done = next((i for i, line in enumerate(lines) if HF_DONE in line or "the export is done" in line), None)
        if done is None:
            raise AirflowFailException(f"the export job ended without writing {hf_path(spec, pending['step'])}")
        files = [name.strip() for name in lines[done + 1 :] if name.strip() and "/" not in name][:50]
        self.log.info("Hugging Face model at %s: %s", hf_path(spec, pending["step"]), ", ".join(files) or "done before")
        return {"step": pending["step"], "hf_path": hf_path(spec, pending["step"]), "files": files}


class EvaluateModelOperator(_RayJobStep):
    """Scores the Hugging Face model with the release's run_eval.py, and the base model once per release, model,
    benchmark and settings (remembered in the export bucket). Skipped with ``eval_benchmark: off``. Returns
    ``{"result", "baseline", "baseline_uri", "score"}``."""

    def execute(self, context: Context) -> None:
        """Defer on the base model's evaluation when it was never measured, else on the model's."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.gcp.baselines import Baselines
        from nemo_rl_gke.plan.model_out import baseline_key

        spec = self.run_spec(context)
        if spec.eval_benchmark == EVAL_OFF:
            raise AirflowSkipException("eval_benchmark is off: no evaluation")
        key = baseline_key(spec)
        baseline = Baselines(self.hook, spec).get(key)
        if baseline is None:
            self.log.info("No score of the base model for %s yet: measuring it once", key)
            self._evaluate(context, spec, None, {"baseline": None})
        self.log.info("The base model's score for %s: %s (measured by %s)", key["benchmark"], baseline.get("score"),
                      baseline.get("measured_by"))  # fmt: skip
        self._evaluate(context, spec, final_step(context, spec), {"baseline": baseline})

    def _evaluate(self, context: Context, spec: RunSpec, step: int | None, pending: dict[str, Any]) -> NoReturn:
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.plan.model_out import evaluation_job

        submitted = pull(context, SUBMIT)
        request = evaluation_job(
            spec, context["dag"].dag_id, context["run_id"], submitted["submission_id"], step=step,
            deployment=self.deployment,
        )  # fmt: skip
        what = f"evaluation of step {step}" if step is not None else "evaluation of the base model"
        self.run_job(context, spec, request, f"{what} on {spec.eval_benchmark}", {**pending, "step": step})

    def job_done(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Read the score; after the base model's, remember it and evaluate the run's model."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.gcp.baselines import Baselines
        from nemo_rl_gke.observe.eval_result import parse_eval_result
        from nemo_rl_gke.plan.model_out import baseline_key

        spec = self.run_spec(context)
        pending = self.pending(context)
        result = parse_eval_result(self.job_log(spec, event))
        if result is None:
            raise AirflowFailException(
                f"Ray job {event.get('submission_id')} ended without NeMo RL's result block (score=...): the "
                "evaluation did not finish"
            )
        self.log.info("%s: %s", "base model" if pending["step"] is None else f"step {pending['step']}", result.text())
        baselines = Baselines(self.hook, spec)
        key = baseline_key(spec)
        if pending["step"] is None:
            run = f"{context['dag'].dag_id}/{context['run_id']}"
            where = baselines.put(key, result.to_dict(), run)
            self.log.info("The base model's score is remembered at %s", where)
            self._evaluate(
                context, spec, final_step(context, spec), {"baseline": {**result.to_dict(), "measured_by": run}}
            )
        baseline = pending.get("baseline") or {}
        return {
            "step": pending["step"],
            "score": result.score,
            "result": result.to_dict(),
            "baseline": baseline.get("score"),
            "baseline_result": baseline,
            "baseline_uri": baselines.uri(key),
            "evaluated_at": iso_now(),
        }


class PublishModelOperator(StepOperator):
    """Decides, by the conf's publish policy, whether the run's model becomes the lineage's published one; if it does,
    the published-model Asset event carries the score, the baseline, the Hugging Face and checkpoint URIs. A model
    that is not promoted ends this step skipped (the run succeeds; the report alerts). Returns the decision."""

    ui_color = "#fff3d6"

    def execute(self, context: Context) -> dict[str, Any]:
        """Decide; publish the event or skip."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.decide import publish as publishing

        spec = self.run_spec(context)
        exported = pull(context, EXPORT) or {}
        evaluated = pull(context, EVALUATE) or {}
        published = self.last_published(context)
        decision = publishing.decide(
            spec.publish,
            spec.publish_margin,
            evaluated.get("score"),
            baseline=evaluated.get("baseline"),
            published=published,
        )
        converted = pull(context, CONVERT) or {}
        uri = exported.get("uri")
        hf_uri = f"{uri}hf/" if uri and converted.get("hf_path") else None
        result = {
            **decision.to_dict(),
            "checkpoint_uri": uri,
            "hf_uri": hf_uri,
            "step": exported.get("step"),
            "benchmark": spec.eval_benchmark,
            "published_run": (published or {}).get("run"),
        }
        self.log.info("Publish (%s): %s: %s", spec.publish, decision.outcome, decision.reason)
        if not decision.promoted:
            context["ti"].xcom_push(key="return_value", value=result)
            raise AirflowSkipException(f"{decision.outcome}: {decision.reason}")
        report = pull(context, CHECK_CHECKPOINT) or {}
        extra = {
            "uri": uri,
            "step": exported.get("step"),
            "hf_uri": hf_uri,
            "score": decision.score,
            "baseline": decision.baseline,
            "previous_score": decision.published,
            "benchmark": spec.eval_benchmark,
            "result": evaluated.get("result"),
            "recipe": spec.recipe,
            "run": f"{context['dag'].dag_id}/{context['run_id']}",
            "shards": report.get("shards"),
        }
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = extra
        self.log.info("Published: %s (checkpoint %s)", hf_uri or uri, uri)
        return result

    def last_published(self, context: Context) -> dict[str, Any] | None:
        """The extra of the lineage's newest published-model event (None: none yet, or no inlet)."""
        if not self.inlets:
            return None
        events = list(context["inlet_events"][self.inlets[0]].ascending(False).limit(1))
        return dict(events[0].extra or {}) if events else None
