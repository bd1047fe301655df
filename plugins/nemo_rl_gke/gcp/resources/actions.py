"""The two idempotent actions on a run's resources (DESIGN rule 2), never duplicating, changing or stealing one.

- ensure: get; missing -> create (and hand back the operation to wait on); present -> refuse it when someone else
  made it (unless the conf adopts existing resources), refuse it when it differs from the conf (never changed in
  place, never retried), else use it. A resource still being created (Lustre CREATING, cluster or pool PROVISIONING)
  is waited on through the operation the API lists for it, so the caller defers on it exactly as on its own create.
  When the API shows no such operation the call raises :class:`NotReadyError` (the task's retry reads the resource
  again) rather than waiting here, since a sync wait would hold a worker slot (DESIGN rule 3).
- delete: get; missing -> ``absent``; not this deployment's and group's -> ``kept-unowned`` (never deleted); ours but
  neither used nor created by this run (a drift refusal, a step that never ran) -> ``kept-unused``; else delete (404
  counts as done).

Waiting is not done here: the operator defers on the returned :class:`~nemo_rl_gke.gcp.operations.OperationRef`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.gcp.hooks import is_conflict
from nemo_rl_gke.gcp.operations import OperationRef
from nemo_rl_gke.gcp.resources.base import Resource
from nemo_rl_gke.gcp.resources.errors import DriftError, NotOwnedError, NotReadyError, ResourceFailedError
from nemo_rl_gke.run.outcomes import ABSENT, ADOPTED, CREATED, DELETED, EXISTS, KEPT_UNOWNED, KEPT_UNUSED

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActionResult:
    """What :func:`ensure` or :func:`delete_resource` did (an :mod:`~nemo_rl_gke.run.outcomes` word) and the operation
    to wait on, if any."""

    action: str
    operation: OperationRef | None = None
    reason: str = ""  # why a kept resource was kept, in words for the log and the run report

    def to_dict(self) -> dict[str, Any]:
        """JSON form, for XCom."""
        return {"action": self.action, "operation": self.operation.to_dict() if self.operation else None}


def _whose(resource: Resource, actual: dict[str, Any]) -> str:
    found = resource.recorded_owner(actual)
    return f"it belongs to {found}" if found else f"no owner record of this package in its {resource.marker_where}"


def _not_owned(resource: Resource, actual: dict[str, Any]) -> NotOwnedError:
    whose = _whose(resource, actual)
    return NotOwnedError(
        f"{resource.label} ({resource.key}) already exists in project {resource.spec.project} but is not this run "
        f"group's ({resource.owner}): {whose}. This run never changes or deletes it. Fix: set adopt_existing=true "
        f"in the conf to use it as it is, or change '{resource.name_param}' so that the run creates its own."
    )


def _drift(resource: Resource, lines: list[str]) -> DriftError:
    listed = "\n".join(f"  - {line}" for line in lines)
    return DriftError(
        f"{resource.label} ({resource.key}) exists but does not match the run conf; an existing resource is never "
        f"changed in place:\n{listed}\nFix: change the conf to match it, or delete it so the run creates it anew.",
        lines,
    )


def _existing(resource: Resource, hook: GcpHook, actual: dict[str, Any], action: str) -> ActionResult:
    """The ensure outcome for a resource that is there: check it is usable, or find what to wait on."""
    if resource.ready(actual):
        return ActionResult(action)
    state = resource.state(actual) or "not ready"
    if resource.deleting(actual):
        raise NotReadyError(f"{resource.label} is being deleted ({state}); run the task again once it is gone")
    if resource.failed(actual):
        raise ResourceFailedError(f"{resource.label} exists in state {state}; delete it (or repair it) and run again")
    operation = resource.pending_operation(hook, actual)
    if operation is None:
        raise NotReadyError(
            f"{resource.label} exists in state {state} and the API lists no operation on it to wait for; "
            "run the task again later"
        )
    log.info("%s is %s: waiting on its running operation %s", resource.label, state, operation.path)
    return ActionResult(action, operation)


def ensure(resource: Resource, hook: GcpHook, adopt_existing: bool) -> ActionResult:
    """Make ``resource`` exist as the conf says, without ever duplicating, changing or stealing it.

    - missing: create it -> ``created`` with the create operation;
    - present, not ours, ``adopt_existing`` false -> :class:`NotOwnedError` (naming the resource and how to adopt);
    - present but different from the conf -> :class:`DriftError` with the diff (never retried, never patched);
    - present and ours -> ``exists``; present, not ours, adopted -> ``adopted``; in both cases with the running
      operation to wait on when it is still being created (see the module docstring).

    A create answered with 409 (a retried create that had gone through, or a concurrent run) is read back and treated
    as present: ``created`` when it carries our marker, else the not-owned rules above.
    """
    actual = resource.get(hook)
    created_by_race = False
    if actual is None:
        try:
            operation = resource.create(hook)
        except Exception as exc:
            if not is_conflict(exc):
                raise
            actual = resource.get(hook)
            if actual is None:
                raise
            created_by_race = True
            log.info("%s: create answered 409; it exists now, checking it", resource.label)
        else:
            log.info("%s: created", resource.label)
            return ActionResult(CREATED, operation)
    owned = resource.owned(actual)
    if not owned and not adopt_existing:
        raise _not_owned(resource, actual)
    lines = resource.drift(actual)
    if lines:
        raise _drift(resource, lines)
    action = (CREATED if created_by_race else EXISTS) if owned else ADOPTED
    log.info("%s: %s", resource.label, action)
    return _existing(resource, hook, actual, action)


def delete_verdict(resource: Resource, actual: dict[str, Any] | None, *, used: bool) -> str:
    """What :func:`delete_resource` decides about ``resource`` as read (``actual``, None when it is absent), before any
    write: ``absent``, ``kept-unowned``, ``kept-unused``, or ``deleted`` (it goes). A dry run asks the same question.
    """
    if actual is None:
        return ABSENT
    if not resource.owned(actual):
        return KEPT_UNOWNED
    if not used and not resource.created_by_this_run(actual):
        return KEPT_UNUSED
    return DELETED


def delete_resource(resource: Resource, hook: GcpHook, *, used: bool) -> ActionResult:
    """Delete ``resource`` if it is there, ours, and this run used or created it: ``deleted`` (with the operation),
    ``absent``, ``kept-unowned`` or ``kept-unused``.

    ``used`` says this run's ensure step took it as its own (created or exists). A resource of another deployment or
    group, or an adopted one, is never deleted, whatever the conf says (DESIGN rule 2); one of ours that this run
    refused (drift) or never reached is left for the run that uses it. A 404 at any step counts as done.
    """
    actual = resource.get(hook)
    verdict = delete_verdict(resource, actual, used=used)
    if verdict == ABSENT:
        log.info("%s: absent, nothing to delete", resource.label)
        return ActionResult(ABSENT)
    assert actual is not None
    if verdict == KEPT_UNOWNED:
        reason = f"not this run group's ({_whose(resource, actual)}): never deleted"
        log.warning("%s is %s", resource.label, reason)
        return ActionResult(KEPT_UNOWNED, reason=reason)
    if verdict == KEPT_UNUSED:
        reason = "this run neither used nor created it (refused, or never reached): left for the run that uses it"
        log.warning("%s: %s", resource.label, reason)
        return ActionResult(KEPT_UNUSED, reason=reason)
    if resource.deleting(actual):
        operation = resource.pending_operation(hook, actual)
        if operation is None:
            raise NotReadyError(
                f"{resource.label} is already being deleted and the API lists no operation on it to wait for; "
                "run the task again later (it reads absent once the deletion is done)"
            )
        log.info("%s is already being deleted: waiting on %s", resource.label, operation.path)
        return ActionResult(DELETED, operation)
    operation = resource.delete(hook)
    if operation is None:
        return ActionResult(ABSENT)
    log.info("%s: delete requested (%s)", resource.label, operation.path)
    return ActionResult(DELETED, operation)
