"""The running sandbox: its store, faults, call log and latency model, and the two things every API does with them
(start an operation, supersede one that hangs)."""

from __future__ import annotations

from pathlib import Path

from sandbox import formats
from sandbox.auth import DEFAULT_LIFETIME_S, Auth
from sandbox.calllog import CallLog
from sandbox.errors import ApiError
from sandbox.faults import Faults
from sandbox.http import Call
from sandbox.kube import KubeApi
from sandbox.kuberay import KubeRay
from sandbox.operations import Effect, LatencyModel, Operation, new_operation_id
from sandbox.quotas import RateLimiter
from sandbox.store import Resource, Store


class Sandbox:
    """Everything a request handler may touch. One instance per server process."""

    def __init__(
        self, state_dir: Path, latency_scale: float = 1.0, token_lifetime_s: float = DEFAULT_LIFETIME_S
    ) -> None:
        self.state_dir = state_dir
        self.store = Store(state_dir)
        # The key, the tokens and the bearer check: ``sandbox.auth.verify(authorization_header)``.
        self.auth = Auth(state_dir, token_lifetime_s)
        self.faults = Faults()
        self.rates = RateLimiter()
        self.calls = CallLog()
        self.latency_scale = latency_scale
        self.started = formats.now()
        # Set by the server once it listens.
        self.url = ""
        self.kuberay = KubeRay(self.store, state_dir)
        self.kube = KubeApi(self.store, self.faults, self.calls, self.kuberay, verify=self.auth.verify)
        # A running GKE cluster serves its Kubernetes API; a deleted one takes its objects, its listener and its
        # RayClusters' Ray processes along.
        self.store.on_ready.append(self._ready)
        self.store.on_drop.append(self._dropped)

    def _ready(self, resource: Resource) -> None:
        if resource.kind == "container.cluster":
            self.kube.serve(resource)

    def _dropped(self, resource: Resource) -> None:
        if resource.kind == "container.cluster":
            self.kube.drop_cluster(resource.key)
        elif resource.kind == "container.nodePool":
            # A pool gone any way (deleted, its cluster deleted, a reset) takes its nodes and flex-start request.
            self.kuberay.capacity.forget_pool(resource.key)

    @property
    def latency(self) -> LatencyModel:
        """The latency model: the global scale with the seeded per-kind seconds."""
        return LatencyModel(self.latency_scale, self.store.config.latency_seconds)

    def now(self) -> float:
        """The wall clock every operation is scheduled by."""
        return formats.now()

    def start_operation(
        self,
        call: Call,
        *,
        service: str,
        kind: str,
        verb: str,
        project: str,
        location: str,
        target: str,
        effect: Effect,
        meta: dict[str, object] | None = None,
        request_id: str | None = None,
        error: ApiError | None = None,
    ) -> Operation:
        """Start an operation (its resources must be in the store already) and settle it at once if it is instant.

        ``error`` makes it end in that error (a failure the real API reports inside the operation). Otherwise an
        operation fault matched by the call makes it end in error or hang.
        """
        at = self.now()
        outcome, record = "ok", None
        if error is not None:
            outcome, record = "error", error.to_record()
        elif call.operation_fault is not None:
            outcome = call.operation_fault.operation or "ok"
            if outcome == "error":
                record = call.operation_fault.operation_error().to_record()
        operation = Operation(
            id=new_operation_id(at),
            service=service,
            kind=kind,
            verb=verb,
            project=project,
            location=location,
            target=target,
            start=at,
            duration=self.latency.seconds(kind),
            outcome=outcome,
            error=record,
            effect=effect,
            request_id=request_id,
            meta=dict(meta or {}),
        )
        while operation.id in self.store.operations:
            operation.id = new_operation_id(at)
        self.store.add_operation(operation)
        call.started.append(operation.id)
        self.store.settle(at)
        return operation

    def supersede_hung(self, resource: Resource) -> bool:
        """End the hanging create of ``resource`` (or of its children) in error so a delete can go ahead.

        A hanging operation only exists because a test injected one; without this a teardown could never clean up
        after it. Returns whether anything hung.
        """
        aborted = False
        for operation in self.store.running(resource.key):
            if operation.outcome == "hang":
                self.store.abort(operation, self.now(), ApiError("ABORTED", "Operation was superseded by a delete."))
                aborted = True
        return aborted
