"""Deferrable operators that create, adopt and delete the run's Google Cloud resources.

Thin glue (DESIGN): the resource is the one the topology step names, the actions live in
:mod:`nemo_rl_gke.gcp.resources`, and every wait on a long-running operation is a deferral to
:class:`~nemo_rl_gke.triggers.operations.OperationTrigger`, so no worker slot is held while Google works (rule 3).
Imported while the DAG file is parsed: google clients, the resources and the hooks are imported inside methods only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import Context

from nemo_rl_gke.airflow_compat import AirflowException, AirflowFailException
from nemo_rl_gke.links import GCP_RESOURCE_LINKS
from nemo_rl_gke.operators.base import StepOperator, pull
from nemo_rl_gke.run import outcomes, topology
from nemo_rl_gke.run.times import iso_now

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.operations import OperationRef
    from nemo_rl_gke.gcp.resources import Resource
    from nemo_rl_gke.gcp.resources.lustre import LustreInstance
    from nemo_rl_gke.run.spec import RunSpec


class _ResourceStep(StepOperator):
    """A step whose subject is one GCP resource: the resource of the step (ensure) or of what it deletes."""

    @property
    def resource_key(self) -> str:
        """The task id of the step that makes the resource."""
        return self.step.deletes[0] if self.step.is_teardown else self.step_id

    def resource(self, context: Context, spec: RunSpec) -> Resource:
        """This task's resource, from the registry, judged as this run's."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.resources import resources

        return resources(spec, self.identity(context, spec))[self.resource_key]

    def describe(self, resource: Resource) -> str:
        """How messages name the resource: kind, name and step."""
        return f"{resource.label} ({resource.key})"

    def result(self, resource: Resource, action: str) -> dict[str, str]:
        """The task's XCom return value."""
        return {"key": resource.key, "name": resource.name, "action": action}

    def wait_on(
        self, context: Context, spec: RunSpec, operation: OperationRef, resource: Resource, action: str
    ) -> None:
        """Defer on the operation; ``execute_complete`` resumes with the action so far."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.triggers.operations import OperationTrigger

        self.defer_until(
            context,
            spec,
            OperationTrigger,
            what=f"{self.describe(resource)}: {action}; operation {operation.path}",
            pending=self.result(resource, action),
            operation=operation.to_dict(),
        )

    def event_failure(self, resource: Resource, event: dict[str, Any]) -> str:
        """The message of a failed wait: the resource, the trigger's message, the operation and its last state."""
        operation = (event.get("operation") or {}).get("path", "?")
        return (
            f"{self.describe(resource)}: {event.get('status', 'error')}: {event.get('message', 'no message')} "
            f"(operation {operation}, last state {event.get('state', 'UNKNOWN')})"
        )


