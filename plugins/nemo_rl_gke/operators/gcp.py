"""Deferrable operators that create, adopt and delete the run's Google Cloud resources, and the live preflight.

Thin glue (DESIGN): names come from the RunSpec the validate task pushed, the actions live in
:mod:`nemo_rl_gke.gcp.resources`, and every wait on a long-running operation is a deferral to
:class:`~nemo_rl_gke.triggers.operations.OperationTrigger`, so no worker slot is held while Google works (rule 3).

This module is imported while the DAG file is parsed: google clients, the resources and the hooks are imported inside
``execute`` / ``execute_complete`` only.
"""

from __future__ import annotations

import time
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from nemo_rl_gke.operators.preflight import FINDINGS_KEY, VALIDATE_TASK_ID
from nemo_rl_gke.operators.report import RecordsStart

if TYPE_CHECKING:
    from nemo_rl_gke.findings import Finding
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.gcp.operations import OperationRef
    from nemo_rl_gke.gcp.resources import Resource
    from nemo_rl_gke.spec import RunSpec

DEFAULT_GCP_CONN_ID = "google_cloud_default"
# The only policy that deletes Google Cloud resources. keep_cluster_and_storage keeps every GCP resource (only the
# RayCluster goes, in the kube teardown), keep_all keeps everything; an unknown policy keeps too, never deletes.
DELETING_POLICY = "delete_all"
# The trigger enforces the stage timeout and says which resource timed out; Airflow's own deferral timeout is only a
# backstop for a trigger that never fires at all, so it is set a little later than the trigger's deadline.
DEFERRAL_BACKSTOP_S = 600
KEPT_BY_POLICY = "kept-by-policy"
KEPT_UNOWNED = "kept-unowned"  # delete_resource's answer for a resource without our ownership marker
KEPT_FOR_CHECKPOINT = "kept-for-checkpoint"
KEPT_FOR_LUSTRE = "kept-for-lustre"
# What a kept Lustre instance still needs: its peering, the peering's range and the network it lives in.
LUSTRE_NEEDS = ("peering", "peering-range", "net")
EXPORT_TASK_ID = "checkpoint.export"
SUBMIT_TASK_ID = "train.submit"
DELETE_LUSTRE_TASK_ID = "teardown.delete-lustre"


