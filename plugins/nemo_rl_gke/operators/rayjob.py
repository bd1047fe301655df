"""Submitting the GRPO Ray job exactly once, and the deferrable sensor that follows it to the end.

Thin glue: the job comes from :mod:`nemo_rl_gke.plan.ray_job` (rendered from the recipe and RunSpec), its secrets from
:mod:`nemo_rl_gke.ray.submit`, the Ray Jobs API from :class:`~nemo_rl_gke.ray.hooks.RayJobsHook` (the run's dashboard
and its tokens), and the wait from :class:`~nemo_rl_gke.triggers.rayjob.RayJobTrigger`. Clients are imported inside
the methods only.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from nemo_rl_gke.links import JOB_LINKS, WAIT_LINKS
from nemo_rl_gke.observe.metrics import LogFollower, last_finished_save, summary_text
from nemo_rl_gke.observe.redaction import StreamRedactor
from nemo_rl_gke.operators.base import StepOperator, epoch_of, iso_now, pull
from nemo_rl_gke.plan.ray_job import job_request, job_secrets
from nemo_rl_gke.ray.submit import SecretMissingError, ray_token_source, resolve_secrets
from nemo_rl_gke.run.budget import BudgetSpentError, must_save_by, run_budget
from nemo_rl_gke.run.deployment import ConnectionNotAllowedError
from nemo_rl_gke.run.ownership import PendingCheckpoint
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.topology import (
    JOB_BUDGET,
    JOB_STALLED,
    JOB_STEPS,
    JOB_SUMMARY,
    LUSTRE,
    RESUME,
    STARTED_AT,
    SUBMIT,
    VALIDATE,
)

SUBMIT_TIMEOUT_S = 15 * 60

if TYPE_CHECKING:
    from nemo_rl_gke.observe.metrics import RunMetrics
    from nemo_rl_gke.run.spec import RunSpec


def run_started_at(context: Context) -> float:
    """When the run started (the validate task's start), the clock of its budget: provisioning spends it too."""
    started = epoch_of(pull(context, VALIDATE, STARTED_AT))
    if started is not None:
        return started
    dag_run_start = getattr(context.get("dag_run"), "start_date", None)
    return dag_run_start.timestamp() if dag_run_start is not None else time.time()


class SubmitRayJobOperator(StepOperator):
    """Submits the run's GRPO job to the RayCluster through the Ray Jobs API, exactly once per DAG run.

    The submission id is derived from the DAG run, so a retry adopts the job already running. Secrets come from the
    connections the deployment allows (the conf may only pick among them), are masked, and go to Ray only as
    environment variables. Returns ``{"submission_id", "action": "submitted" | "adopted", "status", "dashboard"}``.
    """

    operator_extra_links = JOB_LINKS
    ui_color = "#f3e8fb"

    def __init__(self, **kwargs: Any) -> None:
        # Ray's JobSubmissionClient sets no timeout on its requests: a connection that hangs would hold the worker
        # slot for ever. A submit is seconds (a status GET, a small working_dir upload, the POST) plus the Lustre
        # mark; 15 min bounds it with room for the API server's retries, and a retry adopts a job that did start.
        kwargs.setdefault("execution_timeout", timedelta(seconds=SUBMIT_TIMEOUT_S))
        super().__init__(**kwargs)

    def execute(self, context: Context) -> dict[str, Any]:
        """Render the job, resolve its secrets, submit or adopt it."""
        from airflow.sdk import BaseHook
        from airflow.sdk.log import mask_secret

        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.ray.hooks import RayJobsHook

        spec = self.run_spec(context)
        budget = run_budget(spec, self.deployment)
        deadline = budget.deadline(run_started_at(context))
        try:
            save_by = None if deadline is None else must_save_by(deadline - time.time())
            # The job refuses to train unless checkpoint_dir holds exactly the step it starts from (rayjobs).
            resumed = (pull(context, RESUME) or {}).get("resumed_from") or {}
            request = job_request(
                spec,
                load_recipe(spec.recipe),
                context["dag"].dag_id,
                context["run_id"],
                deployment=self.deployment,
                resumed_step=resumed.get("step"),
                must_save_by=save_by,
            )
        except ConnectionNotAllowedError as exc:
            raise AirflowFailException(str(exc)) from exc
        except BudgetSpentError as exc:
            raise AirflowFailException(
                f"{exc}: the run's budget ({budget.hours:.2f} h, max_run_hours / max_run_usd) was spent before the "
                "job could start, so it was not submitted. Raise the conf's limits (up to the deployment's "
                "[nemo_rl_gke] max_run_hours / max_run_usd), or keep the cluster warm to start sooner."
            ) from exc
        if save_by is not None:
            self.log.info("Run budget %.2f h: checkpointing.checkpoint_must_save_by=%s", budget.hours, save_by)

        def password_of(conn_id: str) -> str | None:
            try:
                password = BaseHook.get_connection(conn_id).password
            except Exception:
                return None
            if password:
                mask_secret(password)
            return password

        try:
            secrets = resolve_secrets(request, password_of, self.deployment)
        except (SecretMissingError, ConnectionNotAllowedError) as exc:
            raise AirflowFailException(str(exc)) from exc
        ray = RayJobsHook.for_run(spec, self.hook, self.deployment)
        self.log.info("Ray dashboard of RayCluster %s via %s", spec.raycluster_name, ray.address.via)
        self.log.info("Job %s: %s", request.submission_id, request.entrypoint.splitlines()[-1])
        mark_checkpoint_pending(self, context, spec, spec.final_step)
        submission = ray.submit(request, secrets)
        return {**submission.to_dict(), "dashboard": ray.address.url, "submitted_at": iso_now()}


def mark_checkpoint_pending(operator: StepOperator, context: Context, spec: RunSpec, step: int) -> None:
    """Record the checkpoint the run's Lustre instance will hold, before the job can write it: until an export copies
    it, every later run's teardown and the sweeper keep the instance. The record is this run's own object in the
    bucket the instance names (:mod:`nemo_rl_gke.gcp.pending`): one request, done when it returns, so the submit waits
    on no long-running operation."""
    # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
    from nemo_rl_gke.gcp.pending import CheckpointRecords
    from nemo_rl_gke.gcp.resources import resources

    owner = operator.identity(context, spec)
    lustre = resources(spec, owner)[LUSTRE]
    actual = lustre.get(operator.hook)
    if actual is None or not lustre.owned(actual):
        # An adopted instance is never deleted by this package: there is nothing to guard, and it stays as it is.
        operator.log.info("%s is not this group's: no checkpoint record needed", lustre.label)
        return
    where = CheckpointRecords(operator.hook, spec, actual).put(PendingCheckpoint(owner.run, step, spec.checkpoint_dir))
    operator.log.info(
        "Recorded at %s: %s holds run %s's checkpoint (step %s) until an export copies it", where, lustre.label,
        owner.run, step,
    )  # fmt: skip


class RayJobSensor(StepOperator):
    """Waits, deferred, for the GRPO job to end; streams its log into the task log and its metrics into XCom.

    Fails with Ray's message, the error type, the exit code and the driver's last lines when the job fails or is
    stopped; stops the job and fails when the zero-learning guard finds a run that never learned (or collapsed) or
    the job timeout passes. A run that converged is stopped after its next checkpoint save and succeeds with that
    checkpoint. The run's budget stops the job at a save (or it stops itself at NeMo RL's
    ``checkpoint_must_save_by``): that checkpoint is validated and exported and the run succeeds, "stopped at
    budget". A stalled job (no new step for the stall bound) is stopped and this task fails "stalled at step N";
    the checkpoint steps, which run after it whatever its end, validate and export its newest save. XCom: ``steps``
    (one row per training step, read from the job's log when the wait ends), ``summary``, ``budget``
    (:meth:`~nemo_rl_gke.run.budget.RunBudget.xcom`), ``stalled`` (``{"final_step", "message"}``) and the return value
    (status, summary, ``final_step`` the checkpoint step to validate and export, ``converged_at``,
    ``stopped_at_budget``, ``max_steps``).
    """

    operator_extra_links = WAIT_LINKS
    ui_color = "#f3e8fb"

    def execute(self, context: Context) -> None:
        """Defer to the trigger that follows the job."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.ray.hooks import RayJobsHook
        from nemo_rl_gke.triggers.rayjob import RayJobTrigger

        spec = self.run_spec(context)
        submitted = pull(context, SUBMIT)
        budget = run_budget(spec, self.deployment)
        started = run_started_at(context)
        address = RayJobsHook.for_run(spec, self.hook, self.deployment).address
        guard = f"K={spec.zero_learning_steps}" if spec.zero_learning_guard else "off"
        self.defer_until(
            context,
            spec,
            RayJobTrigger,
            what=f"Ray job {submitted['submission_id']} (zero-learning guard {guard})",
            address=address.url,
            submission_id=submitted["submission_id"],
            needs_token=address.needs_token,
            # The job's clock started at submission: a re-deferral or a retry keeps that deadline.
            started_at=epoch_of(submitted.get("submitted_at")) or time.time(),
            zero_learning_steps=spec.zero_learning_steps if spec.zero_learning_guard else 0,
            secret_conn_ids=[secret.conn_id for secret in job_secrets(spec, self.deployment)],
            ca_pem=address.ca_pem,
            budget_deadline=budget.deadline(started) or 0.0,
            run_started_at=started,
            usd_per_hour=budget.usd_per_hour or 0.0,
            max_steps=spec.max_steps,
            stall_after_s=spec.stall_after_s or 0.0,
            **ray_token_source(spec),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Push the per-step table and the summary; succeed (converged or done) or fail with the full story."""
        spec = self.run_spec(context)
        summary = event.get("summary") or {}
        log = self.read_job_log(spec, str(event.get("submission_id")))
        steps = [s.to_dict() for s in log.completed_steps] if log is not None else []
        context["ti"].xcom_push(key=JOB_STEPS, value=steps)
        context["ti"].xcom_push(key=JOB_SUMMARY, value=summary)
        self.log.info("Training summary: %s", summary_text(summary))
        status = event.get("status")
        guard = event.get("guard") or {}
        budget = run_budget(spec, self.deployment).xcom(stopped_at_budget=status == "budget")
        context["ti"].xcom_push(key=JOB_BUDGET, value=budget)
        result = {
            "status": event.get("job_status"),
            "submission_id": event.get("submission_id"),
            **summary,
            "stopped_at_budget": status == "budget",
            "max_steps": spec.max_steps,
        }
        tail = "\n".join(event.get("tail") or [])
        if status in ("budget", "stalled") and event.get("final_step") is not None:
            # Either way the newest finished save is the run's checkpoint: validated and exported as usual.
            later = last_finished_save(log.steps) if log is not None else None
            step = max(int(event["final_step"]), later or 0)
            mark_checkpoint_pending(self, context, spec, step)
            if status == "budget":
                self.log.info("%s; checkpoint step %s is the one validated and exported", event.get("message"), step)
                return {**result, "final_step": step, "converged_at": None}
            stalled = f"{event.get('message')}\nLast lines of the driver log:\n{tail}"
            context["ti"].xcom_push(key=JOB_STALLED, value={"final_step": step, "message": stalled})
            raise AirflowFailException(f"{stalled}\nCheckpoint step {step} is validated and exported next.")
        if status == "converged":
            # The stop can land after the job saved once more: the newest save that finished is the final one.
            later = last_finished_save(log.steps) if log is not None else None
            step = max(int(event["final_step"]), later or 0)
            converged = guard.get("decided_at")
            self.log.info("Converged at step %s: checkpoint step %s is the one validated and exported", converged, step)
            mark_checkpoint_pending(self, context, spec, step)
            return {**result, "final_step": step, "converged_at": converged}
        if status == "success":
            final = event.get("final_step")
            return {**result, "final_step": int(final) if final is not None else spec.final_step, "converged_at": None}
        message = f"{event.get('message', 'no message')}\nLast lines of the driver log:\n{tail}"
        raise AirflowFailException(message)

    def read_job_log(self, spec: RunSpec, submission_id: str) -> RunMetrics | None:
        """The metrics of the job's whole log (the trigger event carries only a summary, so it stays small whatever
        the job's length); None, with a warning, when the log cannot be read."""
        from airflow.sdk import BaseHook

        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.ray.hooks import RayJobsHook

        try:
            text = RayJobsHook.for_run(spec, self.hook, self.deployment).logs(submission_id)
        except Exception as exc:  # the table is a convenience: the run's outcome does not depend on it
            self.log.warning("The per-step table could not be read from job %s's log: %s", submission_id, exc)
            return None
        # The table holds only numbers and names from the log (timer and worker-group names): mask the job's secrets.
        secrets = []
        for secret in job_secrets(spec, self.deployment):
            try:
                secrets.append(BaseHook.get_connection(secret.conn_id).password or "")
            except Exception:
                continue
        follower = LogFollower(redactor=StreamRedactor([s for s in secrets if s]))
        follower.feed_full_log(text)
        follower.flush()
        return follower.metrics