class EnsureGcpResourceOperator(_ResourceStep):
    """Creates or adopts one GCP resource of the run and waits, deferred, until it is ready.

    ``ensure`` gets the resource first: an owned or allowed existing one is adopted (and a still-running operation on
    it is waited for), a missing one is created. Returns ``{"key", "name", "action", "ready_at"}`` with action
    ``created``, ``adopted`` or ``exists``.

    Failures: an unowned resource (without ``adopt_existing``) or drift from the spec fails at once without retries,
    and so does an operation that ended in error, since the API gave its answer and a blind re-create would fail the
    same way or pile up half-made resources. A timeout or a polling error may be retried: a retry re-runs ``ensure``,
    which finds the resource and waits on its operation again, never duplicating it.
    """

    operator_extra_links = GCP_RESOURCE_LINKS
    ui_color = "#e3f0fb"

    def execute(self, context: Context) -> dict[str, str]:
        """Ensure the resource; defer on its operation if there is one."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.hooks import http_status
        from nemo_rl_gke.gcp.resources import DriftError, NotOwnedError, ResourceFailedError, ensure

        spec = self.run_spec(context)
        resource = self.resource(context, spec)
        if self.resource_key == topology.NODE_POOL and spec.capacity_ladder:
            resource = self.rung_pool(context, spec, resource)
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
            self.wait_on(context, spec, outcome.operation, resource, outcome.action)
        return self.check_ready(resource, outcome.action)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, str]:
        """Resume after the trigger: fail with the trigger's message, or check the resource is ready."""
        spec = self.run_spec(context)
        resource = self.resource(context, spec)
        if event.get("status") == "success":
            return self.check_ready(resource, self.pending(context)["action"])
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.hooks import busy_text

        message = self.event_failure(resource, event)
        # An operation that failed because another one held the network (Service Networking's code 3 "There is a
        # peering operation in progress") is worth another try; any other failure inside the operation is final.
        if event.get("status") == "error" and event.get("state") == "DONE" and not busy_text(message):
            raise AirflowFailException(message)
        raise AirflowException(message)

    def rung_pool(self, context: Context, spec: RunSpec, resource: Resource) -> Resource:
        """The GPU pool as the ladder's rung it already is on (a cluster kept warm after a run that fell down the
        ladder keeps that rung's pool): that pool is the run's, not drift."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.decide import ladder
        from nemo_rl_gke.run import capacity

        found = ladder.kept_rung(capacity.options(spec), spec.capacity, resource.get(self.hook))
        if found is None:
            return resource
        self.log.info("%s is on the capacity ladder's %s rung already: kept as it is", self.describe(resource), found)
        return self.resource(context, capacity.on_rung(spec, found))

    def check_ready(self, resource: Resource, action: str) -> dict[str, str]:
        """Re-get the resource and fail unless it exists and is ready."""
        actual = resource.get(self.hook)
        if actual is None:
            raise AirflowException(f"{self.describe(resource)} does not exist after it was {action}")
        problem = resource.problem(actual)
        if problem and resource.spec.capacity_ladder:
            # The ladder's next rung takes over once kube.raycluster has applied the workers that ask for nodes.
            self.log.warning("%s; the capacity ladder goes on to its next rung at %s", problem, topology.RAYCLUSTER)
        elif problem:
            raise AirflowFailException(problem)  # the same conf meets the same stock-out: not retried
        if not resource.ready(actual):
            state = resource.state(actual) or "unknown"
            raise AirflowException(f"{self.describe(resource)} is not ready: state {state}")
        self.log.info("%s is ready (%s)", self.describe(resource), action)
        # When it was ready: the GPU pool's is where the run's GPU cost (and its USD budget) starts counting.
        return {**self.result(resource, action), "ready_at": iso_now()}


class DeleteGcpResourceOperator(_ResourceStep):
    """Deletes one GCP resource of the run, if the teardown policy lets it go and it is this run's to delete.

    Kept (the task ends skipped, its result in XCom, so the grid shows it apart from a deletion): by policy (the
    topology says which policies delete what); another deployment's or group's resource, or an adopted one (DESIGN
    rule 2); one of the group's that this run refused or never reached; Lustre while it holds a checkpoint that no
    export has copied (any run's record, :mod:`nemo_rl_gke.gcp.pending`, or a step directory the listing found that
    no record names), and what Lustre needs while it stays. One that is already gone counts as deleted (404 is
    success). The wait on the delete operation is deferred with the teardown timeout. Returns ``{"key", "name",
    "action"}`` with an :mod:`~nemo_rl_gke.run.outcomes` action; a kept Lustre adds ``pending``, every pending record.
    """

    ui_color = "#fbe9e3"

    def execute(self, context: Context) -> dict[str, str]:
        """Delete the resource when the policy, ownership and checkpoints allow; defer on the delete operation."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.decide.teardown import kept_for_storage, lustre_goes, storage_keys
        from nemo_rl_gke.gcp.resources import delete_resource

        spec = self.run_spec(context)
        resource = self.resource(context, spec)
        if not topology.deletes_under(self.resource_key, spec.teardown_policy):
            self.keep(
                context, self.result(resource, outcomes.KEPT_BY_POLICY), f"teardown_policy={spec.teardown_policy}"
            )
        ensured = pull(context, self.resource_key) or {}
        used = ensured.get("action") in (outcomes.CREATED, outcomes.EXISTS)
        records: list[Any] = []
        if self.resource_key in storage_keys():
            lustre: LustreInstance = self.resource_of(context, spec, topology.LUSTRE)  # type: ignore[assignment]
            lustre_actual = lustre.get(self.hook)
            run = self.identity(context, spec).run
            if self.resource_key == topology.LUSTRE and lustre_actual is not None and lustre.owned(lustre_actual):
                records = self.lustre_records(context, spec, lustre_actual, run)
            kept = kept_for_storage(
                self.resource_key,
                lustre,
                lustre_actual,
                run=run,
                records=records,
                accepts_own_loss=spec.accept_checkpoint_loss,
                release_run=spec.release_checkpoint_of_run,
            )
            if kept:
                found = self.result(resource, kept[0])
                if self.resource_key == topology.LUSTRE:
                    # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
                    from nemo_rl_gke.gcp.pending import pending_rows

                    found["pending"] = pending_rows(records)  # type: ignore[assignment]
                self.keep(context, found, kept[1])
            if self.resource_key == topology.LUSTRE and lustre_goes(lustre, lustre_actual, used=used):
                self.forget_records(spec, lustre_actual)  # type: ignore[arg-type]
        outcome = delete_resource(resource, self.hook, used=used)
        if outcome.action in outcomes.KEPT:
            self.keep(context, self.result(resource, outcome.action), f"{self.describe(resource)}: {outcome.reason}")
        if outcome.operation is not None:
            self.wait_on(context, spec, outcome.operation, resource, outcome.action)
        self.log.info("%s: %s", self.describe(resource), outcome.action)
        return self.result(resource, outcome.action)

    def lustre_records(self, context: Context, spec: RunSpec, actual: dict[str, Any], run: str) -> list[Any]:
        """Lustre's checkpoint records, after this run's listing of its step directories (taken by the validation
        job while the cluster was up) was compared with them; None listing when the run did not get that far."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.pending import records_before_delete, release

        report = pull(context, topology.CHECK_CHECKPOINT, topology.CHECKPOINT_REPORT) or {}
        listing = report.get("steps_present")
        records = records_before_delete(
            self.hook, spec, actual, run=run, listing=listing if isinstance(listing, list) else None
        )
        return release(self.hook, spec, actual, records, run=run, accepts_own_loss=spec.accept_checkpoint_loss,
                       release_run=spec.release_checkpoint_of_run)  # fmt: skip

    def forget_records(self, spec: RunSpec, actual: dict[str, Any]) -> None:
        """The instance goes, and every record with it: each was exported or released (a stale record would keep
        the next instance of that name)."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.pending import CheckpointRecords

        removed = CheckpointRecords(self.hook, spec, actual).remove_all()
        self.log.info("Removed %s checkpoint record(s) of Lustre instance %s before deleting it", removed,
                      spec.lustre_name)  # fmt: skip

    def resource_of(self, context: Context, spec: RunSpec, key: str) -> Resource:
        """Another resource of the run, judged as this run's."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.resources import resources

        return resources(spec, self.identity(context, spec))[key]

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, str]:
        """Resume after the trigger: done when the resource is gone, whatever the operation said."""
        spec = self.run_spec(context)
        resource = self.resource(context, spec)
        # 404 is success: a delete operation that failed because the resource had already gone still leaves it gone.
        if resource.get(self.hook) is None:
            if event.get("status") != "success":
                self.log.warning("%s is gone although: %s", self.describe(resource), event.get("message"))
            self.log.info("%s deleted", self.describe(resource))
            return self.result(resource, outcomes.DELETED)
        if event.get("status") == "success":
            raise AirflowException(f"{self.describe(resource)} still exists after its delete operation finished")
        if event.get("status") == "error" and event.get("state") == "DONE" and event.get("operation"):
            # The delete failed inside its operation: some resources have a documented other way (the peering).
            from nemo_rl_gke.gcp.operations import OperationRef

            fallback = resource.fallback_delete(self.hook, OperationRef.from_dict(event["operation"]))
            if fallback is not None:
                self.log.warning("%s: %s; deleting it another way", self.describe(resource), event.get("message"))
                self.wait_on(context, spec, fallback, resource, outcomes.DELETED)
        # Retryable on purpose: a delete refused while a dependent is still going away succeeds on a later try.
        raise AirflowException(self.event_failure(resource, event))


class ScaleGpuPoolOperator(_ResourceStep):
    """Scales the GPU pool of a cluster kept warm (``keep_cluster_and_storage``) to 0 nodes, deferred on the resize.

    The RayCluster is gone by then, so nothing runs on the pool: its nodes would only bill until the autoscaler
    noticed. Under ``delete_all`` the pool goes with its cluster (``not-needed``); under ``keep_all`` it is kept as it
    is (skipped, ``kept-by-policy``). Returns ``{"key", "name", "action"}``.
    """

    ui_color = "#fbe9e3"

    @property
    def resource_key(self) -> str:
        """The GPU node pool."""
        return topology.NODE_POOL

    def execute(self, context: Context) -> dict[str, str]:
        """Resize the pool to 0 when the policy keeps the cluster warm and the pool is this run group's."""
        spec = self.run_spec(context)
        pool = self.resource(context, spec)
        if topology.deletes_under(self.resource_key, spec.teardown_policy):
            return self.result(pool, outcomes.NOT_NEEDED)  # it goes with its cluster
        if not topology.scales_down_under(self.resource_key, spec.teardown_policy):
            self.keep(context, self.result(pool, outcomes.KEPT_BY_POLICY), f"teardown_policy={spec.teardown_policy}")
        actual = pool.get(self.hook)
        if actual is None:
            return self.result(pool, outcomes.ABSENT)
        if not pool.owned(actual):
            self.keep(context, self.result(pool, outcomes.KEPT_UNOWNED), "not this run group's: never resized")
        operation = pool.scale_to_zero(self.hook)  # type: ignore[attr-defined]
        if operation is None:
            return self.result(pool, outcomes.ABSENT)
        self.wait_on(context, spec, operation, pool, outcomes.SCALED_TO_ZERO)
        return self.result(pool, outcomes.SCALED_TO_ZERO)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, str]:
        """Resume after the resize: done, or fail (retryable) with the operation's story."""
        spec = self.run_spec(context)
        pool = self.resource(context, spec)
        if event.get("status") != "success":
            raise AirflowException(self.event_failure(pool, event))
        self.log.info("%s: scaled to 0 nodes; the cluster stays warm for the next run", self.describe(pool))
        return self.result(pool, outcomes.SCALED_TO_ZERO)