class _GcpResourceOperator(RecordsStart):
    """Shared plumbing: the spec from the validate task's XCom, the resource by key, the hook, the deferral."""

    def __init__(
        self,
        *,
        resource_key: str,
        gcp_conn_id: str = DEFAULT_GCP_CONN_ID,
        validate_task_id: str = VALIDATE_TASK_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.resource_key = resource_key
        self.gcp_conn_id = gcp_conn_id
        self.validate_task_id = validate_task_id

    @cached_property
    def hook(self) -> GcpHook:
        """The sync GCP hook; built on first use, never at parse time."""
        from nemo_rl_gke.gcp.hooks import GcpHook

        return GcpHook(gcp_conn_id=self.gcp_conn_id)

    def run_spec(self, context: Context) -> RunSpec:
        """The RunSpec the validate task accepted (the one source of names)."""
        from nemo_rl_gke.spec import RunSpec

        return RunSpec.from_conf(context["ti"].xcom_pull(task_ids=self.validate_task_id))

    def resource(self, spec: RunSpec) -> Resource:
        """This task's resource, by its stable key."""
        from nemo_rl_gke.gcp.resources import resources

        found = resources(spec)
        if self.resource_key not in found:
            raise AirflowFailException(
                f"unknown resource key {self.resource_key!r}; expected one of {', '.join(found)}"
            )
        return found[self.resource_key]

    def describe(self, resource: Resource) -> str:
        """How messages name the resource: kind, name and key."""
        return f"{resource.label} ({resource.key})"

    def result(self, resource: Resource, action: str) -> dict[str, str]:
        """The task's XCom return value."""
        return {"key": resource.key, "name": resource.name, "action": action}

    def defer_on(self, operation: OperationRef, *, resource: Resource, spec: RunSpec, stage: str, action: str) -> None:
        """Hand the wait on ``operation`` to the triggerer, with the spec's poll interval and the stage's timeout."""
        from nemo_rl_gke.triggers.operations import OperationTrigger

        timeout_s = spec.stage_timeout_s(stage)
        self.log.info(
            "%s: %s; waiting for operation %s (poll every %ss, timeout %ss), no worker slot held meanwhile",
            self.describe(resource),
            action,
            operation.path,
            spec.poll_interval_s,
            timeout_s,
        )
        self.defer(
            trigger=OperationTrigger(
                operation=operation.to_dict(),
                gcp_conn_id=self.gcp_conn_id,
                poll_interval=spec.poll_interval_s,
                timeout=timeout_s,
                # Fixed here, once: the trigger serializes it, so a triggerer restart keeps the same deadline.
                started_at=time.time(),
            ),
            method_name="execute_complete",
            kwargs={"action": action},
            timeout=timedelta(seconds=timeout_s + DEFERRAL_BACKSTOP_S),
        )

    def event_failure(self, resource: Resource, event: dict[str, Any]) -> str:
        """The message of a failed wait: the resource, the trigger's message, the operation and its last state."""
        operation = (event.get("operation") or {}).get("path", "?")
        return (
            f"{self.describe(resource)}: {event.get('status', 'error')}: {event.get('message', 'no message')} "
            f"(operation {operation}, last state {event.get('state', 'UNKNOWN')})"
        )


class EnsureGcpResourceOperator(_GcpResourceOperator):
    """Creates or adopts one GCP resource of the run and waits, deferred, until it is ready.

    ``ensure`` gets the resource first: an owned or allowed existing one is adopted (and a still-running operation on
    it is waited for), a missing one is created. Returns ``{"key", "name", "action"}`` with action ``created``,
    ``adopted`` or ``exists``.

    Failures: an unowned resource (without ``adopt_existing``) or drift from the spec fails at once without retries,
    and so does an operation that ended in error, since the API gave its answer and a blind re-create would fail the
    same way or pile up half-made resources. A timeout or a polling error may be retried: a retry re-runs ``ensure``,
    which finds the resource and waits on its operation again, never duplicating it.
    """

    ui_color = "#e3f0fb"

    def execute(self, context: Context) -> dict[str, str]:
        """Ensure the resource; defer on its operation if there is one."""
        from nemo_rl_gke.gcp.hooks import http_status
        from nemo_rl_gke.gcp.resources import DriftError, NotOwnedError, ResourceFailedError, ensure

        spec = self.run_spec(context)
        resource = self.resource(spec)
        try:
            outcome = ensure(resource, self.hook, spec.adopt_existing)
        except (NotOwnedError, DriftError, ResourceFailedError) as exc:
            # Same conf, same answer (or a resource in ERROR that needs a human): a retry cannot help.
            raise AirflowFailException(str(exc)) from exc
        except Exception as exc:
            status = http_status(exc)
            if status is not None and 400 <= status < 500:
                # The API refused the request itself (400, 403, ...): the same request would be refused again.
                raise AirflowFailException(f"{self.describe(resource)}: the API refused it: {exc}") from exc
            raise
        if outcome.operation is not None:
            self.defer_on(outcome.operation, resource=resource, spec=spec, stage=resource.stage, action=outcome.action)
        return self.check_ready(resource, outcome.action)

    def execute_complete(self, context: Context, event: dict[str, Any], action: str = "created") -> dict[str, str]:
        """Resume after the trigger: fail with the trigger's message, or check the resource is ready."""
        spec = self.run_spec(context)
        resource = self.resource(spec)
        if event.get("status") == "success":
            return self.check_ready(resource, action)
        message = self.event_failure(resource, event)
        if event.get("status") == "error" and event.get("state") == "DONE":
            raise AirflowFailException(message)
        raise AirflowException(message)

    def check_ready(self, resource: Resource, action: str) -> dict[str, str]:
        """Re-get the resource and fail unless it exists and is ready."""
        actual = resource.get(self.hook)
        if actual is None:
            raise AirflowException(f"{self.describe(resource)} does not exist after it was {action}")
        if not resource.ready(actual):
            state = resource.state(actual) or "unknown"
            raise AirflowException(f"{self.describe(resource)} is not ready: state {state}")
        self.log.info("%s is ready (%s)", self.describe(resource), action)
        return self.result(resource, action)


class DeleteGcpResourceOperator(_GcpResourceOperator):
    """Deletes one GCP resource of the run, if the teardown policy lets it go and this DAG created it.

    Only ``delete_all`` deletes GCP resources. A resource without the ownership marker is logged and kept (DESIGN rule
    2); one that is already gone counts as deleted (404 is success). The wait on the delete operation is deferred with
    the spec's teardown timeout. Returns ``{"key", "name", "action"}``, action one of ``deleted``, ``absent``,
    ``kept-by-policy``, ``kept-unowned``.
    """

    ui_color = "#fbe9e3"

    def execute(self, context: Context) -> dict[str, str]:
        """Delete the resource when the policy and ownership allow; defer on the delete operation."""
        from nemo_rl_gke.gcp.resources import delete_resource

        spec = self.run_spec(context)
        resource = self.resource(spec)
        if spec.teardown_policy != DELETING_POLICY:
            self.log.info("%s kept by teardown policy %s", self.describe(resource), spec.teardown_policy)
            return self.result(resource, KEPT_BY_POLICY)
        if self.resource_key == "lustre":
            reason = self.checkpoint_at_risk(context, spec)
            if reason:
                self.log.warning("%s kept: %s", self.describe(resource), reason)
                return self.result(resource, KEPT_FOR_CHECKPOINT)
        if self.resource_key in LUSTRE_NEEDS:
            lustre = context["ti"].xcom_pull(task_ids=DELETE_LUSTRE_TASK_ID) or {}
            if lustre.get("action") == KEPT_FOR_CHECKPOINT:
                self.log.warning(
                    "%s kept: the Lustre instance kept for its checkpoint still uses it", self.describe(resource)
                )
                return self.result(resource, KEPT_FOR_LUSTRE)
        outcome = delete_resource(resource, self.hook)
        if outcome.action == KEPT_UNOWNED:
            self.log.warning("%s kept: not created by this DAG", self.describe(resource))
            return self.result(resource, KEPT_UNOWNED)
        if outcome.operation is not None:
            self.defer_on(outcome.operation, resource=resource, spec=spec, stage="teardown", action=outcome.action)
        self.log.info("%s: %s", self.describe(resource), outcome.action)
        return self.result(resource, outcome.action)

    def checkpoint_at_risk(self, context: Context, spec: RunSpec) -> str:
        """Why deleting Lustre now would lose the only copy of a checkpoint ('' when it would not, DESIGN rule 4)."""
        if spec.accept_checkpoint_loss:
            return ""
        exported = context["ti"].xcom_pull(task_ids=EXPORT_TASK_ID) or {}
        if exported.get("action") == "exported":
            return ""
        if not context["ti"].xcom_pull(task_ids=SUBMIT_TASK_ID):
            return ""  # no job ran in this run, so nothing it wrote can be lost
        return (
            f"the checkpoint export did not succeed, so the only copy of {spec.checkpoint_dir} is on this instance "
            f"(Lustre path {spec.checkpoint_dir.removeprefix('/data') or '/'}). Export it (gcloud lustre instances "
            "export-data), then delete the instance, or re-run with accept_checkpoint_loss=true"
        )

    def execute_complete(self, context: Context, event: dict[str, Any], action: str = "deleted") -> dict[str, str]:
        """Resume after the trigger: done when the resource is gone, whatever the operation said."""
        spec = self.run_spec(context)
        resource = self.resource(spec)
        # 404 is success: a delete operation that failed because the resource had already gone still leaves it gone.
        if resource.get(self.hook) is None:
            if event.get("status") != "success":
                self.log.warning("%s is gone although: %s", self.describe(resource), event.get("message"))
            self.log.info("%s deleted", self.describe(resource))
            return self.result(resource, "deleted")
        if event.get("status") == "success":
            raise AirflowException(f"{self.describe(resource)} still exists after its delete operation finished")
        # Retryable on purpose: a delete refused while a dependent is still going away succeeds on a later try.
        raise AirflowException(self.event_failure(resource, event))


def secret_findings(spec: RunSpec) -> list[Finding]:
    """The job's secrets exist now (connection with a password), before anything is created."""
    from airflow.sdk import BaseHook

    from nemo_rl_gke.findings import Finding
    from nemo_rl_gke.rayjobs import job_secrets

    findings = []
    for secret in job_secrets(spec):
        param = "hf_conn_id" if secret.name == "HF_TOKEN" else "wandb_conn_id"
        try:
            password = BaseHook.get_connection(secret.conn_id).password
        except Exception:
            password = None
        if not password:
            findings.append(
                Finding(
                    "secrets.present",
                    (param,),
                    secret.conn_id,
                    f"the job needs {secret.name} from the password of Airflow connection '{secret.conn_id}', which "
                    "does not exist or has no password",
                    f"create it: airflow connections add {secret.conn_id} --conn-type generic --conn-password <token> "
                    "(or AIRFLOW_CONN_*, or your secrets backend); the token never goes in the conf",
                )
            )
    return findings


class PreflightLiveOperator(RecordsStart):
    """Checks the live project before anything is created: reservation, RoCE profile, APIs, quota.

    Fails (no retries) with every finding at once, in the same format as the offline validate task, and pushes them
    to XCom under ``findings``.
    """

    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        gcp_conn_id: str = DEFAULT_GCP_CONN_ID,
        validate_task_id: str = VALIDATE_TASK_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gcp_conn_id = gcp_conn_id
        self.validate_task_id = validate_task_id

    @cached_property
    def hook(self) -> GcpHook:
        """The sync GCP hook; built on first use, never at parse time."""
        from nemo_rl_gke.gcp.hooks import GcpHook

        return GcpHook(gcp_conn_id=self.gcp_conn_id)

    def execute(self, context: Context) -> None:
        """Run the live checks of the validated spec; fail with all findings."""
        from nemo_rl_gke.findings import format_findings
        from nemo_rl_gke.gcp.live_checks import live_findings
        from nemo_rl_gke.spec import RunSpec

        spec = RunSpec.from_conf(context["ti"].xcom_pull(task_ids=self.validate_task_id))
        findings = [*live_findings(spec, self.hook), *secret_findings(spec)]
        if findings:
            for finding in findings:
                self.log.error("%s", finding)
            context["ti"].xcom_push(key=FINDINGS_KEY, value=[f.to_dict() for f in findings])
            raise AirflowFailException(format_findings(findings))
        self.log.info(
            "Live preflight passed in project %s: reservation %s, network profile, APIs and quota",
            spec.project,
            spec.reservation,
        )
