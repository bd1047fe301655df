"""The sandbox's state: resources, operations and the seeded config, persisted as one JSON file in the state dir.

Resources are keyed by their relative path (``projects/P/global/networks/N``,
``projects/P/locations/L/clusters/C/nodePools/NP``); a resource's children are the ones whose key extends it. A
resource records the keys it ``refs`` (a subnet its network, a node pool its subnets), which is what makes a delete
of something in use fail. Each request settles the operations that are due, then its handler mutates the store; the
server saves after every request that changed something (write to a temp file, then rename, so a crash never leaves a
half-written state).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox import files
from sandbox.config import Config
from sandbox.errors import ApiError
from sandbox.operations import Operation

STATE_FILE = "state.json"
STATE_VERSION = 1
PHASES = ("creating", "ready", "deleting", "error")


@dataclass
class Resource:
    """One live resource: its API body (camelCase, as stored), lifecycle phase and what it depends on.

    ``phase`` is creating / ready / deleting / error; ``op`` is the operation in flight on it. ``keep_on_error``
    resources (GKE's) turn ERROR when their create fails instead of vanishing. ``extra`` holds what only the sandbox
    knows (a Lustre instance's data directory and IP).
    """

    kind: str
    key: str
    body: dict[str, Any]
    phase: str = "creating"
    op: str | None = None
    refs: list[str] = field(default_factory=list)
    created: float = 0.0
    keep_on_error: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The last segment of the key."""
        return self.key.rsplit("/", 1)[-1]

    @property
    def project(self) -> str:
        """The project segment of the key (every key but a connection's starts ``projects/P/``)."""
        parts = self.key.split("/")
        return parts[1] if parts[0] == "projects" else self.extra.get("project", "")


class Store:
    """Resources, operations and config in memory, with atomic persistence to ``state_dir/state.json``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.resources: dict[str, Resource] = {}
        self.operations: dict[str, Operation] = {}
        self.config = Config()
        # Compute common instance metadata per project: {"fingerprint", "items"} (the runs' leases live there).
        self.metadata: dict[str, dict[str, Any]] = {}
        self.dirty = False
        # Called with every resource that goes away (deleted or reset), for what lives outside the store.
        self.on_drop: list[Callable[[Resource], None]] = []
        # Called with every resource whose create has just finished, for the same.
        self.on_ready: list[Callable[[Resource], None]] = []

    # --- persistence ---------------------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The state file."""
        return self.state_dir / STATE_FILE

    def load(self) -> bool:
        """Load the state file if there is one; returns whether it existed."""
        if not self.path.exists():
            return False
        record = json.loads(self.path.read_text(encoding="utf-8"))
        if record.get("version") != STATE_VERSION:
            raise ValueError(f"{self.path}: state version {record.get('version')}, expected {STATE_VERSION}")
        self.resources = {r["key"]: Resource(**r) for r in record["resources"]}
        self.operations = {o["id"]: Operation.from_json(o) for o in record["operations"]}
        self.config = Config.from_json(record["config"])
        self.metadata = record.get("metadata", {})
        return True

    def save(self) -> None:
        """Write the whole state atomically (temp file in the same directory, then rename)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        record = {
            "version": STATE_VERSION,
            "resources": [dataclasses.asdict(r) for r in self.resources.values()],
            "operations": [o.to_json() for o in self.operations.values()],
            "config": self.config.to_json(),
            "metadata": self.metadata,
        }
        fd, temp = tempfile.mkstemp(prefix=".state-", suffix=".json", dir=self.state_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(record, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        self.dirty = False

    def save_if_dirty(self) -> None:
        """Save only when something changed since the last save."""
        if self.dirty:
            self.save()

    def reset(self) -> None:
        """Forget every resource and operation (the config stays) and delete their local files."""
        for resource in list(self.resources.values()):
            self._drop(resource)
        self.resources.clear()
        self.operations.clear()
        self.metadata.clear()
        files.remove_tree(files.gcs_root(self.state_dir))
        files.remove_tree(files.gcs_meta_root(self.state_dir))
        self.dirty = True

    # --- resources -----------------------------------------------------------------------------------------------
    def get(self, key: str) -> Resource | None:
        """The resource at ``key``, in any phase."""
        return self.resources.get(key)

    def put(self, resource: Resource) -> None:
        """Add or replace a resource."""
        self.resources[resource.key] = resource
        self.dirty = True

    def of_kind(self, kind: str, prefix: str = "") -> Iterator[Resource]:
        """Resources of one kind whose key starts with ``prefix``, in creation order."""
        for resource in sorted(self.resources.values(), key=lambda r: (r.created, r.key)):
            if resource.kind == kind and resource.key.startswith(prefix):
                yield resource

    def children(self, key: str) -> list[Resource]:
        """Resources below ``key`` (a cluster's node pools)."""
        return [r for r in self.resources.values() if r.key.startswith(key + "/")]

    def users_of(self, key: str) -> list[Resource]:
        """Other resources that refer to ``key`` (its own children excepted), oldest first."""
        users = [r for r in self.resources.values() if key in r.refs and not r.key.startswith(key + "/")]
        return sorted(users, key=lambda r: (r.created, r.key))

    def remove(self, key: str) -> None:
        """Delete a resource and its children, with their local files."""
        for resource in [*self.children(key), self.resources.get(key)]:
            if resource is not None:
                self._drop(resource)
                self.resources.pop(resource.key, None)
        self.dirty = True

    def _drop(self, resource: Resource) -> None:
        for hook in self.on_drop:
            hook(resource)
        data_dir = resource.extra.get("data_dir")
        if data_dir:
            files.remove_tree(Path(data_dir))

    # --- operations ----------------------------------------------------------------------------------------------
    def add_operation(self, operation: Operation) -> None:
        """Record a started operation and point the resources it affects at it."""
        if operation.id in self.operations:
            raise ValueError(f"operation id {operation.id} is already used")
        self.operations[operation.id] = operation
        for key in operation.effect.ready:
            self.resources[key].op = operation.id
        for key in operation.effect.remove:
            for resource in [self.resources[key], *self.children(key)]:
                resource.op = operation.id
                resource.phase = "deleting"
        self.dirty = True

    def operation(self, op_id: str) -> Operation | None:
        """The operation with this id (ids are unique across services)."""
        return self.operations.get(op_id)

    def by_request_id(self, service: str, project: str, request_id: str) -> Operation | None:
        """The operation an earlier call with the same ``requestId`` started (the APIs' idempotent retry)."""
        for operation in self.operations.values():
            if (operation.service, operation.project, operation.request_id) == (service, project, request_id):
                return operation
        return None

    def running(self, prefix: str) -> list[Operation]:
        """Unfinished operations on ``prefix`` or anything below it."""
        return [
            o
            for o in self.operations.values()
            if not o.done and (o.target == prefix or o.target.startswith(prefix + "/"))
        ]

    def abort(self, operation: Operation, at: float, error: ApiError) -> None:
        """End an unfinished operation now, in error (a delete supersedes a create that hangs)."""
        operation.outcome = "error"
        operation.error = error.to_record()
        operation.duration = max(0.0, at - operation.start)
        self.dirty = True
        self.settle(at)

    def settle(self, at: float) -> list[Operation]:
        """Finish every operation due by ``at``, in end-time order, applying its effect; returns them."""
        due = sorted(
            (o for o in self.operations.values() if not o.done and o.end is not None and o.end <= at),
            key=lambda o: (o.end, o.start, o.id),
        )
        for operation in due:
            self._finish(operation)
        if due:
            self.dirty = True
        return due

    def _finish(self, operation: Operation) -> None:
        effect = operation.effect
        if operation.outcome == "ok" and effect.copy:
            source, destination = (Path(p) for p in effect.copy)
            try:
                operation.meta["files_copied"] = files.copy_tree(source, destination)
            except FileNotFoundError:
                operation.outcome = "error"
                missing = operation.meta.get("missing_message", f"{source} not found")
                operation.error = ApiError("NOT_FOUND", missing).to_record()
        failed = operation.outcome != "ok"
        for key in effect.ready:
            self._settle_made(operation, key, failed)
        for key in effect.remove:
            resource = self.resources.get(key)
            if resource is None:
                continue
            if failed:
                for item in [resource, *self.children(key)]:
                    if item.op == operation.id:
                        item.op, item.phase = None, "ready"
            else:
                self.remove(key)
        operation.finished = operation.end

    def _settle_made(self, operation: Operation, key: str, failed: bool) -> None:
        """A resource the operation made: ready (its hooks told), in ERROR when it keeps a failed create, else gone."""
        resource = self.resources.get(key)
        if resource is None or resource.op != operation.id:
            return
        resource.op = None
        if not failed:
            resource.phase = "ready"
            operation.snapshot = operation.snapshot or copy.deepcopy(resource.body)
            for hook in self.on_ready:
                hook(resource)
        elif resource.keep_on_error:
            resource.phase = "error"
        else:
            self.remove(key)
