"""Falling down the GPU capacity ladder while ``kube.raycluster`` waits for its workers, deferred all the way.

Each rung is one deferred wait on the RayCluster (:class:`~nemo_rl_gke.triggers.raycluster.RayClusterTrigger`, its
timeout the rung's seconds, watching the GPU pool for a stock-out). When a wait ends, the rung is recorded and the
ladder's decision (:func:`nemo_rl_gke.decide.ladder.after_rung`) says what follows: the run goes on, or the pool is
replaced by the next rung's (deleted, a deferred wait on the delete operation; created with the next option,
another) and the wait starts again, or the step fails naming every rung tried. The RayCluster stays applied (its
Pending workers are what the autoscaler scales the new pool for), and so do the networks, Lustre and the cluster.
Every rung tried is a row of the ``capacity`` record in the step's result (:mod:`nemo_rl_gke.run.capacity`).

A retried try finds the rung it was on from the pool that exists: the pool in the cloud is the ladder's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from nemo_rl_gke.airflow_compat import AirflowException, AirflowFailException
from nemo_rl_gke.operators.base import StepOperator
from nemo_rl_gke.run import capacity, topology
from nemo_rl_gke.run.times import iso_now

if TYPE_CHECKING:
    from airflow.sdk import Context

    from nemo_rl_gke.gcp.resources import Resource
    from nemo_rl_gke.run.spec import RunSpec


class CapacityLadder(StepOperator):
    """The RayCluster's wait for its GPU workers, one capacity rung at a time (mixed into the apply operator)."""

    def timeout_s(self, spec: RunSpec) -> float:
        """The RayCluster step holds the lease for the whole ladder: every rung and each pool replacement."""
        if self.step_id == topology.RAYCLUSTER and spec.capacity_ladder:
            return capacity.longest_wait_s(spec)
        return super().timeout_s(spec)

    def pool_of(self, context: Context, spec: RunSpec, option: str) -> Resource:
        """The GPU node pool as rung ``option`` makes it."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.resources import resources

        rung_spec = capacity.on_rung(spec, option)
        return resources(rung_spec, self.identity(context, rung_spec))[topology.NODE_POOL]

    def current_rung(self, context: Context, spec: RunSpec) -> int:
        """The rung whose pool exists now (a retried try goes on where the last one was); 0 without a ladder."""
        if not spec.capacity_ladder:
            return 0
        # lazy: the decisions load when a task runs, not at DAG parsing
        from nemo_rl_gke.decide import ladder

        return ladder.current_rung(capacity.options(spec), self.pool_of(context, spec, spec.capacity).get(self.hook))

    def wait_on_rung(self, context: Context, spec: RunSpec, pending: dict[str, Any], index: int) -> NoReturn:
        """Defer until the RayCluster is ready on rung ``index``, or the rung ends (its time, a stock-out)."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.triggers.raycluster import RayClusterTrigger

        rungs = capacity.ladder(spec)
        rung = rungs[index]
        # Only a ladder watches the pool: a lone rung's stock-out fails cluster.node-pool already.
        pool_path = f"/v1/{spec.node_pool_path}" if len(rungs) > 1 else None
        where = f" on rung {index + 1} of {len(rungs)} ({rung.capacity}, {rung.wait_s:.0f}s)" if len(rungs) > 1 else ""
        self.defer_until(
            context,
            spec,
            RayClusterTrigger,
            what=f"RayCluster {spec.namespace}/{spec.raycluster_name} to be ready{where}",
            pending={**pending, "rung": index, "rung_started_at": iso_now()},
            timeout_s=rung.wait_s,
            cluster_path=spec.cluster_path,
            namespace=spec.namespace,
            name=spec.raycluster_name,
            wait_for="ready",
            node_pool_path=pool_path,
        )

    def rung_ended(self, context: Context, spec: RunSpec, event: dict[str, Any]) -> dict[str, Any]:
        """The RayCluster's wait ended: record the rung, ask the ladder (:func:`~nemo_rl_gke.decide.ladder.after_rung`)
        and act: the result with the served rung, the next rung (deferred), or a failure naming every rung tried."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.decide import ladder
        from nemo_rl_gke.triggers.operations import SUCCESS, TIMEOUT
        from nemo_rl_gke.triggers.raycluster import STOCKOUT

        pending = dict(self.pending(context) or {})
        index = int(pending.pop("rung", 0))
        started = str(pending.pop("rung_started_at", iso_now()))
        rungs = capacity.ladder(spec)
        rung = rungs[index]
        status = str(event.get("status", "error"))
        message = str(event.get("message", "no message"))
        outcome = {SUCCESS: capacity.SERVED, STOCKOUT: capacity.STOCKOUT, TIMEOUT: capacity.NO_NODES}.get(
            status, capacity.FAILED
        )
        ended = capacity.row(
            rung.capacity, rung.wait_s, started_at=started, ended_at=iso_now(), outcome=outcome, message=message
        )
        answer = ladder.after_rung(rungs, index, ended, pending.get("capacity", []))
        pending["capacity"] = list(answer.rows)
        if answer.move is ladder.Move.SERVED:
            self.log.info("%s", message)
            if len(rungs) > 1:
                self.log.info("GPU capacity: %s served the run (rung %d of %d)", rung.capacity, index + 1, len(rungs))
            return pending
        if answer.move is ladder.Move.NEXT and answer.next_rung is not None:
            following = rungs[answer.next_rung]
            self.log.warning(
                "GPU capacity: %s gave no nodes (%s: %s); replacing the node pool with rung %d, %s",
                rung.capacity, outcome, message, answer.next_rung + 1, following.capacity,
            )  # fmt: skip
            self.replace_pool(context, spec, pending, answer.next_rung)
        ladder_note = f" (capacity ladder: {answer.tried()})" if len(rungs) > 1 else ""
        # The message already says what is stuck (Pending, Unschedulable, image pulls): a retry would wait again.
        raise AirflowFailException(f"{status}: {message}{ladder_note}")

    def replace_pool(self, context: Context, spec: RunSpec, pending: dict[str, Any], index: int) -> NoReturn:
        """Delete the last rung's pool, deferred; :meth:`rung_pool_deleted` creates rung ``index``'s."""
        pending = {**pending, "rung": index}
        previous = capacity.ladder(spec)[index - 1].capacity
        pool = self.pool_of(context, spec, previous)
        operation = pool.delete(self.hook)
        if operation is None:
            self.create_rung_pool(context, spec, pending)
        self.wait_on_operation(
            context, spec, operation, pending, method="rung_pool_deleted", what=f"{pool.label}: delete"
        )

    def rung_pool_deleted(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The old rung's pool is gone (or the delete failed): create the next rung's."""
        # lazy: the decisions load when a task runs, not at DAG parsing
        from nemo_rl_gke.decide import ladder

        spec = self.run_spec(context)
        pending = dict(self.pending(context) or {})
        index = int(pending["rung"])
        old = self.pool_of(context, spec, capacity.ladder(spec)[index - 1].capacity)
        if ladder.replaced_pool_blocks(str(event.get("status")), old.get(self.hook)):
            raise AirflowException(f"{old.label}: its delete failed: {event.get('message')}")
        self.create_rung_pool(context, spec, pending)

    def create_rung_pool(self, context: Context, spec: RunSpec, pending: dict[str, Any]) -> NoReturn:
        """Create rung ``pending["rung"]``'s pool, deferred on the create; or wait on it when it is there."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.resources import ensure

        index = int(pending["rung"])
        pool = self.pool_of(context, spec, capacity.ladder(spec)[index].capacity)
        outcome = ensure(pool, self.hook, spec.adopt_existing)
        if outcome.operation is None:
            self.wait_on_rung(context, spec, pending, index)
        self.wait_on_operation(
            context, spec, outcome.operation, pending, method="rung_pool_created", what=f"{pool.label}: create"
        )

    def rung_pool_created(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The next rung's pool exists: wait for the RayCluster's workers on it."""
        spec = self.run_spec(context)
        pending = dict(self.pending(context) or {})
        if event.get("status") != "success":
            raise AirflowFailException(f"the next capacity rung's node pool failed: {event.get('message')}")
        self.wait_on_rung(context, spec, pending, int(pending["rung"]))

    def wait_on_operation(
        self, context: Context, spec: RunSpec, operation: Any, pending: dict[str, Any], *, method: str, what: str
    ) -> NoReturn:
        """Defer on a node pool operation (bounded by ``cluster_timeout_s``), resuming in ``method``."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.triggers.operations import OperationTrigger

        self.defer_until(
            context,
            spec,
            OperationTrigger,
            what=f"{what}; operation {operation.path}",
            pending=pending,
            timeout_s=float(spec.cluster_timeout_s),
            method_name=method,
            operation=operation.to_dict(),
        )
