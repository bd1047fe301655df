"""One Google Cloud object of a run, as the rest of the package sees it, and what every kind shares.

Each :class:`Resource` knows one object of the run by its step's task id (``network.net``, ``storage.lustre``, ...):
how to read it (``get``, ``None`` on 404), create it with the request the builders made, delete it, tell whether
who made it (``recorded_owner``: its deployment, run group and creating run), how it differs from the conf
(``drift``) and whether it is usable (``ready``).
"""

from __future__ import annotations

import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from nemo_rl_gke.gcp.hooks import http_status, is_not_found
from nemo_rl_gke.gcp.resources.drift import Check, diff
from nemo_rl_gke.run import topology

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.gcp.operations import OperationRef
    from nemo_rl_gke.plan.api import ApiRequest
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec

log = logging.getLogger(__name__)
T = TypeVar("T")


def absent_on_404(call: Callable[[], T]) -> T | None:
    """The call's answer, or ``None`` when the API says the object is not there: 404 means gone, never an error."""
    try:
        return call()
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise


def request_id() -> str:
    """A fresh id for one create or delete call, reused by its transient retries.

    A retried request that had gone through gets the first one's operation back instead of a 409. Never derived from
    the name: a later run recreating the same name within the server's memory of ids would get the old operation.
    """
    return str(uuid.uuid4())


class Resource(ABC):
    """One Google Cloud object of the run: how to read, create, delete, own-check, drift-check and ready-check it.

    :param spec: the run's spec (every name and path comes from it).
    :param owner: the run's identity: stamped on what it creates, compared with what it finds.
    :param key: the task id of the step that makes it (:mod:`nemo_rl_gke.run.topology`).
    :param name: the object's name in Google Cloud.
    :param name_param: the conf parameter the name comes from, named in error messages.
    :param request: the create request the builders made; its message is sent and its body is the drift reference.
    :param delete_request: the delete request, as the plan lists it.
    """

    kind: ClassVar[str]
    checks: ClassVar[tuple[Check, ...]] = ()
    # Where the resource sits in its create body: the container bodies are whole Create*Request messages.
    body_root: ClassVar[str] = ""
    # Where the owner record lives, for messages: labels where the API has them, else the description.
    marker_where: ClassVar[str] = "labels"

    def __init__(
        self,
        spec: RunSpec,
        owner: Owner,
        *,
        key: str,
        name: str,
        name_param: str,
        request: ApiRequest,
        delete_request: ApiRequest,
    ) -> None:
        self.spec = spec
        self.owner = owner
        self.key = key
        self.name = name
        self.name_param = name_param
        self.request = request
        self.delete_request = delete_request

    @property
    def stage(self) -> str:
        """The stage of its step: picks the wait's timeout."""
        return topology.step(self.key).stage

    @property
    def planned(self) -> list[ApiRequest]:
        """The requests its creation makes, in order, as the plan lists them."""
        return [self.request]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, name={self.name!r})"

    @property
    def label(self) -> str:
        """How messages name it: ``network nemo-rl-net``."""
        return f"{self.kind} {self.name}"

    @abstractmethod
    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """The resource as its REST JSON, or ``None`` when it does not exist."""

    @abstractmethod
    def create(self, hook: GcpHook) -> OperationRef | None:
        """Send the create request; the operation to wait on (``None`` when the API finished at once)."""

    @abstractmethod
    def delete(self, hook: GcpHook) -> OperationRef | None:
        """Send the delete request; the operation to wait on, or ``None`` when the resource was already gone."""

    def delete_message(self, **fields: str) -> Any:
        """A copy of the plan's delete request as the client's message, with ``fields`` set (a request id is made
        per send, so the plan cannot hold it); the plan's own message is never changed."""
        message = self.delete_request.message
        if message is None:
            raise TypeError(f"{self.label}: the plan's delete request carries no message to send")
        return type(message)(message, **fields)

    @abstractmethod
    def recorded_owner(self, actual: dict[str, Any]) -> Owner | None:
        """Who it says made it (deployment, group, creating run), or None: someone outside this package."""

    def owned(self, actual: dict[str, Any]) -> bool:
        """Whether it belongs to this run's deployment and group (anything else is foreign, never deleted)."""
        return self.owner.owns(self.recorded_owner(actual))

    def created_by_this_run(self, actual: dict[str, Any]) -> bool:
        """Whether this very run created it."""
        return self.owned(actual) and self.owner.created(self.recorded_owner(actual))

    def drift(self, actual: dict[str, Any]) -> list[str]:
        """How the resource differs from the run conf, one ``"field: expected X, found Y"`` line per field."""
        body = self.request.body or {}
        return diff(body.get(self.body_root, {}) if self.body_root else body, actual, self.checks)

    # The lifecycle: the field holding the state (none for most Compute objects) and what its values mean.
    state_field = ""
    ready_states: tuple[str, ...] = ()  # empty: usable as soon as it can be read
    failed_states: tuple[str, ...] = ()
    deleting_states: tuple[str, ...] = ()

    def state(self, actual: dict[str, Any]) -> str:
        """Its lifecycle state as the API says it (empty when the API has none)."""
        return str(actual.get(self.state_field, "")) if self.state_field else ""

    def ready(self, actual: dict[str, Any]) -> bool:
        """Whether it is usable now."""
        return not self.ready_states or self.state(actual) in self.ready_states

    def failed(self, actual: dict[str, Any]) -> bool:
        """Whether it is in a state no wait will fix."""
        return self.state(actual) in self.failed_states

    def deleting(self, actual: dict[str, Any]) -> bool:
        """Whether it is being deleted."""
        return self.state(actual) in self.deleting_states

    def pending_operation(self, hook: GcpHook, actual: dict[str, Any]) -> OperationRef | None:
        """The unfinished operation working on it (for a resource found mid-create), or ``None``."""
        return None

    def problem(self, actual: dict[str, Any]) -> str:
        """Why it cannot serve the run although it exists, in words with the fix ('' when nothing is wrong)."""
        return ""

    def fallback_delete(self, hook: GcpHook, failed: OperationRef) -> OperationRef | None:
        """Another way to delete it after its delete operation ``failed`` (inside the operation), or ``None``."""
        return None


def list_operations(hook: GcpHook, method: Callable[..., Any], resource: Resource, **kwargs: Any) -> Any:
    """An ``operations.list`` answer, or ``None`` where the endpoint does not serve the listing (404, 405, 501)."""
    try:
        return hook.call(method, **kwargs, what=f"list operations of {resource.label}")
    except Exception as exc:
        if is_not_found(exc) or http_status(exc) in (405, 501):
            log.warning("%s: the API does not list operations here (%s)", resource.label, exc)
            return None
        raise
