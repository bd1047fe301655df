"""Submitting the GRPO Ray job exactly once, and the deferrable sensor that follows it to the end.

Thin glue: the job comes from :mod:`nemo_rl_gke.plan.ray_job` (rendered from the recipe and RunSpec), its secrets from
:mod:`nemo_rl_gke.ray.submit`, the Ray Jobs API from :class:`~nemo_rl_gke.ray.hooks.RayJobsHook` (the run's dashboard
and its tokens), and the wait from :class:`~nemo_rl_gke.triggers.rayjob.RayJobTrigger`. Clients are imported inside
the methods only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import Context

from nemo_rl_gke.airflow_compat import AirflowFailException
from nemo_rl_gke.links import JOB_LINKS, WAIT_LINKS
from nemo_rl_gke.operators.base import DEFERRAL_BACKSTOP_S, StepOperator, pull
from nemo_rl_gke.run.times import epoch_of, iso_now, iso_of
from nemo_rl_gke.run.topology import (
    JOB_BUDGET,
    JOB_RECOVERIES,
    JOB_STALLED,
    JOB_STEPS,
    JOB_SUMMARY,
    LUSTRE,
    NODE_POOL,
    RAYCLUSTER,
    RESUME,
    STARTED_AT,
    SUBMIT,
    VALIDATE,
)

SUBMIT_TIMEOUT_S = 15 * 60
# A recovery's wait for the replacement node (GKE auto-repair or the instance group recreating the VM takes minutes).
RECOVERY_WAIT_S = 30 * 60
# How long a stopped attempt may take to end before the next one would start beside it.
FENCE_TIMEOUT_S = 60.0
# The job wait's own timeout lies past the clock's latest stop by this much: the clock decides, never the timeout.
CLOCK_SLACK_S = 300.0
TERMINAL_JOB_STATUSES = ("SUCCEEDED", "FAILED", "STOPPED")

if TYPE_CHECKING:
    from nemo_rl_gke.observe.metrics import RunMetrics
    from nemo_rl_gke.plan.ray_job import JobRequest
    from nemo_rl_gke.ray.hooks import RayJobsHook
    from nemo_rl_gke.run.deadline import RunClock
    from nemo_rl_gke.run.spec import RunSpec


def run_started_at(context: Context) -> float:
    """When the run started (the validate task's start), the clock of its budget: provisioning spends it too."""
    started = epoch_of(pull(context, VALIDATE, STARTED_AT))
    if started is not None:
        return started
    dag_run_start = getattr(context.get("dag_run"), "start_date", None)
    return dag_run_start.timestamp() if dag_run_start is not None else time.time()


def clock_of(operator: StepOperator, context: Context, spec: RunSpec, submitted_at: float | None) -> RunClock:
    """The run's clock from what its steps recorded: its start, when the GPU pool came up, when the served rung's
    wait began, and the job's first submission (None: not submitted yet)."""
    # lazy: execution-only, kept out of DAG parsing
    from nemo_rl_gke.run import capacity
    from nemo_rl_gke.run.budget import run_clock

    served = capacity.served_row(pull(context, RAYCLUSTER))
    return run_clock(
        spec,
        operator.deployment,
        run_started_at=run_started_at(context),
        pool_ready_at=epoch_of((pull(context, NODE_POOL) or {}).get("ready_at")),
        served_started_at=epoch_of(served.get("started_at")) if served else None,
        submitted_at=submitted_at,
    )


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
        spec = self.run_spec(context)
        # The job refuses to train unless checkpoint_dir holds exactly the step it starts from (rayjobs).
        resume = pull(context, RESUME) or {}
        resumed = resume.get("resumed_from") or {}
        return submit_grpo_job(self, context, spec, resumed.get("step"), set_aside=resume.get("set_aside") or ())


def submit_grpo_job(
    operator: StepOperator,
    context: Context,
    spec: RunSpec,
    resumed_step: int | None,
    *,
    attempt: int = 0,
    set_aside: Sequence[int] = (),
) -> dict[str, Any]:
    """Render the run's GRPO job (attempt ``attempt``: 0 is the first submission, a recovery's has its number in
    the submission id; ``set_aside``: the steps a ``resume=promoted`` job moves out of its way), resolve its
    secrets, and submit or adopt it. Returns ``{"submission_id", "action",
    "status", "dashboard", "submitted_at"}``."""
    # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
    from nemo_rl_gke.observe.recoveries import attempt_id
    from nemo_rl_gke.plan.ray_job import job_request
    from nemo_rl_gke.ray.hooks import RayJobsHook
    from nemo_rl_gke.run.deadline import BudgetSpentError, setup_reserve
    from nemo_rl_gke.run.deployment import ConnectionNotAllowedError
    from nemo_rl_gke.run.recipes import load_recipe
    from nemo_rl_gke.run.steps import final_step

    recipe = load_recipe(spec.recipe)
    now = time.time()
    # A recovery's attempt keeps the job timeout of the first submission.
    first = epoch_of((pull(context, SUBMIT) or {}).get("submitted_at")) if attempt else None
    clock = clock_of(operator, context, spec, first or now)
    reserve = setup_reserve(recipe.setup_s, (pull(context, RESUME) or {}).get("startups") or ())
    try:
        save_by = clock.save_by(now, reserve)
        request = job_request(
            spec,
            recipe,
            context["dag"].dag_id,
            context["run_id"],
            deployment=operator.deployment,
            resumed_step=resumed_step,
            set_aside=set_aside,
            must_save_by=None if save_by is None else save_by.text,
        )
    except ConnectionNotAllowedError as exc:
        raise AirflowFailException(str(exc)) from exc
    except BudgetSpentError as exc:
        raise AirflowFailException(
            f"{exc}, so the job was not submitted ({clock.limit_text()}). Raise that limit (a conf may raise "
            "max_run_hours / max_run_usd up to the deployment's [nemo_rl_gke] limits, and job_timeout_s or "
            "flex_start_max_hours), or keep the cluster warm to start sooner."
        ) from exc
    if attempt:
        request = dataclasses.replace(request, submission_id=attempt_id(request.submission_id, attempt))
    if save_by is not None:
        operator.log.info(
            "Run deadline %s, at %s: checkpointing.checkpoint_must_save_by=%s (%s)", clock.limit_text(),
            iso_of(clock.deadline.at) if clock.deadline else "-", save_by.text, save_by.explain(),
        )  # fmt: skip

    secrets = job_secret_values(operator, request)
    ray = RayJobsHook.for_run(spec, operator.hook, operator.deployment)
    operator.log.info("Ray dashboard of RayCluster %s via %s", spec.raycluster_name, ray.address.via)
    operator.log.info("Job %s: %s", request.submission_id, request.entrypoint.splitlines()[-1])
    mark_checkpoint_pending(operator, context, spec, final_step(spec, recipe))
    submission = ray.submit(request, secrets)
    # An adopted job (a retry after the worker died past its submit request) keeps the clock of its real start.
    started = iso_of(submission.started_at) if submission.started_at else iso_now()
    return {
        **submission.to_dict(),
        "dashboard": ray.address.url,
        "submitted_at": started,
        "save_by": None if save_by is None else save_by.to_dict(),
    }


def job_secret_values(operator: StepOperator, request: JobRequest) -> dict[str, str]:
    """The values of a job's secrets, read from the connections the deployment allows and masked in every log; fails
    the task when one is missing or not allowed."""
    from airflow.sdk import BaseHook
    from airflow.sdk.log import mask_secret

    # lazy: execution-only, kept out of DAG parsing
    from nemo_rl_gke.ray.submit import SecretMissingError, resolve_secrets
    from nemo_rl_gke.run.deployment import ConnectionNotAllowedError

    def password_of(conn_id: str) -> str | None:
        try:
            password = BaseHook.get_connection(conn_id).password
        except Exception:
            return None
        if password:
            mask_secret(password)
        return password

    try:
        return resolve_secrets(request, password_of, operator.deployment)
    except (SecretMissingError, ConnectionNotAllowedError) as exc:
        raise AirflowFailException(str(exc)) from exc


def mark_checkpoint_pending(operator: StepOperator, context: Context, spec: RunSpec, step: int) -> None:
    """Record the checkpoint the run's Lustre instance will hold, before the job can write it: until an export copies
    it, every later run's teardown and the sweeper keep the instance. The record is this run's own object in the
    bucket the instance names (:mod:`nemo_rl_gke.gcp.pending`): one request, done when it returns, so the submit waits
    on no long-running operation."""
    # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
    from nemo_rl_gke.gcp.pending import CheckpointRecords
    from nemo_rl_gke.gcp.resources import resources
    from nemo_rl_gke.run.ownership import PendingCheckpoint

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

    def timeout_s(self, spec: RunSpec) -> float:
        """The job's wait: its timeout, the deployment's overrun past it, and a slack so the clock stops it first."""
        return super().timeout_s(spec) + self.deployment.budget_overrun_minutes * 60.0 + CLOCK_SLACK_S

    def execute(self, context: Context) -> None:
        """Defer to the trigger that follows the job (its newest attempt, when a recovery resubmitted it)."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.decide import recovery
        from nemo_rl_gke.observe.recoveries import attempt_id
        from nemo_rl_gke.ray.hooks import RayJobsHook

        spec = self.run_spec(context)
        base = pull(context, SUBMIT)["submission_id"]
        ray = RayJobsHook.for_run(spec, self.hook, self.deployment)
        # A retry of this task (its worker died mid-recovery) follows the attempt Ray has, never starts one.
        attempt = recovery.attempt_to_follow(spec.max_recoveries, lambda n: ray.status(attempt_id(base, n)) is not None)
        if attempt:
            self.log.info("Following attempt %d of the job: %s", attempt, attempt_id(base, attempt))
        submitted = pull(context, SUBMIT)
        if attempt:
            # A retried wait follows a recovery's attempt: its deadline was made as the first one's was.
            submitted = {**submitted, "save_by": self._attempt_save_by(context, attempt)}
        self._follow(context, spec, attempt_id(base, attempt), attempt_started_at=0.0, save_by=submitted.get("save_by"))

    def _attempt_save_by(self, context: Context, attempt: int) -> dict[str, Any] | None:
        """What a recovery's attempt was given (its record), else None."""
        for record in self._recoveries(context):
            if int(record.get("attempt") or 0) == attempt:
                return record.get("save_by")
        return None

    def _follow(
        self,
        context: Context,
        spec: RunSpec,
        submission_id: str,
        *,
        attempt_started_at: float,
        save_by: dict[str, Any] | None,
    ) -> NoReturn:
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.plan.ray_job import job_secrets
        from nemo_rl_gke.ray.hooks import RayJobsHook
        from nemo_rl_gke.ray.submit import ray_token_source
        from nemo_rl_gke.triggers.log_position import task_key
        from nemo_rl_gke.triggers.rayjob import RayJobTrigger

        submitted = pull(context, SUBMIT)
        first = epoch_of(submitted.get("submitted_at")) or time.time()
        clock = clock_of(self, context, spec, first)
        if save_by:
            clock = clock.with_job(float(save_by.get("seconds") or 0.0), float(save_by.get("margin_s") or 0.0))
        address = RayJobsHook.for_run(spec, self.hook, self.deployment).address
        guard = f"K={spec.zero_learning_steps}" if spec.zero_learning_guard else "off"
        self.defer_until(
            context,
            spec,
            RayJobTrigger,
            what=f"Ray job {submission_id} (zero-learning guard {guard})",
            address=address.url,
            submission_id=submission_id,
            needs_token=address.needs_token,
            # The job's clock started at its first submission: a re-deferral, a retry or a recovery keeps that deadline.
            started_at=first,
            attempt_started_at=attempt_started_at,
            zero_learning_steps=spec.zero_learning_steps if spec.zero_learning_guard else 0,
            secret_conn_ids=[secret.conn_id for secret in job_secrets(spec, self.deployment)],
            ca_pem=address.ca_pem,
            run_started_at=run_started_at(context),
            clock=clock.to_dict(),
            max_steps=spec.max_steps,
            stall_after_s=spec.stall_after_s or 0.0,
            task_key=task_key(context["ti"]),
            **ray_token_source(spec),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Push the per-step table and the summary; succeed (converged or done) or fail with the full story."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.decide.job_end import after_wait
        from nemo_rl_gke.decide.job_stop import BUDGET, CONVERGED
        from nemo_rl_gke.observe.metrics import last_finished_save
        from nemo_rl_gke.run.budget import run_budget

        spec = self.run_spec(context)
        if event.get("wait_for") == "workers":
            return self._resubmit(context, spec, event)
        log = self.read_job_log(spec, str(event.get("submission_id")))
        recoveries = self._recoveries(context)
        if event.get("status") == "failed":
            self._recover_or_fail(context, spec, event, log, recoveries)
        summary = self._push_table(context, spec, event, log, recoveries)
        status = event.get("status")
        guard = event.get("guard") or {}
        budget = run_budget(spec, self.deployment).xcom(stopped_at_budget=status == BUDGET)
        stop = event.get("stop")
        if stop:
            budget["stop"] = stop
        context["ti"].xcom_push(key=JOB_BUDGET, value=budget)
        result = {
            "status": event.get("job_status"),
            "submission_id": event.get("submission_id"),
            **summary,
            "stopped_at_budget": status == BUDGET,
            "max_steps": spec.max_steps,
        }
        tail = "\n".join(event.get("tail") or [])
        later = last_finished_save(log.steps) if log is not None else None
        final = event.get("final_step")
        end = after_wait(str(status), None if final is None else int(final), later, guard.get("decided_at"))
        if end.succeeds:
            if end.pending and end.checkpoint is not None:
                # The newest finished save is the run's checkpoint: validated and exported as usual.
                mark_checkpoint_pending(self, context, spec, end.checkpoint)
            if status == CONVERGED:
                self.log.info("Converged at step %s: checkpoint step %s is the one validated and exported",
                              end.converged_at, end.checkpoint)  # fmt: skip
            elif status == BUDGET:
                self.log.info("%s; checkpoint step %s is the one validated and exported", event.get("message"),
                              end.checkpoint)  # fmt: skip
            return {**result, "final_step": self._final_step(spec, end.checkpoint), "converged_at": end.converged_at}
        if end.checkpoint is not None:
            # A stall's save is still the run's checkpoint: marked pending and exported by the give-up.
            stalled = f"{event.get('message')}\nLast lines of the driver log:\n{tail}"
            self._give_up(context, stalled, end.checkpoint, sep="\n")
        if status == BUDGET and stop and stop.get("lost"):
            lost = stop["lost"]
            self.log.error(
                "Nothing was saved before the stop: %s step(s) and %.2f GPU-hours are lost: %s", lost.get("steps"),
                float(lost.get("gpu_hours") or 0.0), lost.get("why"),
            )  # fmt: skip
        message = f"{event.get('message', 'no message')}\nLast lines of the driver log:\n{tail}"
        verdict = event.get("recovery_verdict")
        raise AirflowFailException(f"{message}\n{verdict}" if verdict else message)

    @staticmethod
    def _final_step(spec: RunSpec, checkpoint: int | None) -> int:
        """The checkpoint the run hands on: the one the end chose, else the recipe's last step."""
        if checkpoint is not None:
            return checkpoint
        # lazy: the recipes load when a step is read, not at DAG parsing
        from nemo_rl_gke.run.recipes import load_recipe
        from nemo_rl_gke.run.steps import final_step

        return final_step(spec, load_recipe(spec.recipe))

    def _give_up(self, context: Context, message: str, checkpoint: int | None, *, sep: str = ". ") -> NoReturn:
        """Fail the wait; a checkpoint it has is marked pending and recorded, so it is validated and exported next
        (``sep`` joins the message and that sentence: a message ending in the driver's lines takes a new line)."""
        if checkpoint is None:
            raise AirflowFailException(f"{message}, and no checkpoint was saved")
        mark_checkpoint_pending(self, context, self.run_spec(context), checkpoint)
        context["ti"].xcom_push(key=JOB_STALLED, value={"final_step": checkpoint, "message": message})
        raise AirflowFailException(f"{message}{sep}Checkpoint step {checkpoint} is validated and exported next.")

    def _push_table(
        self,
        context: Context,
        spec: RunSpec,
        event: dict[str, Any],
        log: RunMetrics | None,
        recoveries: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """Push the per-step table across the attempts and the summary, on every way the wait ends (a failure's
        alert and report say how far training got from them); the summary."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.observe.metrics import summary_text

        steps, summary = self._run_steps(spec, log, recoveries, event.get("summary") or {})
        if event.get("startup_s") is not None:
            # The next runs of the recipe reserve their setup time from this (the export's Asset event carries it).
            summary = {**summary, "startup_s": round(float(event["startup_s"]), 1)}
        context["ti"].xcom_push(key=JOB_STEPS, value=steps)
        context["ti"].xcom_push(key=JOB_SUMMARY, value=summary)
        self.log.info("Training summary: %s", summary_text(summary))
        return summary

    # --- node-loss recovery ------------------------------------------------------------------------------------------
    def _recoveries(self, context: Context) -> list[dict[str, Any]]:
        """The recoveries this try of the task made so far (XCom survives its deferrals)."""
        return list(context["ti"].xcom_pull(task_ids=self.step_id, key=JOB_RECOVERIES) or [])

    def _recover_or_fail(
        self,
        context: Context,
        spec: RunSpec,
        event: dict[str, Any],
        log: RunMetrics | None,
        recoveries: list[dict[str, Any]],
    ) -> None:
        """A failed job: defer to wait for the replacement when a recovery rule says it was a lost node and
        attempts are left; fail with the newest checkpoint exported when they ran out; return (the caller fails
        the run as before) when no rule recovers it. The verdict is logged either way."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.decide.recovery import Move, after_failure
        from nemo_rl_gke.decide.recovery_rules import classify
        from nemo_rl_gke.observe.metrics import newest_save
        from nemo_rl_gke.observe.recoveries import recovery_record
        from nemo_rl_gke.ray.hooks import RayJobsHook
        from nemo_rl_gke.triggers.raycluster import RayClusterTrigger

        submission_id = str(event.get("submission_id"))
        info = RayJobsHook.for_run(spec, self.hook, self.deployment).job_info(submission_id) or {}
        steps = log.steps if log is not None else []
        done = [s for s in steps if s.completed]
        verdict = classify(info.get("error_type"), str(info.get("message") or event.get("message") or ""),
                           event.get("tail") or [], len(done))  # fmt: skip
        self.log.info("Ray job %s failed: %s", submission_id, verdict.text())
        event["recovery_verdict"] = verdict.text()
        # The attempt that failed resumed from the previous recovery's step, or from where the run itself started.
        started_from = (
            recoveries[-1]["resumed_from"]
            if recoveries
            else ((pull(context, RESUME) or {}).get("resumed_from") or {}).get("step")
        )
        answer = after_failure(
            verdict, used=len(recoveries), max_recoveries=spec.max_recoveries, saved=newest_save(steps),
            started_from=started_from,
        )  # fmt: skip
        if answer.move is Move.NOT_RECOVERED:
            return
        resume_from = answer.resume_from
        if answer.move is Move.GIVE_UP:
            self._push_table(context, spec, event, log, recoveries)
            self._give_up(context, f"{event.get('message')}\n{answer.why}", resume_from)
        ended = info.get("end_time")
        record = recovery_record(
            attempt=len(recoveries) + 1,
            failed_job=submission_id,
            rule=verdict.rule,
            why=verdict.why,
            failed_at=float(ended) / 1000.0 if ended else time.time(),
            steps=steps,
            resumed_from=resume_from,
            gpus=spec.worker_replicas * spec.gpus_per_node,
        )
        context["ti"].xcom_push(key=JOB_RECOVERIES, value=[*recoveries, record])
        self.log.warning(
            "Recovery %d of %d: waiting for RayCluster %s to have all %d workers again, then resubmitting from "
            "step %s (%d step(s) lost)", record["attempt"], spec.max_recoveries, spec.raycluster_name,
            spec.worker_replicas, resume_from, record["steps_lost"],
        )  # fmt: skip
        trigger = RayClusterTrigger(
            cluster_path=spec.cluster_path,
            namespace=spec.namespace,
            name=spec.raycluster_name,
            wait_for="workers",
            gcp_conn_id=self.gcp_conn_id,
            poll_interval=spec.poll_interval_s,
            timeout=RECOVERY_WAIT_S,
            started_at=time.time(),
        )
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            timeout=timedelta(seconds=RECOVERY_WAIT_S + DEFERRAL_BACKSTOP_S),
        )

    def _resubmit(self, context: Context, spec: RunSpec, event: dict[str, Any]) -> NoReturn:
        """The replacement is ready (or did not come): fence the failed attempt, submit the next, follow it."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.decide.recovery import Move, after_replacement
        from nemo_rl_gke.observe.recoveries import recoveries_text, resubmitted
        from nemo_rl_gke.ray.hooks import RayJobsHook

        recoveries = self._recoveries(context)
        record = recoveries[-1]
        answer = after_replacement(
            event.get("status") == "success", str(event.get("message")), attempt=int(record["attempt"]),
            resume_from=record["resumed_from"],
        )  # fmt: skip
        if answer.move is Move.GIVE_UP:
            self._give_up(context, answer.why, answer.resume_from)
        resume_from = answer.resume_from
        self.log.info("%s", event.get("message"))
        ray = RayJobsHook.for_run(spec, self.hook, self.deployment)
        self._fence(ray, record["failed_job"])
        submission = submit_grpo_job(self, context, spec, resume_from, attempt=int(record["attempt"]))
        now = time.time()
        recoveries[-1] = {**resubmitted(record, submission["submission_id"], now), "save_by": submission.get("save_by")}
        context["ti"].xcom_push(key=JOB_RECOVERIES, value=recoveries)
        self.log.warning("%s", recoveries_text(recoveries[-1:]))
        save_by = submission.get("save_by")
        self._follow(context, spec, submission["submission_id"], attempt_started_at=now, save_by=save_by)

    def _fence(self, ray: RayJobsHook, submission_id: str) -> None:
        """Make sure the failed attempt is stopped and its driver gone before the next one starts: two attempts on
        one checkpoint directory would each write it."""
        deadline = time.monotonic() + FENCE_TIMEOUT_S
        status = ray.status(submission_id)
        if status not in TERMINAL_JOB_STATUSES:
            ray.stop(submission_id)
        while status not in TERMINAL_JOB_STATUSES and status is not None:
            if time.monotonic() > deadline:
                raise AirflowFailException(
                    f"Ray job {submission_id} is still {status} {FENCE_TIMEOUT_S:.0f}s after it was stopped: no new "
                    f"attempt is started beside it. Stop it by hand (ray job stop {submission_id}) and clear this task"
                )
            time.sleep(1.0)
            status = ray.status(submission_id)
        self.log.info("Fenced: Ray job %s is %s, so its driver is gone", submission_id, status)

    def _run_steps(
        self, spec: RunSpec, log: RunMetrics | None, recoveries: list[dict[str, Any]], summary: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The per-step table and the summary: of the job, or of all its attempts after a recovery (each row marked
        with its attempt, the lost steps left out)."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.observe.metrics import RunMetrics, StepMetrics
        from nemo_rl_gke.observe.recoveries import merge_attempts

        last = [s for s in log.completed_steps] if log is not None else []
        if not recoveries:
            # The trigger's summary is of the log at the stop; the job trains on until the stop lands, and the table
            # and the summary must count the same steps.
            return [s.to_dict() for s in last], {**summary, **log.summary()} if log is not None else summary
        attempts, saves = [], set(log.checkpoints if log else [])
        for record in recoveries:
            earlier = self.read_job_log(spec, record["failed_job"])
            attempts.append(earlier.steps if earlier is not None else [])
            cut = record["resumed_from"]
            saves |= {step for step in (earlier.checkpoints if earlier else []) if cut is not None and step <= cut}
        attempts.append(log.steps if log is not None else [])
        rows = merge_attempts(attempts, [r["resumed_from"] for r in recoveries])
        metrics = RunMetrics()
        metrics.steps = [StepMetrics.from_dict(row) for row in rows]
        metrics.checkpoints = sorted(saves)
        merged = {**summary, **metrics.summary(), "recoveries": len(recoveries)}
        return rows, merged

    def read_job_log(self, spec: RunSpec, submission_id: str) -> RunMetrics | None:
        """The metrics of the job's whole log (the trigger event carries only a summary, so it stays small whatever
        the job's length); None, with a warning, when the log cannot be read."""
        from airflow.sdk import BaseHook

        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.observe.metrics import LogFollower
        from nemo_rl_gke.observe.redaction import StreamRedactor
        from nemo_rl_gke.plan.ray_job import job_secrets
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
